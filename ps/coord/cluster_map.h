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

/// Slot ownership at one version: a primary and an optional backup server id per slot.
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
  /// requests for it until the copy is in (docs/elasticity.md, "Online resharding").
  std::vector<uint16_t> importing;
  /// Dense tables are spread over servers 0 .. dense_servers-1 (the servers of the first map);
  /// no map change moves them: resharding never retires those ids, a fail-over retires a dead
  /// one (dense tables are not replicated; its ranges are unavailable from then on).
  uint32_t dense_servers = 0;

  /// Version 1 of a cluster of `servers`: primaries as SlotMap::Uniform(servers.size()), no
  /// backups, nothing importing, dense tables over all of them.
  static ClusterMap Uniform(std::vector<MapServer> servers);
  /// Uniform(servers) with `replication` copies of each slot (`tessera-ctl map init
  /// --replication=N`): 1 is Uniform; 2 gives each slot the backup (primary + 1) % n, n the
  /// number of servers, which must be at least 2. InvalidArgument for another replication or
  /// too few servers.
  static Result<ClusterMap> Replicated(std::vector<MapServer> servers, uint32_t replication);

  /// OK when the map is whole: version >= 1, 1..65535 servers, kNumSlots primaries, backups
  /// and importing entries, each naming a server with an address, a backup and an importing
  /// source never the slot's primary, 1 <= dense_servers <= servers.
  /// InvalidArgument naming the first slot or server that is wrong.
  Status Validate() const;
  /// The routing of the primaries (SlotMap::FromOwners).
  Result<SlotMap> PrimaryMap() const;

  bool operator==(const ClusterMap&) const = default;
};

/// The record's JSON: {"format":1, "version":V, "servers":[{"id","address"}...],
/// "primary":[[RUN,ID]...], "backup":[[RUN,ID or -1]...], "importing":[[RUN,ID or -1]...],
/// "dense_servers":D}, each slot list as runs of equal ids in slot order (a uniform map of n
/// servers is n runs). "importing" and "dense_servers" may be absent (records written before
/// resharding: nothing importing, dense tables over every server). Fails on a map that does
/// not validate.
Result<std::string> EncodeClusterMap(const ClusterMap& map);
/// Parses and validates a record; Corruption saying what is wrong.
Result<ClusterMap> DecodeClusterMap(std::string_view text);

}  // namespace tessera
