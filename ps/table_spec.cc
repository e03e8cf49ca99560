#include "ps/table_spec.h"

#include <xxhash.h>

#include <cmath>
#include <sstream>

namespace tessera {

TableSpec TableSpec::Sparse(std::string name, uint32_t dim, OptimizerSpec opt,
                            InitializerSpec init) {
  TableSpec s;
  s.name = std::move(name);
  s.kind = TableKind::kSparse;
  s.dim = dim;
  s.optimizer = opt;
  s.initializer = init;
  return s;
}

TableSpec TableSpec::Dense(std::string name, uint64_t length, OptimizerSpec opt,
                           InitializerSpec init) {
  TableSpec s;
  s.name = std::move(name);
  s.kind = TableKind::kDense;
  s.length = length;
  s.optimizer = opt;
  s.initializer = init;
  return s;
}

std::string_view OptimizerKindName(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kSgd:
      return "sgd";
    case OptimizerKind::kMomentum:
      return "momentum";
    case OptimizerKind::kAdagrad:
      return "adagrad";
    case OptimizerKind::kRowwiseAdagrad:
      return "rowwise_adagrad";
    case OptimizerKind::kAdam:
      return "adam";
    case OptimizerKind::kFtrl:
      return "ftrl";
  }
  return "unknown";
}

Status ValidateStoredTableSpec(const TableSpec& s) {
  if (s.name.empty()) return Status::InvalidArgument("table name is empty");
  if (s.name.size() > kMaxTableNameLength) {
    return Status::InvalidArgument("table name longer than " + std::to_string(kMaxTableNameLength) +
                                   " bytes");
  }
  const std::string where = "table '" + s.name + "': ";
  if (s.kind == TableKind::kSparse) {
    if (s.dim == 0 || s.dim > kMaxSparseDim) {
      return Status::InvalidArgument(where + "sparse dim must be in 1.." +
                                     std::to_string(kMaxSparseDim) + ", got " +
                                     std::to_string(s.dim));
    }
    if (s.length != 0) return Status::InvalidArgument(where + "sparse tables take no length");
  } else if (s.kind == TableKind::kDense) {
    if (s.length == 0 || s.length > kMaxDenseLength) {
      return Status::InvalidArgument(where + "dense length must be in 1..2^34, got " +
                                     std::to_string(s.length));
    }
    if (s.dim != 0) return Status::InvalidArgument(where + "dense tables take no dim");
  } else {
    return Status::InvalidArgument(where + "unknown table kind");
  }
  if (static_cast<uint8_t>(s.optimizer.kind) > static_cast<uint8_t>(OptimizerKind::kFtrl)) {
    return Status::InvalidArgument(where + "unknown optimizer");
  }
  if (static_cast<uint8_t>(s.initializer.kind) > static_cast<uint8_t>(InitializerKind::kNormal)) {
    return Status::InvalidArgument(where + "unknown initializer");
  }
  const auto& o = s.optimizer;
  for (float v :
       {o.learning_rate, o.momentum, o.beta1, o.beta2, o.epsilon, o.initial_accumulator,
        o.ftrl_beta, o.l1, o.l2, s.initializer.a, s.initializer.b, s.admission.probability}) {
    if (!std::isfinite(v)) return Status::InvalidArgument(where + "non-finite hyper-parameter");
  }
  if (o.learning_rate < 0 || o.epsilon < 0 || o.l1 < 0 || o.l2 < 0 || o.initial_accumulator < 0) {
    return Status::InvalidArgument(where +
                                   "negative learning rate, epsilon, l1, l2 or accumulator");
  }
  if (o.beta1 < 0 || o.beta1 >= 1 || o.beta2 < 0 || o.beta2 >= 1) {
    return Status::InvalidArgument(where + "Adam betas must be in [0, 1)");
  }
  if (s.admission.probability <= 0 || s.admission.probability > 1) {
    return Status::InvalidArgument(where + "admission probability must be in (0, 1]");
  }
  if (s.kind == TableKind::kDense &&
      (s.admission.min_count > 1 || s.admission.probability < 1 || s.eviction.max_idle_steps != 0 ||
       s.eviction.max_idle_seconds != 0)) {
    return Status::InvalidArgument(where + "admission and eviction apply to sparse tables only");
  }
  return Status::OK();
}

