// The controller of online resharding and backup rebuilds (docs/elasticity.md): moves slots
// and dense parts among the servers of a cluster map in etcd, and gives backups to the slots
// that lack one, while clients go on training. tessera-ctl scale and map rebuild call
// ScaleCluster and RebuildBackups; tessera-server runs them in the background
// (BackgroundController: a rebuild after a fail-over, --auto_join) and drains itself before it
// stops (DrainServer, --drain_on_stop). Library tessera_control; it needs tessera_coord (etcd),
// which a client-only build lacks.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>

#include "ps/client/client.h"
#include "ps/coord/etcd_client.h"
#include "ps/status.h"

namespace tessera {

class Membership;
namespace internal {
class BackgroundRun;
}  // namespace internal

/// What a scale or a rebuild does and how fast.
struct ScaleOptions {
  /// The number of live servers wanted (server ids 0.. that have an address, plus new ids
  /// registered under PREFIX/members/server-<id>).
  uint32_t servers = 0;
  /// Slots moved per map flip: the requests for a moving slot wait while its batch copies.
  uint32_t batch_slots = 1024;
  /// The share of wall time the controller spends moving: after each batch it waits
  /// (1/pace - 1) times as long as the batch took, leaving the servers' cores to training in
  /// between (1: no pause). Default 0.5.
  double pace = 0.5;
  /// Rows per SlotImport request at most about this many bytes.
  size_t max_piece_bytes = size_t{64} << 20;
  Deadline deadline = NoDeadline();
  /// Progress lines (one per batch) go here; null: none.
  std::FILE* log = nullptr;
  /// When set and true, the run stops before its next batch (Cancelled); a batch under way
  /// finishes or fails by its calls' timeouts. A rebuild that stops so leaves nothing flipped.
  const std::atomic<bool>* cancel = nullptr;
  /// The run holds the controller lock (PREFIX/controller, ps/coord/membership.h) under a
  /// lease of this TTL, recorded as held by `controller_id`; it stops before its next batch
  /// (Unavailable) if the lease is lost.
  std::string controller_id = "tessera-ctl";
  int64_t controller_ttl_s = 10;
  /// Another controller holds the lock: wait for it until `deadline` (true), or fail at once
  /// with FailedPrecondition naming the holder (false).
  bool wait_for_controller = true;
};

/// What a scale or a rebuild did.
struct ScaleReport {
  uint64_t from_version = 0, to_version = 0;
  /// Slots whose primary moved.
  uint32_t slots_moved = 0;
  /// Slots given a (new) backup: a rebuild's, or a replicated map's resharding.
  uint32_t slots_backed = 0;
  /// The dense parts given a backup, and moved to another primary.
  uint32_t dense_parts_backed = 0;
  uint32_t dense_parts_moved = 0;
  uint32_t batches = 0;
  /// Rows copied while their old owner still served them, and rows copied during the holds
  /// (updated after the copy ahead, or all of a move an interrupted run left flipped); bytes
  /// of both.
  uint64_t rows_ahead = 0, rows_in_hold = 0, bytes_moved = 0;
  double seconds = 0;
  /// The longest time a batch's slots waited: from the flip of the map to the copy being in.
  double max_hold_ms = 0;
};

/// Brings the map under `prefix` to `options.servers` live servers with slots spread evenly,
/// moving as few slots as it can (each server keeps its lowest slots); finishes first any move
/// an interrupted run left flipped. Each batch: delete what the new owners hold of the slots
/// (stale rows of an earlier stay), copy the rows ahead from the old owners (still serving),
/// CAS the map (new primaries, `importing` the old), copy the rows the old owners updated
/// since, mark them in, CAS `importing` away, delete them from the old owners. Ends by
/// retiring drained ids. The dense parts of a server it drains move first, all in one flip; a
/// replicated map moves its backups too and keeps a backup for every slot and dense part among
/// the servers it keeps. `base` is the client options of its calls to the servers (each gets a
/// client of its own). Holds the controller lock for the run. InvalidArgument for 0 servers,
/// 0 batch slots or a pace outside (0, 1]; FailedPrecondition when a server id it needs is not
/// registered, or (without `wait_for_controller`) another controller holds the lock.
Result<ScaleReport> ScaleCluster(EtcdClient& etcd, const std::string& prefix,
                                 const ClientOptions& base, const ScaleOptions& options);

/// Gives every slot whose primary is a registered server and which has no backup a backup: the
/// next registered server after its primary (docs/elasticity.md, "Backup rebuild"); finishes
/// first any fill an interrupted run left flipped. Each batch: delete what the new backups hold
/// of the slots, copy the rows ahead from the primaries (serving), CAS the map (backup set,
/// `importing` the primary: the primaries forward the slots' pushes to the backups, which hold
/// them), copy the rows the primaries updated since, mark them in (the backups apply what
/// they held), CAS `importing` away. `options.servers` is not used. FailedPrecondition when a
/// slot without a backup has no other registered server to take one.
Result<ScaleReport> RebuildBackups(EtcdClient& etcd, const std::string& prefix,
                                   const ClientOptions& base, const ScaleOptions& options);

/// The client options of a server's own calls to the other servers (a background rebuild, a
/// scale, a drain): a 30 s request timeout and, with `curve_secret_key` (this server's CurveZMQ
/// secret key; the servers share one key pair), its public key as the servers' key and the
/// peer key pair `curve_peer_secret_key` (empty: the server key pair) as the client's own, which
/// the servers give the peer right (slot moves). Empty `curve_secret_key`: plain TCP.
ClientOptions PeerClientOptions(const std::string& curve_secret_key,
                                const std::string& curve_peer_secret_key = "");

/// How much a line of a server's controller matters.
enum class ControlLogLevel { kDebug, kInfo, kWarning };
/// Where a server's controller writes its lines (tessera-server: glog; kDebug at VLOG(1)).
/// Called from the controller's threads.
using ControlLog = std::function<void(ControlLogLevel, const std::string&)>;

/// What a server's background controller runs, and as whom.
struct BackgroundControllerOptions {
  /// The cluster's key prefix in etcd (the PREFIX of --coordinator).
  std::string prefix;
  /// This server's id in the map (its --rank): the runs hold the controller lock as
  /// "server-<id>".
  uint32_t server_id = 0;
  /// Lease TTL of the controller lock, in seconds. Default 10.
  int64_t lock_ttl_s = 10;
  /// Share of wall time a run spends copying (ScaleOptions::pace), in (0, 1]. Default 0.5.
  double pace = 0.5;
  /// Rebuild() runs a backup rebuild (--rebuild_backups). Default true.
  bool rebuild_backups = true;
  /// Join() runs a scale taking in the servers registered under the next ids (--auto_join).
  /// Default false.
  bool auto_join = false;
  /// The client options of the runs' calls to the servers (PeerClientOptions).
  ClientOptions peer;
  /// What each run did (kInfo, when it changed the map) and why one failed (kWarning; kDebug
  /// when another controller held the lock, as the work is kicked again while it is due).
  /// Null: no lines.
  ControlLog log;
};

/// A server's background controller: a backup rebuild after a promotion the server made or
/// when one is due, and a scale taking in new servers. Each runs on a thread of its own after
/// each kick, once more when kicked while it runs; each run is a RebuildBackups or
/// ScaleCluster with the options' pace, a 10 minute deadline, and no wait for the controller
/// lock (a run that finds it held gives up; it is kicked again while the work is due).
/// Rebuild() and Join() may be called from any thread, but not during Stop() or destruction.
/// Borrows `etcd`, which must outlive it. Destruction stops as Stop() does.
class BackgroundController {
 public:
  BackgroundController(EtcdClient* etcd, BackgroundControllerOptions options);
  ~BackgroundController();
  BackgroundController(const BackgroundController&) = delete;
  BackgroundController& operator=(const BackgroundController&) = delete;

