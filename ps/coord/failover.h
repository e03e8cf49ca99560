// Fail-over of a replicated cluster map (--replication=2, docs/elasticity.md "Replication and
// fail-over"): the backups of dead servers' slots become their primaries by one
// compare-and-swap of the map.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "ps/coord/cluster_map.h"
#include "ps/coord/etcd_client.h"
#include "ps/status.h"

namespace tessera {

/// What PromoteBackups did to a map, and what it could not do.
struct Promotion {
  /// The next map (version + 1) when `changed`, else the input map as it was.
  ClusterMap map;
  /// True when `map` differs from the input (and has its version + 1).
  bool changed = false;
  /// Slots whose primary became their backup: (dead server, new primary) -> slots.
  std::map<std::pair<uint16_t, uint16_t>, uint32_t> promoted;
  /// Slots whose primary is dead with no live backup: dead server -> slots. They keep their
  /// primary and are unavailable until it comes back (restarted on its --data_dir).
  std::map<uint16_t, uint32_t> unavailable;
  /// Slots whose dead backup was removed (backup = none).
  uint32_t backups_cleared = 0;
  /// Slots being moved by a resharding (importing set) whose primary or source is dead: left
  /// untouched (resharding during a failure is not handled; `tessera-ctl scale` refuses a
  /// replicated map anyway).
  uint32_t importing_untouched = 0;
  /// Dense parts whose primary became their backup: (dead server, new primary) -> parts.
  std::map<std::pair<uint16_t, uint16_t>, uint32_t> dense_promoted;
  /// Dense parts whose primary is dead with no live backup (among them every part of a dead
  /// server of a map without dense_primary): dead server -> parts. They keep their primary and
  /// are unavailable until it comes back.
  std::map<uint16_t, uint32_t> dense_unavailable;
  /// Dense parts whose dead backup was removed (backup = none).
  uint32_t dense_backups_cleared = 0;
  /// Dead servers retired by this change (address emptied; ids are never reused).
  std::vector<uint16_t> retired;
  /// Total of `promoted`.
  uint32_t slots_promoted() const;
  /// Total of `dense_promoted`.
  uint32_t dense_parts_promoted() const;
};

/// The map after the servers `dead` (server ids of `map`) died. Each slot (unless importing, see
/// below) whose primary is dead and whose backup is alive (a server with an address, not in
/// `dead`) gets primary = backup, backup = none; one whose primary is dead without a live
/// backup keeps its primary (reported in `unavailable`); one whose backup is dead gets
/// backup = none. A slot with importing set whose primary or importing source is dead is left
/// as it is (`importing_untouched`). Dense parts are treated like slots: one whose primary
/// (dense_primary[p], server p when that is empty) is dead and whose backup is alive gets
/// primary = backup, backup = none (`dense_promoted`; an empty dense_primary is filled in
/// first); one whose primary is dead without a live backup keeps it (`dense_unavailable`); a
/// dead dense backup is removed (`dense_backups_cleared`); a part being moved to another
/// primary (dense_importing another server) whose new primary is dead is left as it is
/// (`dense_unavailable`). A dead server that no slot (as primary, backup or importing source)
/// and no dense part (as primary, backup or importing source) names any more is retired (its
/// address emptied): the retired id tells clients to send what they had in flight there to
/// the promoted backups. So a dead server of a map without dense
/// replication (no dense_primary) that holds dense part p (p < dense_servers) stays in the
/// map, unavailable like a slot without a backup, until it comes back. Ids of `dead` that
/// are already retired are ignored. The result validates; `changed` is false (and the version
/// the same) when nothing changes. InvalidArgument when `map` does not validate or `dead`
/// names no server of it. Pure: no etcd.
Result<Promotion> PromoteBackups(const ClusterMap& map, const std::vector<uint16_t>& dead);

/// What changed from `before` to `after` (a later version of the same map), in words for an
/// operator whose compare-and-swap lost to it: servers retired, taken in or added, slots and
/// dense parts failed over to their backups (a fail-over: their primary died), slots moved
/// (a scale), backups removed or given (a rebuild), fills and moves started or finished.
/// "" when no slot, dense part or server changed. Pure.
std::string DescribeMapChange(const ClusterMap& before, const ClusterMap& after);

/// Options of a FailoverWatcher.
struct FailoverOptions {
  /// The cluster's key prefix (CoordinatorUrl::prefix), e.g. "/tessera/job1". Required.
  std::string prefix;
  /// The membership id of the process running the watcher (e.g. "server-0"). Never counted
  /// dead by this watcher, and the watcher does nothing while that member is not listed (its
  /// own registration is lost or not made yet: its view of the others is not to be trusted).
  /// Required.
  std::string self_id;
  /// How often the members and the map are read, in milliseconds (> 0). Default: 200.
  int poll_ms = 200;
  /// Called with one line per event worth a log line (a promotion, slots left unavailable, a
  /// failed read or write of etcd), on the watcher's thread; must not destroy the watcher.
  /// Default: none.
  std::function<void(const std::string&)> log;
  /// Called after each map change this watcher stored (with what it did), on the watcher's
  /// thread; must not destroy the watcher. Default: none.
  std::function<void(const Promotion&)> on_promoted;
  /// Called on the watcher's thread, at most every `unbacked_every_ms`, while no server is
  /// dead (or every slot of a dead server that has a live backup was promoted: what is left
  /// of it has no live copy and waits for it), this process is the lowest live server of the
  /// map, at least two are live, and a slot or dense part (of a map with dense backups) whose
  /// primary is live has no backup and none being filled: a backup rebuild is due (the
  /// promoting server's died with it, gave up, or lost to another controller). Must not
  /// destroy the watcher. Default: none.
  std::function<void()> on_unbacked;
  int unbacked_every_ms = 5000;
  /// Called on the watcher's thread, at most every `unbacked_every_ms`, while every server of
  /// the map is live, this process is the lowest of them, and servers are registered under the
  /// next unused ids (server-<n>, server-<n+1>, ... for a map of n ids) or under retired ids
  /// (restarted under their old --rank), or a server of the map is named by no slot (a scale
  /// that stopped after adding it): with the number of servers the
  /// map should have (its live ones and those registered), for a `scale` to take them in. Also
  /// for a map without backups. Must not destroy the watcher. Default: none.
  std::function<void(uint32_t servers)> on_joined;
};

/// Promotes the backups of dead servers. Every poll period its thread reads the live members
/// (PREFIX/members/*) and the map (PREFIX/slotmap). A server of the map with an address is dead
/// when its member key is absent and this watcher saw it listed earlier: a cluster whose
/// servers register one by one, or restart one after another, promotes nothing while they come
/// up (see failover.cc for why a server never seen is not presumed dead). The map after
/// PromoteBackups is stored by a compare-and-swap from the version read; a lost swap (another
/// server's watcher, or another writer, changed the map) is simply read again next period, so
/// any number of watchers on one cluster are safe and the change is made once. A map that is
/// not replicated (ClusterMap::Replicated: replication 1 and no backup of a slot or a dense
/// part) is not looked at further unless `on_joined` is set (no member read): nothing in it
/// can be promoted. A replicated map whose backups are all gone (a double failure) is: a
/// rebuild is due (`on_unbacked`). With no server dead, the lowest live
/// server's watcher also reports rebuilds due (`on_unbacked`; also once the dead servers'
/// slots that could be promoted were) and servers waiting to join (`on_joined`).
/// Thread-safe; destruction stops the thread and joins it. Borrows `etcd`, which must outlive
/// the watcher.
class FailoverWatcher {
 public:
  /// Starts the thread; InvalidArgument for bad options.
  static Result<std::unique_ptr<FailoverWatcher>> Start(EtcdClient* etcd, FailoverOptions options);
  ~FailoverWatcher();
  FailoverWatcher(const FailoverWatcher&) = delete;
  FailoverWatcher& operator=(const FailoverWatcher&) = delete;

