// The include form of Tessera 0.1.0, deprecated since <tessera/client.h>: "ps/client/client.h"
// with PREFIX/include/tessera as the include root. It keeps compiling for the 0.1 releases.
#include "plugin.h"
#include "ps/client/client.h"
#include "ps/client/export_reader.h"

long long OldIncludeFormRequestTimeoutMs() { return tessera::ClientOptions{}.request_timeout_ms; }
