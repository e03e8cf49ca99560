// The `tessera` Python module: the client (ps/client/client.h) and the export reader
// (ps/client/export_reader.h) for Python and PyTorch jobs.
//
// Contract (python/README.md has it with examples):
// - Errors: a non-OK Status raises a subclass of tessera.Error named after its code (e.g.
//   tessera.NotFoundError), whose text is Status::ToString() and whose `code` is the code's
//   name. Argument errors found here raise TypeError (wrong dtype) or ValueError (shape, size,
//   layout). Nothing aborts the interpreter.
// - Arrays: keys are uint64 and gradients float32; C-contiguous arrays of those dtypes (and CPU
//   torch tensors, which numpy views without a copy) are read in place. Other integer or
//   float arrays are converted once. `out=` arrays are written in place, so they must be
//   float32, C-contiguous and writable: nothing else is accepted.
// - Threads: every call that waits (for a server or on a handle) releases the GIL, so other
//   Python threads run meanwhile. A Client may be used from several Python threads at once.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <array>
#include <cctype>
#include <charconv>
#include <cstdint>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "ps/client/client.h"
#include "ps/client/export_reader.h"
#include "ps/coord/coordinator_url.h"
#include "ps/coord/etcd_map_source.h"
#include "ps/routing.h"
#include "ps/status.h"
#include "ps/table_spec.h"

namespace py = pybind11;