  /// Stops the thread and waits for it (a round in progress finishes first). Idempotent.
  void Stop();
  /// Map changes this watcher stored (compare-and-swaps it won).
  int64_t promotions() const { return promotions_.load(); }
  /// Slots whose backup this watcher made primary, over all its changes.
  int64_t slots_promoted() const { return slots_promoted_.load(); }
  /// Polls completed (whatever they found).
  int64_t rounds() const { return rounds_.load(); }
  /// OK, or the error of the last poll that failed (an etcd read or write).
  Status last_error() const;

 private:
  FailoverWatcher(EtcdClient* etcd, FailoverOptions options);
  void Loop();
  // One poll: read, decide, swap.
  Status Round();
  // Calls on_unbacked when `map` (no server dead) is due a backup rebuild by this process.
  void CheckBackedUp(const ClusterMap& map, const std::set<std::string>& listed);
  // Calls on_joined when servers registered under the next ids of `map` wait to be taken in.
  void CheckJoined(const ClusterMap& map, const std::set<std::string>& listed,
                   const std::set<std::string>& leaving);
  void Log(const std::string& line) const;
  // A log line per thing a stored promotion did.
  void LogPromotion(const Promotion& p) const;

  EtcdClient* const etcd_;
  const FailoverOptions options_;
  std::set<std::string> seen_alive_;  // member ids listed at some poll; the thread's alone
  std::string last_unavailable_;      // the last "unavailable" line logged; the thread's alone
  std::string last_logged_error_;     // the last error logged; the thread's alone
  std::chrono::steady_clock::time_point last_unbacked_{};  // the thread's alone
  std::chrono::steady_clock::time_point last_joined_{};    // the thread's alone
  std::mutex stop_mu_;                // held through a whole Stop(): later callers wait
  std::atomic<int64_t> promotions_{0};
  std::atomic<int64_t> slots_promoted_{0};
  std::atomic<int64_t> rounds_{0};
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;  // guarded by mu_
  Status last_error_;      // guarded by mu_
  std::thread thread_;
};

}  // namespace tessera
