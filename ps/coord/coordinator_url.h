// The --coordinator flag's value: etcd://[USER@]HOST:PORT/PREFIX.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "ps/coord/etcd_client.h"
#include "ps/status.h"

namespace tessera {

/// Where a cluster's coordination state lives: an etcd endpoint and the key prefix of this
/// cluster, so that several clusters can share one etcd. A value type; thread-compatible.
struct CoordinatorUrl {
  /// etcd user (etcd's auth); empty: none.
  std::string user;
  /// The user's password, read by Parse from the file $TESSERA_ETCD_PASSWORD_FILE names; never
  /// printed (ToString leaves it out).
  std::string password;
  std::string host;
  uint16_t port = 0;
  /// The key prefix, "/" + PREFIX of the URL: "/tessera/job1" for etcd://h:2379/tessera/job1.
  /// Every key of the cluster starts with it (docs/elasticity.md lists them).
  std::string prefix;

  /// Parses "etcd://[USER@]HOST:PORT/PREFIX": USER 1..128 of [A-Za-z0-9._-], HOST a name or
  /// IPv4 address ([A-Za-z0-9.-]), PORT 1..65535, PREFIX one or more '/'-separated segments of
  /// [A-Za-z0-9._-] (no empty, "." or ".." segment, no trailing '/'). InvalidArgument saying
  /// what is wrong otherwise. With USER the password is read from the file named by the
  /// environment variable TESSERA_ETCD_PASSWORD_FILE (kEtcdPasswordFileEnv): a regular file of
  /// at most 4 KiB, one trailing newline dropped; InvalidArgument when the variable is unset or
  /// the password empty, the file's error (naming it) when it cannot be read.
  static Result<CoordinatorUrl> Parse(std::string_view url);

  /// "etcd://[USER@]HOST:PORT/PREFIX" again (never the password).
  std::string ToString() const;
  /// Options of an EtcdClient for this endpoint and user (timeout as given).
  EtcdOptions etcd_options(int timeout_ms = EtcdOptions{}.timeout_ms) const;
};

/// The environment variable naming the etcd password file of a coordinator URL with a user.
inline constexpr char kEtcdPasswordFileEnv[] = "TESSERA_ETCD_PASSWORD_FILE";

/// Checks a name that becomes one segment of a key (a member id): 1..128 characters of
/// [A-Za-z0-9._-], not "." or "..". InvalidArgument naming `what` otherwise.
Status ValidateKeySegment(std::string_view segment, std::string_view what);

}  // namespace tessera
