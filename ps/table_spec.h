// Table specifications: what a table is, how it is optimized and initialized.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "ps/status.h"

namespace tessera {

/// Sparse tables hold one row of `dim` floats per 64-bit key; dense tables hold one tensor of
/// `length` floats cut into chunks spread over all servers.
enum class TableKind : uint8_t { kSparse = 0, kDense = 1 };

/// Server-side optimizers. Values are part of the wire protocol: never renumber.
enum class OptimizerKind : uint8_t {
  kSgd = 0,
  kMomentum = 1,        ///< Heavy-ball momentum: m = momentum*m + g; w -= lr*m.
  kAdagrad = 2,         ///< Per element: a += g^2; w -= lr*g/(sqrt(a)+eps).
  kRowwiseAdagrad = 3,  ///< One accumulator per row: a += mean(g^2); w -= lr*g/(sqrt(a)+eps).
  kAdam = 4,            ///< Bias-corrected with the row's own step count.
  kFtrl = 5,            ///< FTRL-Proximal (McMahan et al. 2013) with L1 and L2.
};

/// Optimizer hyper-parameters. Fields an optimizer does not use are ignored (but still compared
/// when two specs are checked for equality).
struct OptimizerSpec {
  OptimizerKind kind = OptimizerKind::kSgd;
  /// Step size (FTRL: alpha). Default: 0.01.
  float learning_rate = 0.01f;
  /// Momentum coefficient (Momentum). Default: 0.9.
  float momentum = 0.9f;
  /// Adam first and second moment decay. Defaults: 0.9, 0.999.
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  /// Added to denominators (Adagrad, Adam). Default: 1e-8.
  float epsilon = 1e-8f;
  /// Starting value of Adagrad accumulators. Default: 0.
  float initial_accumulator = 0.0f;
  /// FTRL beta, L1 and L2 strengths (FTRL's own proximal terms). Defaults: 1, 0, 0.
  float ftrl_beta = 1.0f;
  float l1 = 0.0f;
  /// Every other optimizer: L2 regularization, l2 * value added to the gradient of each
  /// element a push updates (lazy for sparse rows: rows no push touches are not decayed).
  float l2 = 0.0f;
};

/// The largest learning-rate scale of a push (Client::SetLearningRateScale) a server accepts.
inline constexpr float kMaxLrScale = 1000.0f;

/// How a row (or dense element) gets its first value. Every value is a pure function of
/// (seed, key, element index): it never depends on the server, the lane or the time.
enum class InitializerKind : uint8_t { kZeros = 0, kConstant = 1, kUniform = 2, kNormal = 3 };

struct InitializerSpec {
  InitializerKind kind = InitializerKind::kZeros;
  /// Constant: the value. Uniform: lower bound. Normal: mean. Default: 0.
  float a = 0.0f;
  /// Uniform: upper bound. Normal: standard deviation. Default: 0.
  float b = 0.0f;
  /// Seed mixed with the key. Default: 0.
  uint64_t seed = 0;
};

/// Sparse-table admission: a key gets a stored row only after it was pushed `min_count` times
/// (0 or 1: at once), and then only with `probability`. Until admitted a pull returns the
/// initializer's value.
struct AdmissionSpec {
  uint32_t min_count = 0;
  float probability = 1.0f;
};

/// Sparse-table eviction: rows not updated for `max_idle_steps` of the server's push counter or
/// `max_idle_seconds` are deleted on a schedule. 0 disables each rule.
struct EvictionSpec {
  uint64_t max_idle_steps = 0;
  uint64_t max_idle_seconds = 0;
};

/// The full description of a table. Creating a table that exists with an equal spec is a no-op;
/// with another spec it fails with AlreadyExists naming the difference.
struct TableSpec {
  std::string name;
  TableKind kind = TableKind::kSparse;
  /// Sparse: floats per key (1..65536).
  uint32_t dim = 0;
  /// Dense: number of floats in the tensor (1..2^34).
  uint64_t length = 0;
  OptimizerSpec optimizer;
  InitializerSpec initializer;
  AdmissionSpec admission;
  EvictionSpec eviction;

  /// Convenience constructors.
  static TableSpec Sparse(std::string name, uint32_t dim, OptimizerSpec opt = {},
                          InitializerSpec init = {});
  static TableSpec Dense(std::string name, uint64_t length, OptimizerSpec opt = {},
                         InitializerSpec init = {});
};

inline constexpr uint32_t kMaxSparseDim = 65536;
inline constexpr uint64_t kMaxDenseLength = uint64_t{1} << 34;
inline constexpr size_t kMaxTableNameLength = 256;

/// Checks that a spec is well-formed (name, sizes, finite hyper-parameters) and that no push can
/// make its optimizer write NaN or infinity (Adagrad, Adam: epsilon or an initial accumulator
/// above 0; FTRL: learning rate above 0, beta not negative). For a table being created.
Status ValidateTableSpec(const TableSpec& spec);
/// The well-formedness part only: what a table already stored must satisfy to be opened (a
/// data dir written before a rule of ValidateTableSpec existed still opens).
Status ValidateStoredTableSpec(const TableSpec& spec);

/// Empty when equal; otherwise a human-readable list of differences, e.g.
/// "dim: 16 vs 32; optimizer.learning_rate: 0.01 vs 0.1".
std::string DescribeSpecDifference(const TableSpec& a, const TableSpec& b);

/// The table id used on the wire: a fixed 64-bit hash of the name (never 0).
uint64_t TableIdForName(std::string_view name);

std::string_view OptimizerKindName(OptimizerKind kind);

}  // namespace tessera
