// Names of checkpoint and export directories: relative names resolved under an admin root
// (the server's --admin_root; a client's ClientOptions::admin_root for the marker files it
// writes itself). The same rules on both sides, so a name the client accepts is one every
// server accepts.
#pragma once

#include <string>
#include <string_view>

#include "ps/status.h"

namespace tessera {

/// Checks an admin name: 1..kMaxRequestNameBytes bytes, relative (no leading '/'), no ".."
/// component, no NUL byte. InvalidArgument saying which rule it breaks otherwise.
Status ValidateAdminName(std::string_view name);

/// The canonical form of an admin root directory, created if missing (with its parents).
/// A relative root is taken relative to the working directory. InvalidArgument for an empty
/// root, IOError when it cannot be created or resolved. Never throws.
Result<std::string> CanonicalAdminRoot(const std::string& root);

/// Resolves `name` (ValidateAdminName) under `canonical_root` (from CanonicalAdminRoot):
/// std::filesystem::weakly_canonical of root/name, which must be the root itself or inside
/// it, so a symbolic link under the root that points out of it is refused. Returns the
/// resolved path. InvalidArgument for a bad name or one that resolves outside the root;
/// IOError when it cannot be resolved (e.g. a component longer than the file system allows).
/// Never throws.
Result<std::string> ResolveAdminPath(const std::string& canonical_root, std::string_view name);

}  // namespace tessera
