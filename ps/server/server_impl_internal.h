// The server's implementation, one class whose methods live in one file per concern:
//   server.cc      start-up, recovery of the table list, shutdown;
//   io_loop.cc     the I/O thread: receive, validate, dispatch, reply; table and meta ops;
//   data_ops.cc    sparse and dense pulls and pushes, split by lane and answered once;
//   admin_ops.cc   checkpoints at a clock cut, restore, serving exports.
// Lanes (lane_internal.h), the request log (request_log_internal.h) and the clocks
// (consistency_internal.h) are components of their own.
#pragma once

#include <absl/container/flat_hash_map.h>
#include <absl/container/flat_hash_set.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>
#include <zmq.hpp>

#include "ps/admin_marker.h"
#include "ps/routing.h"
#include "ps/server/backup_links_internal.h"
#include "ps/server/checkpoint_cut_internal.h"
#include "ps/server/consistency_internal.h"
#include "ps/server/dedup_internal.h"
#include "ps/server/lane_internal.h"
#include "ps/server/map_fence_internal.h"
#include "ps/server/peers_internal.h"
#include "ps/server/push_order_internal.h"
#include "ps/server/replication_queue_internal.h"
#include "ps/server/request_internal.h"
#include "ps/server/request_log_internal.h"
#include "ps/server/slot_migration_internal.h"
#include "ps/server/snapshot_internal.h"
#include "ps/server/table_registry_internal.h"
#include "ps/server/server.h"
#include "ps/server/server_metrics_internal.h"
#include "ps/slot_rows.h"
#include "ps/table_spec.h"

namespace tessera::internal {

/// Rows a SlotImport brings for one lane, in arrival order: each one's table, key (a dense
/// table's chunk index for dense chunks), metadata and floats (value, then optimizer state)
/// at its offset in `floats`.
struct RowBatch {
  std::vector<uint64_t> tables, keys;
  std::vector<RowMeta> metas;
  std::vector<float> floats;
  std::vector<size_t> offsets;

  /// Appends a row of `n` floats read from `data` (unaligned).
  void Add(uint64_t table, uint64_t key, const SlotRowMeta& m, const char* data, uint32_t n) {
    tables.push_back(table);
    keys.push_back(key);
    metas.push_back(RowMeta{m.update_count, m.last_step, m.last_update_s});
    offsets.push_back(floats.size());
    floats.resize(floats.size() + n);
    std::memcpy(floats.data() + offsets.back(), data, size_t{n} * sizeof(float));
  }
};

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
  uint64_t cluster_map_version() const { return fence_.version(); }

 private:
  // One lane's part of a request: the lane and the body it runs there.
  struct LanePart {
    uint32_t lane;
    std::function<Status(Lane&)> run;
  };

  // ---- server.cc: start-up
  Status BindSocket();
  // Refuses a data_dir written by a server of another rank or cluster size.
  Status CheckDataDirLayout();
  Status RecoverTables(std::vector<std::unique_ptr<LaneStore>>& stores);

  // ---- io_loop.cc: the I/O thread
  void IoLoop();
  void ReceiveBurst();
  void Maintain();
  void ForwardReplies();
  // False when the reply was not queued (the peer is gone, or its queue is full: then the
  // peer is marked stalled).
  bool SendToPeer(std::vector<zmq::message_t>& parts);
  bool ReplyError(zmq::message_t identity, const Header& req, const Status& s);
  void ReplyOk(zmq::message_t identity, const Header& req, Header h = Header(),
               const std::string* data = nullptr);
  void HandleMessage(std::vector<zmq::message_t> parts);
  // HandleMessage's work: decode, admit, dispatch.
  void Receive(const std::shared_ptr<Pending>& p, std::vector<zmq::message_t>& parts);
  // A reply this thread sent for `p` (SendReply) found the peer's queue full: counts it and
  // marks the peer stalled (edge_ops.cc).
  void NoteDroppedReply(Pending& p);
  Status Dispatch(const std::shared_ptr<Pending>& p);
  /// Dispatch of the data ops (sparse and dense pulls and pushes): the origin key, then a
  /// primary's forwarded push to its backup checks (CheckReplica, ParkedReplica), a client's
  /// request to the map version check; then Sparse or Dense.
  Status DataOp(const std::shared_ptr<Pending>& p);
  Status ExpectFrames(const Pending& p, size_t n);
  Status CheckBudget(uint64_t count, uint64_t floats_per_item, bool with_keys);
  Status CreateTable(const std::shared_ptr<Pending>& p);
  Status GetTable(const std::shared_ptr<Pending>& p);
  Status MetaOp(const std::shared_ptr<Pending>& p);
  Status StatsOp(const std::shared_ptr<Pending>& p);
  Status ClockOp(const std::shared_ptr<Pending>& p);
  Status BarrierOp(const std::shared_ptr<Pending>& p);
  // Sends every parked request through the gates again.
  void Readmit(std::vector<std::shared_ptr<Pending>> parked);