  /// Kicks a backup rebuild; nothing without `rebuild_backups`.
  void Rebuild();
  /// True with `auto_join`: Join() runs scales.
  bool joins() const { return join_ != nullptr; }
  /// Kicks a scale to `servers` servers; nothing without `auto_join`.
  void Join(uint32_t servers);
  /// Stops the runs before their next batches and joins their threads; later kicks do
  /// nothing. Idempotent.
  void Stop();

 private:
  EtcdClient* const etcd_;
  const BackgroundControllerOptions options_;
  std::atomic<uint32_t> join_servers_{0};
  std::unique_ptr<internal::BackgroundRun> rebuild_, join_;
};

/// How a server drains itself before it stops.
struct DrainOptions {
  /// The cluster's key prefix in etcd (the PREFIX of --coordinator).
  std::string prefix;
  /// This server's id in the map (its --rank); the drain holds the controller lock as
  /// "server-<id>-drain", waiting for another holder.
  uint32_t server_id = 0;
  /// Lease TTL of the controller lock, in seconds. Default 10.
  int64_t lock_ttl_s = 10;
  /// Give up the drain after this many seconds. Default 600.
  int64_t timeout_s = 600;
  /// The client options of the drain's calls to the servers (PeerClientOptions).
  ClientOptions peer;
  /// Why it did not drain or what the drain did: kInfo, kWarning. Null: no lines.
  ControlLog log;
};

/// Drains server `options.server_id` when it is the highest live id of the map (a StatefulSet
/// scaled down stops its highest ordinal first) and not the last one: marks its member record
/// leaving (`membership`, its registration; no --auto_join watcher takes the retired but still
/// registered id back, nor does a rebuild give it a slot), then a scale to one server fewer
/// moves its slots, dense parts and the backups it holds to the others and retires its id.
/// Otherwise, or when the map cannot be read or the scale fails, it leaves the server
/// undrained; each case is logged with its reason. Blocks until done.
void DrainServer(EtcdClient& etcd, Membership& membership, const DrainOptions& options);

}  // namespace tessera
