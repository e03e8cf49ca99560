// The head of an HTTP/1.x request as the metrics endpoint reads it off a socket: the request
// line checked byte by byte, the header lines skipped (the endpoint answers by path alone).
#pragma once

#include <string>
#include <string_view>

namespace tessera::internal {

/// What ParseRequestHead made of the bytes received so far.
struct HttpRequestHead {
  enum class State {
    kIncomplete,  // no blank line yet, and nothing wrong so far: read more
    kComplete,    // method and path below are set
    kBad,         // not an HTTP/1.x request; `error` says why
  };
  State state = State::kIncomplete;
  std::string method;  // "GET", "HEAD", ... (upper-case letters only)
  std::string path;    // the target without its query string, e.g. "/metrics"
  std::string error;
};

/// Parses `in`, the first bytes a client sent. The request line must be
/// `METHOD SP /target SP HTTP/1.0|HTTP/1.1` (CRLF or LF); the head ends at the first empty
/// line. A request line that is already wrong is kBad as soon as it is complete, or as soon as
/// its method or target cannot become valid, so that a client speaking another protocol is
/// answered at once. The caller bounds the size of `in`. Thread-compatible (a pure function).
HttpRequestHead ParseRequestHead(std::string_view in);

}  // namespace tessera::internal