Status ValidateTableSpec(const TableSpec& s) {
  TESSERA_RETURN_IF_ERROR(ValidateStoredTableSpec(s));
  const std::string where = "table '" + s.name + "': ";
  const auto& o = s.optimizer;
  // Values that would turn a row into NaN or infinity on its first push of a zero gradient
  // element (0 / 0), or on any push (FTRL divides by the learning rate).
  const bool adagrad =
      o.kind == OptimizerKind::kAdagrad || o.kind == OptimizerKind::kRowwiseAdagrad;
  if (adagrad && o.epsilon == 0 && o.initial_accumulator == 0) {
    return Status::InvalidArgument(where + "Adagrad needs epsilon > 0 or initial_accumulator > 0"
                                   " (a zero gradient would divide 0 by 0)");
  }
  if (o.kind == OptimizerKind::kAdam && o.epsilon == 0) {
    return Status::InvalidArgument(where + "Adam needs epsilon > 0 (a zero gradient would "
                                   "divide 0 by 0)");
  }
  if (o.kind == OptimizerKind::kFtrl && (o.learning_rate == 0 || o.ftrl_beta < 0)) {
    return Status::InvalidArgument(where + "FTRL needs learning_rate (alpha) > 0 and "
                                   "ftrl_beta >= 0");
  }
  return Status::OK();
}

namespace {
template <typename T>
void Diff(std::ostringstream& out, const char* field, const T& a, const T& b) {
  if (a == b) return;
  if (out.tellp() > 0) out << "; ";
  out << field << ": ";
  if constexpr (std::is_enum_v<T>) {
    out << static_cast<int>(a) << " vs " << static_cast<int>(b);
  } else {
    out << a << " vs " << b;
  }
}
}  // namespace

std::string DescribeSpecDifference(const TableSpec& a, const TableSpec& b) {
  std::ostringstream out;
  Diff(out, "name", a.name, b.name);
  Diff(out, "kind", a.kind, b.kind);
  Diff(out, "dim", a.dim, b.dim);
  Diff(out, "length", a.length, b.length);
  Diff(out, "optimizer.kind", a.optimizer.kind, b.optimizer.kind);
  Diff(out, "optimizer.learning_rate", a.optimizer.learning_rate, b.optimizer.learning_rate);
  Diff(out, "optimizer.momentum", a.optimizer.momentum, b.optimizer.momentum);
  Diff(out, "optimizer.beta1", a.optimizer.beta1, b.optimizer.beta1);
  Diff(out, "optimizer.beta2", a.optimizer.beta2, b.optimizer.beta2);
  Diff(out, "optimizer.epsilon", a.optimizer.epsilon, b.optimizer.epsilon);
  Diff(out, "optimizer.initial_accumulator", a.optimizer.initial_accumulator,
       b.optimizer.initial_accumulator);
  Diff(out, "optimizer.ftrl_beta", a.optimizer.ftrl_beta, b.optimizer.ftrl_beta);
  Diff(out, "optimizer.l1", a.optimizer.l1, b.optimizer.l1);
  Diff(out, "optimizer.l2", a.optimizer.l2, b.optimizer.l2);
  Diff(out, "initializer.kind", a.initializer.kind, b.initializer.kind);
  Diff(out, "initializer.a", a.initializer.a, b.initializer.a);
  Diff(out, "initializer.b", a.initializer.b, b.initializer.b);
  Diff(out, "initializer.seed", a.initializer.seed, b.initializer.seed);
  Diff(out, "admission.min_count", a.admission.min_count, b.admission.min_count);
  Diff(out, "admission.probability", a.admission.probability, b.admission.probability);
  Diff(out, "eviction.max_idle_steps", a.eviction.max_idle_steps, b.eviction.max_idle_steps);
  Diff(out, "eviction.max_idle_seconds", a.eviction.max_idle_seconds, b.eviction.max_idle_seconds);
  return out.str();
}

uint64_t TableIdForName(std::string_view name) {
  uint64_t h = XXH3_64bits(name.data(), name.size());
  return h == 0 ? 1 : h;
}

}  // namespace tessera
