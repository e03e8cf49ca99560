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
#include "ps/server/consistency_internal.h"
#include "ps/server/dedup_internal.h"
#include "ps/server/lane_internal.h"
#include "ps/server/peers_internal.h"
#include "ps/server/request_internal.h"
#include "ps/server/request_log_internal.h"
#include "ps/server/snapshot_internal.h"
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
  // Server::SetClusterMap / cluster_map_version (fencing.cc).
  Status SetClusterMap(const RoutingMap& map);
  uint64_t cluster_map_version() const { return map_version_.load(std::memory_order_acquire); }

 private:
  struct TableInfo {
    uint64_t id;
    TableSpec spec;
  };
  // A checkpoint waiting for every worker to finish the steps up to its cut.
  struct CutState {
    int64_t cut;
    uint32_t num_workers;
    std::string dir;
    std::shared_ptr<Pending> request;
    // The map version every server takes it at (0: the server follows no map).
    uint64_t map_version = 0;
  };
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
  void AddTableInfo(uint64_t id, const TableSpec& spec);

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
  Result<const TableInfo*> FindTable(const Header& h, TableKind kind);
  Status ExpectFrames(const Pending& p, size_t n);
  Status CheckBudget(uint64_t count, uint64_t floats_per_item, bool with_keys);
  Status CreateTable(const std::shared_ptr<Pending>& p);
  /// True when table `id` exists with `spec`, false when it does not exist; AlreadyExists
  /// naming the difference when it exists with another spec (`compared`: how the message
  /// names the two specs).
  Result<bool> SameTableExists(uint64_t id, const TableSpec& spec, const char* compared);
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
  struct ClusterMapState {
    uint64_t version = 0;
    SlotMap primary;
    // The servers dense tables are spread over.
    uint32_t dense_servers = 0;
    // Per slot: this server is its primary and its rows are being copied here (empty: none).
    std::vector<bool> importing;
    // Per slot: this server is its backup and is being filled from its primary (a backup
    // rebuild); it holds the primary's forwarded pushes for it until the copy is in (empty:
    // none).
    std::vector<bool> filling;
    // Per slot not primaried here: the server its primary is moving from (the importing
    // source), whose pushes forwarded before it gave the slot up are still taken (empty: none;
    // RoutingMap::kNoBackup: not moving).
    std::vector<uint16_t> moving_from;
    // Per dense part: this server is its backup being filled from its primary, or its new
    // primary the part is moving to (empty: none). Either holds the part's requests until the
    // copy is in.
    std::vector<bool> dense_filling;
    // Per dense part: the server it is moving from (RoutingMap::kNoBackup: not moving; empty:
    // none moves).
    std::vector<uint16_t> dense_moving_from;
    // Replication: per slot, its backup server (RoutingMap::kNoBackup: none); empty: no slot
    // has one. The data endpoint of each server id, to reach backups.
    std::vector<uint16_t> backup;
    std::vector<std::string> addresses;
    // Dense part p: served by dense_primary[p], backed up by dense_backup[p] (empty: part p on
    // server p, no backup; RoutingMap).
    std::vector<uint16_t> dense_primary, dense_backup;
    uint32_t DenseOwner(uint32_t p) const {
      return p < dense_primary.size() ? dense_primary[p] : p;
    }
    uint16_t DenseBackup(uint32_t p) const {
      return p < dense_backup.size() ? dense_backup[p] : RoutingMap::kNoBackup;
    }
  };
  /// The map the I/O thread serves by; null when the server follows no map or has none yet.
  const ClusterMapState* CurrentMap();
  /// With follow_cluster_map: FailedPrecondition, naming both versions, when data request `h`
  /// carries another map version than the server's. Skipped, when `exempt_retries`, for a
  /// retried push that is already logged or accepted (it applies nothing again;
  /// AnsweredAsRetry answers it). A request checked again after waiting (Resubmit) was
  /// accepted by this server itself, so it is not exempt.
  Status CheckMapVersion(const Header& h, bool exempt_retries = true);
  /// The map version an error reply carries (0: the server follows no map).
  uint64_t ReplyMapVersion() const {
    return options_.follow_cluster_map ? cluster_map_version() : 0;
  }
  /// True when `h` retries a push this server accepted already (PushDedup).
  bool IsRetriedPush(const Header& h) const;

  /// The owner of each slot: the followed map's primaries, else the static cluster's.
  const SlotMap& Owners();
  /// The number of servers dense tables are spread over (the followed map's, else the static
  /// cluster's).
  uint32_t DenseServers();

  // ---- reshard_ops.cc: moving slots (docs/elasticity.md, "Online resharding")
  /// True when client request `p` touches a slot or dense part whose rows are still being
  /// copied to this server as its (new) primary.
  bool CopyingInRequest(const Pending& p);
  /// True when CopyingInRequest(p): it waits in import_parked_ until SlotImport says the copy
  /// is in (or the map moves), or is refused when too many wait.
  bool ParkedByImport(const std::shared_ptr<Pending>& p);
  /// True when `map` has rows of `slot` copied to this server: as its importing primary (a
  /// move) or as its backup being filled (a rebuild).
  static bool CopyingIn(const ClusterMapState* map, uint32_t slot);
  /// True when forwarded push `p` (keys read) touches a slot this server is the backup being
  /// filled of and whose copy is not in yet: it waits, in order with every forwarded push after
  /// it, at the head of replica_parked_ (ReadmitReplicas, once SlotImport says it is in).
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
  /// The slots and dense parts marked in (import_filled_, dense_filled_), stored in the
  /// engine's metadata and read back at start: a restarted server that took pushes for them
  /// refuses a repeated copy.
  Status PersistFilled();
  Status LoadFilled();
  /// Answers the requests held longer than kImportHoldLimit for a copy (Maintain).
  void ExpireImportParked();
  static constexpr std::chrono::seconds kImportHoldLimit{60};
  /// Requests held for copies at most; beyond it a request for a moving slot is refused
  /// (Unavailable) instead of held.
  static constexpr size_t kMaxImportParked = 65536;
  /// SlotImport's rows step: checks them (DecodeImport), creates the tables they bring, and
  /// writes them in their lanes, durably, before the reply.
  Status ImportSlotRows(const std::shared_ptr<Pending>& p, const std::vector<uint32_t>& slots);
  Status SlotExportOp(const std::shared_ptr<Pending>& p);
  Status SlotImportOp(const std::shared_ptr<Pending>& p);
  Status SlotDropOp(const std::shared_ptr<Pending>& p);

  // ---- replication.cc: primary-backup replication (docs/elasticity.md)
  // One backup's part of a push: the request sent to it, until it answers.
  struct ReplPiece {
    uint16_t backup = 0;
    uint64_t request_id = 0;
    std::vector<zmq::message_t> parts;  // envelope, keys, values (kept to send again)
    std::vector<uint32_t> slots;        // the slots it touches, sorted (sparse)
    int64_t dense_part = -1;            // the dense part it writes (dense; -1: sparse)
    std::chrono::steady_clock::time_point sent_at;
    bool done = false;
    bool acked = false;  // the backup answered OK (it holds the push)
  };
  // A data request waiting, in arrival order, for the backups of the pushes ahead of it and
  // its own; `release` hands it to the log and the lanes.
  struct ReplEntry {
    std::shared_ptr<Pending> p;
    std::function<void()> release;
    std::vector<ReplPiece> pieces;
    uint32_t waiting = 0;  // pieces not answered yet
    bool failed = false;   // answered with an error; released without running
    // When a map moved what it writes away from this server while its backup had not
    // answered (it waits for that answer up to kOrphanLimit); zero: not orphaned.
    std::chrono::steady_clock::time_point orphaned{};
    // The map version it was sequenced (and forwarded) by.
    uint64_t version = 0;
  };
  /// SlotExport's and SlotImport's `count` for dense parts (a backup rebuild): the chunks of
  /// [parts]; SlotImport 3: [parts][chunks], 4: [parts] done.
  static constexpr uint64_t kExportDenseFill = 3;
  static constexpr uint64_t kExportDenseMove = 4;  // dense parts moving away from this server
  static constexpr uint64_t kImportDenseRows = 3;
  static constexpr uint64_t kImportDenseDone = 4;
  /// A SlotExport waiting for the requests sequenced by a map older than `version` to reach
  /// the lanes.
  struct WaitingExport {
    uint64_t version;
    std::function<void()> run;
  };
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
  struct BackupLink {
    std::string address;
    zmq::socket_t dealer;
  };
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
  /// The header of a push forwarded to a backup (Header::replica_from), numbered as the
  /// client numbered it (client_origin) or, without a client id, in this primary's stream.
  Header ForwardedHeader(const Pending& p, Op op, uint64_t map_version);
  static zmq::message_t EnvelopeOf(const Header& h);
  void SendPiece(ReplPiece& piece);
  /// Counts the backups' answers: OK completes a piece, Unavailable sends it again soon, any
  /// other error fails the entry (nothing applied; the client is told to retry).
  void DrainBackupReplies();
  void PieceDone(ReplEntry& e, size_t index);
  void FailEntry(ReplEntry& e, const Status& why);
  /// Runs the entries at the head of the queue whose backups all answered.
  void ReleaseReady();
  /// Sends again each piece unanswered for kReplicaResend (a backup that restarted or lost
  /// it; the backup applies a piece once: its dedup knows the numbers).
  void ResendReplication();
  /// After a map change: a piece whose backup the map dropped no longer waits for it; an entry
  /// whose slots this server no longer owns waits for its backup's answer (orphaned).
  void ReplicationMapChanged();
  static constexpr std::chrono::milliseconds kReplicaResend{500};
  static constexpr std::chrono::seconds kOrphanLimit{30};
  /// A forwarded push of a newer map version than this server's (or arriving while others
  /// wait) waits in replica_parked_, in order, until the map is here (ReadmitReplicas, on a
  /// map change and at each maintenance pass). False when it may be served now.
  /// True also for a resend of a forwarded push parked already (the same primary, request id,
  /// client and number: the primary sends unanswered pieces again every kReplicaResend): it is
  /// dropped, the parked one's answer answers it.
  bool ParkedReplica(const std::shared_ptr<Pending>& p);
  void ReadmitReplicas();
  /// Holds forwarded push `p` for a backup fill (HeldForFill, DenseHeldForFill): at the head of
  /// replica_parked_, where it came from (ReadmitReplicas) or where nothing waits. Unavailable
  /// (the primary sends it again soon) for a new one while others wait: only past
  /// kMaxReplicaParked (else ParkedReplica took it), and never ahead of older ones.
  Status HoldForFill(const std::shared_ptr<Pending>& p);
  static constexpr size_t kMaxReplicaParked = 65536;
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
  /// True when the checkpoint cut, a slot copy (ParkedByImport) or the staleness gate parked
  /// `p` (to be readmitted later), or when `p` is a push held behind a parked push of its
  /// client (HeldBehindClient).
  bool Parked(const std::shared_ptr<Pending>& p);
  /// A client's pushes are logged in its order, so that the dedup's logged mark never passes
  /// one that waits: while a push of client C is parked, C's later pushes are held behind it
  /// (client_order_). True when `p` is held (or refused: too many held).
  bool HeldBehindClient(const std::shared_ptr<Pending>& p);
  /// Counts `p`, just parked, as its client's parked push when it is one (OrderedPush).
  void NoteParked(Pending& p);
  /// `p` leaves its park: true when it was its client's last parked push (the held ones may go).
  bool Unpark(Pending& p);
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
  // True while a push of a step up to `cut` waits for its backups (not in the lanes yet).
  bool CutWaitsForBackups(int64_t cut) const;

  // ---- admin_ops.cc: checkpoints, restore, export
  bool ParkedByCut(const std::shared_ptr<Pending>& p);
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
  std::vector<std::pair<uint64_t, TableSpec>> TableList() const;

  // Requests of at most this many floats that touch one lane may run on the I/O thread.
  static constexpr uint64_t kInlineMaxFloats = 16384;
  // Dense requests up to this many floats may run on the I/O thread across lanes (RunParts).
  static constexpr uint64_t kInlineMaxDenseFloats = uint64_t{1} << 20;

  const ServerOptions options_;
  zmq::context_t ctx_;
  zmq::socket_t router_;   // I/O thread only (after Start)
  zmq::socket_t replies_;  // I/O thread only
  SlotMap slot_map_;
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
  std::thread io_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> stopped_{false};
  zmq::socket_t router_monitor_{ctx_, zmq::socket_type::pair};  // I/O thread only
  std::string admin_root_;  // canonical; empty: admin ops disabled

  // The cluster map (fencing.cc): written by SetClusterMap on any thread, read by the I/O
  // thread through its own copy of the pointer, refreshed when map_version_ moves.
  mutable std::mutex map_mu_;
  std::shared_ptr<const ClusterMapState> map_;  // guarded by map_mu_
  std::atomic<uint64_t> map_version_{0};
  std::shared_ptr<const ClusterMapState> io_map_;  // I/O thread only
  uint64_t stale_map_refusals_ = 0;                // I/O thread only
  bool map_changed_ = false;                       // I/O thread only: CurrentMap saw a new one
  // Resharding (I/O thread only): slots whose copy is in at the current map (SlotImport,
  // count=1), requests waiting for a copy, and counters for stats.
  std::vector<bool> import_filled_ = std::vector<bool>(kNumSlots, false);
  // Dense parts whose copy is in (SlotImport dense done: a backup's fill or a moved part's new
  // primary), stored like import_filled_ (PersistFilled).
  std::vector<bool> dense_filled_;
  // Job metadata keys ("user/NAME") clients wrote here since the process started: a copy of
  // the records imported when the server joins the map does not replace them.
  absl::flat_hash_set<std::string> meta_written_;
  std::vector<std::shared_ptr<Pending>> import_parked_;
  std::atomic<uint64_t> slot_rows_exported_{0}, slot_rows_imported_{0}, slot_rows_dropped_{0};
  uint64_t import_parked_total_ = 0;
  // Forwarded pushes held for a backup fill (HeldForFill), counted each time one is held.
  uint64_t fill_held_total_ = 0;
  std::deque<WaitingExport> waiting_exports_;
  // This process among restarts of the server (random): a mark of SlotExport, since a
  // restart resets the lanes' step counters.
  const uint64_t instance_ = RandomInstance();
  static uint64_t RandomInstance();

  // Replication (replication.cc), I/O thread only.
  std::deque<ReplEntry> repl_queue_;
  std::deque<std::shared_ptr<Pending>> replica_parked_;
  // What identifies each of replica_parked_ (ReplicaKey), to drop the primary's resends.
  absl::flat_hash_set<std::tuple<uint64_t, uint64_t, uint64_t, uint64_t>> replica_parked_keys_;
  const Pending* readmitting_replica_ = nullptr;  // the one ReadmitReplicas is serving
  uint64_t replica_resends_dropped_ = 0;
  absl::flat_hash_map<uint64_t, std::pair<ReplEntry*, size_t>> repl_waiting_;
  absl::flat_hash_map<uint16_t, BackupLink> backup_links_;
  bool poll_items_dirty_ = true;
  // The numbering of forwarded pushes that have no client id (a stream of this process).
  const uint64_t replication_stream_ = instance_ | 1;
  uint64_t replication_seq_ = 0, replication_ids_ = 0;
  uint64_t replicated_pushes_ = 0, failed_replications_ = 0, fenced_replicas_ = 0;

  // State below is owned by the I/O thread.
  absl::flat_hash_map<uint64_t, TableInfo> tables_;
  absl::flat_hash_map<std::string, uint64_t> names_;
  Consistency consistency_;
  PushDedup dedup_;
  uint64_t requests_ = 0, errors_ = 0, pushes_ = 0, push_keys_ = 0, pulls_ = 0, pull_keys_ = 0,
           retried_pushes_ = 0;
  int64_t max_push_clock_ = -1;
  std::optional<CutState> cut_;
  std::vector<std::shared_ptr<Pending>> cut_parked_;
  // Per client id with a parked push (HeldBehindClient): how many are parked, and its later
  // pushes held behind them, in sequence order.
  struct ClientOrder {
    uint32_t parked = 0;
    std::deque<std::shared_ptr<Pending>> held;
  };
  absl::flat_hash_map<uint64_t, ClientOrder> client_order_;
  uint64_t held_behind_now_ = 0, held_behind_total_ = 0;
  // True while Readmit runs: a request that waited already is not refused by a park's bound.
  bool readmitting_ = false;
  ConnectionTable connections_{options_.max_connections};
  PeerTable peers_{options_.max_in_flight_per_peer};
  uint64_t refused_connections_ = 0, dropped_replies_ = 0, throttled_requests_ = 0;

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
  std::vector<std::pair<uint64_t, std::string>> TableNames() const;
};

}  // namespace tessera::internal
