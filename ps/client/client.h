// The Tessera client: push and pull sparse and dense parameters on a cluster of servers.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "ps/cluster_map_source.h"
#include "ps/status.h"
#include "ps/table_spec.h"

namespace tessera {

namespace internal {
struct Call;
class ClientImpl;
struct ClientTestAccess;
}  // namespace internal

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

/// A deadline `ms` milliseconds from now.
inline Deadline DeadlineAfterMs(int64_t ms) { return Clock::now() + std::chrono::milliseconds(ms); }
/// No deadline.
inline Deadline NoDeadline() { return Deadline::max(); }

/// Consistency of a training job (the same on every worker of the job).
struct ConsistencyOptions {
  /// Number of workers that call Clock(). 0: no clock-based waiting.
  uint32_t num_workers = 0;
  /// Bounded staleness: a pull from a worker at clock c waits until every worker has reached
  /// c - staleness. 0 is bulk-synchronous; -1 (default) is asynchronous (never waits).
  int32_t staleness = -1;
};

struct ClientOptions {
  /// Server endpoints in rank order, e.g. {"tcp://127.0.0.1:7000", ...}. Required, except
  /// for a client created with a cluster map source (then empty: the map names the servers).
  std::vector<std::string> servers;
  /// This worker's id in [0, consistency.num_workers), or any id for a non-training client.
  uint32_t worker_id = 0;
  ConsistencyOptions consistency;
  /// A request with no reply after this long is sent again (see retry_for_ms), or fails with
  /// Unavailable. Default: 60000 ms.
  int64_t request_timeout_ms = 60000;
  /// How long a call to a server that is down (connection lost, not connected, no reply in
  /// time) is retried, with backoff from 100 ms to 2 s, before it fails with Unavailable. Long
  /// enough by default to ride through a server restart. Pushes carry this client's id and a
  /// per-server sequence number, so a push whose reply was lost applies once. Data, clock,
  /// barrier, meta, stats and table calls are retried; checkpoint, restore and export are not.
  /// 0: no retries. Default: 120000 ms.
  int64_t retry_for_ms = 120000;
  /// How long Create() waits for every server to answer a ping. Default: 10000 ms.
  int64_t connect_timeout_ms = 10000;
  /// CurveZMQ public key of the servers (40 Z85 characters), for clusters started with a
  /// secret key: connections are then encrypted (the client uses a fresh key pair of its own).
  /// Default: empty (plain TCP). A key that does not match the servers' (or a missing one,
  /// or one for servers without encryption) fails Create() and calls to that server within
  /// about a second with FailedPrecondition naming the key.
  std::string curve_server_key;
  /// With curve_server_key: this client's own CurveZMQ secret key (40 Z85 characters), for
  /// servers that let in only listed keys (tessera-server --authorized_clients) or give a key
  /// admin rights (--admin_clients). A key the servers refuse fails Create() with
  /// FailedPrecondition. Default: empty: a fresh key pair (a client with no listed key).
  std::string curve_client_secret_key;
  /// The servers' --admin_root as this process sees it (the same shared directory). Checkpoint
  /// and Export write their marker files (CHECKPOINT, EXPORT, LATEST) under it and read
  /// LATEST from it; the servers resolve the same relative names under their own root.
  /// Default: empty: Checkpoint and Export fail with FailedPrecondition (Restore needs no
  /// local root).
  std::string admin_root;
  /// Dense calls: each server's range is sent as requests of at most this many bytes
  /// (rounded up to whole 64 KiB server chunks), one after another on the same connection,
  /// so that the server applies (or, for a pull, copies out) one chunk while the next is on
  /// the wire, and the client copies a pulled chunk while the next arrives. Each chunk is a
  /// request of its own (its own push sequence number; a call that partly failed says so).
  /// 0: one request per server. Default: 1 MiB.
  uint64_t dense_chunk_bytes = uint64_t{1} << 20;
};

/// A table known to the client (from CreateTable or GetTable). Cheap to copy.
struct Table {
  uint64_t id = 0;
  TableSpec spec;
};

/// The completion of an asynchronous call. Copyable; all copies refer to the same call.
class Handle {
 public:
  Handle() = default;
  /// Whether the handle refers to a call.
  bool valid() const { return call_ != nullptr; }

