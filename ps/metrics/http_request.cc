#include <cstddef>

#include "ps/metrics/http_request_internal.h"

namespace tessera::internal {
namespace {

constexpr size_t kMaxMethod = 16;

bool IsTargetByte(char c) { return c > 0x20 && c < 0x7f; }

HttpRequestHead Bad(std::string why) {
  HttpRequestHead h;
  h.state = HttpRequestHead::State::kBad;
  h.error = std::move(why);
  return h;
}

}  // namespace

HttpRequestHead ParseRequestHead(std::string_view in) {
  // Method: upper-case letters up to the first space.
  size_t i = 0;
  while (i < in.size() && in[i] >= 'A' && in[i] <= 'Z' && i < kMaxMethod) ++i;
  if (i == in.size()) return {};
  if (in[i] != ' ' || i == 0) return Bad("request line does not start with a method");
  const std::string_view method = in.substr(0, i);
  // Target: printable bytes up to the next space, starting with '/'.
  const size_t target = ++i;
  if (i < in.size() && in[i] != '/') return Bad("request target does not start with '/'");
  while (i < in.size() && IsTargetByte(in[i])) ++i;
  if (i == in.size()) return {};
  if (in[i] != ' ') return Bad("request target holds a control or non-ASCII byte");
  const std::string_view path = in.substr(target, i - target);
  // Version, then the end of the line.
  const size_t line_end = in.find('\n', i + 1);
  if (line_end == std::string_view::npos) {
    // Not complete: still wrong if what came so far is no prefix of the version.
    constexpr std::string_view kVersion = "HTTP/1.";
    const std::string_view got = in.substr(i + 1, kVersion.size());
    if (kVersion.substr(0, got.size()) != got) return Bad("not an HTTP/1.x request");
    return {};
  }
  std::string_view version = in.substr(i + 1, line_end - i - 1);
  if (!version.empty() && version.back() == '\r') version.remove_suffix(1);
  if (version != "HTTP/1.1" && version != "HTTP/1.0") {
    return Bad("not an HTTP/1.0 or HTTP/1.1 request");
  }
  // Header lines, up to an empty one (CRLF or LF).
  for (size_t line = line_end + 1;;) {
    const size_t end = in.find('\n', line);
    if (end == std::string_view::npos) return {};
    if (end == line || (end == line + 1 && in[line] == '\r')) break;
    line = end + 1;
  }
  HttpRequestHead h;
  h.state = HttpRequestHead::State::kComplete;
  h.method = std::string(method);
  h.path = std::string(path.substr(0, path.find('?')));
  return h;
}

}  // namespace tessera::internal