  // ---- edge_ops.cc: bounds on connections, peers and requests; the admin root
  /// High-water marks, handshake limit and the socket monitor of the ROUTER (before bind);
  /// resolves the admin root.
  Status ConfigureRouterBounds();
  /// Feeds the ROUTER monitor's accepted/disconnected events to connections_.
  void DrainRouterEvents();
  /// Admits a decoded request that came on connection `fd` (-1: unknown), or answers it with
  /// the reason it is refused (connection limit, envelope limits, in-flight limit) or drops it
  /// (its peer does not read replies). True when it may be dispatched.
  bool Admitted(const std::shared_ptr<Pending>& p, int fd);
  /// `name` resolved under --admin_root; FailedPrecondition when admin ops are disabled.
  Result<std::string> AdminPath(std::string_view name) const;

  // ---- fencing.cc: the cluster map version of data requests
  /// With follow_cluster_map: FailedPrecondition, naming both versions, when data request `h`
  /// carries another map version than the server's. Skipped, when `exempt_retries`, for a
  /// retried push that is already logged or accepted (it applies nothing again;
  /// AnsweredAsRetry answers it). A request checked again after waiting (Resubmit) was
  /// accepted by this server itself, so it is not exempt.
  Status CheckMapVersion(const Header& h, bool exempt_retries = true);
  /// True when `h` retries a push this server accepted already (PushDedup).
  bool IsRetriedPush(const Header& h) const;

  // ---- reshard_ops.cc: moving slots (docs/elasticity.md, "Online resharding")
  /// True when client request `p` touches a slot or dense part whose rows are still being
  /// copied to this server as its (new) primary.
  bool CopyingInRequest(const Pending& p);
  /// True when CopyingInRequest(p): it waits in SlotMigration until SlotImport says the copy
  /// is in (or the map moves), or is refused when too many wait.
  bool ParkedByImport(const std::shared_ptr<Pending>& p);
  /// True when forwarded push `p` (keys read) touches a slot this server is the backup being
  /// filled of and whose copy is not in yet: it waits, in order with every forwarded push after
  /// it, at the head of the ReplicaPark (ReadmitReplicas, once SlotImport says it is in).
  bool HeldForFill(const Pending& p);
  /// After the I/O thread's map moved: forgets copies of slots no longer importing and sends
  /// what waited for a copy through the gates again (fenced by the new version).
  void OnMapChanged();
  /// The slots frame of a SlotExport/SlotImport/SlotDrop request (u32 each, < kNumSlots).
  Result<std::vector<uint32_t>> RequestSlots(const Pending& p);
  /// The map the server serves by (null: none yet), once it is at least the request's version
  /// (Unavailable before: the controller asks again); FailedPrecondition without
  /// follow_cluster_map.
  Result<const ClusterMapState*> MapAtLeast(const Header& h);
  /// MapAtLeast, then FailedPrecondition for a slot this server does not own in that map
  /// (`must_own`: the copy ahead) or owns (otherwise: slots given up, or not taken yet).
  Status CheckOwnership(const Header& h, const std::vector<uint32_t>& slots, bool must_own);
  /// The slots and dense parts marked in (SlotMigration), stored in the
  /// engine's metadata and read back at start: a restarted server that took pushes for them
  /// refuses a repeated copy.
  Status PersistFilled();
  Status LoadFilled();
  /// Answers the requests held longer than SlotMigration::kHoldLimit for a copy (Maintain).
  void ExpireImportParked();
  /// SlotImport's rows step: checks them (DecodeImport), creates the tables they bring, and
  /// writes them in their lanes, durably, before the reply.
  Status ImportSlotRows(const std::shared_ptr<Pending>& p, const std::vector<uint32_t>& slots);
  Status SlotExportOp(const std::shared_ptr<Pending>& p);
  Status SlotImportOp(const std::shared_ptr<Pending>& p);
  Status SlotDropOp(const std::shared_ptr<Pending>& p);