 private:
  friend class internal::ClientImpl;
  friend class Client;
  explicit Handle(std::shared_ptr<internal::Call> c) : call_(std::move(c)) {}
  std::shared_ptr<internal::Call> call_;
};

/// A connection to a Tessera cluster. Thread-safe: any number of threads may issue calls
/// concurrently. Calls are asynchronous; each returns a Handle that Wait() completes.
///
/// Buffers: input spans (keys, gradients) are copied before the call returns; output buffers
/// passed to Pull must stay valid and untouched until Wait() on the handle returns OK or an
/// error other than DeadlineExceeded, until Cancel() on it returns, or until the client is
/// destroyed.
///
/// Errors: calls to a server that is down are retried until it is back, for up to
/// retry_for_ms (pushes apply exactly once), and then fail with Unavailable; the client
/// reconnects by itself, so later calls succeed once the server is back. Bad arguments fail with InvalidArgument
/// before anything is sent; errors found by a server come back with the server's message.
class Client {
 public:
  /// Connects to every server and waits until each answers (connect_timeout_ms).
  static Result<std::unique_ptr<Client>> Create(const ClientOptions& options);
  /// A client of a cluster that follows a cluster map (docs/elasticity.md): the servers and
  /// the slot owners come from `map_source` (for etcd: EtcdClusterMapSource of
  /// ps/coord/etcd_map_source.h, library tessera_coord), `options.servers` must be empty.
  /// Every data request carries the map's version; the client watches the source, and a
  /// request a server refuses as "stale cluster map" is routed again by a newer map and sent
  /// again, for as long as retry_for_ms allows (each reroute of a client behind the map goes
  /// by a newer map than the last, so a map stepping through many versions is followed; a
  /// server behind the client's map is given time to catch up); a push under a new
  /// sequence number when the refusal proves that no attempt of it was taken anywhere, else
  /// under its number, counted in the refusing server's sequence, so that a backup that logged
  /// it from that server answers it as a retry; a retry of a push whose reply was lost keeps
  /// its number, and the server answers it as a retry at any version). A push whose parts
  /// went to several servers and partly failed says in its error which parts were applied. A refused
  /// sparse request whose keys now belong to several servers is split among them. The client
  /// owns the source. FailedPrecondition when the source has no map yet; a later map that
  /// changes the server list fails the requests it would reroute (FailedPrecondition: create
  /// a new client).
  static Result<std::unique_ptr<Client>> Create(const ClientOptions& options,
                                                std::unique_ptr<ClusterMapSource> map_source);
  /// Unused since 2026-12: stale-map reroutes are bounded by ClientOptions::retry_for_ms
  /// alone (each goes by a newer map than the last). Kept one release for source compatibility.
  [[deprecated("stale-map reroutes are bounded by retry_for_ms alone")]]
  static constexpr uint32_t kMaxStaleMapRetries = 8;
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  /// Creates a table on every server. Same spec again: OK. Other spec: AlreadyExists with the
  /// difference. Blocking.
  Result<Table> CreateTable(const TableSpec& spec, Deadline deadline = NoDeadline());
  /// Looks up an existing table by name. Blocking.
  Result<Table> GetTable(const std::string& name, Deadline deadline = NoDeadline());
  /// Drops table `name` on every server: its rows leave memory and disk (durably), requests
  /// naming it then fail with NotFound, and a table created again under the name starts empty,
  /// with any spec. A name no server knows: OK (a retried drop finishes). Needs the admin right
  /// (docs/operations.md); send it once no push to the table is in flight (those fail with
  /// NotFound), and not while slots move (docs/elasticity.md). Blocking.
  Status DropTable(const std::string& name, Deadline deadline = NoDeadline());

  /// Sparse pull: writes keys.size() rows of table.spec.dim floats to `out` in the caller's
  /// key order. Keys may repeat and come in any order.
  ///
  /// Strictly increasing keys (unique and sorted, one pass finds them) skip the dedup in every
  /// sparse call, and a call whose keys all go to one server sends them, and its gradients,
  /// as one block each (pulled rows land in `out` in one copy).
  Handle Pull(const Table& table, std::span<const uint64_t> keys, float* out);
  /// Sparse push: gradients of keys.size() rows (duplicate keys' gradients are summed).
  Handle Push(const Table& table, std::span<const uint64_t> keys, std::span<const float> grads);
  /// The same without copies where it can: keys that are strictly increasing (so unique;
  /// one pass over them finds that) skip the dedup, and when they all go to one server the
  /// request's frames point into `*keys` and `*grads` themselves, which the client keeps alive
  /// as DensePush's shared_ptr form does (same rules: do not change them while the client
  /// holds a reference). Other keys (any order, repeats) are deduped and packed as by the span
  /// form: the same result. InvalidArgument for null.
  Handle Push(const Table& table, std::shared_ptr<const std::vector<uint64_t>> keys,
              std::shared_ptr<const std::vector<float>> grads);
  /// Push then pull the same keys in one round trip; `out` receives the values after the push.
  Handle PushPull(const Table& table, std::span<const uint64_t> keys, std::span<const float> grads,
                  float* out);

