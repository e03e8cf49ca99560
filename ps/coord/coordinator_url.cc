#include "ps/coord/coordinator_url.h"

#include <charconv>
#include <cstdlib>

#include "ps/read_file_internal.h"

namespace tessera {

namespace {

bool IsSegmentChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '_' || c == '-';
}

bool IsHostChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '-';
}

Status Bad(std::string_view url, const std::string& why) {
  return Status::InvalidArgument("coordinator URL \"" + std::string(url) + "\": " + why +
                                 " (expected etcd://HOST:PORT/PREFIX)");
}

Result<uint16_t> ParsePort(std::string_view url, std::string_view text) {
  uint32_t port = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), port);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size() || port == 0 ||
      port > 65535) {
    return Bad(url, "port \"" + std::string(text) + "\" is not a number in 1..65535");
  }
  return static_cast<uint16_t>(port);
}

// The password of `user` from the file $TESSERA_ETCD_PASSWORD_FILE names.
Result<std::string> ReadPassword(std::string_view url, const std::string& user) {
  const char* path = std::getenv(kEtcdPasswordFileEnv);
  if (path == nullptr || *path == '\0') {
    return Bad(url, "etcd user " + user + " given but " + kEtcdPasswordFileEnv +
                        " does not name the password file");
  }
  internal::ReadFileOptions o;
  o.max_bytes = 4096;
  Result<std::string> text = internal::ReadRegularFile(path, o);
  if (!text.ok()) {
    return text.status().WithContext("etcd password file of user " + user + " (" +
                                     kEtcdPasswordFileEnv + ")");
  }
  std::string password = std::move(text).value();
  if (!password.empty() && password.back() == '\n') password.pop_back();
  if (!password.empty() && password.back() == '\r') password.pop_back();
  if (password.empty()) {
    return Status::InvalidArgument(std::string("etcd password file ") + path + " of user " + user +
                                   " is empty");
  }
  return password;
}

}  // namespace

Status ValidateKeySegment(std::string_view segment, std::string_view what) {
  const std::string name(what);
  if (segment.empty() || segment.size() > 128) {
    return Status::InvalidArgument(name + " must have 1..128 characters, got " +
                                   std::to_string(segment.size()));
  }
  if (segment == "." || segment == "..") {
    return Status::InvalidArgument(name + " \"" + std::string(segment) + "\" is not allowed");
  }
  for (char c : segment) {
    if (!IsSegmentChar(c)) {
      return Status::InvalidArgument(name + " \"" + std::string(segment) +
                                     "\" has a character outside [A-Za-z0-9._-]");
    }
  }
  return Status::OK();
}

Result<CoordinatorUrl> CoordinatorUrl::Parse(std::string_view url) {
  constexpr std::string_view kScheme = "etcd://";
  if (url.substr(0, kScheme.size()) != kScheme) return Bad(url, "the scheme must be etcd://");
  std::string_view rest = url.substr(kScheme.size());
  const size_t slash = rest.find('/');
  if (slash == std::string_view::npos) return Bad(url, "no /PREFIX after HOST:PORT");
  std::string_view authority = rest.substr(0, slash);
  CoordinatorUrl out;
  if (const size_t at = authority.find('@'); at != std::string_view::npos) {
    out.user = std::string(authority.substr(0, at));
    Status s = ValidateKeySegment(out.user, "USER");
    if (!s.ok()) return Bad(url, s.message());
    authority = authority.substr(at + 1);
  }
  const size_t colon = authority.rfind(':');
  if (colon == std::string_view::npos) return Bad(url, "no :PORT after the host");
  out.host = std::string(authority.substr(0, colon));
  if (out.host.empty()) return Bad(url, "empty host");
  for (char c : out.host) {
    if (!IsHostChar(c))
      return Bad(url, "host \"" + out.host + "\" has a character outside [A-Za-z0-9.-]");
  }
  TESSERA_ASSIGN_OR_RETURN(out.port, ParsePort(url, authority.substr(colon + 1)));
  std::string_view path = rest.substr(slash + 1);
  if (path.empty()) return Bad(url, "empty PREFIX");
  while (!path.empty()) {
    const size_t next = path.find('/');
    const std::string_view segment = path.substr(0, next);
    Status s = ValidateKeySegment(segment, "PREFIX segment");
    if (!s.ok()) return Bad(url, s.message());
    out.prefix += "/" + std::string(segment);
    if (next == std::string_view::npos) break;
    path = path.substr(next + 1);
    if (path.empty()) return Bad(url, "PREFIX ends with '/'");
  }
  if (!out.user.empty()) {
    TESSERA_ASSIGN_OR_RETURN(out.password, ReadPassword(url, out.user));
  }
  return out;
}

std::string CoordinatorUrl::ToString() const {
  return "etcd://" + (user.empty() ? "" : user + "@") + host + ":" + std::to_string(port) + prefix;
}

EtcdOptions CoordinatorUrl::etcd_options(int timeout_ms) const {
  EtcdOptions o;
  o.host = host;
  o.port = port;
  o.timeout_ms = timeout_ms;
  o.user = user;
  o.password = password;
  return o;
}

}  // namespace tessera