namespace tessera::python {
namespace {

// ------------------------------------------------------------------ errors

constexpr size_t kNumCodes = static_cast<size_t>(StatusCode::kCancelled) + 1;

// The exception class of each StatusCode. Owned by the module for the life of the
// interpreter: the references are leaked on purpose, since a static py::object would be
// released after the interpreter is gone.
std::array<PyObject*, kNumCodes> g_error_classes{};

// Raises the exception of a non-OK status (the caller holds the GIL).
[[noreturn]] void Raise(const Status& s) {
  PyObject* cls = g_error_classes[static_cast<size_t>(s.code())];
  if (cls == nullptr) cls = g_error_classes[0];
  py::object exc = py::reinterpret_borrow<py::object>(cls)(s.ToString());
  exc.attr("code") = std::string(StatusCodeName(s.code()));
  exc.attr("message") = s.message();
  PyErr_SetObject(cls, exc.ptr());
  throw py::error_already_set();
}

void Check(const Status& s) {
  if (!s.ok()) Raise(s);
}

template <typename T>
T Take(Result<T> r) {
  if (!r.ok()) Raise(r.status());
  return std::move(r).value();
}

Deadline DeadlineOf(std::optional<int64_t> timeout_ms) {
  return timeout_ms ? DeadlineAfterMs(*timeout_ms) : NoDeadline();
}

// ------------------------------------------------------------------ arrays

py::module_& Numpy() {
  static py::module_* np = new py::module_(py::module_::import("numpy"));
  return *np;
}

std::string ShapeText(const std::vector<py::ssize_t>& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) {
    s += (i ? ", " : "") + std::to_string(shape[i]);
  }
  return s + (shape.size() == 1 ? ",)" : ")");
}

std::vector<py::ssize_t> ShapeOf(const py::array& a) {
  return std::vector<py::ssize_t>(a.shape(), a.shape() + a.ndim());
}

std::string DtypeText(const py::array& a) { return py::str(a.dtype()).cast<std::string>(); }

// numpy's view of `obj` (no copy for ndarrays, CPU torch tensors, buffers and
// __array_interface__ objects). TypeError for objects numpy only makes object arrays of.
py::array AsArray(py::handle obj, const char* what) {
  py::array a = Numpy().attr("asarray")(obj);
  if (a.dtype().kind() == 'O') {
    throw py::type_error(std::string(what) + ": expected a numeric array, got " +
                         py::str(py::type::handle_of(obj)).cast<std::string>());
  }
  return a;
}

// Keys: borrowed when `obj` is already a C-contiguous uint64 array, else converted once from
// non-negative integers.
struct Keys {
  py::array array;  // keeps the memory alive while a call reads it
  std::span<const uint64_t> span;
  std::vector<py::ssize_t> shape;
};

Keys AsKeys(py::handle obj) {
  Keys k;
  py::array a = AsArray(obj, "keys");
  if (a.ndim() == 0) throw py::value_error("keys: expected an array of keys, got a scalar");
  const char kind = a.dtype().kind();
  if (kind != 'u' && kind != 'i') {
    throw py::type_error("keys: expected an integer array (uint64), got dtype " + DtypeText(a));
  }
  if (kind == 'i' && a.size() > 0 && Numpy().attr("any")(Numpy().attr("less")(a, 0)).cast<bool>()) {
    throw py::value_error("keys: negative keys (keys are unsigned 64-bit integers)");
  }
  if (!py::isinstance<py::array_t<uint64_t, py::array::c_style>>(a)) {
    a = Numpy().attr("ascontiguousarray")(a, Numpy().attr("uint64"));
  }
  k.shape = ShapeOf(a);
  k.span = {static_cast<const uint64_t*>(a.data()), static_cast<size_t>(a.size())};
  k.array = std::move(a);
  return k;
}

// Whether `a`'s shape fits `rows` rows of `dim` floats: keys.shape + (dim,), (rows, dim) or
// (rows * dim,). Throws ValueError naming the expected shapes otherwise.
void CheckRowsShape(const py::array& a, const std::vector<py::ssize_t>& key_shape, size_t rows,
                    size_t dim, const std::string& what) {
  const auto shape = ShapeOf(a);
  std::vector<py::ssize_t> full = key_shape;
  full.push_back(static_cast<py::ssize_t>(dim));
  const std::vector<py::ssize_t> flat2 = {static_cast<py::ssize_t>(rows),
                                          static_cast<py::ssize_t>(dim)};
  const std::vector<py::ssize_t> flat1 = {static_cast<py::ssize_t>(rows * dim)};
  if (shape == full || shape == flat2 || shape == flat1) return;
  throw py::value_error(what + ": expected shape " + ShapeText(full) + " (or " + ShapeText(flat1) +
                        ") for " + std::to_string(rows) + " keys of dim " + std::to_string(dim) +
                        ", got " + ShapeText(shape));
}

// Gradients: borrowed when already a C-contiguous float32 array, else converted once from a
// floating-point array. Integer or boolean gradients are a TypeError (most likely a bug).
py::array AsGrads(py::handle obj, const char* what) {
  py::array a = AsArray(obj, what);
  if (a.dtype().kind() != 'f') {
    throw py::type_error(std::string(what) + ": expected a float32 array, got dtype " +
                         DtypeText(a));
  }
  if (!py::isinstance<py::array_t<float, py::array::c_style>>(a)) {
    a = Numpy().attr("ascontiguousarray")(a, Numpy().attr("float32"));
  }
  return a;
}

// An output array written in place: float32, C-contiguous, writable, never converted (a
// converted copy would silently receive the result instead of the caller's array).
py::array AsOut(py::handle obj) {
  if (py::isinstance<py::list>(obj) || py::isinstance<py::tuple>(obj)) {
    throw py::type_error("out: expected a float32 array or tensor written in place, got a " +
                         py::str(py::type::handle_of(obj)).cast<std::string>());
  }
  py::array a = AsArray(obj, "out");
  if (!py::isinstance<py::array_t<float>>(a)) {
    throw py::type_error("out: expected dtype float32 (written in place, not converted), got " +
                         DtypeText(a));
  }
  if (!(a.flags() & py::array::c_style)) {
    throw py::value_error(
        "out: must be C-contiguous (written in place); use "
        "numpy.ascontiguousarray or tensor.contiguous() first");
  }
  if (!a.writeable()) throw py::value_error("out: array is read-only");
  return a;
}

// `out` for `rows` x `dim` floats: the caller's array checked, or a new (key shape, dim) one.
py::array OutRows(const std::optional<py::object>& out, const Keys& keys, size_t dim) {
  const size_t rows = keys.span.size();
  if (out && !out->is_none()) {
    py::array a = AsOut(*out);
    CheckRowsShape(a, keys.shape, rows, dim, "out");
    return a;
  }
  std::vector<py::ssize_t> shape = keys.shape;
  shape.push_back(static_cast<py::ssize_t>(dim));
  return py::array_t<float>(shape);
}

py::array OutDense(const std::optional<py::object>& out, uint64_t length) {
  if (out && !out->is_none()) {
    py::array a = AsOut(*out);
    if (static_cast<uint64_t>(a.size()) != length) {
      throw py::value_error("out: expected " + std::to_string(length) + " floats, got " +
                            std::to_string(a.size()) + " (shape " + ShapeText(ShapeOf(a)) + ")");
    }
    return a;
  }
  return py::array_t<float>(static_cast<py::ssize_t>(length));
}

float* MutableFloats(py::array& a) { return static_cast<float*>(a.mutable_data()); }
std::span<const float> Floats(const py::array& a) {
  return {static_cast<const float*>(a.data()), static_cast<size_t>(a.size())};
}

// ------------------------------------------------------------------ specs

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

// ------------------------------------------------------------------ client

// "host:port" is "tcp://host:port": Python callers rarely spell the transport. The list then
// goes through ParseClusterList, so it is checked as the binaries check --cluster ("@FILE"
// lists are taken as written).
std::vector<std::string> ParseEndpoints(const py::object& cluster) {
  std::vector<std::string> items;
  if (py::isinstance<py::str>(cluster)) {
    const std::string text = cluster.cast<std::string>();
    if (!text.empty() && text[0] == '@') return Take(ParseClusterList(text));
    std::istringstream in(text);
    std::string item;
    while (std::getline(in, item, ',')) items.push_back(item);
  } else {
    items = cluster.cast<std::vector<std::string>>();
  }
  std::string spec;
  for (std::string& e : items) {
    const size_t a = e.find_first_not_of(" \t");
    if (a == std::string::npos) continue;
    e = e.substr(a, e.find_last_not_of(" \t") - a + 1);
    if (e.find("://") == std::string::npos) e = "tcp://" + e;
    spec += (spec.empty() ? "" : ",") + e;
  }
  return Take(ParseClusterList(spec));
}

// The Python Client. The C++ client is shared with in-flight calls and Futures, so close()
// (or the Client being collected) never pulls it out from under a call another thread waits
// on: it is destroyed when the last of them lets go.
class PyClient {
 public:
  explicit PyClient(std::shared_ptr<Client> c) : client_(std::move(c)) {}

