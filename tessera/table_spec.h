// <tessera/table_spec.h>: TableSpec, OptimizerSpec, InitializerSpec and the limits of a table.
// Include root: PREFIX/include once installed (the target tessera::client or
// `pkg-config --cflags tessera` puts it on the path), the repository root in the tree.
#pragma once

#include "ps/table_spec.h"  // IWYU pragma: export
