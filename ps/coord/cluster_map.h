// The cluster map: the one versioned record of who serves which slot (docs/elasticity.md).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

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
  static constexpr uint16_t kNoServer = 0xFFFF;

  /// Increases by one with every change stored in etcd; 1 for the first map.
  uint64_t version = 0;
  std::vector<MapServer> servers;
  /// kNumSlots server ids.
  std::vector<uint16_t> primary;
  /// kNumSlots server ids or kNoServer.
  std::vector<uint16_t> backup;

  /// Version 1 of a cluster of `servers`: primaries as SlotMap::Uniform(servers.size()), no
  /// backups.
  static ClusterMap Uniform(std::vector<MapServer> servers);

  /// OK when the map is whole: version >= 1, 1..65535 servers, kNumSlots primaries and backups,
  /// each naming a server with an address, a backup never its slot's primary. InvalidArgument
  /// naming the first slot or server that is wrong.
  Status Validate() const;
  /// The routing of the primaries (SlotMap::FromOwners).
  Result<SlotMap> PrimaryMap() const;

  bool operator==(const ClusterMap&) const = default;
};

/// The record's JSON: {"format":1, "version":V, "servers":[{"id","address"}...],
/// "primary":[[RUN,ID]...], "backup":[[RUN,ID or -1]...]}, each slot list as runs of equal ids
/// in slot order (a uniform map of n servers is n runs). Fails on a map that does not validate.
Result<std::string> EncodeClusterMap(const ClusterMap& map);
/// Parses and validates a record; Corruption saying what is wrong.
Result<ClusterMap> DecodeClusterMap(std::string_view text);

}  // namespace tessera