  // The client, or FailedPrecondition after close(). Called with the GIL held.
  std::shared_ptr<Client> Get() const {
    if (!client_) Raise(Status::FailedPrecondition("the client is closed"));
    return client_;
  }
  void Close() {
    std::shared_ptr<Client> c = std::move(client_);
    py::gil_scoped_release nogil;
    c.reset();  // joins the I/O thread when nobody else holds it
  }
  bool closed() const { return client_ == nullptr; }

 private:
  std::shared_ptr<Client> client_;
};

// An asynchronous call: keeps the client and the output array alive until the call is final.
// Dropping an unfinished Future cancels the call, so nothing writes into freed memory.
class Future {
 public:
  Future(std::shared_ptr<Client> client, Handle h, py::object result)
      : client_(std::move(client)), handle_(std::move(h)), result_(std::move(result)) {}
  ~Future() {
    if (!final_ && client_) {
      py::gil_scoped_release nogil;
      client_->Cancel(handle_);
    }
  }
  Future(const Future&) = delete;
  Future& operator=(const Future&) = delete;

  // Waits (GIL released); returns the output array of a pull, else None. A timeout raises
  // DeadlineExceededError and leaves the call in flight (wait again, or cancel()).
  py::object Wait(std::optional<int64_t> timeout_ms) {
    if (!final_) {
      Status s;
      {
        py::gil_scoped_release nogil;
        s = client_->Wait(handle_, DeadlineOf(timeout_ms));
      }
      if (s.code() == StatusCode::kDeadlineExceeded) Raise(s);
      final_ = true;
      status_ = s;
    }
    Check(status_);
    return result_;
  }
  // Whether the call is final (Wait would not block).
  bool Done() {
    if (final_) return true;
    Status s;
    {
      py::gil_scoped_release nogil;
      s = client_->Wait(handle_, Clock::now());
    }
    if (s.code() == StatusCode::kDeadlineExceeded) return false;
    final_ = true;
    status_ = s;
    return true;
  }
  void Cancel() {
    if (final_) return;
    py::gil_scoped_release nogil;
    client_->Cancel(handle_);
  }

