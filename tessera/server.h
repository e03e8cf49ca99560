// <tessera/server.h>: Server, a shard embedded in a process (needs tessera::server).
// Include root: PREFIX/include once installed (the target tessera::client or
// `pkg-config --cflags tessera` puts it on the path), the repository root in the tree.
#pragma once

#include "ps/server/server.h"  // IWYU pragma: export
