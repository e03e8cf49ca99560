// The server of one shard, in rooms. Each concern's state is a component of its own: the
// cluster map and fencing (map_fence_internal.h), copies of slots and dense parts in
// (slot_migration_internal.h), a primary's replication queue and a backup's parked pushes
// (replication_queue_internal.h), the links to backups (backup_links_internal.h), the
// checkpoint cut (checkpoint_cut_internal.h), pushes held behind a parked push of their client
// (push_order_internal.h), the tables (table_registry_internal.h), push sequence numbers
// (dedup_internal.h), connections and peers (peers_internal.h), metrics
// (server_metrics_internal.h). Lanes (lane_internal.h), the request log
// (request_log_internal.h) and the clocks (consistency_internal.h) are components of their own.
// Small types: lane_part_internal.h (a request's lane parts), io_state_internal.h (the I/O
// thread's bookkeeping), slot_copy_internal.h (what a slot copy carries).
// ServerImpl keeps the sockets, the table registry, Dispatch and the orchestration, one .cc per
// concern, a `// ---- file.cc: what` group below each: server.cc, io_loop.cc, control_ops.cc,
// edge_ops.cc, reshard_ops.cc (moving slots), backup_fill.cc (filling a new backup),
// replication.cc (primary-backup), data_ops.cc (pulls, pushes and their gates), admin_scope.cc
// and admin_ops.cc (checkpoints, restore, exports).
#pragma once

#include <absl/container/flat_hash_set.h>

#include <algorithm>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>
#include <zmq.hpp>

#include "ps/admin_marker.h"
#include "ps/server/access_internal.h"
#include "ps/routing.h"
#include "ps/server/backup_links_internal.h"
#include "ps/server/checkpoint_cut_internal.h"
#include "ps/server/consistency_internal.h"
#include "ps/server/dedup_internal.h"
#include "ps/server/io_state_internal.h"
#include "ps/server/lane_internal.h"
#include "ps/server/lane_part_internal.h"
#include "ps/server/log_wait_internal.h"
#include "ps/server/map_fence_internal.h"
#include "ps/server/map_recheck_internal.h"
#include "ps/server/map_wait_internal.h"
#include "ps/server/peers_internal.h"
#include "ps/server/push_order_internal.h"
#include "ps/server/replication_queue_internal.h"
#include "ps/server/request_internal.h"
#include "ps/server/request_log_internal.h"
#include "ps/server/restore_credits_internal.h"
#include "ps/server/slot_migration_internal.h"
#include "ps/server/snapshot_internal.h"
#include "ps/server/table_registry_internal.h"
#include "ps/server/server.h"
#include "ps/server/server_metrics_internal.h"
#include "ps/table_spec.h"

namespace tessera::internal {

/// Metadata records of drops not finished yet (DropTable), one per table id.
inline constexpr char kDroppedTablePrefix[] = "dropped-table/";

// A slot export's lane part (ServerImpl::ExportLanes): on the lane, freezes what the copy
// reads (LaneSnapshot) and returns the scan that reads it off the lane, writing the rows to
// `out` and counting them.
using ExportScan = std::function<Status(std::string* out, uint64_t* rows)>;
using ExportFreeze = std::function<Result<ExportScan>(Lane&)>;

/// Reads one whole message from `socket` without waiting; false when none is there.
bool TryReceive(zmq::socket_t& socket, std::vector<zmq::message_t>* parts);

/// The server of one shard. Start() binds, recovers and starts the threads; Shutdown() stops
/// them. Everything below the sockets is owned by the I/O thread once it runs, except what the
/// lanes own (their stores).
class ServerImpl {
 public:
  explicit ServerImpl(const ServerOptions& o);
  ~ServerImpl();

  Status Start();
  void Shutdown();
  const std::string& endpoint() const { return endpoint_; }
  // Server::SetClusterMap / cluster_map_version (MapFence).
  Status SetClusterMap(const RoutingMap& map) { return fence_.Set(map); }
  Status SetClusterMapLoader(MapRecheck::Load load) { return recheck_.SetLoader(std::move(load)); }
  uint64_t cluster_map_version() const { return fence_.version(); }