 private:
  std::shared_ptr<Client> client_;
  Handle handle_;
  py::object result_;
  bool final_ = false;
  Status status_;
};

// Waits with the GIL released and raises on an error.
void WaitOrRaise(Client& c, const Handle& h, std::optional<int64_t> timeout_ms) {
  Status s;
  {
    py::gil_scoped_release nogil;
    s = c.Wait(h, DeadlineOf(timeout_ms));
    // A timed-out call still owns its output buffer; cancel it so the array may be freed.
    if (s.code() == StatusCode::kDeadlineExceeded) c.Cancel(h);
  }
  Check(s);
}

void CheckSparse(const Table& t) {
  if (t.spec.kind != TableKind::kSparse) {
    Raise(Status::InvalidArgument("table '" + t.spec.name + "' is not a sparse table"));
  }
}
void CheckDense(const Table& t) {
  if (t.spec.kind != TableKind::kDense) {
    Raise(Status::InvalidArgument("table '" + t.spec.name + "' is not a dense table"));
  }
}

// The table argument of a data call: a Table, or a name looked up on the servers.
Table TableOf(Client& c, const py::handle& table) {
  if (py::isinstance<Table>(table)) return table.cast<Table>();
  if (py::isinstance<py::str>(table)) {
    const std::string name = table.cast<std::string>();
    Result<Table> t = [&] {
      py::gil_scoped_release nogil;
      return c.GetTable(name);
    }();
    return Take(std::move(t));
  }
  throw py::type_error("table: expected a tessera.Table or a table name");
}

// Issues a sparse pull into `out` (checked or allocated); returns the handle and the array.
std::pair<Handle, py::array> StartPull(Client& c, const Table& t, const Keys& keys,
                                       const std::optional<py::object>& out) {
  CheckSparse(t);
  py::array a = OutRows(out, keys, t.spec.dim);
  float* dst = MutableFloats(a);
  Handle h;
  {
    py::gil_scoped_release nogil;
    h = c.Pull(t, keys.span, dst);
  }
  return {std::move(h), std::move(a)};
}

Handle StartPush(Client& c, const Table& t, const Keys& keys, const py::array& grads) {
  CheckSparse(t);
  CheckRowsShape(grads, keys.shape, keys.span.size(), t.spec.dim, "grads");
  py::gil_scoped_release nogil;  // the client copies keys and grads before Push returns
  return c.Push(t, keys.span, Floats(grads));
}

std::pair<uint64_t, uint64_t> DenseRange(const TableSpec& spec, uint64_t offset,
                                         std::optional<uint64_t> length) {
  if (offset > spec.length) {
    Raise(Status::InvalidArgument("table '" + spec.name + "': offset " + std::to_string(offset) +
                                  " is past its length " + std::to_string(spec.length)));
  }
  return {offset, length ? *length : spec.length - offset};
}

py::object StatValue(const std::string& text) {
  int64_t i = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), i);
  if (ec == std::errc() && p == text.data() + text.size()) return py::int_(i);
  double d = 0;
  auto [q, ec2] = std::from_chars(text.data(), text.data() + text.size(), d);
  if (ec2 == std::errc() && q == text.data() + text.size()) return py::float_(d);
  return py::str(text);
}

// ------------------------------------------------------------------ bindings

