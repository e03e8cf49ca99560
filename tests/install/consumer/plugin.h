#pragma once
#include <string>

// Creates a table on the cluster at `endpoint`, pushes and pulls, checks the values. Returns
// 0 and prints "consumer: OK" when they are right; otherwise prints why and returns 1.
int RunAgainst(const std::string& endpoint);

// The client's default request timeout, from a file that includes the headers the deprecated
// way ("ps/client/client.h", include/tessera as the root): that form still compiles.
long long OldIncludeFormRequestTimeoutMs();
