// Where a process that follows a cluster map (docs/elasticity.md) gets it from: an interface
// in the core, so that the client library takes a map without linking the etcd client (which
// needs cpp-httplib and nlohmann-json, absent from a client-only build). tessera_coord's
// EtcdClusterMapSource (ps/coord/etcd_map_source.h) is the implementation over etcd.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ps/routing.h"
#include "ps/status.h"

namespace tessera {

/// The routing part of one version of the cluster map. A value type; thread-compatible.
struct RoutingMap {
  /// An `importing` entry of a slot that is not moving.
  static constexpr uint16_t kNotImporting = 0xFFFF;
  /// The map's version (>= 1; 0 only in a default-constructed value).
  uint64_t version = 0;
  /// Data endpoint of each server id ("" for a retired id).
  std::vector<std::string> addresses;
  /// The primary owner (a server id) of each slot.
  SlotMap primary;
  /// Dense tables are spread over servers 0 .. dense_servers-1 (0: over every address).
  uint32_t dense_servers = 0;
  /// Resharding: per slot, the server its rows are being copied from to its primary
  /// (kNotImporting: none); empty when nothing moves. Servers hold requests for such slots until the
  /// copy is in; clients route by `primary` alone.
  std::vector<uint16_t> importing;
  /// Replication (--replication=2): per slot, the server that receives its primary's pushes
  /// before the primary answers them (kNoBackup: none); empty when no slot has one.
  std::vector<uint16_t> backup;
  static constexpr uint16_t kNoBackup = 0xFFFF;
  /// Dense tables: part p of every dense table (DenseRangeOfServer(..., p, dense_servers)) is
  /// served by dense_primary[p] and, with replication, backed up by dense_backup[p]
  /// (kNoBackup: none). Empty: part p on server p, no backup. A fail-over moves a part to its
  /// backup as it moves slots.
  std::vector<uint16_t> dense_primary;
  std::vector<uint16_t> dense_backup;
  /// Per dense part, as `importing` for slots (kNoBackup: not; empty when none is): its
  /// primary while its backup is being filled from it (a backup rebuild: the backup holds the
  /// part's forwarded pushes until the copy is in), or the server it moves from (resharding:
  /// its new primary holds the part's requests until the copy is in).
  std::vector<uint16_t> dense_importing;
  /// The server of dense part `p`.
  uint32_t DenseOwner(uint32_t p) const { return p < dense_primary.size() ? dense_primary[p] : p; }
  /// The backup of dense part `p` (kNoBackup: none).
  uint16_t DenseBackup(uint32_t p) const { return p < dense_backup.size() ? dense_backup[p] : kNoBackup; }
};

/// Called with each newer map, or with the error of a map that could not be read (the source
/// goes on watching).
using RoutingMapCallback = std::function<void(const Result<RoutingMap>&)>;

/// A source of cluster maps. Implementations are thread-safe: Load and Watch may be called
/// from any thread.
class ClusterMapSource {
 public:
  virtual ~ClusterMapSource() = default;
  /// The current map; NotFound when none was created yet; Unavailable / DeadlineExceeded when
  /// the store does not answer.
  virtual Result<RoutingMap> Load() = 0;
  /// Starts delivering maps to `callback` on a thread of the source: the current map, when
  /// there is one, then each newer version in order (waiting for the first one when none
  /// exists yet). Runs until the source is destroyed, which waits for a running callback; the
  /// callback must not destroy the source. At most one watch per source
  /// (FailedPrecondition for a second).
  virtual Status Watch(RoutingMapCallback callback) = 0;
};

}  // namespace tessera
