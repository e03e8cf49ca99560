#include "ps/coord/cluster_map.h"

#include <algorithm>

#include <nlohmann/json.hpp>

namespace tessera {

using nlohmann::json;

namespace {

constexpr int kFormat = 1;

json EncodeRuns(const std::vector<uint16_t>& ids, bool none_as_minus_one) {
  json runs = json::array();
  size_t i = 0;
  while (i < ids.size()) {
    size_t j = i;
    while (j < ids.size() && ids[j] == ids[i]) ++j;
    const int64_t id =
        none_as_minus_one && ids[i] == ClusterMap::kNoServer ? -1 : static_cast<int64_t>(ids[i]);
    runs.push_back(json::array({j - i, id}));
    i = j;
  }
  return runs;
}

// Expands [[RUN, ID]...] into kNumSlots ids; -1 (when allowed) becomes kNoServer.
Result<std::vector<uint16_t>> DecodeRuns(const json& j, const char* name, bool allow_none) {
  const std::string what = std::string("cluster map: ") + name;
  if (!j.is_array()) return Status::Corruption(what + " is not an array of runs");
  std::vector<uint16_t> ids;
  ids.reserve(kNumSlots);
  for (const json& run : j) {
    if (!run.is_array() || run.size() != 2 || !run[0].is_number_integer() ||
        !run[1].is_number_integer()) {
      return Status::Corruption(what + ": a run is not [count, server id]");
    }
    const int64_t count = run[0].get<int64_t>(), id = run[1].get<int64_t>();
    const bool none = allow_none && id == -1;
    if (count <= 0 || count > kNumSlots - static_cast<int64_t>(ids.size()) ||
        (!none && (id < 0 || id >= ClusterMap::kNoServer))) {
      return Status::Corruption(what + ": bad run [" + std::to_string(count) + ", " +
                                std::to_string(id) + "] at slot " + std::to_string(ids.size()));
    }
    ids.insert(ids.end(), count, none ? ClusterMap::kNoServer : static_cast<uint16_t>(id));
  }
  if (ids.size() != kNumSlots) {
    return Status::Corruption(what + " covers " + std::to_string(ids.size()) + " slots, not " +
                              std::to_string(kNumSlots));
  }
  return ids;
}

json EncodeIds(const std::vector<uint16_t>& ids) {
  json out = json::array();
  for (uint16_t id : ids) {
    out.push_back(id == ClusterMap::kNoServer ? int64_t{-1} : static_cast<int64_t>(id));
  }
  return out;
}

// Parses [ID...] (one id per dense part); -1 (when allowed) becomes kNoServer. The number of
// entries is Validate's to check.
Result<std::vector<uint16_t>> DecodeIds(const json& j, const char* name, bool allow_none) {
  const std::string what = std::string("cluster map: ") + name;
  if (!j.is_array()) return Status::Corruption(what + " is not an array of server ids");
  std::vector<uint16_t> ids;
  for (const json& e : j) {
    const int64_t id = e.is_number_integer() ? e.get<int64_t>() : -2;
    const bool none = allow_none && id == -1;
    if (!none && (id < 0 || id >= ClusterMap::kNoServer)) {
      return Status::Corruption(what + ": part " + std::to_string(ids.size()) + " is " + e.dump() +
                                ", not a server id" + (allow_none ? " or -1" : ""));
    }
    ids.push_back(none ? ClusterMap::kNoServer : static_cast<uint16_t>(id));
  }
  return ids;
}

Result<std::vector<MapServer>> DecodeServers(const json& j) {
  if (!j.is_array()) return Status::Corruption("cluster map: servers is not an array");
  std::vector<MapServer> out;
  for (const json& s : j) {
    if (!s.is_object() || !s.contains("id") || !s["id"].is_string() || !s.contains("address") ||
        !s["address"].is_string()) {
      return Status::Corruption("cluster map: server " + std::to_string(out.size()) +
                                " is not {\"id\": string, \"address\": string}");
    }
    out.push_back({s["id"].get<std::string>(), s["address"].get<std::string>()});
  }
  return out;
}

Status CheckSlot(const ClusterMap& m, uint32_t slot) {
  const uint16_t p = m.primary[slot], b = m.backup[slot], from = m.importing[slot];
  const std::string where =
      "cluster map v" + std::to_string(m.version) + ": slot " + std::to_string(slot);
  if (p >= m.servers.size() || m.servers[p].address.empty()) {
    return Status::InvalidArgument(where + ": primary " + std::to_string(p) +
                                   " is not a server with an address");
  }
  if (from != ClusterMap::kNoServer && from == p) {
    // A backup rebuild: the backup is being filled from the primary.
    if (b == ClusterMap::kNoServer) {
      return Status::InvalidArgument(where + ": importing from its primary " + std::to_string(p) +
                                     " (a backup being filled) without a backup");
    }
  } else if (from != ClusterMap::kNoServer &&
             (from >= m.servers.size() || m.servers[from].address.empty())) {
    return Status::InvalidArgument(where + ": importing from " + std::to_string(from) +
                                   ", which is not another server with an address");
  }
  if (b == ClusterMap::kNoServer) return Status::OK();
  if (b >= m.servers.size() || m.servers[b].address.empty() || b == p) {
    return Status::InvalidArgument(where + ": backup " + std::to_string(b) +
                                   " is not another server with an address");
  }
  return Status::OK();
}

// Dense part `part` of a map with dense_primary and dense_backup of dense_servers entries or
// empty.
Status CheckDensePart(const ClusterMap& m, uint32_t part) {
  const std::string where =
      "cluster map v" + std::to_string(m.version) + ": dense part " + std::to_string(part);
  const uint16_t p = m.DensePrimary(part);
  if (!m.dense_primary.empty() && (p >= m.servers.size() || m.servers[p].address.empty())) {
    return Status::InvalidArgument(where + ": primary " + std::to_string(p) +
                                   " is not a server with an address");
  }
  const uint16_t b = m.DenseBackup(part);
  const uint16_t from =
      m.dense_importing.empty() ? ClusterMap::kNoServer : m.dense_importing[part];
  if (from == p && b == ClusterMap::kNoServer) {
    return Status::InvalidArgument(where + ": importing from its primary " + std::to_string(p) +
                                   " without a backup to fill");
  }
  if (from != ClusterMap::kNoServer && from != p &&
      (from >= m.servers.size() || m.servers[from].address.empty())) {
    return Status::InvalidArgument(where + ": moving from " + std::to_string(from) +
                                   ", which is not a server with an address");
  }
  if (b == ClusterMap::kNoServer) return Status::OK();
  if (b >= m.servers.size() || m.servers[b].address.empty() || b == p) {
    return Status::InvalidArgument(where + ": backup " + std::to_string(b) +
                                   " is not another server with an address");
  }
  return Status::OK();
}

}  // namespace

ClusterMap ClusterMap::Uniform(std::vector<MapServer> servers) {
  ClusterMap m;
  m.version = 1;
  const uint32_t n = static_cast<uint32_t>(servers.size());
  m.servers = std::move(servers);
  if (n > 0) m.primary = SlotMap::Uniform(n).owners();
  m.backup.assign(kNumSlots, kNoServer);
  m.importing.assign(kNumSlots, kNoServer);
  m.dense_servers = n;
  return m;
}

Result<ClusterMap> ClusterMap::Replicated(std::vector<MapServer> servers, uint32_t replication) {
  if (replication != 1 && replication != 2) {
    return Status::InvalidArgument("replication " + std::to_string(replication) +
                                   " is not supported (1: none, 2: one backup per slot)");
  }
  const size_t n = servers.size();
  if (replication == 2 && n < 2) {
    return Status::InvalidArgument("replication 2 needs at least 2 servers, got " +
                                   std::to_string(n));
  }
  ClusterMap m = Uniform(std::move(servers));
  m.replication = replication;
  if (replication == 2) {
    for (uint32_t slot = 0; slot < kNumSlots; ++slot) {
      m.backup[slot] = static_cast<uint16_t>((m.primary[slot] + 1) % n);
    }
    for (uint32_t part = 0; part < m.dense_servers; ++part) {
      m.dense_primary.push_back(static_cast<uint16_t>(part));
      m.dense_backup.push_back(static_cast<uint16_t>((part + 1) % n));
    }
  }
  return m;
}

bool ClusterMap::Replicated() const {
  const auto some = [](const std::vector<uint16_t>& ids) {
    return std::any_of(ids.begin(), ids.end(), [](uint16_t b) { return b != kNoServer; });
  };
  return replication >= 2 || some(backup) || some(dense_backup);
}

Status ClusterMap::Validate() const {
  if (version == 0) return Status::InvalidArgument("cluster map: version 0 (the first is 1)");
  if (replication != 1 && replication != 2) {
    return Status::InvalidArgument("cluster map: replication " + std::to_string(replication) +
                                   " (1 or 2)");
  }
  if (servers.empty() || servers.size() >= kNoServer) {
    return Status::InvalidArgument("cluster map: " + std::to_string(servers.size()) +
                                   " servers (1..65534)");
  }
  if (primary.size() != kNumSlots || backup.size() != kNumSlots ||
      importing.size() != kNumSlots) {
    return Status::InvalidArgument("cluster map: " + std::to_string(primary.size()) +
                                   " primaries, " + std::to_string(backup.size()) +
                                   " backups and " + std::to_string(importing.size()) +
                                   " importing entries, not " + std::to_string(kNumSlots) +
                                   " each");
  }
  for (uint32_t slot = 0; slot < kNumSlots; ++slot) TESSERA_RETURN_IF_ERROR(CheckSlot(*this, slot));
  if (dense_servers == 0 || dense_servers > servers.size()) {
    return Status::InvalidArgument("cluster map: dense_servers " + std::to_string(dense_servers) +
                                   " is not in 1.." + std::to_string(servers.size()));
  }
  for (const auto* dense : {&dense_primary, &dense_backup, &dense_importing}) {
    if (!dense->empty() && dense->size() != dense_servers) {
      return Status::InvalidArgument("cluster map: " + std::to_string(dense_primary.size()) +
                                     " dense primaries, " + std::to_string(dense_backup.size()) +
                                     " dense backups and " +
                                     std::to_string(dense_importing.size()) +
                                     " dense importing entries, not 0 or " +
                                     std::to_string(dense_servers) + " (dense_servers) each");
    }
  }
  // Without dense_primary a dense server may be retired: a record written before dense
  // replication whose dense server failed (its dense ranges are unavailable; clients fail
  // requests for them naming it).
  for (uint32_t part = 0; part < dense_servers; ++part) {
    TESSERA_RETURN_IF_ERROR(CheckDensePart(*this, part));
  }
  return Status::OK();
}

Result<SlotMap> ClusterMap::PrimaryMap() const {
  return SlotMap::FromOwners(primary, static_cast<uint32_t>(servers.size()));
}

Result<std::string> EncodeClusterMap(const ClusterMap& map) {
  TESSERA_RETURN_IF_ERROR(map.Validate());
  json servers = json::array();
  for (const MapServer& s : map.servers) servers.push_back({{"id", s.id}, {"address", s.address}});
  json j = {{"format", kFormat},
            {"version", map.version},
            {"servers", servers},
            {"primary", EncodeRuns(map.primary, false)},
            {"backup", EncodeRuns(map.backup, true)},
            {"importing", EncodeRuns(map.importing, true)},
            {"dense_servers", map.dense_servers}};
  // Absent when empty: a map without dense replication keeps the record it had before it.
  if (!map.dense_primary.empty()) j["dense_primary"] = EncodeIds(map.dense_primary);
  if (!map.dense_backup.empty()) j["dense_backup"] = EncodeIds(map.dense_backup);
  // Absent from a map without replication, which keeps the record it had before the field.
  if (map.Replicated()) j["replication"] = map.replication;
  // Only while a part's backup is being filled.
  if (std::any_of(map.dense_importing.begin(), map.dense_importing.end(),
                  [](uint16_t f) { return f != ClusterMap::kNoServer; })) {
    j["dense_importing"] = EncodeIds(map.dense_importing);
  }
  // Ids and addresses are the caller's strings: invalid UTF-8 would make dump() throw.
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

Result<ClusterMap> DecodeClusterMap(std::string_view text) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return Status::Corruption("cluster map: not a JSON object");
  if (!j.contains("format") || j["format"] != kFormat) {
    return Status::Corruption("cluster map: format is not " + std::to_string(kFormat));
  }
  for (const char* field : {"version", "servers", "primary", "backup"}) {
    if (!j.contains(field)) return Status::Corruption(std::string("cluster map: no ") + field);
  }
  if (!j["version"].is_number_unsigned()) {
    return Status::Corruption("cluster map: version is not an unsigned number");
  }
  ClusterMap m;
  m.version = j["version"].get<uint64_t>();
  TESSERA_ASSIGN_OR_RETURN(m.servers, DecodeServers(j["servers"]));
  TESSERA_ASSIGN_OR_RETURN(m.primary, DecodeRuns(j["primary"], "primary", false));
  TESSERA_ASSIGN_OR_RETURN(m.backup, DecodeRuns(j["backup"], "backup", true));
  if (j.contains("importing")) {
    TESSERA_ASSIGN_OR_RETURN(m.importing, DecodeRuns(j["importing"], "importing", true));
  } else {
    m.importing.assign(kNumSlots, ClusterMap::kNoServer);
  }
  if (j.contains("dense_servers")) {
    if (!j["dense_servers"].is_number_unsigned() || j["dense_servers"].get<uint64_t>() > 65535) {
      return Status::Corruption("cluster map: dense_servers is not a number in 0..65535");
    }
    m.dense_servers = j["dense_servers"].get<uint32_t>();
  } else {
    m.dense_servers = static_cast<uint32_t>(m.servers.size());
  }
  if (j.contains("dense_primary")) {
    TESSERA_ASSIGN_OR_RETURN(m.dense_primary,
                             DecodeIds(j["dense_primary"], "dense_primary", false));
  }
  if (j.contains("dense_backup")) {
    TESSERA_ASSIGN_OR_RETURN(m.dense_backup, DecodeIds(j["dense_backup"], "dense_backup", true));
  }
  if (j.contains("dense_importing")) {
    TESSERA_ASSIGN_OR_RETURN(m.dense_importing,
                             DecodeIds(j["dense_importing"], "dense_importing", true));
  }
  if (j.contains("replication")) {
    if (!j["replication"].is_number_unsigned() || j["replication"].get<uint64_t>() > 2) {
      return Status::Corruption("cluster map: replication is not 1 or 2");
    }
    m.replication = j["replication"].get<uint32_t>();
  } else {
    // Written before the record had it: replicated when it lists backups (a map made with
    // --replication=2 lists dense backups for good, also when a fail-over emptied them).
    const bool backed = std::any_of(m.backup.begin(), m.backup.end(),
                                    [](uint16_t b) { return b != ClusterMap::kNoServer; });
    m.replication = !m.dense_backup.empty() || backed ? 2 : 1;
  }
  Status valid = m.Validate();
  if (!valid.ok()) return Status::Corruption(valid.message());
  return m;
}

}  // namespace tessera
