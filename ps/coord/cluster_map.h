// The cluster map: the one versioned record of who serves which slot (docs/elasticity.md).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ps/cluster_map_source.h"
#include "ps/routing.h"
#include "ps/status.h"

namespace tessera {

/// A server of the map. Its index in ClusterMap::servers is its server id, the number slots
/// name; an id is never reused, so a removed server keeps its entry with an empty address.
struct MapServer {
  /// Its membership id (Member::id).
  std::string id;
  /// Its data endpoint; "" for a retired id.
  std::string address;
  bool operator==(const MapServer&) const = default;
};

/// Slot ownership at one version: a primary and an optional backup server id per slot (and,
/// with dense replication, per dense part).
/// A value type; thread-compatible.
struct ClusterMap {
  /// Backup of a slot that has none.
  static constexpr uint16_t kNoServer = RoutingMap::kNotImporting;

  /// Increases by one with every change stored in etcd; 1 for the first map.
  uint64_t version = 0;
  std::vector<MapServer> servers;
  /// kNumSlots server ids.
  std::vector<uint16_t> primary;
  /// kNumSlots server ids or kNoServer.
  std::vector<uint16_t> backup;
  /// Resharding: kNumSlots server ids or kNoServer. A slot whose rows are being copied to its
  /// (new) primary names the server it comes from (its previous primary); the primary holds
  /// requests for it until the copy is in (docs/elasticity.md, "Online resharding"). A slot
  /// whose importing source is its own primary is a backup rebuild: its backup is being filled
  /// from the primary and holds the primary's forwarded pushes for it until the copy is in
  /// ("Backup rebuild").
  std::vector<uint16_t> importing;
  /// Dense tables are split into dense_servers parts (the servers of the first map); part p is
  /// served by dense_primary[p] (server p when that is empty). Resharding moves the parts of
  /// a server it drains to the servers it keeps (dense_importing), and gives a dense backup on
  /// a server it retires to another.
  uint32_t dense_servers = 0;
  /// Dense replication: empty (part p on server p, no backup: a map made without replication,
  /// or written before dense parts were replicated), or dense_servers server ids, the server of
  /// each part. A fail-over moves a dead server's parts to their backups, as it moves slots.
  std::vector<uint16_t> dense_primary;
  /// Empty (no part has a backup), or dense_servers entries: per part a server id, never the
  /// part's server, that receives its pushes before the primary answers them, or kNoServer.
  std::vector<uint16_t> dense_backup;
  /// Empty (no dense part being copied), or dense_servers entries: kNoServer, the part's
  /// primary while its backup is being filled from it (a backup rebuild, like `importing`), or
  /// another server: the one the part moves from to its (new) primary (resharding). Written
  /// only while some part has one; an empty list and all kNoServer mean the same.
  std::vector<uint16_t> dense_importing;
  /// The number of copies each slot and dense part is meant to have (`tessera-ctl map init
  /// --replication`): 1 or 2. A fail-over leaves fewer (a double failure may leave no backup
  /// at all) until a rebuild gives them back; the fail-over watcher and the controller go by
  /// this, not by the backups there are.
  uint32_t replication = 1;

  /// True when the map is meant to be replicated (replication >= 2), or a slot or dense part
  /// has a backup (a map built by hand).
  bool Replicated() const;

  /// The server of dense part `part` (server `part` without dense_primary), and its backup
  /// (kNoServer: none, or no dense_backup list).
  uint16_t DensePrimary(uint32_t part) const {
    return dense_primary.empty() ? static_cast<uint16_t>(part) : dense_primary[part];
  }
  uint16_t DenseBackup(uint32_t part) const {
    return dense_backup.empty() ? kNoServer : dense_backup[part];
  }

  /// Version 1 of a cluster of `servers`: primaries as SlotMap::Uniform(servers.size()), no
  /// backups, nothing importing, dense tables over all of them.
  static ClusterMap Uniform(std::vector<MapServer> servers);
  /// Uniform(servers) with `replication` copies of each slot and dense part (`tessera-ctl map
  /// init --replication=N`, recorded in `replication`): 1 is Uniform (dense_primary and
  /// dense_backup empty); 2 gives each slot the backup (primary + 1) % n, n the number of
  /// servers, which must be at least 2, and dense part p the primary p and the backup
  /// (p + 1) % n. InvalidArgument for another
  /// replication or too few servers.
  static Result<ClusterMap> Replicated(std::vector<MapServer> servers, uint32_t replication);

  /// OK when the map is whole: version >= 1, replication 1 or 2, 1..65535 servers, kNumSlots
  /// primaries, backups and importing entries, each naming a server with an address, a backup
  /// never the slot's primary, an importing source the primary only when the slot has a backup
  /// (a rebuild), 1 <= dense_servers <= servers, dense_primary and dense_backup each empty or
  /// dense_servers entries, a dense primary a server with an address, a dense backup kNoServer
  /// or a server with an address other than its part's primary, a dense importing source the
  /// part's primary with a backup (a fill) or another server with an address (a move). Without
  /// dense_primary a dense server may be retired (records written before dense replication:
  /// a fail-over retired it).
  /// InvalidArgument naming the first slot, dense part or server that is wrong.
  Status Validate() const;
  /// The routing of the primaries (SlotMap::FromOwners).
  Result<SlotMap> PrimaryMap() const;

  bool operator==(const ClusterMap&) const = default;
};

/// The record's JSON: {"format":1, "version":V, "servers":[{"id","address"}...],
/// "primary":[[RUN,ID]...], "backup":[[RUN,ID or -1]...], "importing":[[RUN,ID or -1]...],
/// "dense_servers":D, "dense_primary":[ID...], "dense_backup":[ID or -1...],
/// "dense_importing":[ID or -1...], "replication":R}, each slot list
/// as runs of equal ids in slot order (a uniform map of n servers is n runs), each dense list
/// one id per part. "importing" and "dense_servers" may be absent (records written before
/// resharding: nothing importing, dense tables over every server); "dense_primary" and
/// "dense_backup" are written only when not empty, so a map without them has the record it
/// had before dense replication, and are absent from such records (decoded as empty).
/// "replication" is written for a map that is Replicated() only; a record without it (a map
/// without replication, or one written before the field) is read as 2 when it lists dense
/// backups or a slot has a backup, else 1. Fails on a map that does not validate.
Result<std::string> EncodeClusterMap(const ClusterMap& map);
/// Parses and validates a record; Corruption saying what is wrong.
Result<ClusterMap> DecodeClusterMap(std::string_view text);

}  // namespace tessera
