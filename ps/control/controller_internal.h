// The controller of tessera-ctl scale and map rebuild (scale.cc: moves and fills;
// scale_replicated.cc: the controller lock, dense parts, resharding a replicated map).
// Internal to tessera_control.
#pragma once

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "ps/control/scale.h"
#include "ps/control/scale_internal.h"
#include "ps/coord/cluster_map.h"
#include "ps/coord/membership.h"
#include "ps/coord/slot_map_store.h"
#include "ps/slot_rows.h"

namespace tessera::internal::reshard {

using SteadyClock = std::chrono::steady_clock;

inline double MsSince(SteadyClock::time_point t) {
  return std::chrono::duration<double, std::milli>(SteadyClock::now() - t).count();
}

inline Result<bool> Done(const Status& s) {
  if (!s.ok()) return s;
  return true;
}

// One client per server id (each a static client of that one server). A request to a server
// that is down is retried by the client for at most kRetryForMs: the controller retries
// Unavailable itself, looking whether the server still lives (Controller::UntilSeen).
class Servers {
 public:
  static constexpr int64_t kRetryForMs = 2000;
  Servers(const ClientOptions& base) : base_(base) {
    base_.retry_for_ms = std::min(base_.retry_for_ms, kRetryForMs);
  }
  Result<Client*> Get(uint32_t id, const std::string& address) {
    auto& c = clients_[id];
    if (!c) {
      ClientOptions o = base_;
      o.servers = {address};
      TESSERA_ASSIGN_OR_RETURN(c, Client::Create(o));
    }
    return c.get();
  }
  // The server id of a client Get made (kNoServer for another).
  uint16_t IdOf(const Client* c) const {
    for (const auto& [id, client] : clients_) {
      if (client.get() == c) return static_cast<uint16_t>(id);
    }
    return ClusterMap::kNoServer;
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
inline Result<Marks> ReadMarks(const std::vector<SlotMark>& read) {
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

  // How long a server may stay unreachable (Unavailable) while it is still registered before
  // a call to it gives up: a process stopped past its lease, or cut off from the controller.
  static constexpr std::chrono::seconds kUnreachableLimit{60};
  // How often a call to a server that is not answering looks whether it is still registered.
  static constexpr std::chrono::milliseconds kMemberCheck{500};

 private:
  // Calls `f` (a request to `server`) until it is not Unavailable (a server that has not seen
  // the map version yet: its watch delivers within milliseconds, and every one of them holds
  // requests for moving slots), until the run's deadline. A server that died does not come
  // back within a run: when it is no longer registered (looked at every kMemberCheck), or has
  // not answered for kUnreachableLimit, the call gives up, naming it, so that the run ends and
  // frees the controller lock.
  template <typename F>
  auto UntilSeen(const Client* server, F f) -> decltype(f()) {
    const auto first = SteadyClock::now();
    auto checked = first;
    for (;;) {
      auto r = f();
      if (r.ok() || r.status().code() != StatusCode::kUnavailable || Clock::now() >= o_.deadline) {
        return r;
      }
      if (SteadyClock::now() - checked >= kMemberCheck) {
        checked = SteadyClock::now();
        TESSERA_RETURN_IF_ERROR(StillThere(server, r.status(), first));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }
  // OK while `server` (unavailable since `since`, last with `why`) is registered and that was
  // less than kUnreachableLimit ago (or the members cannot be read); else Unavailable saying
  // that it died or does not answer.
  Status StillThere(const Client* server, const Status& why, SteadyClock::time_point since);
  // Per server id of `map`: registered (PREFIX/members) with an address in the map.
  // `leaving` servers count as registered when `with_leaving`.
  Result<std::vector<bool>> Registered(const ClusterMap& map, bool with_leaving);
  // Gives up the fills (backup rebuilds) an interrupted run left flipped whose source (the
  // slot's or part's primary) or destination (its new backup) is not registered: no copy can
  // be made from a dead server, and a dead backup takes none; the slot loses that backup (one
  // CAS). A later batch gives it another one if its primary lives.
  Status DropDeadFills();

  // Stores `next` as the version after map_'s. A lost swap (another writer changed the map:
  // a fail-over needs no controller lock) is FailedPrecondition saying what changed and what
  // to run (LostCas).
  Status Cas(ClusterMap next);
  Status LostCas(const Status& lost);
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
  // The same for dense parts: those whose backup is being filled (dense_importing = the part's
  // primary) and those moving to a new primary (dense_importing = the old one): one copy of
  // their chunks each (under the hold: a dense part is small next to a table's slots), done,
  // CAS.
  Status SettleDenseFills();
  // Moves the dense parts as PlanDense says for `targets` (off servers not among them, then
  // evenly over them): one CAS for all, then their copy (SettleDenseFills).
  Status MoveDense(const std::vector<uint16_t>& targets);
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
  // The dense backups of a replicated map whose servers will be `targets` that are elsewhere
  // are dropped, and every part without one gets one among the targets.
  Status KeepDense(const std::vector<uint16_t>& targets);
  // Resharding of a replicated map: in batches of the slots whose primary or backup changes,
  // drops the backups that change (one CAS), moves the primaries (Batch; a backup that stays
  // keeps receiving the slot's pushes), gives the slots their new backups (a backup fill,
  // Batch), so that each slot has one backup again before the next batch.
  Status MoveReplicated(const std::vector<uint16_t>& targets);
  // Retires the ids not among `targets` (nothing names them any more).
  Status RetireOthers(const std::vector<uint16_t>& targets);

  // Takes the controller lock (ScaleOptions::controller_id), waiting for another holder when
  // asked to.
  Status Lock();
  // OK while the run may go on: not cancelled, the lock still held.
  Status MayContinue() const;

  EtcdClient& etcd_;
  std::string prefix_;
  std::unique_ptr<Membership> lock_;
  SlotMapStore store_;
  Servers servers_;
  ScaleOptions o_;
  ClusterMap map_;
  ScaleReport report_;
  // The command that runs this controller by hand, for messages: "scale" or "map rebuild".
  std::string command_ = "scale";
};

}  // namespace tessera::internal::reshard