 private:
  // ---- server.cc: start-up, recovery of the table list, shutdown
  Status BindSocket();
  Status ConfigureAccess();  // access_ and, with CurveZMQ, the ZAP handler
  Status CheckDataDirLayout();
  Status RecoverTables(std::vector<std::unique_ptr<LaneStore>>& stores);
  // ---- io_loop.cc: the I/O thread: receive, validate, dispatch, reply
  void IoLoop();
  void ReceiveBurst();
  void Maintain();
  void ForwardReplies();
  bool SendToPeer(std::vector<zmq::message_t>& parts);  // false: not queued
  bool ReplyError(zmq::message_t identity, const Header& req, const Status& s);
  void ReplyOk(zmq::message_t identity, const Header& req, Header h = Header(),
               const std::string* data = nullptr);
  void HandleMessage(std::vector<zmq::message_t> parts);
  void Receive(const std::shared_ptr<Pending>& p, std::vector<zmq::message_t>& parts);
  void NoteDroppedReply(Pending& p);
  Status Dispatch(const std::shared_ptr<Pending>& p);
  Status DataOp(const std::shared_ptr<Pending>& p);  // sparse and dense pulls and pushes
  Status ServeData(const std::shared_ptr<Pending>& p);  // DataOp past MapWait
  Status ExpectFrames(const Pending& p, size_t n);
  Status CheckBudget(uint64_t count, uint64_t floats_per_item, bool with_keys);
  void Readmit(std::vector<std::shared_ptr<Pending>> parked);
  void NoteInlineReply(const Header& req, bool ok, size_t bytes);
  void PublishIoMetrics();
  // ---- control_ops.cc: tables, job metadata, stats, clocks and barriers
  Status CreateTable(const std::shared_ptr<Pending>& p);
  Status DropTable(const std::shared_ptr<Pending>& p);
  Status GetTable(const std::shared_ptr<Pending>& p);
  Status MetaOp(const std::shared_ptr<Pending>& p);
  Status StatsOp(const std::shared_ptr<Pending>& p);
  Status ClockOp(const std::shared_ptr<Pending>& p);
  Status ApplyClock(const std::shared_ptr<Pending>& p);  // ClockOp past MapWait
  Status BarrierOp(const std::shared_ptr<Pending>& p);
  // ---- edge_ops.cc: bounds on connections, peers and requests; the admin root
  Status ConfigureRouterBounds();
  void DrainRouterEvents();
  bool Admitted(const std::shared_ptr<Pending>& p, int fd);  // true: may be dispatched
  Result<std::string> AdminPath(std::string_view name) const;
  // ---- reshard_ops.cc: moving slots (docs/elasticity.md, "Online resharding")
  static uint64_t RandomInstance();
  bool CopyingInRequest(const Pending& p);
  bool ParkedByImport(const std::shared_ptr<Pending>& p);
  void OnMapChanged();
  Result<std::vector<uint32_t>> RequestSlots(const Pending& p);
  Result<const ClusterMapState*> MapAtLeast(const Header& h);
  Status CheckOwnership(const Header& h, const std::vector<uint32_t>& slots, bool must_own);
  Status PersistFilled();
  Status LoadFilled();
  void ExpireImportParked();
  Status ImportSlotRows(const std::shared_ptr<Pending>& p, const std::vector<uint32_t>& slots);
  Status SlotExportOp(const std::shared_ptr<Pending>& p);
  Status SlotImportOp(const std::shared_ptr<Pending>& p);
  Status SlotDropOp(const std::shared_ptr<Pending>& p);
  // ---- backup_fill.cc: filling a new backup (docs/elasticity.md, "Backup rebuild")
  bool HeldForFill(const Pending& p);
  bool DenseHeldForFill(uint32_t part);
  Result<std::vector<uint32_t>> RequestDenseParts(const Pending& p, const ClusterMapState* map);
  Status DenseFillExport(const std::shared_ptr<Pending>& p);  // SlotExport count 3
  Status CheckFillSlots(const std::vector<uint32_t>& slots);
  void ExportLanes(const std::shared_ptr<Pending>& p, uint64_t version, ExportFreeze freeze);
  Status DenseFillImport(const std::shared_ptr<Pending>& p);
  void RunWaitingExports();
  // ---- replication.cc: primary-backup replication (docs/elasticity.md)
  void KeyByOrigin(Pending& p);
  bool ReplicationActive();
  Result<const ClusterMapState*> ReplicaMap(const Header& h);
  Result<uint32_t> DensePartOf(const Header& h, uint64_t length, const std::string& name);
  Status CheckDenseReplica(const Header& h, uint32_t part);
  Status CheckReplica(const Pending& p);  // the fencing of an old primary
  Status ValidateForwarded(Pending& p);  // before it may wait anywhere
  bool ParkedReplica(const std::shared_ptr<Pending>& p);
  void ExpireReplicas();
  Status HoldForFill(const std::shared_ptr<Pending>& p);
  void ReadmitReplicas();
  zmq::socket_t* BackupSocket(uint16_t server);
  void Sequence(const std::shared_ptr<Pending>& p, std::function<void()> release);
  void ForwardDenseToBackup(ReplEntry& e);
  void ForwardToBackups(ReplEntry& e);
  static zmq::message_t EnvelopeOf(const Header& h);
  void SendPiece(ReplPiece& piece);
  void DrainBackupReplies();
  void FailEntry(ReplEntry& e, const Status& why);
  void ReleaseReady();
  void ResendReplication();
  void ReplicationMapChanged();
  void CloseUnusedLinks();
  // ---- data_ops.cc: sparse and dense pulls and pushes, split by lane and answered once
  Status CheckMapVersion(const Header& h, bool exempt_retries = true);
  bool HeldForMap(const std::shared_ptr<Pending>& p);  // MapWait: ahead of this server's map
  void ReadmitMapWait();
  void ExpireMapWait();
  bool IsRetriedPush(const Header& h) const;
  void RunParts(const std::shared_ptr<Pending>& p, std::vector<LanePart> parts, bool writes,
                uint64_t seq, bool may_inline);
  void RunOnAllLanes(const std::shared_ptr<Pending>& p, std::function<Status(Lane&)> fn,
                     bool writes);
  Status Sparse(const std::shared_ptr<Pending>& p);
  Status SubmitSparse(const std::shared_ptr<Pending>& p, KeySplit by_lane);
  Status Dense(const std::shared_ptr<Pending>& p);
  Result<bool> AnsweredAsRetry(const std::shared_ptr<Pending>& p);  // exactly-once pushes
  void LogAndRun(const std::shared_ptr<Pending>& p, std::vector<LanePart> parts, bool may_inline);
  void FlushStaged();  // group commit
  // The group's log write: log_->WriteStaged() when null.
  void FlushStagedWith(const std::function<Status(const std::vector<StagedRun>&)>& write);
  bool StagedFrom(const zmq::message_t& identity) const;
  // ---- log_wait.cc: group commit that serves reads while the disk syncs
  void FlushStagedServingReads();
  Status WriteStagedServingReads(const std::vector<StagedRun>& staged);
  Status SubmitDense(const std::shared_ptr<Pending>& p);
  void SubmitParts(const std::shared_ptr<Pending>& p, std::vector<LanePart> parts, bool push,
                   bool may_inline);
  bool Parked(const std::shared_ptr<Pending>& p);  // true: a gate kept `p`
  bool ParkedByCut(const std::shared_ptr<Pending>& p);
  bool ParkedByStaleness(const std::shared_ptr<Pending>& p);
  bool HeldBehindClient(const std::shared_ptr<Pending>& p);
  void ReleaseHeld(uint64_t client, const Status* refused);
  void GiveBackSeq(const Header& h, bool resend);
  bool ResentUnderItsNumber(const Header& h, const Status& refused);
  Status Resubmit(const std::shared_ptr<Pending>& p);
  // ---- admin_scope.cc: what checkpoints, restores and exports cover under a map
  RowFilter HeldRows(bool with_backups);
  std::shared_ptr<const RowFilter> PrimaryRowsFilter();
  Status CheckAdminMap(const Header& h, const std::string& what);
  uint32_t ClusterSize();
  void AbortCut(const Status& why);
  void AbortCutOnMapChange();
  void AbortExpiredCut();
  void AbortCutForRefusedPush(const Header& h, uint64_t version, bool held = false);
  // ---- admin_ops.cc: checkpoints at a clock cut, restore, serving exports
  Status CheckpointOp(const std::shared_ptr<Pending>& p);
  void TakeSnapshotIfReady();
  void WriteLaneSnapshots(const std::shared_ptr<Pending>& p, const std::string& dir,
                          const SnapshotOptions& options, std::function<Status()> header);
  Result<std::function<Status()>> CheckpointHeader(const std::string& dir, int64_t cut,
                                                   uint64_t map_version);
  Status RestoreOp(const std::shared_ptr<Pending>& p);
  Result<std::vector<std::pair<uint64_t, TableSpec>>> RestoreTables(const std::string& server_dir);
  Status RestoreRows(const std::string& dir, const AdminMarker& marker,
                     const std::function<void(uint32_t, std::function<Status(Lane&)>)>& submit,
                     uint64_t* loaded);
  Status ExportOp(const std::shared_ptr<Pending>& p);
  Result<uint32_t> DeltaSince(const std::string& base);
  std::string ServerDir(const std::string& dir, uint32_t rank) const;

