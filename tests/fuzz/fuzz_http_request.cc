// libFuzzer target: the metrics endpoint's request parser (ps/metrics/http_request_internal.h
// ParseRequestHead) on the bytes a client sent.
//
// Beyond "no crash, no sanitizer report" it checks what the endpoint relies on: a complete head
// has an upper-case method and a path that starts with '/' and holds neither a query nor a
// control byte; a bad one says why; and no prefix of a head that is complete, or may still
// become so, is bad (a client that sends its request in pieces is served).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "ps/metrics/http_request_internal.h"

namespace {

void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz_http_request: invariant failed: %s\n", what);
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using tessera::internal::HttpRequestHead;
  using State = HttpRequestHead::State;
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const HttpRequestHead h = tessera::internal::ParseRequestHead(in);
  if (h.state == State::kBad) {
    Check(!h.error.empty(), "a bad head without a reason");
    return 0;
  }
  if (h.state == State::kComplete) {
    Check(!h.method.empty(), "an empty method");
    for (char c : h.method) Check(c >= 'A' && c <= 'Z', "a method byte that is not A-Z");
    Check(!h.path.empty() && h.path[0] == '/', "a path without its leading '/'");
    for (char c : h.path) Check(c > 0x20 && c < 0x7f && c != '?', "a path byte out of range");
  }
  // Quadratic: only for inputs of the size of a request line and a few headers.
  if (size <= 1024) {
    for (size_t n = 0; n < size; ++n) {
      Check(tessera::internal::ParseRequestHead(in.substr(0, n)).state != State::kBad,
            "a prefix of a valid or incomplete head is bad");
    }
  }
  return 0;
}