void BindSpecs(py::module_& m) {
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
      .def("difference", &DescribeSpecDifference,
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

void BindClient(py::module_& m) {
  py::class_<Future>(m, "Future",
                     "An asynchronous call. wait() returns the output array of a pull (else "
                     "None) or raises; dropping an unfinished Future cancels the call.")
      .def("wait", &Future::Wait, py::arg("timeout_ms") = py::none())
      .def("done", &Future::Done)
      .def("cancel", &Future::Cancel);

  const ClientOptions co;
  py::class_<PyClient>(m, "Client",
                       "A connection to a Tessera cluster (ps/client/client.h). Thread-safe: "
                       "several Python threads may call it at once; every wait releases the GIL.")
      .def(py::init([co](py::object cluster, uint32_t worker_id, uint32_t num_workers,
                         int32_t staleness, int64_t request_timeout_ms, int64_t retry_for_ms,
                         int64_t connect_timeout_ms, std::string curve_server_key,
                         std::string admin_root) {
             ClientOptions o;
             // "etcd://HOST:PORT/PREFIX": the cluster map in etcd names the servers.
             std::optional<CoordinatorUrl> coordinator;
             if (py::isinstance<py::str>(cluster) &&
                 cluster.cast<std::string>().rfind("etcd://", 0) == 0) {
               coordinator = Take(CoordinatorUrl::Parse(cluster.cast<std::string>()));
             } else {
               o.servers = ParseEndpoints(cluster);
             }
             o.worker_id = worker_id;
             o.consistency.num_workers = num_workers;
             o.consistency.staleness = staleness;
             o.request_timeout_ms = request_timeout_ms;
             o.retry_for_ms = retry_for_ms;
             o.connect_timeout_ms = connect_timeout_ms;
             o.curve_server_key = std::move(curve_server_key);
             o.admin_root = std::move(admin_root);
             Result<std::unique_ptr<Client>> c = [&]() -> Result<std::unique_ptr<Client>> {
               py::gil_scoped_release nogil;
               if (!coordinator) return Client::Create(o);
               TESSERA_ASSIGN_OR_RETURN(auto source, EtcdClusterMapSource::Create(*coordinator));
               return Client::Create(o, std::move(source));
             }();
             return std::make_unique<PyClient>(std::shared_ptr<Client>(Take(std::move(c))));
           }),
           py::arg("cluster"), py::kw_only(), py::arg("worker_id") = co.worker_id,
           py::arg("num_workers") = co.consistency.num_workers,
           py::arg("staleness") = co.consistency.staleness,
           py::arg("request_timeout_ms") = co.request_timeout_ms,
           py::arg("retry_for_ms") = co.retry_for_ms,
           py::arg("connect_timeout_ms") = co.connect_timeout_ms,
           py::arg("curve_server_key") = co.curve_server_key, py::arg("admin_root") = co.admin_root)
      .def("close", &PyClient::Close,
           "Drops the connection (after calls still waiting in other threads end).")
      .def_property_readonly("closed", &PyClient::closed)
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PyClient& c, py::args) { c.Close(); })
      .def_property_readonly("num_servers",
                             [](const PyClient& c) { return c.Get()->num_servers(); })
      .def_property_readonly("servers",
                             [](const PyClient& c) { return c.Get()->options().servers; })
      .def_property_readonly("worker_id",
                             [](const PyClient& c) { return c.Get()->options().worker_id; })
      .def_property_readonly(
          "cluster_map_version", [](const PyClient& c) { return c.Get()->cluster_map_version(); },
          "The cluster map version calls are routed by (0: a static cluster).")
      .def_property_readonly(
          "stale_map_retries", [](const PyClient& c) { return c.Get()->stale_map_retries(); },
          "Requests sent again after a server refused them as routed by an older map.")

      // Tables.
      .def(
          "create_table",
          [](PyClient& self, const TableSpec& spec, std::optional<int64_t> timeout_ms) {
            auto c = self.Get();
            Result<Table> t = [&] {
              py::gil_scoped_release nogil;
              return c->CreateTable(spec, DeadlineOf(timeout_ms));
            }();
            return Take(std::move(t));
          },
          py::arg("spec"), py::arg("timeout_ms") = py::none(),
          "Creates the table on every server (same spec again: OK; another spec: "
          "AlreadyExistsError naming the differences).")
      .def(
          "get_table",
          [](PyClient& self, const std::string& name, std::optional<int64_t> timeout_ms) {
            auto c = self.Get();
            Result<Table> t = [&] {
              py::gil_scoped_release nogil;
              return c->GetTable(name, DeadlineOf(timeout_ms));
            }();
            return Take(std::move(t));
          },
          py::arg("name"), py::arg("timeout_ms") = py::none(),
          "An existing table by name (NotFoundError if there is none).")

      // Sparse data.
      .def(
          "pull",
          [](PyClient& self, py::handle table, py::handle keys, std::optional<py::object> out,
             std::optional<int64_t> timeout_ms) {
            auto c = self.Get();
            const Table t = TableOf(*c, table);
            const Keys k = AsKeys(keys);
            auto [h, a] = StartPull(*c, t, k, out);
            WaitOrRaise(*c, h, timeout_ms);
            return a;
          },
          py::arg("table"), py::arg("keys"), py::arg("out") = py::none(),
          py::arg("timeout_ms") = py::none(),
          "Rows of `keys` (shape keys.shape + (dim,)); with out=, written into that float32 "
          "C-contiguous array in place and returned.")
      .def(
          "pull_async",
          [](PyClient& self, py::handle table, py::handle keys, std::optional<py::object> out) {
            auto c = self.Get();
            const Table t = TableOf(*c, table);
            const Keys k = AsKeys(keys);
            auto [h, a] = StartPull(*c, t, k, out);
            return std::make_unique<Future>(c, h, a);
          },
          py::arg("table"), py::arg("keys"), py::arg("out") = py::none(),
          "As pull, but returns a Future at once; Future.wait() returns the array. The Future "
          "keeps the array alive; do not read or write it before wait() returns.")
      .def(
          "push",
          [](PyClient& self, py::handle table, py::handle keys, py::handle grads,
             std::optional<int64_t> timeout_ms) {
            auto c = self.Get();
            const Table t = TableOf(*c, table);
            const Keys k = AsKeys(keys);
            const py::array g = AsGrads(grads, "grads");
            WaitOrRaise(*c, StartPush(*c, t, k, g), timeout_ms);
          },
          py::arg("table"), py::arg("keys"), py::arg("grads"), py::arg("timeout_ms") = py::none(),
          "Applies the table's optimizer to the gradients of `keys` (duplicate keys' gradients "
          "are summed).")
      .def(
          "push_async",
          [](PyClient& self, py::handle table, py::handle keys, py::handle grads) {
            auto c = self.Get();
            const Table t = TableOf(*c, table);
            const Keys k = AsKeys(keys);
            const py::array g = AsGrads(grads, "grads");
            // Keys and gradients are copied before Push returns: the Future holds no arrays.
            return std::make_unique<Future>(c, StartPush(*c, t, k, g), py::none());
          },
          py::arg("table"), py::arg("keys"), py::arg("grads"),
          "As push, but returns a Future at once. The arrays may be reused immediately.")
      .def(
          "push_pull",
          [](PyClient& self, py::handle table, py::handle keys, py::handle grads,
             std::optional<py::object> out, std::optional<int64_t> timeout_ms) {
            auto c = self.Get();
            const Table t = TableOf(*c, table);
            CheckSparse(t);
            const Keys k = AsKeys(keys);
            const py::array g = AsGrads(grads, "grads");
            CheckRowsShape(g, k.shape, k.span.size(), t.spec.dim, "grads");
            py::array a = OutRows(out, k, t.spec.dim);
            float* dst = MutableFloats(a);
            Handle h;
            {
              py::gil_scoped_release nogil;
              h = c->PushPull(t, k.span, Floats(g), dst);
            }
            WaitOrRaise(*c, h, timeout_ms);
            return a;
          },
          py::arg("table"), py::arg("keys"), py::arg("grads"), py::arg("out") = py::none(),
          py::arg("timeout_ms") = py::none(),
          "Push, then the rows after the push, in one round trip.")

      // Dense data.
      .def(
          "dense_pull",
          [](PyClient& self, py::handle table, uint64_t offset, std::optional<uint64_t> length,
             std::optional<py::object> out, std::optional<int64_t> timeout_ms) {
            auto c = self.Get();
            const Table t = TableOf(*c, table);
            CheckDense(t);
            auto [off, len] = DenseRange(t.spec, offset, length);
            py::array a = OutDense(out, len);
            float* dst = MutableFloats(a);
            Handle h;
            {
              py::gil_scoped_release nogil;
              h = c->DensePull(t, off, len, dst);
            }
            WaitOrRaise(*c, h, timeout_ms);
            return a;
          },
          py::arg("table"), py::arg("offset") = 0, py::arg("length") = py::none(),
          py::arg("out") = py::none(), py::arg("timeout_ms") = py::none(),
          "Elements [offset, offset + length) (default: to the end) as a 1-D float32 array.")
      .def(
          "dense_push",
          [](PyClient& self, py::handle table, py::handle grads, uint64_t offset,
             std::optional<int64_t> timeout_ms) {
            auto c = self.Get();
            const Table t = TableOf(*c, table);
            CheckDense(t);
            const py::array g = AsGrads(grads, "grads");
            Handle h;
            {
              py::gil_scoped_release nogil;
              h = c->DensePush(t, offset, Floats(g));
            }
            WaitOrRaise(*c, h, timeout_ms);
          },
          py::arg("table"), py::arg("grads"), py::arg("offset") = 0,
          py::arg("timeout_ms") = py::none(),
          "Gradients of elements [offset, offset + grads.size) (any shape, flattened).")

      // Clocks, barriers, metadata, stats.
      .def(
          "clock",
          [](PyClient& self, std::optional<int64_t> timeout_ms) {
            auto c = self.Get();
            WaitOrRaise(*c, c->Clock(), timeout_ms);
            return c->clock();
          },
          py::arg("timeout_ms") = py::none(),
          "Ends this worker's step (advances its clock on every server); returns the new clock.")
      .def_property_readonly(
          "current_clock", [](const PyClient& c) { return c.Get()->clock(); },
          "This worker's clock (clock() calls, or the value of set_clock).")
      .def(
          "set_clock",
          [](PyClient& self, int64_t clock, std::optional<int64_t> timeout_ms) {
            auto c = self.Get();
            WaitOrRaise(*c, c->SetClock(clock), timeout_ms);
          },
          py::arg("clock"), py::arg("timeout_ms") = py::none())
      .def(
          "set_learning_rate_scale",
          [](PyClient& self, float scale) {
            Status s = self.Get()->SetLearningRateScale(scale);
            if (!s.ok()) Raise(s);
          },
          py::arg("scale"),
          "Pushes sent from now on have each table's learning rate multiplied by `scale` on the "
          "servers (a warm-up or decay factor; FTRL tables ignore it); in [0, 1000].")
      .def_property_readonly(
          "learning_rate_scale", [](const PyClient& c) { return c.Get()->learning_rate_scale(); })
      .def(
          "barrier",
          [](PyClient& self, const std::string& name, std::optional<int64_t> timeout_ms) {
            auto c = self.Get();
            Status s;
            {
              py::gil_scoped_release nogil;
              s = c->Barrier(name, DeadlineOf(timeout_ms));
            }
            Check(s);
          },
          py::arg("name"), py::arg("timeout_ms") = py::none(),
          "Blocks (GIL released) until num_workers workers called barrier(name).")
      .def(
          "put_meta",
          [](PyClient& self, const std::string& name, py::bytes value,
             std::optional<int64_t> timeout_ms) {
            auto c = self.Get();
            std::string v = value;
            Status s;
            {
              py::gil_scoped_release nogil;
              s = c->PutMeta(name, v, DeadlineOf(timeout_ms));
            }
            Check(s);
          },
          py::arg("name"), py::arg("value"), py::arg("timeout_ms") = py::none(),
          "Stores a small durable record on server 0 (bytes or str).")
      .def(
          "get_meta",
          [](PyClient& self, const std::string& name,
             std::optional<int64_t> timeout_ms) -> py::object {
            auto c = self.Get();
            Result<std::optional<std::string>> r = [&] {
              py::gil_scoped_release nogil;
              return c->GetMeta(name, DeadlineOf(timeout_ms));
            }();
            std::optional<std::string> v = Take(std::move(r));
            if (!v) return py::none();
            return py::bytes(*v);
          },
          py::arg("name"), py::arg("timeout_ms") = py::none(),
          "The record as bytes, or None when there is none.")
      .def(
          "server_stats",
          [](PyClient& self, uint32_t rank, std::optional<int64_t> timeout_ms) {
            auto c = self.Get();
            Result<std::string> r = [&] {
              py::gil_scoped_release nogil;
              return c->ServerStats(rank, DeadlineOf(timeout_ms));
            }();
            const std::string text = Take(std::move(r));
            py::dict d;
            std::istringstream in(text);
            std::string line;
            while (std::getline(in, line)) {
              const size_t sp = line.find(' ');
              if (sp == std::string::npos) continue;
              d[py::str(line.substr(0, sp))] = StatValue(line.substr(sp + 1));
            }
            return d;
          },
          py::arg("rank") = 0, py::arg("timeout_ms") = py::none(),
          "Server `rank`'s statistics as a dict (numbers where they parse as numbers).")

      // Admin.
      .def(
          "checkpoint",
          [](PyClient& self, const std::string& dir, std::optional<int64_t> timeout_ms) {
            auto c = self.Get();
            Result<int64_t> r = [&] {
              py::gil_scoped_release nogil;
              return c->Checkpoint(dir, DeadlineOf(timeout_ms));
            }();
            return Take(std::move(r));
          },
          py::arg("dir"), py::arg("timeout_ms") = py::none(),
          "Consistent checkpoint of the cluster into `dir` (relative to admin_root); returns "
          "the cut clock.")
      .def(
          "restore",
          [](PyClient& self, const std::string& dir, std::optional<int64_t> timeout_ms) {
            auto c = self.Get();
            Status s;
            {
              py::gil_scoped_release nogil;
              s = c->Restore(dir, DeadlineOf(timeout_ms));
            }
            Check(s);
          },
          py::arg("dir"), py::arg("timeout_ms") = py::none())
      .def(
          "export",
          [](PyClient& self, const std::string& root, bool delta,
             std::optional<int64_t> timeout_ms) {
            auto c = self.Get();
            Result<uint64_t> r = [&] {
              py::gil_scoped_release nogil;
              return c->Export(root, delta, DeadlineOf(timeout_ms));
            }();
            return Take(std::move(r));
          },
          py::arg("root"), py::arg("delta") = false, py::arg("timeout_ms") = py::none(),
          "Serving export (values only) under `root` (relative to admin_root); returns its "
          "version. Read it with ExportReader(admin_root/root).");
}

