// The `tessera` Python module: numpy arrays (and CPU torch tensors, which numpy views without
// a copy) checked and read or written in place: keys, gradients and `out=` arrays.
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "ps/status.h"
#include "ps/table_spec.h"
#include "python/module_internal.h"

namespace tessera::python {
namespace {

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

}  // namespace

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

std::pair<uint64_t, uint64_t> DenseRange(const TableSpec& spec, uint64_t offset,
                                         std::optional<uint64_t> length) {
  if (offset > spec.length) {
    Raise(Status::InvalidArgument("table '" + spec.name + "': offset " + std::to_string(offset) +
                                  " is past its length " + std::to_string(spec.length)));
  }
  return {offset, length ? *length : spec.length - offset};
}

}  // namespace tessera::python