  // ---- replication.cc: primary-backup replication (docs/elasticity.md)
  /// SlotExport's and SlotImport's `count` for dense parts (a backup rebuild): the chunks of
  /// [parts]; SlotImport 3: [parts][chunks], 4: [parts] done.
  static constexpr uint64_t kExportDenseFill = 3;
  static constexpr uint64_t kExportDenseMove = 4;  // dense parts moving away from this server
  static constexpr uint64_t kImportDenseRows = 3;
  static constexpr uint64_t kImportDenseDone = 4;
  /// Runs the exports no older request waits ahead of (after the queue moved).
  void RunWaitingExports();
  /// The lanes' part of SlotExport `p` of map `version`, once no request sequenced by an
  /// older map waits in the replication queue: `scan` writes each lane's rows (after its
  /// marks, if any) to its output and counts them; the output goes to p->text[lane + 1] (the
  /// caller sets p->text, the specs in [0]) and the count to slot_rows_exported.
  void ExportLanes(const std::shared_ptr<Pending>& p, uint64_t version,
                   std::function<Status(Lane&, std::string* out, uint64_t* rows)> scan);
  /// FailedPrecondition for a slot without a backup in the map served by (SlotExport count 2).
  Status CheckFillSlots(const std::vector<uint32_t>& slots);
  /// The parts frame of a dense SlotExport/SlotImport (u32 each, < the map's dense_servers).
  Result<std::vector<uint32_t>> RequestDenseParts(const Pending& p, const ClusterMapState* map);
  /// SlotExport count 3: the chunks of dense parts this server is the primary of whose backup
  /// is being filled, as rows of their tables (key: chunk index), sequenced like a slot fill.
  Status DenseFillExport(const std::shared_ptr<Pending>& p);
  /// SlotImport count 3 (chunks) and 4 (done) on the backup being filled of dense parts.
  Status DenseFillImport(const std::shared_ptr<Pending>& p);
  /// True when forwarded dense push of part `part` waits for that part's fill.
  bool DenseHeldForFill(uint32_t part);
  /// A push that counts in another server's sequence (Header::client_origin) is deduplicated
  /// under the client's id mixed with that server: rewrites header.client_id to that key and
  /// keeps the client's own id in p.origin_client. Every push passes here before anything else.
  void KeyByOrigin(Pending& p);
  /// True while data requests go through the replication queue: the map gives some slot a
  /// backup, or requests still wait there.
  bool ReplicationActive();
  /// A push forwarded by a primary (Header::replica_from): Unavailable while this server is
  /// behind the sender's map; FailedPrecondition unless, in its map, the sender is the primary
  /// and this server the backup of every slot the push touches (the fencing of an old primary).
  Status CheckReplica(const Pending& p);
  /// CheckReplica of a forwarded dense push of dense part `part`.
  Status CheckDenseReplica(const Header& h, uint32_t part);
  /// Unavailable while this server's map is older than forwarded request `h`'s (the primary
  /// asks again); FailedPrecondition without a map.
  Result<const ClusterMapState*> ReplicaMap(const Header& h);
  /// The dense part (DenseRangeOfServer) holding elements [h.offset, h.offset + h.count) of
  /// a table of `length` floats; FailedPrecondition when the range spans two parts.
  Result<uint32_t> DensePartOf(const Header& h, uint64_t length, const std::string& name);
  /// The DEALER to backup `server` (connected on first use, again when its address changed);
  /// null when the map has no address for it.
  zmq::socket_t* BackupSocket(uint16_t server);
  /// Hands `p` to `release` at once, or, while replication is active, after every request
  /// ahead of it and, for a push, after its backups answered.
  void Sequence(const std::shared_ptr<Pending>& p, std::function<void()> release);
  /// Splits the push of `e` by the backup of its keys' slots and sends each backup its part.
  void ForwardToBackups(ReplEntry& e);
  /// Sends the dense push of `e` to the backup of its dense part, if it has one.
  void ForwardDenseToBackup(ReplEntry& e);
  static zmq::message_t EnvelopeOf(const Header& h);
  void SendPiece(ReplPiece& piece);
  /// Counts the backups' answers: OK completes a piece, Unavailable sends it again soon, any
  /// other error fails the entry (nothing applied; the client is told to retry).
  void DrainBackupReplies();
  void FailEntry(ReplEntry& e, const Status& why);
  /// Runs the entries at the head of the queue whose backups all answered.
  void ReleaseReady();
  /// Sends again the pieces due (ReplicationQueue::Due) and fails the orphans past the limit.
  void ResendReplication();
  /// After a map change: a piece whose backup the map dropped no longer waits for it; an entry
  /// whose slots this server no longer owns waits for its backup's answer (orphaned).
  void ReplicationMapChanged();
  /// True when forwarded push `p` waits (or, a resend of one that waits, is dropped) in
  /// ReplicaPark until this server's map catches up (ReadmitReplicas, on a map change and at
  /// each maintenance pass); false when it may be served now.
  bool ParkedReplica(const std::shared_ptr<Pending>& p);
  void ReadmitReplicas();
  /// Holds forwarded push `p` for a backup fill (HeldForFill, DenseHeldForFill): ReplicaPark.
  Status HoldForFill(const std::shared_ptr<Pending>& p);
  /// Closes the links to servers that back up none of this server's slots and dense parts and
  /// that no waiting piece names (after a map change, and at each maintenance pass).
  void CloseUnusedLinks();