void BindExportReader(py::module_& m) {
  m.def(
      "latest_export_version",
      [](const std::string& root) { return Take(LatestExportVersion(root)); }, py::arg("root"),
      "The latest complete export version under `root` (0 when there is none).");

  auto open = [](const std::string& root, uint64_t version) {
    Result<std::unique_ptr<ExportReader>> r = [&] {
      py::gil_scoped_release nogil;
      return ExportReader::Open(root, version);
    }();
    return std::shared_ptr<ExportReader>(Take(std::move(r)));
  };
  auto spec_of = [](const ExportReader& r, const std::string& table) {
    return Take(r.spec(table));
  };
  py::class_<ExportReader, std::shared_ptr<ExportReader>>(
      m, "ExportReader",
      "A serving export loaded into memory (no server needed). Immutable: lookups from any "
      "number of threads.")
      .def(py::init(open), py::arg("root"), py::arg("version") = 0,
           "Opens version `version` under `root` (0: the latest).")
      .def_static("open", open, py::arg("root"), py::arg("version") = 0)
      .def_property_readonly("version", &ExportReader::version)
      .def("tables", &ExportReader::tables)
      .def("spec", spec_of, py::arg("table"))
      .def(
          "lookup",
          [spec_of](const ExportReader& r, const std::string& table, py::handle keys,
                    std::optional<py::object> out) {
            const TableSpec spec = spec_of(r, table);
            if (spec.kind != TableKind::kSparse) {
              Raise(Status::InvalidArgument("table '" + table + "' is not a sparse table"));
            }
            const Keys k = AsKeys(keys);
            py::array a = OutRows(out, k, spec.dim);
            float* dst = MutableFloats(a);
            Status s;
            {
              py::gil_scoped_release nogil;
              s = r.Lookup(table, k.span, dst);
            }
            Check(s);
            return a;
          },
          py::arg("table"), py::arg("keys"), py::arg("out") = py::none(),
          "Rows of `keys` (initializer values for keys without a row).")
      .def(
          "dense_read",
          [spec_of](const ExportReader& r, const std::string& table, uint64_t offset,
                    std::optional<uint64_t> length, std::optional<py::object> out) {
            const TableSpec spec = spec_of(r, table);
            auto [off, len] = DenseRange(spec, offset, length);
            py::array a = OutDense(out, len);
            float* dst = MutableFloats(a);
            Status s;
            {
              py::gil_scoped_release nogil;
              s = r.DenseRead(table, off, len, dst);
            }
            Check(s);
            return a;
          },
          py::arg("table"), py::arg("offset") = 0, py::arg("length") = py::none(),
          py::arg("out") = py::none())
      .def(
          "row_count",
          [](const ExportReader& r, const std::string& table) { return Take(r.RowCount(table)); },
          py::arg("table"));
}

