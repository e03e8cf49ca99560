// The `tessera` Python module: the table specs (ps/table_spec.h) and their enums, and the
// Table a client knows.
#include <cctype>
#include <cstdint>
#include <optional>
#include <sstream>
#include <string>
#include <utility>

#include "ps/client/client.h"
#include "ps/status.h"
#include "ps/table_spec.h"
#include "python/module_internal.h"

namespace tessera::python {
namespace {

OptimizerKind ParseOptimizerKind(const py::handle& kind) {
  if (!py::isinstance<py::str>(kind)) return kind.cast<OptimizerKind>();
  const std::string s = kind.cast<std::string>();
  for (auto k : {OptimizerKind::kSgd, OptimizerKind::kMomentum, OptimizerKind::kAdagrad,
                 OptimizerKind::kRowwiseAdagrad, OptimizerKind::kAdam, OptimizerKind::kFtrl}) {
    std::string name(OptimizerKindName(k));
    for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (s == name) return k;
  }
  if (s == "rowwise_adagrad") return OptimizerKind::kRowwiseAdagrad;
  throw py::value_error("optimizer kind '" + s +
                        "': expected sgd, momentum, adagrad, rowwise_adagrad, adam or ftrl");
}

InitializerKind ParseInitializerKind(const py::handle& kind) {
  if (!py::isinstance<py::str>(kind)) return kind.cast<InitializerKind>();
  const std::string s = kind.cast<std::string>();
  if (s == "zeros") return InitializerKind::kZeros;
  if (s == "constant") return InitializerKind::kConstant;
  if (s == "uniform") return InitializerKind::kUniform;
  if (s == "normal") return InitializerKind::kNormal;
  throw py::value_error("initializer kind '" + s +
                        "': expected zeros, constant, uniform or normal");
}

std::string OptimizerRepr(const OptimizerSpec& o) {
  std::ostringstream s;
  s << "OptimizerSpec(kind='" << OptimizerKindName(o.kind) << "', learning_rate=" << o.learning_rate
    << ")";
  return s.str();
}

std::string SpecRepr(const TableSpec& t) {
  std::ostringstream s;
  s << "TableSpec(name='" << t.name << "', kind='"
    << (t.kind == TableKind::kSparse ? "sparse" : "dense") << "', ";
  if (t.kind == TableKind::kSparse) {
    s << "dim=" << t.dim;
  } else {
    s << "length=" << t.length;
  }
  s << ", optimizer='" << OptimizerKindName(t.optimizer.kind)
    << "', learning_rate=" << t.optimizer.learning_rate << ")";
  return s.str();
}

void RegisterSpecEnums(py::module_& m) {
  py::enum_<TableKind>(m, "TableKind")
      .value("SPARSE", TableKind::kSparse)
      .value("DENSE", TableKind::kDense);
  py::enum_<OptimizerKind>(m, "OptimizerKind")
      .value("SGD", OptimizerKind::kSgd)
      .value("MOMENTUM", OptimizerKind::kMomentum)
      .value("ADAGRAD", OptimizerKind::kAdagrad)
      .value("ROWWISE_ADAGRAD", OptimizerKind::kRowwiseAdagrad)
      .value("ADAM", OptimizerKind::kAdam)
      .value("FTRL", OptimizerKind::kFtrl);
  py::enum_<InitializerKind>(m, "InitializerKind")
      .value("ZEROS", InitializerKind::kZeros)
      .value("CONSTANT", InitializerKind::kConstant)
      .value("UNIFORM", InitializerKind::kUniform)
      .value("NORMAL", InitializerKind::kNormal);
}

void RegisterOptimizerSpec(py::module_& m) {
  const OptimizerSpec od;
  py::class_<OptimizerSpec>(m, "OptimizerSpec",
                            "Server-side optimizer of a table (ps/table_spec.h). `kind` is an "
                            "OptimizerKind or one of 'sgd', 'momentum', 'adagrad', "
                            "'rowwise_adagrad', 'adam', 'ftrl'.")
      .def(py::init([](py::object kind, float lr, float momentum, float beta1, float beta2,
                       float epsilon, float initial_accumulator, float ftrl_beta, float l1,
                       float l2) {
             OptimizerSpec o;
             o.kind = ParseOptimizerKind(kind);
             o.learning_rate = lr;
             o.momentum = momentum;
             o.beta1 = beta1;
             o.beta2 = beta2;
             o.epsilon = epsilon;
             o.initial_accumulator = initial_accumulator;
             o.ftrl_beta = ftrl_beta;
             o.l1 = l1;
             o.l2 = l2;
             return o;
           }),
           py::arg("kind") = "sgd", py::arg("learning_rate") = od.learning_rate,
           py::arg("momentum") = od.momentum, py::arg("beta1") = od.beta1,
           py::arg("beta2") = od.beta2, py::arg("epsilon") = od.epsilon,
           py::arg("initial_accumulator") = od.initial_accumulator,
           py::arg("ftrl_beta") = od.ftrl_beta, py::arg("l1") = od.l1, py::arg("l2") = od.l2)
      .def_readwrite("kind", &OptimizerSpec::kind)
      .def_readwrite("learning_rate", &OptimizerSpec::learning_rate)
      .def_readwrite("momentum", &OptimizerSpec::momentum)
      .def_readwrite("beta1", &OptimizerSpec::beta1)
      .def_readwrite("beta2", &OptimizerSpec::beta2)
      .def_readwrite("epsilon", &OptimizerSpec::epsilon)
      .def_readwrite("initial_accumulator", &OptimizerSpec::initial_accumulator)
      .def_readwrite("ftrl_beta", &OptimizerSpec::ftrl_beta)
      .def_readwrite("l1", &OptimizerSpec::l1)
      .def_readwrite("l2", &OptimizerSpec::l2)
      .def("__repr__", &OptimizerRepr);
}

// InitializerSpec, AdmissionSpec and EvictionSpec: what happens to a table's rows.
void RegisterRowSpecs(py::module_& m) {
  py::class_<InitializerSpec>(m, "InitializerSpec",
                              "First value of a row or dense element: 'zeros', 'constant' (a), "
                              "'uniform' (in [a, b]) or 'normal' (mean a, stddev b), a pure "
                              "function of (seed, key, element).")
      .def(py::init([](py::object kind, float a, float b, uint64_t seed) {
             return InitializerSpec{ParseInitializerKind(kind), a, b, seed};
           }),
           py::arg("kind") = "zeros", py::arg("a") = 0.0f, py::arg("b") = 0.0f, py::arg("seed") = 0)
      .def_readwrite("kind", &InitializerSpec::kind)
      .def_readwrite("a", &InitializerSpec::a)
      .def_readwrite("b", &InitializerSpec::b)
      .def_readwrite("seed", &InitializerSpec::seed);

  py::class_<AdmissionSpec>(m, "AdmissionSpec",
                            "A key gets a stored row after min_count pushes, with probability.")
      .def(py::init([](uint32_t min_count, float probability) {
             return AdmissionSpec{min_count, probability};
           }),
           py::arg("min_count") = 0, py::arg("probability") = 1.0f)
      .def_readwrite("min_count", &AdmissionSpec::min_count)
      .def_readwrite("probability", &AdmissionSpec::probability);

  py::class_<EvictionSpec>(m, "EvictionSpec", "Rows idle this long are deleted (0: never).")
      .def(py::init([](uint64_t steps, uint64_t seconds) {
             return EvictionSpec{steps, seconds};
           }),
           py::arg("max_idle_steps") = 0, py::arg("max_idle_seconds") = 0)
      .def_readwrite("max_idle_steps", &EvictionSpec::max_idle_steps)
      .def_readwrite("max_idle_seconds", &EvictionSpec::max_idle_seconds);
}

void RegisterTableSpec(py::module_& m) {
  auto make_spec = [](TableKind kind, std::string name, uint64_t size, OptimizerSpec opt,
                      InitializerSpec init, std::optional<AdmissionSpec> adm,
                      std::optional<EvictionSpec> ev) {
    if (kind == TableKind::kSparse && size > kMaxSparseDim) {
      throw py::value_error("dim " + std::to_string(size) + " is above " +
                            std::to_string(kMaxSparseDim));
    }
    TableSpec s = kind == TableKind::kSparse
                      ? TableSpec::Sparse(std::move(name), static_cast<uint32_t>(size), opt, init)
                      : TableSpec::Dense(std::move(name), size, opt, init);
    if (adm) s.admission = *adm;
    if (ev) s.eviction = *ev;
    return s;
  };
  py::class_<TableSpec>(m, "TableSpec",
                        "What a table is. Build one with TableSpec.sparse(name, dim, ...) or "
                        "TableSpec.dense(name, length, ...).")
      .def_static(
          "sparse",
          [make_spec](std::string name, uint64_t dim, OptimizerSpec opt, InitializerSpec init,
                      std::optional<AdmissionSpec> adm, std::optional<EvictionSpec> ev) {
            return make_spec(TableKind::kSparse, std::move(name), dim, opt, init, adm, ev);
          },
          py::arg("name"), py::arg("dim"), py::arg("optimizer") = OptimizerSpec(),
          py::arg("initializer") = InitializerSpec(), py::arg("admission") = py::none(),
          py::arg("eviction") = py::none(),
          "A sparse table: one row of `dim` floats per uint64 key.")
      .def_static(
          "dense",
          [make_spec](std::string name, uint64_t length, OptimizerSpec opt, InitializerSpec init) {
            return make_spec(TableKind::kDense, std::move(name), length, opt, init, std::nullopt,
                             std::nullopt);
          },
          py::arg("name"), py::arg("length"), py::arg("optimizer") = OptimizerSpec(),
          py::arg("initializer") = InitializerSpec(), "A dense tensor of `length` floats.")
      .def_readwrite("name", &TableSpec::name)
      .def_readwrite("kind", &TableSpec::kind)
      .def_readwrite("dim", &TableSpec::dim)
      .def_readwrite("length", &TableSpec::length)
      .def_readwrite("optimizer", &TableSpec::optimizer)
      .def_readwrite("initializer", &TableSpec::initializer)
      .def_readwrite("admission", &TableSpec::admission)
      .def_readwrite("eviction", &TableSpec::eviction)
      .def(
          "validate", [](const TableSpec& s) { Check(ValidateTableSpec(s)); },
          "Raises InvalidArgumentError when the spec is malformed.")
      .def("difference", &DescribeSpecDifference, py::arg("other"),
           "Empty when equal, else the differences, e.g. 'dim: 16 vs 32'.")
      .def("__eq__", [](const TableSpec& a,
                        const TableSpec& b) { return DescribeSpecDifference(a, b).empty(); })
      .def("__repr__", &SpecRepr);

  py::class_<Table>(m, "Table", "A table known to the client (create_table, get_table).")
      .def_readonly("id", &Table::id)
      .def_readonly("spec", &Table::spec)
      .def_property_readonly("name", [](const Table& t) { return t.spec.name; })
      .def_property_readonly("kind", [](const Table& t) { return t.spec.kind; })
      .def_property_readonly("dim", [](const Table& t) { return t.spec.dim; })
      .def_property_readonly("length", [](const Table& t) { return t.spec.length; })
      .def("__repr__", [](const Table& t) { return "Table(" + SpecRepr(t.spec) + ")"; });
}

}  // namespace

void RegisterSpecs(py::module_& m) {
  RegisterSpecEnums(m);
  RegisterOptimizerSpec(m);
  RegisterRowSpecs(m);
  RegisterTableSpec(m);
}

}  // namespace tessera::python