  // ---- data_ops.cc: pulls and pushes
  /// Hands each part of `p` to its lane (or runs it inline when `may_inline`, the request has
  /// one part and the lane is idle) and answers `p` once, when the last part finishes,
  /// whichever thread that is. `writes` and `seq` describe every part (Task).
  void RunParts(const std::shared_ptr<Pending>& p, std::vector<LanePart> parts, bool writes,
                uint64_t seq, bool may_inline);
  /// RunParts with the same body on every lane.
  void RunOnAllLanes(const std::shared_ptr<Pending>& p, std::function<Status(Lane&)> fn,
                     bool writes);
  Status Sparse(const std::shared_ptr<Pending>& p);
  Status SubmitSparse(const std::shared_ptr<Pending>& p, KeySplit by_lane);
  Status Dense(const std::shared_ptr<Pending>& p);
  /// Exactly-once pushes: true when `p` retries a push that is already logged and has been
  /// answered here; a retried push-pull becomes a pull (false). Unavailable when the original
  /// is still waiting to be logged. A new push is accepted (false).
  Result<bool> AnsweredAsRetry(const std::shared_ptr<Pending>& p);
  /// Hands push `p`'s lane parts to the lanes once it is logged: with a durable log, staged
  /// for the group write of FlushStaged(); without, at once.
  void LogAndRun(const std::shared_ptr<Pending>& p, std::vector<LanePart> parts, bool may_inline);
  /// Group commit: writes the staged pushes' log entries in one write, then hands them to the
  /// lanes in order (or answers them all with the write's error). Runs at the end of every
  /// burst and before anything else reaches a lane, so lanes still see requests in order.
  void FlushStaged();
  Status SubmitDense(const std::shared_ptr<Pending>& p);
  /// Hands the lane parts of data request `p` on: a push to the log (LogAndRun), a pull to
  /// the lanes (RunParts); through the replication queue (Sequence) while it is active,
  /// except a push a primary forwarded here.
  void SubmitParts(const std::shared_ptr<Pending>& p, std::vector<LanePart> parts, bool push,
                   bool may_inline);
  /// True when a gate kept `p`: held behind a parked push of its client (HeldBehindClient),
  /// parked by the checkpoint cut (ParkedByCut), a slot copy (ParkedByImport) or the
  /// staleness bound (ParkedByStaleness), to be readmitted later.
  bool Parked(const std::shared_ptr<Pending>& p);
  bool ParkedByCut(const std::shared_ptr<Pending>& p);
  bool ParkedByStaleness(const std::shared_ptr<Pending>& p);
  /// The gate of a client's order: true when `p` is held behind a parked push of its client
  /// (PushOrder).
  bool HeldBehindClient(const std::shared_ptr<Pending>& p);
  /// The pushes held behind `client`'s parked one, once none is parked: readmitted in order,
  /// or, when the parked push was refused (`refused`), refused too (their numbers given back,
  /// latest first), since logging them would put the mark above the refused one.
  void ReleaseHeld(uint64_t client, const Status* refused);
  /// A push that waited and is answered without being applied gives its sequence number back
  /// (PushDedup::Abandon), so the client's resend is taken as new; `resend`: it is answered
  /// Unavailable, so the client sends it again as it is and its later pushes wait for it
  /// (PushDedup::kBlocked). No-op for reads.
  void GiveBackSeq(const Header& h, bool resend);
  /// Submits a validated request that was parked.
  Status Resubmit(const std::shared_ptr<Pending>& p);

