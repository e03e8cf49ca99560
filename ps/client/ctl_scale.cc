#include "ps/client/ctl_scale_internal.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <thread>

#include "ps/coord/cluster_map.h"
#include "ps/coord/membership.h"
#include "ps/coord/slot_map_store.h"
#include "ps/slot_rows.h"

namespace tessera::internal {
namespace {

using SteadyClock = std::chrono::steady_clock;

double MsSince(SteadyClock::time_point t) {
  return std::chrono::duration<double, std::milli>(SteadyClock::now() - t).count();
}

// Calls `f` until it is not Unavailable (a server that has not seen the map version yet: its
// watch delivers within milliseconds, and every one of them holds requests for moving slots).
template <typename F>
auto UntilSeen(Deadline deadline, F f) -> decltype(f()) {
  for (;;) {
    auto r = f();
    if (r.ok() || r.status().code() != StatusCode::kUnavailable || Clock::now() >= deadline) {
      return r;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}
Result<bool> Done(const Status& s) {
  if (!s.ok()) return s;
  return true;
}

// One client per server id (each a static client of that one server).
class Servers {
 public:
  Servers(const ClientOptions& base) : base_(base) {}
  Result<Client*> Get(uint32_t id, const std::string& address) {
    auto& c = clients_[id];
    if (!c) {
      ClientOptions o = base_;
      o.servers = {address};
      TESSERA_ASSIGN_OR_RETURN(c, Client::Create(o));
    }
    return c.get();
  }

 private:
  ClientOptions base_;
  std::map<uint32_t, std::unique_ptr<Client>> clients_;
};

// The lane marks of an export (ps/slot_rows.h): each lane's step when it read its rows, and the
// instance of the server process.
struct Marks {
  uint64_t instance = 0;
  std::vector<uint64_t> steps;
};
Result<Marks> ReadMarks(const std::vector<SlotMark>& read) {
  Marks m;
  for (const SlotMark& mark : read) {
    if (mark.lane >= 4096) {
      return Status::Corruption("a lane mark of lane " + std::to_string(mark.lane));
    }
    if (m.steps.size() <= mark.lane) m.steps.resize(mark.lane + 1);
    m.steps[mark.lane] = mark.step;
    m.instance = mark.instance;
  }
  return m;
}

// Slots moving from one server to another.
using MovePairs = std::map<std::pair<uint16_t, uint16_t>, std::vector<uint32_t>>;

class Controller {
 public:
  Controller(EtcdClient& etcd, const std::string& prefix, const ClientOptions& base,
             const ScaleOptions& o)
      : etcd_(etcd), prefix_(prefix), store_(&etcd, prefix), servers_(base), o_(o) {}

  Result<ScaleReport> Run();
  Result<ScaleReport> Rebuild();

 private:
  Status Cas(ClusterMap next) {
    next.version = map_.version + 1;
    TESSERA_RETURN_IF_ERROR(store_.CompareAndSwap(map_.version, next));
    map_ = std::move(next);
    return Status::OK();
  }
  Result<Client*> Server(uint32_t id) { return servers_.Get(id, map_.servers[id].address); }
  // Copies the rows of `moves` to their new owners while the old ones still serve them (before
  // the flip); the marks of each export go to *ahead.
  Status CopyAhead(const MovePairs& moves, std::map<std::pair<uint16_t, uint16_t>, Marks>* ahead);
  // Copies the slots the map names as importing (flipped already) and settles them: with
  // `ahead`, only the rows their old owner updated after the copy ahead.
  Status Settle(const std::map<std::pair<uint16_t, uint16_t>, Marks>& ahead = {});
  // Exports `slots` from `src` (given up at `v`) and imports them into `dst` as `step`.
  Status Copy(Client* src, Client* dst, uint64_t v, const std::vector<uint32_t>& slots,
              const Client::SlotExportRequest& how, Client::SlotImportStep step, Marks* marks,
              uint64_t* rows);
  Status AddServers(std::vector<uint16_t>* targets);
  // Copies the slots whose backup the map names as being filled (importing = the primary)
  // from their primaries and marks them in on the backups; with `ahead`, only the rows updated
  // after the copy ahead. Then CASes their importing away.
  Status SettleFills(const std::map<std::pair<uint16_t, uint16_t>, Marks>& ahead = {});
  // The same for dense parts (dense_importing = the part's primary): one copy of their chunks
  // (under the hold: a dense part is small next to a table's slots), done, CAS.
  Status SettleDenseFills();
  // The copy at the flip of the slots of `pair` (source, destination) at version `v`, as `how`
  // and since the marks of the pair's copy ahead (if any); every row again when the source
  // restarted since; nothing when the destination has them marked in already. Counts the rows.
  Status CopyAtFlip(const std::pair<uint16_t, uint16_t>& pair, const std::vector<uint32_t>& slots,
                    Client::SlotExportRequest how,
                    const std::map<std::pair<uint16_t, uint16_t>, Marks>& ahead, uint64_t v);
  // SlotImport done at `v` on each destination for its slots.
  Status MarkIn(const std::map<uint16_t, std::vector<uint32_t>>& by_dst, uint64_t v);
  // One batch of a move (`fill` false) or a rebuild (true): drops what the destinations
  // hold of the slots (`drop`: per destination, the slots it may hold stale rows of), copies
  // them ahead from their sources (`pairs`), CASes `next`, settles; then, when `more` batches
  // follow, paces.
  Status Batch(ClusterMap next, const MovePairs& pairs,
               const std::map<uint16_t, std::vector<uint32_t>>& drop, bool fill, bool more);
  // Gives each dense part of a live primary without a backup the next live server (`live`:
  // per server id), one CAS and one copy for all.
  Status RebuildDense(const std::vector<bool>& live);
  // Waits after a batch that began at `start` so that moving takes `o_.pace` of the time.
  void Pace(SteadyClock::time_point start) const;
  // The dense parts of a map whose servers will be `targets`: FailedPrecondition when a part's
  // primary is not among them (dense parts do not move); with `backups`, the dense backups
  // elsewhere are dropped and every part without one gets one among the targets.
  Status KeepDense(const std::vector<uint16_t>& targets, bool backups);
  // Resharding of a replicated map: in batches of the slots whose primary or backup changes,
  // drops the backups that change (one CAS), moves the primaries (Batch; a backup that stays
  // keeps receiving the slot's pushes), gives the slots their new backups (a backup fill,
  // Batch), so that each slot has one backup again before the next batch.
  Status MoveReplicated(const std::vector<uint16_t>& targets);
  // Retires the ids not among `targets` (nothing names them any more).
  Status RetireOthers(const std::vector<uint16_t>& targets);

  EtcdClient& etcd_;
  std::string prefix_;
  SlotMapStore store_;
  Servers servers_;
  ScaleOptions o_;
  ClusterMap map_;
  ScaleReport report_;
};

Status Controller::AddServers(std::vector<uint16_t>* targets) {
  if (targets->size() >= o_.servers) return Status::OK();
  TESSERA_ASSIGN_OR_RETURN(std::vector<Member> members, ListMembers(etcd_, prefix_));
  ClusterMap next = map_;
  std::vector<uint16_t> added;
  while (targets->size() + added.size() < o_.servers) {
    const uint32_t id = static_cast<uint32_t>(next.servers.size());
    const std::string name = "server-" + std::to_string(id);
    auto it = std::find_if(members.begin(), members.end(),
                           [&](const Member& m) { return m.id == name; });
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
  TESSERA_ASSIGN_OR_RETURN(Client * any, Server(targets->front()));
  TESSERA_ASSIGN_OR_RETURN(std::string specs,
                           any->ExportSlots(0, map_.version, {}, {}, o_.deadline));
  for (uint16_t id : added) {
    TESSERA_ASSIGN_OR_RETURN(Client * c, Server(id));
    TESSERA_RETURN_IF_ERROR(
        c->ImportSlots(0, 0, {}, Client::SlotImportStep::kRows, specs, o_.deadline));
    targets->push_back(id);
  }
  return Status::OK();
}

Status Controller::Copy(Client* src, Client* dst, uint64_t v, const std::vector<uint32_t>& slots,
                        const Client::SlotExportRequest& how, Client::SlotImportStep step,
                        Marks* marks, uint64_t* rows) {
  // Both owners may be a moment behind the map version (their watches): asked again then.
  TESSERA_ASSIGN_OR_RETURN(std::string data, UntilSeen(o_.deadline, [&] {
    return src->ExportSlots(0, v, slots, how, o_.deadline);
  }));
  // One read of the export: the pieces to import, its rows and its lane marks.
  TESSERA_ASSIGN_OR_RETURN(SlotRowsPieces split, SplitSlotRows(data, o_.max_piece_bytes));
  TESSERA_ASSIGN_OR_RETURN(*marks, ReadMarks(split.marks));
  *rows = split.rows;
  for (const std::string& piece : split.pieces) {
    TESSERA_RETURN_IF_ERROR(UntilSeen(o_.deadline, [&] {
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
    TESSERA_RETURN_IF_ERROR(UntilSeen(o_.deadline, [&] {
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
    TESSERA_RETURN_IF_ERROR(UntilSeen(o_.deadline, [&] {
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
    TESSERA_RETURN_IF_ERROR(UntilSeen(o_.deadline, [&] {
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

Status Controller::SettleDenseFills() {
  MovePairs fills;  // (primary, backup) -> parts
  for (uint32_t part = 0; part < map_.dense_importing.size(); ++part) {
    if (map_.dense_importing[part] == ClusterMap::kNoServer) continue;
    fills[{map_.dense_importing[part], map_.dense_backup[part]}].push_back(part);
  }
  if (fills.empty()) return Status::OK();
  const auto flipped = SteadyClock::now();
  const uint64_t v = map_.version;
  uint32_t count = 0;
  for (auto& [pair, parts] : fills) {
    TESSERA_ASSIGN_OR_RETURN(Client * src, Server(pair.first));
    TESSERA_ASSIGN_OR_RETURN(Client * dst, Server(pair.second));
    Client::SlotExportRequest how;
    how.backup_fill = true;
    how.dense_parts = true;
    Marks marks;
    uint64_t n = 0;
    Status copied = Copy(src, dst, v, parts, how, Client::SlotImportStep::kDenseRows, &marks, &n);
    if (copied.code() != StatusCode::kAlreadyExists) {
      TESSERA_RETURN_IF_ERROR(copied);
      report_.rows_in_hold += n;
    }
    TESSERA_RETURN_IF_ERROR(UntilSeen(o_.deadline, [&] {
      return Done(dst->ImportSlots(0, v, parts, Client::SlotImportStep::kDenseDone, {},
                                   o_.deadline));
    }).status());
    count += static_cast<uint32_t>(parts.size());
  }
  const double hold = MsSince(flipped);
  report_.max_hold_ms = std::max(report_.max_hold_ms, hold);
  ClusterMap next = map_;
  next.dense_importing.clear();
  TESSERA_RETURN_IF_ERROR(Cas(std::move(next)));
  report_.dense_parts_backed += count;
  if (o_.log != nullptr) {
    std::fprintf(o_.log, "gave %u dense parts a backup at map version %llu; held %.1f ms\n",
                 count, static_cast<unsigned long long>(v), hold);
  }
  return Status::OK();
}

Status Controller::RebuildDense(const std::vector<bool>& live) {
  // Only a map with dense replication (dense_backup listed) gets dense backups.
  if (map_.dense_backup.empty()) return Status::OK();
  ClusterMap next = map_;
  bool any = false;
  for (uint32_t part = 0; part < map_.dense_servers; ++part) {
    const uint16_t p = map_.dense_primary.empty() ? static_cast<uint16_t>(part)
                                                  : map_.dense_primary[part];
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

Result<ScaleReport> Controller::Rebuild() {
  const auto t0 = SteadyClock::now();
  TESSERA_ASSIGN_OR_RETURN(map_, store_.Load());
  report_.from_version = map_.version;
  TESSERA_RETURN_IF_ERROR(SettleFills());  // fills an interrupted run left flipped
  TESSERA_RETURN_IF_ERROR(SettleDenseFills());
  // The servers of the map that are registered now (a dead one not failed over yet is not).
  TESSERA_ASSIGN_OR_RETURN(std::vector<Member> members, ListMembers(etcd_, prefix_));
  std::vector<bool> live(map_.servers.size(), false);
  for (uint16_t id = 0; id < map_.servers.size(); ++id) {
    const std::string name = "server-" + std::to_string(id);
    live[id] = !map_.servers[id].address.empty() &&
               std::any_of(members.begin(), members.end(),
                           [&](const Member& m) { return m.id == name; });
  }
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
    if (o_.cancel != nullptr && o_.cancel->load()) {
      return Status::Cancelled("backup rebuild stopped after " +
                               std::to_string(report_.slots_backed) + " slots");
    }
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

Status Controller::KeepDense(const std::vector<uint16_t>& targets, bool backups) {
  auto kept = [&](uint16_t id) {
    return std::find(targets.begin(), targets.end(), id) != targets.end();
  };
  for (uint16_t part = 0; part < map_.dense_servers; ++part) {
    const uint16_t p = map_.dense_primary.empty() ? part : map_.dense_primary[part];
    if (!kept(p)) {
      return Status::FailedPrecondition(
          "server " + std::to_string(p) + " holds dense part " + std::to_string(part) +
          " (dense_servers " + std::to_string(map_.dense_servers) +
          "): dense parts do not move, so a cluster of this map keeps that server");
    }
  }
  if (!backups || map_.dense_backup.empty()) return Status::OK();
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
    const auto start = SteadyClock::now();
    const std::vector<uint32_t> batch(changed.begin() + i,
                                      changed.begin() + std::min(changed.size(), i + o_.batch_slots));
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
      TESSERA_RETURN_IF_ERROR(UntilSeen(o_.deadline, [&] {
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

Result<ScaleReport> Controller::Run() {
  const auto t0 = SteadyClock::now();
  TESSERA_ASSIGN_OR_RETURN(map_, store_.Load());
  report_.from_version = map_.version;
  const bool replicated = Replicated(map_);
  // What an interrupted run left flipped: backup fills, then moves.
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
  TESSERA_RETURN_IF_ERROR(KeepDense(targets, /*backups=*/false));
  TESSERA_RETURN_IF_ERROR(AddServers(&targets));
  if (replicated) {
    TESSERA_RETURN_IF_ERROR(MoveReplicated(targets));
    // Dense backups among the servers kept, the added ones included (a part whose backup
    // died has none until now).
    TESSERA_RETURN_IF_ERROR(KeepDense(targets, /*backups=*/true));
  } else {
    const auto moves = PlanMoves(map_, targets);
    for (size_t i = 0; i < moves.size(); i += o_.batch_slots) {
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

}  // namespace

Result<ScaleReport> Scale(EtcdClient& etcd, const std::string& prefix, const ClientOptions& base,
                          const ScaleOptions& options) {
  if (options.servers == 0) return Status::InvalidArgument("scale to 0 servers");
  if (options.batch_slots == 0) return Status::InvalidArgument("a batch of 0 slots");
  if (!(options.pace > 0 && options.pace <= 1)) {
    return Status::InvalidArgument("pace " + std::to_string(options.pace) + " is not in (0, 1]");
  }
  Controller c(etcd, prefix, base, options);
  return c.Run();
}

Result<ScaleReport> RebuildBackups(EtcdClient& etcd, const std::string& prefix,
                                   const ClientOptions& base, const ScaleOptions& options) {
  if (options.batch_slots == 0) return Status::InvalidArgument("a batch of 0 slots");
  if (!(options.pace > 0 && options.pace <= 1)) {
    return Status::InvalidArgument("pace " + std::to_string(options.pace) + " is not in (0, 1]");
  }
  Controller c(etcd, prefix, base, options);
  return c.Rebuild();
}

}  // namespace tessera::internal
