// The `tessera` Python module: tessera.Error and one subclass per StatusCode, and a non-OK
// Status raised as one of them.
#include <array>
#include <cstdint>
#include <optional>
#include <string>

#include "ps/client/client.h"
#include "ps/status.h"
#include "python/module_internal.h"

namespace tessera::python {
namespace {

constexpr size_t kNumCodes = static_cast<size_t>(StatusCode::kAborted) + 1;

// The exception class of each StatusCode. Owned by the module for the life of the
// interpreter: the references are leaked on purpose, since a static py::object would be
// released after the interpreter is gone.
std::array<PyObject*, kNumCodes> g_error_classes{};

}  // namespace

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

Deadline DeadlineOf(std::optional<int64_t> timeout_ms) {
  return timeout_ms ? DeadlineAfterMs(*timeout_ms) : NoDeadline();
}

// tessera.Error (a RuntimeError) and one subclass per code; some also derive from the
// builtin a Python caller would catch (ValueError, LookupError, TimeoutError, ...).
void RegisterErrors(py::module_& m) {
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
      {StatusCode::kPermissionDenied, "PermissionDeniedError", PyExc_PermissionError},
      {StatusCode::kAborted, "AbortedError", nullptr},
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

}  // namespace tessera::python