  /// Dense pull of elements [offset, offset + length) into `out`.
  Handle DensePull(const Table& table, uint64_t offset, uint64_t length, float* out);
  /// Dense push of gradients for elements [offset, offset + grads.size()). The gradients are
  /// copied before the call returns.
  Handle DensePush(const Table& table, uint64_t offset, std::span<const float> grads);
  /// The same without the copy: the messages point into `*grads`, which the client keeps alive
  /// (a reference per message) until no server can need it again, after the last reply or
  /// retry. Do not change the floats while the client holds a reference (`grads.use_count()`
  /// above the caller's own): after a reply that is when the call completes, but a call that
  /// failed, timed out or was cancelled may leave a message ZeroMQ still sends (a cancelled
  /// push not sent yet is dropped, never sent). InvalidArgument for null.
  Handle DensePush(const Table& table, uint64_t offset,
                   std::shared_ptr<const std::vector<float>> grads);

  /// Ends this worker's current step: advances its clock on every server. Returns the handle
  /// of the notification; the new clock is clock().
  Handle Clock();
  /// This worker's clock (number of Clock() calls, or the value restored by SetClock).
  int64_t clock() const;
  /// Sets the local clock (a restarted worker resumes at its stored clock) and tells servers.
  Handle SetClock(int64_t clock);

  /// Learning-rate schedule: pushes sent from now on have each table's learning rate multiplied
  /// by `scale` on the servers (e.g. a warm-up or decay factor for the current step; FTRL tables
  /// ignore it). A retried push keeps the scale it was sent with. InvalidArgument unless
  /// finite and in [0, 1000]. Default: 1.
  Status SetLearningRateScale(float scale);
  float learning_rate_scale() const;

  /// Blocks until every worker of the job (consistency.num_workers) has called Barrier(name).
  Status Barrier(const std::string& name, Deadline deadline = NoDeadline());

  /// Durable small records on server 0 (worker positions, job metadata).
  Status PutMeta(const std::string& name, std::string_view value, Deadline deadline = NoDeadline());
  Result<std::optional<std::string>> GetMeta(const std::string& name,
                                             Deadline deadline = NoDeadline());

  /// Server `rank`'s statistics as text (one "name value" per line).
  Result<std::string> ServerStats(uint32_t rank, Deadline deadline = NoDeadline());

  /// Takes a consistent checkpoint of the whole cluster into `dir`, a name relative to the
  /// admin root (the servers' --admin_root, this client's ClientOptions::admin_root: the same
  /// shared directory; no "..", not absolute: InvalidArgument). Each server writes
  /// dir/server-<rank>/, then this client writes dir/CHECKPOINT. The cut is a clock C: every
  /// push of steps <= C is in, none after (pushes of later steps wait while the servers
  /// write). Holds rows with optimizer state, dense tables, specs, and the metadata records
  /// (worker clocks and positions). Returns the cut clock. Blocking.
  Result<int64_t> Checkpoint(const std::string& dir, Deadline deadline = NoDeadline());
  /// Loads the checkpoint `dir` (relative to the servers' --admin_root) into this cluster,
  /// which may have another number of servers than the one that wrote it (rows move to the
  /// servers that now own their slots). Rows of the wrong length: Corruption. Blocking.
  Status Restore(const std::string& dir, Deadline deadline = NoDeadline());

  /// Writes a versioned serving export (values only, no optimizer state) under `root`, a name
  /// relative to the admin root as for Checkpoint: root/v<N>/, N one more than the latest
  /// there (this client reads and writes root/LATEST and root/v<N>/EXPORT under
  /// ClientOptions::admin_root). A delta holds only the rows updated since the servers'
  /// previous export. ExportReader reads the result (local path: admin_root/root). Returns N.
  /// Blocking.
  Result<uint64_t> Export(const std::string& root, bool delta, Deadline deadline = NoDeadline());

  // ---- Resharding (tessera-ctl scale; docs/elasticity.md, "Online resharding"). Operator
  // calls on one server `rank` at cluster map version `map_version`; never retried
  // (Unavailable while the server has not seen that version yet: call again).

