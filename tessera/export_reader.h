// <tessera/export_reader.h>: ExportReader, a serving export read from disk without a server.
// Include root: PREFIX/include once installed (the target tessera::client or
// `pkg-config --cflags tessera` puts it on the path), the repository root in the tree.
#pragma once

#include "ps/client/export_reader.h"  // IWYU pragma: export
