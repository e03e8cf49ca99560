// Internal to the `tessera` Python module (python/*.cc): the Register function of each surface
// (module.cc calls them) and the helpers the surfaces share: a non-OK Status raised as a
// tessera.Error, numpy arrays checked and read or written in place, the Client wrapper.
// Everything here runs with the GIL held unless it says otherwise.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "ps/client/client.h"
#include "ps/status.h"
#include "ps/table_spec.h"

namespace py = pybind11;

namespace tessera::python {

// ------------------------------------------------------------------ surfaces

// tessera.Error and its subclasses (errors.cc). First: Raise needs the classes.
void RegisterErrors(py::module_& m);
// Enums, OptimizerSpec, InitializerSpec, AdmissionSpec, EvictionSpec, TableSpec, Table
// (specs.cc).
void RegisterSpecs(py::module_& m);
// Future and Client (client.cc; clocks, metadata and admin calls in client_admin.cc).
void RegisterClient(py::module_& m);
// latest_export_version and ExportReader (export_reader.cc).
void RegisterExportReader(py::module_& m);
// unique_keys, bag_sum, bag_sum_backward: tessera.torch's CPU kernels (bags.cc).
void RegisterBags(py::module_& m);
// dot_interaction and its backward: tessera.torch's CPU kernel of DLRM's pairwise dots
// (interaction.cc).
void RegisterInteraction(py::module_& m);

// ------------------------------------------------------------------ errors (errors.cc)

// Raises the exception of a non-OK status (the caller holds the GIL).
[[noreturn]] void Raise(const Status& s);

void Check(const Status& s);

template <typename T>
T Take(Result<T> r) {
  if (!r.ok()) Raise(r.status());
  return std::move(r).value();
}

Deadline DeadlineOf(std::optional<int64_t> timeout_ms);

// ------------------------------------------------------------------ arrays (arrays.cc)

// Keys: borrowed when `obj` is already a C-contiguous uint64 array, else converted once from
// non-negative integers.
struct Keys {
  py::array array;  // keeps the memory alive while a call reads it
  std::span<const uint64_t> span;
  std::vector<py::ssize_t> shape;
};

Keys AsKeys(py::handle obj);

// Whether `a`'s shape fits `rows` rows of `dim` floats: keys.shape + (dim,), (rows, dim) or
// (rows * dim,). Throws ValueError naming the expected shapes otherwise.
void CheckRowsShape(const py::array& a, const std::vector<py::ssize_t>& key_shape, size_t rows,
                    size_t dim, const std::string& what);

// Gradients: borrowed when already a C-contiguous float32 array, else converted once from a
// floating-point array. Integer or boolean gradients are a TypeError (most likely a bug).
py::array AsGrads(py::handle obj, const char* what);

// `out` for `rows` x `dim` floats: the caller's array checked, or a new (key shape, dim) one.
py::array OutRows(const std::optional<py::object>& out, const Keys& keys, size_t dim);
// `out` for `length` floats (any shape): the caller's array checked, or a new 1-D one.
py::array OutDense(const std::optional<py::object>& out, uint64_t length);

float* MutableFloats(py::array& a);
std::span<const float> Floats(const py::array& a);

// The range [offset, offset + length) of a dense table (length: to the end when not given);
// InvalidArgumentError when offset is past the table's length.
std::pair<uint64_t, uint64_t> DenseRange(const TableSpec& spec, uint64_t offset,
                                         std::optional<uint64_t> length);

// ------------------------------------------------------------------ kernels' arrays

// Below this many values the GIL stays held: releasing and re-taking it costs more than the
// loop when another Python thread (a data loader) is running, as re-taking it may wait out
// that thread's switch interval (5 ms by default).
inline constexpr int64_t kReleaseGilAbove = 1 << 18;

// `obj` as a C-contiguous array of T read (or written) in place: TypeError naming `what` and
// `dtype` for anything else (no conversion), ValueError when `writable` and it is read-only.
template <typename T>
py::array_t<T, py::array::c_style> Strict(const py::handle& obj, const char* what,
                                          const char* dtype, bool writable) {
  if (!py::isinstance<py::array_t<T, py::array::c_style>>(obj)) {
    throw py::type_error(std::string(what) + ": expected a C-contiguous " + dtype +
                         " numpy array (read in place, not converted), got " +
                         py::str(py::type::handle_of(obj)).cast<std::string>() +
                         (py::isinstance<py::array>(obj)
                              ? " of dtype " + py::str(obj.attr("dtype")).cast<std::string>()
                              : std::string()));
  }
  auto a = py::reinterpret_borrow<py::array_t<T, py::array::c_style>>(obj);
  if (writable && !a.writeable()) throw py::value_error(std::string(what) + ": is read-only");
  return a;
}

// Runs `f` with the GIL released when the batch is large enough to be worth it.
template <typename F>
auto MaybeWithoutGil(int64_t work, F&& f) {
  if (work <= kReleaseGilAbove) return f();
  py::gil_scoped_release nogil;
  return f();
}

// ------------------------------------------------------------------ client

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

// Waits with the GIL released and raises on an error.
void WaitOrRaise(Client& c, const Handle& h, std::optional<int64_t> timeout_ms);

// The Client's calls of clocks, barriers, metadata and stats, and its admin calls
// (client_admin.cc); RegisterClient adds them after its data calls.
void RegisterClientClocks(py::class_<PyClient>& cls);
void RegisterClientMeta(py::class_<PyClient>& cls);
void RegisterClientAdmin(py::class_<PyClient>& cls);

}  // namespace tessera::python