  // ---- admin_scope.cc: what checkpoints, restores and exports cover under a map
  // The rows and dense chunks this server serves: as primary, and also as backup when
  // `with_backups` (a static cluster: the slots and dense range it owns).
  RowFilter HeldRows(bool with_backups);
  // Under a map: the filter of the rows this server is the primary of; else null (every row).
  std::shared_ptr<const RowFilter> PrimaryRowsFilter();
  // Under a map: FailedPrecondition, prefixed with `what`, when `h` carries another map
  // version, or when rows are still being copied into this server under it.
  Status CheckAdminMap(const Header& h, const std::string& what);
  // Servers in the cluster (the live ids of the map).
  uint32_t ClusterSize();
  // Answers the pending checkpoint with `why` and lets the pushes it held run.
  void AbortCut(const Status& why);
  // Aborts the pending checkpoint when the map is no longer the one it was asked at.
  void AbortCutOnMapChange();
  // Aborts the pending checkpoint when `h`, refused by map version (the server at `version`),
  // is a push of a step up to its cut.
  void AbortCutForRefusedPush(const Header& h, uint64_t version);

  // ---- admin_ops.cc: checkpoints, restore, export
  Status CheckpointOp(const std::shared_ptr<Pending>& p);
  void TakeSnapshotIfReady();
  // Every lane freezes its rows; the file writer writes them to `dir`/lane-<i>, and runs
  // `header` (files beside them), all parts of `p`.
  void WriteLaneSnapshots(const std::shared_ptr<Pending>& p, const std::string& dir,
                          const SnapshotOptions& options, std::function<Status()> header);
  // The writing of a checkpoint's tables, meta and manifest files, gathered now.
  Result<std::function<Status()>> CheckpointHeader(const std::string& dir, int64_t cut,
                                                   uint64_t map_version);
  Status RestoreOp(const std::shared_ptr<Pending>& p);
  // The specs of the checkpoint's server directory `server_dir`, created here.
  Result<std::vector<std::pair<uint64_t, TableSpec>>> RestoreTables(const std::string& server_dir);
  Status RestoreRows(const std::string& dir, const AdminMarker& marker,
                     const std::function<void(uint32_t, std::function<Status(Lane&)>)>& submit,
                     uint64_t* loaded);
  Status ExportOp(const std::shared_ptr<Pending>& p);
  // The start time a delta export over base export `base` takes rows from: the earliest of
  // its servers' (a row may have moved from one to another since).
  Result<uint32_t> DeltaSince(const std::string& base);
  std::string ServerDir(const std::string& dir, uint32_t rank) const;

