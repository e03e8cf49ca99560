// <tessera/client.h>: the client library: Client, ClientOptions, Table, Handle (Status and the
// table specs come with it).
// Include root: PREFIX/include once installed (the target tessera::client or
// `pkg-config --cflags tessera` puts it on the path), the repository root in the tree.
#pragma once

#include "ps/client/client.h"  // IWYU pragma: export
