#include "ps/control/scale.h"

#include <algorithm>

#include "ps/control/controller_internal.h"
#include "ps/control/scale_internal.h"

namespace tessera::internal {
namespace reshard {

Status Controller::AddServers(std::vector<uint16_t>* targets) {
  if (targets->size() >= o_.servers) return Status::OK();
  TESSERA_ASSIGN_OR_RETURN(std::vector<Member> members, ListMembers(etcd_, prefix_));
  ClusterMap next = map_;
  std::vector<uint16_t> added;
  // First the retired ids whose server registered again (restarted under its --rank: a
  // StatefulSet pod keeps its ordinal), lowest first: the map gives each its address back.
  // Whatever its data dir holds of slots is dropped before a copy lands there.
  for (uint16_t id = 0; id < next.servers.size() && targets->size() + added.size() < o_.servers;
       ++id) {
    if (!next.servers[id].address.empty()) continue;
    auto it = std::find_if(members.begin(), members.end(),
                           [&](const Member& m) { return m.id == next.servers[id].id; });
    if (it == members.end() || it->leaving) continue;
    next.servers[id].address = it->address;
    added.push_back(id);
  }
  while (targets->size() + added.size() < o_.servers) {
    const uint32_t id = static_cast<uint32_t>(next.servers.size());
    const std::string name = "server-" + std::to_string(id);
    auto it = std::find_if(members.begin(), members.end(),
                           [&](const Member& m) { return m.id == name && !m.leaving; });
    if (it == members.end()) {
      return Status::FailedPrecondition(
          "scaling to " + std::to_string(o_.servers) + " servers needs server id " +
          std::to_string(id) + ", which is not registered under " + prefix_ + "/members/" + name +
          ": start tessera-server --rank=" + std::to_string(id) + " --coordinator=...");
    }
    next.servers.push_back({name, it->address});
    added.push_back(static_cast<uint16_t>(id));
  }
  TESSERA_RETURN_IF_ERROR(Cas(std::move(next)));
  // The new servers learn every table (tables made before they existed).
  // (The server asked may not have seen the new version yet: asked again until it has.)
  TESSERA_ASSIGN_OR_RETURN(Client * any, Server(targets->front()));
  TESSERA_ASSIGN_OR_RETURN(std::string specs, UntilSeen(any, [&] {
    return any->ExportSlots(0, map_.version, {}, {}, o_.deadline);
  }));
  for (uint16_t id : added) {
    TESSERA_ASSIGN_OR_RETURN(Client * c, Server(id));
    TESSERA_RETURN_IF_ERROR(UntilSeen(c, [&] {
      return Done(c->ImportSlots(0, 0, {}, Client::SlotImportStep::kRows, specs, o_.deadline));
    }).status());
    targets->push_back(id);
  }
  std::sort(targets->begin(), targets->end());
  return Status::OK();
}

Status Controller::Copy(Client* src, Client* dst, uint64_t v, const std::vector<uint32_t>& slots,
                        const Client::SlotExportRequest& how, Client::SlotImportStep step,
                        Marks* marks, uint64_t* rows) {
  // Both owners may be a moment behind the map version (their watches): asked again then.
  TESSERA_ASSIGN_OR_RETURN(std::string data, UntilSeen(src, [&] {
    return src->ExportSlots(0, v, slots, how, o_.deadline);
  }));
  // One read of the export: the pieces to import, its rows and its lane marks.
  TESSERA_ASSIGN_OR_RETURN(SlotRowsPieces split, SplitSlotRows(data, o_.max_piece_bytes));
  TESSERA_ASSIGN_OR_RETURN(*marks, ReadMarks(split.marks));
  *rows = split.rows;
  for (const std::string& piece : split.pieces) {
    TESSERA_RETURN_IF_ERROR(UntilSeen(dst, [&] {
      return Done(dst->ImportSlots(0, v, slots, step, piece, o_.deadline));
    }).status());
  }
  report_.bytes_moved += data.size();
  return Status::OK();
}

Status Controller::CopyAhead(const MovePairs& moves,
                             std::map<std::pair<uint16_t, uint16_t>, Marks>* ahead) {
  for (auto& [pair, slots] : moves) {
    TESSERA_ASSIGN_OR_RETURN(Client * src, Server(pair.first));
    TESSERA_ASSIGN_OR_RETURN(Client * dst, Server(pair.second));
    Client::SlotExportRequest how;
    how.still_owned = true;
    uint64_t n = 0;
    TESSERA_RETURN_IF_ERROR(Copy(src, dst, map_.version, slots, how,
                                 Client::SlotImportStep::kAhead, &(*ahead)[pair], &n));
    report_.rows_ahead += n;
  }
  return Status::OK();
}

Status Controller::Settle(const std::map<std::pair<uint16_t, uint16_t>, Marks>& ahead) {
  // Moving slots by (from, to), and by new owner.
  MovePairs moves;
  std::map<uint16_t, std::vector<uint32_t>> by_dst, by_src;
  for (uint32_t slot = 0; slot < kNumSlots; ++slot) {
    const uint16_t from = map_.importing[slot];
    // (A source that is the slot's own primary is a backup fill: SettleFills.)
    if (from == ClusterMap::kNoServer || from == map_.primary[slot]) continue;
    moves[{from, map_.primary[slot]}].push_back(slot);
    by_dst[map_.primary[slot]].push_back(slot);
    by_src[from].push_back(slot);
  }
  if (moves.empty()) return Status::OK();
  const auto flipped = SteadyClock::now();
  const uint64_t v = map_.version;
  for (auto& [pair, slots] : moves) {
    TESSERA_RETURN_IF_ERROR(CopyAtFlip(pair, slots, {}, ahead, v));
  }
  const double copied_ms = MsSince(flipped);
  TESSERA_RETURN_IF_ERROR(MarkIn(by_dst, v));
  const double hold = MsSince(flipped);
  report_.max_hold_ms = std::max(report_.max_hold_ms, hold);
  ClusterMap next = map_;
  for (auto& [dst, slots] : by_dst) {
    for (uint32_t slot : slots) next.importing[slot] = ClusterMap::kNoServer;
  }
  TESSERA_RETURN_IF_ERROR(Cas(std::move(next)));
  for (auto& [src, slots] : by_src) {
    TESSERA_ASSIGN_OR_RETURN(Client * c, Server(src));
    TESSERA_RETURN_IF_ERROR(UntilSeen(c, [&] {
      return Done(c->DropSlots(0, map_.version, slots, o_.deadline));
    }).status());
  }
  uint32_t count = 0;
  for (auto& [pair, slots] : moves) count += static_cast<uint32_t>(slots.size());
  report_.slots_moved += count;
  ++report_.batches;
  if (o_.log != nullptr) {
    std::fprintf(o_.log,
                 "moved %u slots at map version %llu; held %.1f ms (copied at %.1f)\n", count,
                 static_cast<unsigned long long>(v), hold, copied_ms);
  }
  return Status::OK();
}

Status Controller::SettleFills(const std::map<std::pair<uint16_t, uint16_t>, Marks>& ahead) {
  MovePairs fills;  // (primary, backup) -> slots
  std::map<uint16_t, std::vector<uint32_t>> by_backup;
  for (uint32_t slot = 0; slot < kNumSlots; ++slot) {
    if (map_.importing[slot] == ClusterMap::kNoServer ||
        map_.importing[slot] != map_.primary[slot]) {
      continue;
    }
    fills[{map_.primary[slot], map_.backup[slot]}].push_back(slot);
    by_backup[map_.backup[slot]].push_back(slot);
  }
  if (fills.empty()) return Status::OK();
  const auto flipped = SteadyClock::now();
  const uint64_t v = map_.version;
  Client::SlotExportRequest how;
  how.backup_fill = true;
  for (auto& [pair, slots] : fills) TESSERA_RETURN_IF_ERROR(CopyAtFlip(pair, slots, how, ahead, v));
  TESSERA_RETURN_IF_ERROR(MarkIn(by_backup, v));
  const double hold = MsSince(flipped);
  report_.max_hold_ms = std::max(report_.max_hold_ms, hold);
  ClusterMap next = map_;
  uint32_t count = 0;
  for (auto& [backup, slots] : by_backup) {
    for (uint32_t slot : slots) next.importing[slot] = ClusterMap::kNoServer;
    count += static_cast<uint32_t>(slots.size());
  }
  TESSERA_RETURN_IF_ERROR(Cas(std::move(next)));
  report_.slots_backed += count;
  ++report_.batches;
  if (o_.log != nullptr) {
    std::fprintf(o_.log, "gave %u slots a backup at map version %llu; held %.1f ms\n", count,
                 static_cast<unsigned long long>(v), hold);
  }
  return Status::OK();
}

Status Controller::CopyAtFlip(const std::pair<uint16_t, uint16_t>& pair,
                              const std::vector<uint32_t>& slots, Client::SlotExportRequest how,
                              const std::map<std::pair<uint16_t, uint16_t>, Marks>& ahead,
                              uint64_t v) {
  TESSERA_ASSIGN_OR_RETURN(Client * src, Server(pair.first));
  TESSERA_ASSIGN_OR_RETURN(Client * dst, Server(pair.second));
  auto a = ahead.find(pair);
  if (a != ahead.end()) how.since = a->second.steps;
  Marks marks;
  uint64_t n = 0;
  Status copied = Copy(src, dst, v, slots, how, Client::SlotImportStep::kRows, &marks, &n);
  if (copied.code() == StatusCode::kAlreadyExists) {
    // Marked in already by an earlier run that died before settling: the destination has
    // taken pushes for these slots since, which a copy would overwrite.
    return Status::OK();
  }
  if ((copied.ok() && a != ahead.end() && marks.instance != a->second.instance) ||
      (copied.code() == StatusCode::kInvalidArgument && !how.since.empty())) {
    // The source restarted since the copy ahead (its step counters began again, maybe with
    // another number of lanes): every row.
    how.since.clear();
    copied = Copy(src, dst, v, slots, how, Client::SlotImportStep::kRows, &marks, &n);
  }
  TESSERA_RETURN_IF_ERROR(copied);
  report_.rows_in_hold += n;
  return Status::OK();
}

Status Controller::MarkIn(const std::map<uint16_t, std::vector<uint32_t>>& by_dst, uint64_t v) {
  for (auto& [dst, slots] : by_dst) {
    TESSERA_ASSIGN_OR_RETURN(Client * c, Server(dst));
    TESSERA_RETURN_IF_ERROR(UntilSeen(c, [&] {
      return Done(c->ImportSlots(0, v, slots, Client::SlotImportStep::kDone, {}, o_.deadline));
    }).status());
  }
  return Status::OK();
}

void Controller::Pace(SteadyClock::time_point start) const {
  if (o_.pace < 1) {
    std::this_thread::sleep_for(
        std::chrono::duration<double, std::milli>(MsSince(start) * (1 / o_.pace - 1)));
  }
}

Status Controller::Batch(ClusterMap next, const MovePairs& pairs,
                         const std::map<uint16_t, std::vector<uint32_t>>& drop, bool fill,
                         bool more) {
  // A destination may hold rows of these slots from an earlier stay: deleted while it does not
  // own them (nothing writes them there then), so that the copy lands on nothing stale.
  for (auto& [dst, slots] : drop) {
    TESSERA_ASSIGN_OR_RETURN(Client * c, Server(dst));
    TESSERA_RETURN_IF_ERROR(UntilSeen(c, [&] {
      return Done(c->DropSlots(0, map_.version, slots, o_.deadline));
    }).status());
  }
  // The rows go over while the sources still serve them; the flip then holds requests only
  // while the rows updated since are copied.
  const auto batch_start = SteadyClock::now();
  std::map<std::pair<uint16_t, uint16_t>, Marks> ahead;
  TESSERA_RETURN_IF_ERROR(CopyAhead(pairs, &ahead));
  TESSERA_RETURN_IF_ERROR(Cas(std::move(next)));
  TESSERA_RETURN_IF_ERROR(fill ? SettleFills(ahead) : Settle(ahead));
  if (more) Pace(batch_start);
  return Status::OK();
}

Result<ScaleReport> Controller::Rebuild() {
  command_ = "map rebuild";
  const auto t0 = SteadyClock::now();
  TESSERA_RETURN_IF_ERROR(Lock());
  TESSERA_ASSIGN_OR_RETURN(map_, store_.Load());
  report_.from_version = map_.version;
  // Fills an interrupted run left flipped: given up where a server of theirs died, else done.
  TESSERA_RETURN_IF_ERROR(DropDeadFills());
  TESSERA_RETURN_IF_ERROR(SettleFills());
  TESSERA_RETURN_IF_ERROR(SettleDenseFills());
  // The servers of the map that are registered now (a dead one not failed over yet is not).
  TESSERA_ASSIGN_OR_RETURN(std::vector<bool> live, Registered(map_, /*with_leaving=*/false));
  // Each slot of a live primary without a backup gets the next live server after it.
  std::vector<std::pair<uint32_t, uint16_t>> plan;
  for (uint32_t slot = 0; slot < kNumSlots; ++slot) {
    const uint16_t p = map_.primary[slot];
    if (map_.backup[slot] != ClusterMap::kNoServer || map_.importing[slot] != ClusterMap::kNoServer ||
        !live[p]) {
      continue;
    }
    const uint16_t n = static_cast<uint16_t>(map_.servers.size());
    for (uint16_t k = 1; k < n; ++k) {
      const uint16_t b = static_cast<uint16_t>((p + k) % n);
      if (live[b]) {
        plan.push_back({slot, b});
        break;
      }
    }
  }
  if (plan.empty()) {
    for (uint32_t slot = 0; slot < kNumSlots; ++slot) {
      if (map_.backup[slot] == ClusterMap::kNoServer && live[map_.primary[slot]]) {
        return Status::FailedPrecondition(
            "slot " + std::to_string(slot) + " has no backup and no other live server to " +
            "take one: a backup needs at least 2 registered servers");
      }
    }
  }
  for (size_t i = 0; i < plan.size(); i += o_.batch_slots) {
    TESSERA_RETURN_IF_ERROR(MayContinue());
    ClusterMap next = map_;
    MovePairs pairs;
    std::map<uint16_t, std::vector<uint32_t>> by_backup;
    for (size_t j = i; j < std::min(plan.size(), i + o_.batch_slots); ++j) {
      const auto [slot, b] = plan[j];
      pairs[{next.primary[slot], b}].push_back(slot);
      next.backup[slot] = b;
      next.importing[slot] = next.primary[slot];
      by_backup[b].push_back(slot);
    }
    TESSERA_RETURN_IF_ERROR(Batch(std::move(next), pairs, by_backup, /*fill=*/true,
                                  /*more=*/i + o_.batch_slots < plan.size()));
  }
  TESSERA_RETURN_IF_ERROR(RebuildDense(live));
  report_.to_version = map_.version;
  report_.seconds = MsSince(t0) / 1000;
  return report_;
}

Result<ScaleReport> Controller::Run() {
  const auto t0 = SteadyClock::now();
  TESSERA_RETURN_IF_ERROR(Lock());
  TESSERA_ASSIGN_OR_RETURN(map_, store_.Load());
  report_.from_version = map_.version;
  const bool replicated = Replicated(map_);
  // What an interrupted run left flipped: backup fills (given up where a server of theirs
  // died), then moves.
  TESSERA_RETURN_IF_ERROR(DropDeadFills());
  TESSERA_RETURN_IF_ERROR(SettleFills());
  TESSERA_RETURN_IF_ERROR(SettleDenseFills());
  TESSERA_RETURN_IF_ERROR(Settle());
  std::vector<uint16_t> targets;
  for (uint16_t id = 0; id < map_.servers.size(); ++id) {
    if (!map_.servers[id].address.empty() && targets.size() < o_.servers) targets.push_back(id);
  }
  if (replicated && o_.servers < 2) {
    return Status::FailedPrecondition(
        "map version " + std::to_string(map_.version) +
        " is replicated: each slot needs a backup on another server, so it keeps at least 2");
  }
  TESSERA_RETURN_IF_ERROR(AddServers(&targets));
  TESSERA_RETURN_IF_ERROR(MoveDense(targets));
  if (replicated) {
    TESSERA_RETURN_IF_ERROR(MoveReplicated(targets));
    // Dense backups among the servers kept, the added ones included (a part whose backup
    // died has none until now).
    TESSERA_RETURN_IF_ERROR(KeepDense(targets));
  } else {
    const auto moves = PlanMoves(map_, targets);
    for (size_t i = 0; i < moves.size(); i += o_.batch_slots) {
      TESSERA_RETURN_IF_ERROR(MayContinue());
      ClusterMap next = map_;
      std::map<uint16_t, std::vector<uint32_t>> by_dst;
      MovePairs pairs;
      for (size_t j = i; j < std::min(moves.size(), i + o_.batch_slots); ++j) {
        const auto [slot, to] = moves[j];
        pairs[{next.primary[slot], to}].push_back(slot);
        next.importing[slot] = next.primary[slot];
        next.primary[slot] = to;
        by_dst[to].push_back(slot);
      }
      TESSERA_RETURN_IF_ERROR(Batch(std::move(next), pairs, by_dst, /*fill=*/false,
                                    /*more=*/i + o_.batch_slots < moves.size()));
    }
  }
  // Drained servers own nothing now: retire their ids.
  TESSERA_RETURN_IF_ERROR(RetireOthers(targets));
  report_.to_version = map_.version;
  report_.seconds = MsSince(t0) / 1000;
  return report_;
}

}  // namespace reshard
}  // namespace tessera::internal

namespace tessera {

Result<ScaleReport> ScaleCluster(EtcdClient& etcd, const std::string& prefix,
                                 const ClientOptions& base, const ScaleOptions& options) {
  if (options.servers == 0) return Status::InvalidArgument("scale to 0 servers");
  if (options.batch_slots == 0) return Status::InvalidArgument("a batch of 0 slots");
  if (!(options.pace > 0 && options.pace <= 1)) {
    return Status::InvalidArgument("pace " + std::to_string(options.pace) + " is not in (0, 1]");
  }
  internal::reshard::Controller c(etcd, prefix, base, options);
  return c.Run();
}

Result<ScaleReport> RebuildBackups(EtcdClient& etcd, const std::string& prefix,
                                   const ClientOptions& base, const ScaleOptions& options) {
  if (options.batch_slots == 0) return Status::InvalidArgument("a batch of 0 slots");
  if (!(options.pace > 0 && options.pace <= 1)) {
    return Status::InvalidArgument("pace " + std::to_string(options.pace) + " is not in (0, 1]");
  }
  internal::reshard::Controller c(etcd, prefix, base, options);
  return c.Rebuild();
}

}  // namespace tessera
