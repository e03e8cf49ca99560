// The --coordinator flag's value: etcd://HOST:PORT/PREFIX.
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
  std::string host;
  uint16_t port = 0;
  /// The key prefix, "/" + PREFIX of the URL: "/tessera/job1" for etcd://h:2379/tessera/job1.
  /// Every key of the cluster starts with it (docs/elasticity.md lists them).
  std::string prefix;

  /// Parses "etcd://HOST:PORT/PREFIX": HOST a name or IPv4 address ([A-Za-z0-9.-]), PORT
  /// 1..65535, PREFIX one or more '/'-separated segments of [A-Za-z0-9._-] (no empty, "." or
  /// ".." segment, no trailing '/'). InvalidArgument saying what is wrong otherwise.
  static Result<CoordinatorUrl> Parse(std::string_view url);

  /// "etcd://HOST:PORT/PREFIX" again.
  std::string ToString() const;
  /// Options of an EtcdClient for this endpoint (timeout as given).
  EtcdOptions etcd_options(int timeout_ms = EtcdOptions{}.timeout_ms) const;
};

/// Checks a name that becomes one segment of a key (a member id): 1..128 characters of
/// [A-Za-z0-9._-], not "." or "..". InvalidArgument naming `what` otherwise.
Status ValidateKeySegment(std::string_view segment, std::string_view what);

}  // namespace tessera