  // Requests of at most this many floats that touch one lane may run on the I/O thread.
  static constexpr uint64_t kInlineMaxFloats = 16384;
  // Dense requests up to this many floats may run on the I/O thread across lanes (RunParts).
  static constexpr uint64_t kInlineMaxDenseFloats = uint64_t{1} << 20;

  const ServerOptions options_;
  zmq::context_t ctx_;
  zmq::socket_t router_;   // I/O thread only (after Start)
  zmq::socket_t replies_;  // I/O thread only
  std::string endpoint_;
  std::unique_ptr<StorageEngine> engine_;
  std::unique_ptr<RequestLog> log_;
  // Pushes logged by the next group write, with their lane parts (FlushStaged).
  struct StagedRun {
    std::shared_ptr<Pending> p;
    std::vector<LanePart> parts;
    uint64_t seq;
    bool may_inline;
  };
  std::vector<StagedRun> staged_;
  std::vector<std::unique_ptr<Lane>> lanes_;
  std::unique_ptr<FileWriter> writer_;
  struct IoThread {
    std::thread thread;
    std::atomic<bool> stop{false}, stopped{false};
  } io_;

  // The cluster map (map_fence_internal.h): set on any thread, read by the I/O thread.
  MapFence fence_;
  // Resharding and backup fills, the copy-in side (slot_migration_internal.h).
  SlotMigration migration_{RandomInstance()};
  static uint64_t RandomInstance();

  // Replication (replication_queue_internal.h): the primary's queue, the backup's held
  // pushes; the links to backups (I/O thread only).
  struct Replication {
    ReplicationQueue queue;
    ReplicaPark park;
    BackupLinks links;
  } repl_{ReplicationQueue(migration_.instance() | 1), {},
          BackupLinks(ctx_, options_.curve_secret_key)};

  // State below is owned by the I/O thread.
  TableRegistry tables_;
  Consistency consistency_;
  PushDedup dedup_;
  // What the I/O thread counted, for stats and metrics.
  struct IoCounts {
    uint64_t requests = 0, errors = 0, pushes = 0, push_keys = 0, pulls = 0, pull_keys = 0,
             retried_pushes = 0;
    // Admission (edge_ops.cc), and forwarded pushes a backup refused by its map.
    uint64_t refused_connections = 0, dropped_replies = 0, throttled_requests = 0,
             fenced_replicas = 0;
  } counts_;
  // The checkpoint cut and the pushes it parks (checkpoint_cut_internal.h).
  CheckpointCut cut_;
  // Pushes held behind a parked push of their client (push_order_internal.h).
  PushOrder push_order_;
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
          ConnectionTable(options_.max_connections), PeerTable(options_.max_in_flight_per_peer),
          std::string()};

  // Metrics (server_metrics_internal.h): the registry the options name, else this one.
  std::unique_ptr<metrics::Registry> own_registry_;
  std::unique_ptr<ServerMetrics> metrics_;
  // The request HandleMessage is dispatching, for replies sent on the I/O thread (ReplyOk,
  // ReplyError): whether one answered it, whether its header decoded, when it arrived. I/O
  // thread only.
  struct InlineAnswer {
    bool active = false, answered = false, decoded = false;
    uint64_t request_id = 0;
    ServerMetrics::TimePoint received{};
  } inline_answer_;
  // Counts a reply sent by ReplyOk/ReplyError (`bytes` in all) to request `req`; the first
  // reply to the request being dispatched completes it in the metrics, before it is sent (a
  // client that reads the reply and then the metrics finds it counted).
  void NoteInlineReply(const Header& req, bool ok, size_t bytes);
  // The I/O thread's state into metrics_ (each maintenance pass).
  void PublishIoMetrics();
};

}  // namespace tessera::internal