// tessera.Error (a RuntimeError) and one subclass per code; some also derive from the
// builtin a Python caller would catch (ValueError, LookupError, TimeoutError, ...).
void BindErrors(py::module_& m) {
  PyObject* base = PyErr_NewExceptionWithDoc("tessera.Error",
                                             "A Tessera call failed; `code` names the Status code.",
                                             PyExc_RuntimeError, nullptr);
  m.attr("Error") = py::handle(base);
  g_error_classes[0] = base;
  struct Def {
    StatusCode code;
    const char* name;
    PyObject* builtin;
  };
  const Def defs[] = {
      {StatusCode::kInvalidArgument, "InvalidArgumentError", PyExc_ValueError},
      {StatusCode::kNotFound, "NotFoundError", PyExc_LookupError},
      {StatusCode::kAlreadyExists, "AlreadyExistsError", nullptr},
      {StatusCode::kUnavailable, "UnavailableError", PyExc_ConnectionError},
      {StatusCode::kDeadlineExceeded, "DeadlineExceededError", PyExc_TimeoutError},
      {StatusCode::kCorruption, "CorruptionError", nullptr},
      {StatusCode::kIOError, "IOError", PyExc_OSError},
      {StatusCode::kResourceExhausted, "ResourceExhaustedError", nullptr},
      {StatusCode::kInternal, "InternalError", nullptr},
      {StatusCode::kFailedPrecondition, "FailedPreconditionError", nullptr},
      {StatusCode::kCancelled, "CancelledError", nullptr},
  };
  for (const Def& d : defs) {
    const std::string qualified = std::string("tessera.") + d.name;
    py::object bases = d.builtin != nullptr
                           ? py::object(py::make_tuple(py::handle(base), py::handle(d.builtin)))
                           : py::reinterpret_borrow<py::object>(base);
    PyObject* cls = PyErr_NewException(qualified.c_str(), bases.ptr(), nullptr);
    if (cls == nullptr) throw py::error_already_set();
    m.attr(d.name) = py::handle(cls);
    g_error_classes[static_cast<size_t>(d.code)] = cls;
  }
}

}  // namespace
}  // namespace tessera::python

PYBIND11_MODULE(tessera, m) {
  using namespace tessera::python;
  m.doc() =
      "Tessera parameter-server client: sparse and dense tables, NumPy/PyTorch arrays in and "
      "out without copies, export reader. See python/README.md.";
  BindErrors(m);
  BindSpecs(m);
  BindClient(m);
  BindExportReader(m);
}
