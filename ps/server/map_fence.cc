// Fencing by cluster map version (docs/elasticity.md): the map a server follows, and the check
// every data request passes before anything of it is logged or applied.
#include <algorithm>

#include "ps/server/map_fence_internal.h"

namespace tessera::internal {
namespace {

// The dense parts of `m` being copied (ClusterMapState::dense_filling, dense_moving_from), as
// for slots: a source that is the part's primary fills its backup (a rebuild); another source
// is the server the part moves from, and its new primary copies it in.
template <typename State>
void MarkDenseCopies(const RoutingMap& m, uint32_t dense, uint32_t rank, State* state) {
  for (uint32_t part = 0; part < m.dense_importing.size() && part < dense; ++part) {
    const uint16_t from = m.dense_importing[part];
    if (from == RoutingMap::kNoBackup) continue;
    const bool move = from != m.DenseOwner(part);
    if (move) {
      if (state->dense_moving_from.empty()) {
        state->dense_moving_from.assign(dense, RoutingMap::kNoBackup);
      }
      state->dense_moving_from[part] = from;
    }
    if (move ? m.DenseOwner(part) == rank : m.DenseBackup(part) == rank) {
      if (state->dense_filling.empty()) state->dense_filling.assign(dense, false);
      state->dense_filling[part] = true;
    }
  }
}

}  // namespace

Status MapFence::Set(const RoutingMap& m) {
  const uint64_t version = m.version;
  if (!follow_) {
    return Status::FailedPrecondition(
        "server " + std::to_string(rank_) +
        " follows no cluster map (ServerOptions::follow_cluster_map is off)");
  }
  if (version == 0) return Status::InvalidArgument("cluster map version 0 is the static cluster");
  if (m.primary.owners().size() != kNumSlots) {
    return Status::InvalidArgument("cluster map version " + std::to_string(version) +
                                   " has no primary for every slot");
  }
  if (!m.importing.empty() && m.importing.size() != kNumSlots) {
    return Status::InvalidArgument("cluster map version " + std::to_string(version) + ": " +
                                   std::to_string(m.importing.size()) + " importing entries");
  }
  auto state = std::make_shared<ClusterMapState>();
  state->version = version;
  state->primary = m.primary;
  state->dense_servers = m.dense_servers != 0 ? m.dense_servers : num_servers_;
  if (!m.backup.empty() && m.backup.size() != kNumSlots) {
    return Status::InvalidArgument("cluster map version " + std::to_string(version) + ": " +
                                   std::to_string(m.backup.size()) + " backup entries");
  }
  // No backup left anywhere (a fail-over cleared them all): the server stops sequencing its
  // requests for replication.
  auto none = [](const std::vector<uint16_t>& v) {
    return std::all_of(v.begin(), v.end(), [](uint16_t b) { return b == RoutingMap::kNoBackup; });
  };
  if (!none(m.backup)) state->backup = m.backup;
  state->addresses = m.addresses;
  const uint32_t dense = state->dense_servers;
  if ((!m.dense_primary.empty() && m.dense_primary.size() != dense) ||
      (!m.dense_backup.empty() && m.dense_backup.size() != dense)) {
    return Status::InvalidArgument("cluster map version " + std::to_string(version) + ": " +
                                   std::to_string(m.dense_primary.size()) + " dense primaries and " +
                                   std::to_string(m.dense_backup.size()) +
                                   " dense backups for " + std::to_string(dense) + " dense parts");
  }
  state->dense_primary = m.dense_primary;
  MarkDenseCopies(m, dense, rank_, state.get());
  if (!none(m.dense_backup)) state->dense_backup = m.dense_backup;
  for (uint32_t slot = 0; slot < m.importing.size(); ++slot) {
    // Only the slots this server must fill matter to it: as their new primary (a move), or as
    // their backup (a rebuild: the importing source is the primary).
    const uint16_t from = m.importing[slot];
    if (from == RoutingMap::kNotImporting) continue;
    const uint32_t primary = m.primary.ServerOfSlot(slot);
    if (from != primary && primary == rank_) {
      if (state->importing.empty()) state->importing.assign(kNumSlots, false);
      state->importing[slot] = true;
    } else if (from == primary && !m.backup.empty() && m.backup[slot] == rank_) {
      if (state->filling.empty()) state->filling.assign(kNumSlots, false);
      state->filling[slot] = true;
    } else if (from != primary && primary != rank_) {
      if (state->moving_from.empty()) state->moving_from.assign(kNumSlots, RoutingMap::kNoBackup);
      state->moving_from[slot] = from;
    }
  }
  std::shared_ptr<const ClusterMapState> next = std::move(state);
  MutexLock l(mu_);
  if (map_ != nullptr && map_->version >= version) return Status::OK();
  map_ = std::move(next);
  version_.store(version, std::memory_order_release);
  return Status::OK();
}

const ClusterMapState* MapFence::Current() {
  const uint64_t v = version_.load(std::memory_order_acquire);
  if (v == 0) {
    io_version_.store(0, std::memory_order_release);
    return nullptr;
  }
  if (io_map_ == nullptr || io_map_->version != v) {
    MutexLock l(mu_);
    io_map_ = map_;
    changed_ = true;  // OnMapChanged, once the request at hand is done
  }
  io_version_.store(io_map_->version, std::memory_order_release);
  return io_map_.get();
}

const SlotMap& MapFence::Owners() {
  const ClusterMapState* map = Current();
  return map != nullptr ? map->primary : static_owners_;
}

uint32_t MapFence::DenseServers() {
  const ClusterMapState* map = Current();
  return map != nullptr ? map->dense_servers : num_servers_;
}

bool MapFence::Matches(const Header& h, uint64_t* mine) {
  if (!follow_) return true;
  const ClusterMapState* map = Current();
  *mine = map == nullptr ? 0 : map->version;
  return h.map_version == *mine;
}

Status MapFence::Refuse(const Header& h, uint64_t mine) {
  ++refusals_;
  if (h.map_version < mine) {
    return Status::FailedPrecondition(
        "stale cluster map: request has version " + std::to_string(h.map_version) +
        ", server " + std::to_string(rank_) + " is at " + std::to_string(mine) +
        "; nothing of it was applied");
  }
  return Status::FailedPrecondition(
      "stale cluster map on the server: request has version " + std::to_string(h.map_version) +
      ", server " + std::to_string(rank_) + " is still at " + std::to_string(mine) +
      " (it has not seen the newer map yet); nothing of it was applied");
}

}  // namespace tessera::internal
