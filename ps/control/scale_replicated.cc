// The controller's lock, dense parts, and resharding of a replicated map (docs/elasticity.md,
// "Resharding a replicated map").
#include <algorithm>

#include "ps/control/controller_internal.h"

namespace tessera::internal::reshard {

Status Controller::SettleDenseFills() {
  // (source, destination) -> parts, for fills of backups and for moves to new primaries.
  MovePairs fills, moves;
  for (uint32_t part = 0; part < map_.dense_importing.size(); ++part) {
    const uint16_t from = map_.dense_importing[part];
    if (from == ClusterMap::kNoServer) continue;
    const uint16_t primary = map_.DensePrimary(part);
    if (from == primary) {
      fills[{from, map_.dense_backup[part]}].push_back(part);
    } else {
      moves[{from, primary}].push_back(part);
    }
  }
  if (fills.empty() && moves.empty()) return Status::OK();
  const auto flipped = SteadyClock::now();
  const uint64_t v = map_.version;
  uint32_t filled = 0, moved = 0;
  for (const MovePairs* pairs : {&fills, &moves}) {
    for (auto& [pair, parts] : *pairs) {
      TESSERA_ASSIGN_OR_RETURN(Client * src, Server(pair.first));
      TESSERA_ASSIGN_OR_RETURN(Client * dst, Server(pair.second));
      Client::SlotExportRequest how;
      how.backup_fill = pairs == &fills;
      how.dense_parts = true;
      Marks marks;
      uint64_t n = 0;
      // AlreadyExists: marked in by an earlier run that died before settling (the destination
      // took pushes for the parts since, which a copy would overwrite). Asked first with no
      // chunks, so that the source is not needed then (it may have died since).
      Status copied = UntilSeen(dst, [&] {
        return Done(dst->ImportSlots(0, v, parts, Client::SlotImportStep::kDenseRows,
                                     std::string(), o_.deadline));
      }).status();
      if (copied.ok()) {
        copied = Copy(src, dst, v, parts, how, Client::SlotImportStep::kDenseRows, &marks, &n);
      }
      if (copied.code() != StatusCode::kAlreadyExists) {
        TESSERA_RETURN_IF_ERROR(copied);
        report_.rows_in_hold += n;
      }
      TESSERA_RETURN_IF_ERROR(UntilSeen(dst, [&] {
        return Done(dst->ImportSlots(0, v, parts, Client::SlotImportStep::kDenseDone, {},
                                     o_.deadline));
      }).status());
      (how.backup_fill ? filled : moved) += static_cast<uint32_t>(parts.size());
    }
  }
  const double hold = MsSince(flipped);
  report_.max_hold_ms = std::max(report_.max_hold_ms, hold);
  ClusterMap next = map_;
  next.dense_importing.clear();
  TESSERA_RETURN_IF_ERROR(Cas(std::move(next)));
  report_.dense_parts_backed += filled;
  report_.dense_parts_moved += moved;
  if (o_.log != nullptr) {
    std::fprintf(o_.log,
                 "gave %u dense parts a backup and moved %u at map version %llu; held %.1f ms\n",
                 filled, moved, static_cast<unsigned long long>(v), hold);
  }
  return Status::OK();
}

Status Controller::RebuildDense(const std::vector<bool>& live) {
  // Only a map with dense replication (dense_backup listed) gets dense backups.
  if (map_.dense_backup.empty()) return Status::OK();
  ClusterMap next = map_;
  bool any = false;
  for (uint32_t part = 0; part < map_.dense_servers; ++part) {
    const uint16_t p = map_.DensePrimary(part);
    if (map_.dense_backup[part] != ClusterMap::kNoServer || !live[p]) continue;
    const uint16_t n = static_cast<uint16_t>(map_.servers.size());
    for (uint16_t k = 1; k < n; ++k) {
      const uint16_t b = static_cast<uint16_t>((p + k) % n);
      if (!live[b]) continue;
      if (next.dense_importing.empty()) {
        next.dense_importing.assign(map_.dense_servers, ClusterMap::kNoServer);
      }
      next.dense_backup[part] = b;
      next.dense_importing[part] = p;
      any = true;
      break;
    }
  }
  if (any) {
    TESSERA_RETURN_IF_ERROR(Cas(std::move(next)));
    TESSERA_RETURN_IF_ERROR(SettleDenseFills());
  }
  return Status::OK();
}

Status Controller::Lock() {
  TESSERA_ASSIGN_OR_RETURN(lock_, LockController(&etcd_, prefix_, o_.controller_id,
                                                 o_.controller_ttl_s, o_.wait_for_controller,
                                                 o_.deadline));
  return Status::OK();
}

Status Controller::MayContinue() const {
  if (o_.cancel != nullptr && o_.cancel->load()) {
    return Status::Cancelled("stopped after " + std::to_string(report_.slots_moved) +
                             " slots moved and " + std::to_string(report_.slots_backed) +
                             " given a backup");
  }
  if (lock_ != nullptr && lock_->lost()) {
    return Status::Unavailable("the controller lock " + ControllerKey(prefix_) +
                               " was lost (" + lock_->status().ToString() +
                               "): stopped before the next batch; run again");
  }
  return Status::OK();
}

Status Controller::MoveDense(const std::vector<uint16_t>& targets) {
  const std::vector<uint16_t> plan = PlanDense(map_, targets);
  ClusterMap next = map_;
  bool any = false;
  for (uint16_t part = 0; part < map_.dense_servers; ++part) {
    const uint16_t p = map_.DensePrimary(part);
    const uint16_t to = plan[part];
    if (to == p) continue;
    if (next.dense_primary.empty()) {
      for (uint16_t q = 0; q < map_.dense_servers; ++q) next.dense_primary.push_back(q);
    }
    if (next.dense_importing.empty()) {
      next.dense_importing.assign(map_.dense_servers, ClusterMap::kNoServer);
    }
    next.dense_primary[part] = to;
    next.dense_importing[part] = p;
    // A part's backup is never its primary: it gets another one afterwards (KeepDense).
    if (!next.dense_backup.empty() && next.dense_backup[part] == to) {
      next.dense_backup[part] = ClusterMap::kNoServer;
    }
    any = true;
  }
  if (!any) return Status::OK();
  // One flip for all of them: the new primaries hold the parts' requests, the old ones refuse
  // them (fencing); the copy is taken once every push the old primaries took is in.
  TESSERA_RETURN_IF_ERROR(Cas(std::move(next)));
  return SettleDenseFills();
}

Status Controller::KeepDense(const std::vector<uint16_t>& targets) {
  auto kept = [&](uint16_t id) {
    return std::find(targets.begin(), targets.end(), id) != targets.end();
  };
  if (map_.dense_backup.empty()) return Status::OK();
  ClusterMap next = map_;
  bool dropped = false;
  for (uint16_t part = 0; part < map_.dense_servers; ++part) {
    if (next.dense_backup[part] != ClusterMap::kNoServer && !kept(next.dense_backup[part])) {
      next.dense_backup[part] = ClusterMap::kNoServer;
      dropped = true;
    }
  }
  if (dropped) TESSERA_RETURN_IF_ERROR(Cas(std::move(next)));
  std::vector<bool> live(map_.servers.size(), false);
  for (uint16_t id : targets) live[id] = true;
  return RebuildDense(live);
}

Status Controller::MoveReplicated(const std::vector<uint16_t>& targets) {
  std::vector<uint16_t> primary = map_.primary;
  for (const auto& [slot, to] : PlanMoves(map_, targets)) primary[slot] = to;
  const std::vector<uint16_t> backup = PlanBackups(map_, primary, targets);
  std::vector<uint32_t> changed;
  for (uint32_t slot = 0; slot < kNumSlots; ++slot) {
    if (primary[slot] != map_.primary[slot] || backup[slot] != map_.backup[slot]) {
      changed.push_back(slot);
    }
  }
  for (size_t i = 0; i < changed.size(); i += o_.batch_slots) {
    TESSERA_RETURN_IF_ERROR(MayContinue());
    const auto start = SteadyClock::now();
    const size_t end = std::min(changed.size(), i + o_.batch_slots);
    const std::vector<uint32_t> batch(changed.begin() + i, changed.begin() + end);
    // 1. The slots whose backup changes lose it: their primaries stop forwarding to it (and no
    //    longer wait for it). A backup that stays (never the new primary) stays through the
    //    move: it has every push the old primary applied, and the new one forwards to it once
    //    the copy is in.
    ClusterMap next = map_;
    std::map<uint16_t, std::vector<uint32_t>> old_backup;
    for (uint32_t slot : batch) {
      const uint16_t b = map_.backup[slot];
      if (b == ClusterMap::kNoServer || b == backup[slot]) continue;
      next.backup[slot] = ClusterMap::kNoServer;
      if (b != primary[slot] && b != backup[slot]) old_backup[b].push_back(slot);
    }
    if (next.backup != map_.backup) TESSERA_RETURN_IF_ERROR(Cas(std::move(next)));
    // 2. The primaries move, as in an unreplicated map.
    const std::vector<uint16_t> old_primary = map_.primary;
    next = map_;
    MovePairs pairs;
    std::map<uint16_t, std::vector<uint32_t>> by_dst;
    for (uint32_t slot : batch) {
      if (primary[slot] == map_.primary[slot]) continue;
      pairs[{map_.primary[slot], primary[slot]}].push_back(slot);
      next.importing[slot] = map_.primary[slot];
      next.primary[slot] = primary[slot];
      by_dst[primary[slot]].push_back(slot);
    }
    if (!pairs.empty()) {
      TESSERA_RETURN_IF_ERROR(Batch(std::move(next), pairs, by_dst, /*fill=*/false, false));
    }
    // 3. The new backups are filled from the primaries, as in a rebuild.
    next = map_;
    pairs.clear();
    by_dst.clear();
    std::map<uint16_t, std::vector<uint32_t>> to_drop;
    for (uint32_t slot : batch) {
      if (backup[slot] == map_.backup[slot]) continue;
      pairs[{map_.primary[slot], backup[slot]}].push_back(slot);
      next.backup[slot] = backup[slot];
      next.importing[slot] = map_.primary[slot];
      by_dst[backup[slot]].push_back(slot);
      // The slot's old primary dropped its rows in step 2 already: a second drop would only
      // walk their tombstones.
      if (backup[slot] != old_primary[slot]) to_drop[backup[slot]].push_back(slot);
    }
    if (!pairs.empty()) {
      TESSERA_RETURN_IF_ERROR(Batch(std::move(next), pairs, to_drop, /*fill=*/true, false));
    }
    // 4. The old backups' rows are dropped, unless that server holds the slot again (its own
    //    drop came before its copy). The copies ahead above waited on their sources for every
    //    push forwarded before step 1 to be answered, so none lands after this.
    for (auto& [b, slots] : old_backup) {
      TESSERA_ASSIGN_OR_RETURN(Client * c, Server(b));
      TESSERA_RETURN_IF_ERROR(UntilSeen(c, [&] {
        return Done(c->DropSlots(0, map_.version, slots, o_.deadline));
      }).status());
    }
    if (i + o_.batch_slots < changed.size()) Pace(start);
  }
  return Status::OK();
}

Status Controller::RetireOthers(const std::vector<uint16_t>& targets) {
  ClusterMap next = map_;
  bool retired = false;
  for (uint16_t id = 0; id < next.servers.size(); ++id) {
    if (!next.servers[id].address.empty() &&
        std::find(targets.begin(), targets.end(), id) == targets.end()) {
      next.servers[id].address.clear();
      retired = true;
    }
  }
  return retired ? Cas(std::move(next)) : Status::OK();
}

}  // namespace tessera::internal::reshard