  const ServerOptions options_;
  zmq::context_t ctx_;
  zmq::socket_t router_;   // I/O thread only (after Start)
  AccessPolicy access_;              // who may send peer and admin ops (access_internal.h)
  std::unique_ptr<ZapHandler> zap_;  // CurveZMQ's key check; null without CurveZMQ
  zmq::socket_t replies_;  // I/O thread only
  std::string endpoint_;
  std::unique_ptr<StorageEngine> engine_;
  std::unique_ptr<RequestLog> log_;
  // Pushes logged by the next group write, with their lane parts (FlushStaged).
  std::vector<StagedRun> staged_;
  // The group write's thread (FlushStagedServingReads), the requests read during a write and
  // set aside to be handled after it (at most kMaxSetAside: then the socket waits), and
  // whether the last write's wait read the sockets (IoLoop then looks at all of them).
  LogGroupWriter log_writer_;
  static constexpr size_t kMaxSetAside = 1024;
  std::deque<std::vector<zmq::message_t>> set_aside_;
  bool polled_during_log_write_ = false;
  // Restore batches queued to the lanes (restore_credits_internal.h); before lanes_, whose
  // queued batches hold its credits.
  RestoreCredits restore_credits_{options_.restore_max_queued_batches != 0
                                      ? options_.restore_max_queued_batches
                                      : 2 * std::max<uint32_t>(options_.lanes, 1)};
  std::vector<std::unique_ptr<Lane>> lanes_;
  std::unique_ptr<FileWriter> writer_;
  IoThread io_;  // io_state_internal.h
  // The cluster map (map_fence_internal.h): set on any thread, read by the I/O thread.
  MapFence fence_;
  // A backup's re-read of the map for a forwarded push ahead of it (map_recheck_internal.h);
  // after fence_, which it sets.
  MapRecheck recheck_{[this](const RoutingMap& m) { (void)fence_.Set(m); }};
  // Resharding and backup fills, the copy-in side (slot_migration_internal.h).
  SlotMigration migration_{RandomInstance()};
  // Replication (replication_queue_internal.h): the primary's queue, the backup's held
  // pushes; the links to backups (I/O thread only).
  struct Replication {
    ReplicationQueue queue;
    ReplicaPark park;
    BackupLinks links;
  } repl_{ReplicationQueue(migration_.instance() | 1), ReplicaPark(),
          BackupLinks(ctx_, options_.curve_secret_key, options_.curve_peer_secret_key)};
  // State below is owned by the I/O thread.
  TableRegistry tables_;
  Consistency consistency_;
  PushDedup dedup_;
  IoCounts counts_;  // io_state_internal.h
  // The checkpoint cut and the pushes it parks (checkpoint_cut_internal.h).
  CheckpointCut cut_;
  // Pushes held behind a parked push of their client (push_order_internal.h).
  PushOrder push_order_;
  // Client pushes ahead of this server's map, waiting for it (map_wait_internal.h).
  MapWait map_wait_;
  // True while Readmit runs: a request that waited already is not refused by a park's bound.
  bool readmitting_ = false;
  // The edge (edge_ops.cc): the ROUTER's monitor and the connections it counts, the peers in
  // flight, and the root admin ops resolve their directories under.
  struct Edge {
    zmq::socket_t monitor;  // I/O thread only
    ConnectionTable connections;
    PeerTable peers;
    std::string admin_root;  // canonical; empty: admin ops disabled
  } edge_{zmq::socket_t(ctx_, zmq::socket_type::pair),
          ConnectionTable(options_.max_connections,
                          std::chrono::milliseconds(options_.idle_connection_timeout_ms),
                          options_.max_connections_per_ip),
          PeerTable(options_.max_in_flight_per_peer),
          std::string()};
  // Metrics (server_metrics_internal.h): the registry the options name, else this one.
  std::unique_ptr<metrics::Registry> own_registry_;
  std::unique_ptr<ServerMetrics> metrics_;
  InlineAnswer inline_answer_;  // io_state_internal.h; I/O thread only
};

}  // namespace tessera::internal