  /// Which rows ExportSlots reads.
  struct SlotExportRequest {
    /// False: slots the server gave up at the version (FailedPrecondition for one it still
    /// owns): the copy at the flip, complete. True: slots it still owns and serves: a copy
    /// ahead of the flip, which a later export with `since` completes.
    bool still_owned = false;
    /// True (still_owned ignored): slots the server owns whose backup the map at the version
    /// is filling (a backup rebuild), taken once the requests the server sequenced by an older
    /// map are in its lanes; the backup holds the pushes forwarded after that until the copy
    /// is in.
    bool backup_fill = false;
    /// `slots` are dense part numbers, and the export holds the chunks of every dense table in
    /// those parts (as rows keyed by chunk index): with backup_fill, parts the server owns whose
    /// backup is being filled; without, parts moving away from the server at the version (the
    /// copy to their new primary, taken once every request the server sequenced by an older
    /// map is in its lanes).
    bool dense_parts = false;
    /// Empty: every row. Else one step per lane of the server (the marks of an earlier
    /// export): only the rows each lane updated after it.
    std::vector<uint64_t> since;
  };
  /// The rows (value, optimizer state, metadata) of `slots` that server `rank` holds at map
  /// version `map_version`, with every table's spec and a mark per lane (its step counter and
  /// the server's instance), in ps/slot_rows.h's format. Empty `slots`: the specs only.
  Result<std::string> ExportSlots(uint32_t rank, uint64_t map_version,
                                  std::span<const uint32_t> slots,
                                  const SlotExportRequest& how, Deadline deadline = NoDeadline());
  /// What ImportSlots does on the slots' new primary.
  enum class SlotImportStep : uint8_t {
    kRows = 0,  ///< writes `rows` (ExportSlots' format), replacing rows of the same keys
    kDone = 1,  ///< the copy is in: the requests the server held for the slots run
    kAhead = 2,  ///< writes `rows` of slots the server does not own yet (a copy ahead of the
                 ///< flip that makes it their importing primary)
    kDenseRows = 3,  ///< `slots` are dense parts copied to the server (as the backup being
                     ///< filled, or the new primary of a moved part): writes the chunks in
                     ///< `rows` (ExportSlots with dense_parts)
    kDenseDone = 4,  ///< those parts' copy is in: the requests the server held for them run
  };
  /// kRows and kDone only for slots the map at `map_version` gives server `rank` with an
  /// importing source (or, in a backup rebuild, as the backup being filled), kAhead only for
  /// slots it does not own (FailedPrecondition otherwise);
  /// `kRows` with no slots creates the tables in `rows` only.
  Status ImportSlots(uint32_t rank, uint64_t map_version, std::span<const uint32_t> slots,
                     SlotImportStep step, std::string_view rows = {},
                     Deadline deadline = NoDeadline());
  /// Deletes the rows of `slots` from server `rank`, which does not own them at
  /// `map_version` (it gave them up, or is about to import them and holds stale rows).
  Status DropSlots(uint32_t rank, uint64_t map_version, std::span<const uint32_t> slots,
                   Deadline deadline = NoDeadline());

  /// Waits for a call. DeadlineExceeded leaves the call in flight (Wait again later, or
  /// Cancel it); any other result is final.
  Status Wait(const Handle& handle, Deadline deadline = NoDeadline());

  /// Cancels a call: when Cancel returns, nothing more is written into the call's output
  /// buffer (a reply being copied in is finished first), so the caller may free it, e.g.
  /// after Wait returned DeadlineExceeded. Wait on the handle then returns Cancelled, unless
  /// the call had already completed (its result stands). Requests already sent are not
  /// recalled: a cancelled push may or may not be applied. Thread-safe; no effect on an
  /// invalid or completed handle.
  void Cancel(const Handle& handle);

  uint32_t num_servers() const;
  /// The ids of the cluster's servers, ascending: 0 .. num_servers()-1 for a static cluster,
  /// the live ids of the map (a retired id has none) for one that follows a map.
  std::vector<uint32_t> server_ids() const;
  const ClientOptions& options() const;
  /// The version of the cluster map the client routes by; 0 for a static cluster.
  uint64_t cluster_map_version() const;
  /// Requests sent again after a stale-map refusal so far.
  uint64_t stale_map_retries() const;

 private:
  friend struct internal::ClientTestAccess;
  explicit Client(std::unique_ptr<internal::ClientImpl> impl);
  std::unique_ptr<internal::ClientImpl> impl_;
};

}  // namespace tessera
