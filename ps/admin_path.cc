#include "ps/admin_path.h"

#include <filesystem>
#include <system_error>

#include "ps/limits.h"

namespace tessera {

namespace fs = std::filesystem;

Status ValidateAdminName(std::string_view name) {
  if (name.empty()) return Status::InvalidArgument("the directory name is empty");
  if (name.size() > kMaxRequestNameBytes) {
    return Status::InvalidArgument("the directory name has " + std::to_string(name.size()) +
                                   " bytes, more than " + std::to_string(kMaxRequestNameBytes));
  }
  // Quote at most the start of a long name.
  const std::string quoted =
      "'" + std::string(name.substr(0, 200)) + (name.size() > 200 ? "...'" : "'");
  if (name.find('\0') != std::string_view::npos) {
    return Status::InvalidArgument("the directory name " + quoted + " holds a NUL byte");
  }
  if (name.front() == '/') {
    return Status::InvalidArgument("the directory name " + quoted +
                                   " is absolute: give a name relative to the admin root");
  }
  for (size_t b = 0; b <= name.size();) {
    size_t e = name.find('/', b);
    if (e == std::string_view::npos) e = name.size();
    if (name.substr(b, e - b) == "..") {
      return Status::InvalidArgument("the directory name " + quoted +
                                     " has a '..' component: it must stay under the admin root");
    }
    b = e + 1;
  }
  return Status::OK();
}

Result<std::string> CanonicalAdminRoot(const std::string& root) {
  if (root.empty()) return Status::InvalidArgument("the admin root is empty");
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec) return Status::IOError("cannot create the admin root '" + root + "': " + ec.message());
  fs::path canonical = fs::canonical(root, ec);
  if (ec) return Status::IOError("cannot resolve the admin root '" + root + "': " + ec.message());
  return canonical.string();
}

Result<std::string> ResolveAdminPath(const std::string& canonical_root, std::string_view name) {
  TESSERA_RETURN_IF_ERROR(ValidateAdminName(name));
  std::error_code ec;
  const fs::path root(canonical_root);
  const fs::path resolved = fs::weakly_canonical(root / fs::path(name), ec);
  if (ec) {
    return Status::IOError("cannot resolve '" + std::string(name.substr(0, 200)) +
                           "' under the admin root: " + ec.message());
  }
  // Inside the root: the root's components are a prefix of the resolved path's.
  auto r = root.begin(), p = resolved.begin();
  for (; r != root.end() && p != resolved.end(); ++r, ++p) {
    if (*r != *p) break;
  }
  if (r != root.end()) {
    return Status::InvalidArgument("'" + std::string(name.substr(0, 200)) + "' resolves to '" +
                                   resolved.string() + "', outside the admin root '" +
                                   canonical_root + "' (a symbolic link?)");
  }
  return resolved.string();
}

}  // namespace tessera
