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
//
// One file per surface, each with a Register function (module_internal.h): errors.cc,
// specs.cc, client.cc with client_admin.cc, export_reader.cc, bags.cc and
// interaction.cc (tessera.torch's CPU kernels); arrays.cc holds the array checks.
#include <pybind11/pybind11.h>

#include "python/module_internal.h"

// The compiled core of the `tessera` package (python/tessera/__init__.py re-exports it).
PYBIND11_MODULE(_tessera, m) {
  using namespace tessera::python;
  m.doc() =
      "Tessera parameter-server client: sparse and dense tables, NumPy/PyTorch arrays in and "
      "out without copies, export reader. See python/README.md.";
  RegisterErrors(m);
  RegisterSpecs(m);
  RegisterClient(m);
  RegisterExportReader(m);
  RegisterBags(m);
  RegisterInteraction(m);
}
