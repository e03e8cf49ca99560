// <tessera/status.h>: Status, Result<T>, TESSERA_RETURN_IF_ERROR and TESSERA_ASSIGN_OR_RETURN.
// Include root: PREFIX/include once installed (the target tessera::client or
// `pkg-config --cflags tessera` puts it on the path), the repository root in the tree.
#pragma once

#include "ps/status.h"  // IWYU pragma: export
