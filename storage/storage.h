// The storage interface of a server: rows of value + optimizer state, owned per lane.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ps/routing.h"
#include "ps/status.h"
#include "ps/table_spec.h"

namespace tessera {

/// Per-row metadata kept next to the value and optimizer state.
struct RowMeta {
  /// Number of updates applied to the row (Adam's step count).
  uint32_t update_count = 0;
  /// Value of the lane's push counter at the last update.
  uint32_t last_step = 0;
  /// Wall-clock time of the last update, seconds since the epoch.
  uint32_t last_update_s = 0;
};

/// What an update is applied under.
struct ApplyContext {
  /// The lane's push counter (monotonic), for step-based eviction.
  uint64_t step = 0;
  /// Current time in seconds since the epoch.
  uint32_t now_s = 0;
  /// The push's learning-rate factor (Header::lr_scale), passed to Optimizer::Apply.
  float lr_scale = 1.0f;
};

/// Counters a store reports (monotonic unless said otherwise).
struct StoreStats {
  uint64_t rows_in_memory = 0;   ///< Gauge.
  uint64_t bytes_in_memory = 0;  ///< Gauge: bytes the memory tier uses.
  uint64_t lookups = 0;
  uint64_t memory_hits = 0;
  uint64_t applies = 0;
  /// Rows deleted by the table's eviction policy (idle steps or seconds).
  uint64_t evicted_rows = 0;
  /// Apply() keys whose row was already in the memory tier (Apply() hit rate:
  /// apply_memory_hits / apply keys, where apply keys = applies for sparse tables).
  uint64_t apply_memory_hits = 0;
  /// Rows read back from RocksDB (lookups and applies that missed the memory tier and found the
  /// row on disk).
  uint64_t disk_reads = 0;
  /// Rows dropped from the memory tier to stay within the budget (still on disk; not lost).
  uint64_t budget_evictions = 0;
  /// Rows that missed the memory tier and were not let in because their keys were seen less
  /// often lately than the rows they would have replaced (admission by frequency): a lookup's
  /// row is served from disk alone, a push's row stays in memory only until written back.
  uint64_t admission_rejects = 0;
  /// Commits that wrote a batch, and rows (plus dense chunks) they wrote.
  uint64_t commits = 0;
  uint64_t rows_written = 0;
};

/// One table's share of a lane's memory tier (StoreStats' rows_in_memory and bytes_in_memory,
/// by table).
struct TableMemory {
  uint64_t table_id = 0;
  uint64_t rows_in_memory = 0;
  uint64_t bytes_in_memory = 0;
};

class LaneSnapshot;

/// A request-log entry given as parts (written one after the other, never copied together).
struct LogEntry {
  uint64_t seq;
  std::span<const std::string_view> parts;
};

/// The rows that one lane owns, of every table. Not thread-safe: exactly one lane thread uses a
/// LaneStore; no lock is needed on the hot path.
class LaneStore {
 public:
  virtual ~LaneStore() = default;

  /// Makes a table known to this lane. Called again with the same spec: no-op.
  virtual Status AddTable(uint64_t table_id, const TableSpec& spec) = 0;

  /// Sparse: writes the value (dim floats) of keys[i] to out[i]. A key without a row gets its
  /// initializer's value (and a row, unless the table's admission policy says not yet).
  virtual Status Lookup(uint64_t table_id, std::span<const uint64_t> keys,
                        std::span<float* const> out) = 0;

  /// Sparse: applies grads[i] (dim floats) to the row of keys[i] with the table's optimizer.
  virtual Status Apply(uint64_t table_id, std::span<const uint64_t> keys,
                       std::span<const float* const> grads, const ApplyContext& ctx) = 0;

  /// Dense: copies elements [begin, end) of chunk `chunk` (relative to the chunk) to out.
  virtual Status DenseRead(uint64_t table_id, uint64_t chunk, uint32_t begin, uint32_t end,
                           float* out) = 0;

  /// Dense: chunk `chunk`'s values as they are now, shared rather than copied: `*len` values
  /// (then the optimizer state) that stay unchanged while the returned pointer lives, on any
  /// thread; a later DenseApply or PutDenseChunk of the chunk writes to a copy (copy-on-write).
  /// The caller may release the pointer on any thread. Null from an engine that cannot share
  /// a chunk (the caller reads it with DenseRead); errors as DenseRead's.
  virtual Result<std::shared_ptr<const float>> DenseShare(uint64_t table_id, uint64_t chunk,
                                                         uint32_t* len) {
    (void)table_id, (void)chunk, (void)len;
    return std::shared_ptr<const float>();
  }

  /// Dense: applies grad[0 .. end-begin) to elements [begin, end) of chunk `chunk`.
  virtual Status DenseApply(uint64_t table_id, uint64_t chunk, uint32_t begin, uint32_t end,
                            const float* grad, const ApplyContext& ctx) = 0;

  /// Makes every update applied so far durable (survives kill -9 once this returns OK) and
  /// waits for it. A server calls it only for writes its request log does not hold (restores);
  /// logged pushes go out through WriteBack().
  virtual Status Commit() = 0;

  /// Write-back: hands the rows changed so far, with the applied-log mark, to the engine's
  /// writer and returns without waiting for the disk. Once the writer has written them they
  /// are read from the engine (RocksDB's memtables) and need not stay in memory; they are
  /// durable, and committed_seq() advances, once the engine has flushed them (at most
  /// StorageOptions::row_flush_interval_ms later). Until written they stay pinned in memory,
  /// where reads find them. One hand-off is in flight per lane: with `wait`
  /// false and one in flight this returns at once; with `wait` true it waits for it first (the
  /// server's back-pressure). `flush_soon`: the engine flushes as soon as this hand-off, and
  /// any queued behind it, is written, not row_flush_interval_ms later (the server's periodic
  /// hand-offs: the durable mark then lags by about one write-back interval; hand-offs forced
  /// by max_dirty_bytes wait for the interval and so make fewer, larger files). Returns the
  /// error of a hand-off that failed; its rows stay dirty and go out with the next one.
  /// Default: Commit().
  virtual Status WriteBack(bool wait, bool flush_soon) {
    (void)wait;
    (void)flush_soon;
    return Commit();
  }
  /// Bytes of changed rows not yet durable (dirty or being written). Default: 0.
  virtual uint64_t dirty_bytes() const { return 0; }
  /// Whether a hand-off is still being written (WriteBack without `wait` would return without
  /// handing off). Default: false.
  virtual bool write_back_busy() const { return false; }

  /// Visits every stored row of a sparse table (value and state are dim and StateFloats(dim)
  /// floats). Stops early when `fn` returns false.
  using RowVisitor = std::function<bool(uint64_t key, const float* value, const float* state,
                                        const RowMeta& meta)>;
  /// Rows that were only created by a Lookup (update_count == 0: they hold the initializer's
  /// value, which any reader can recompute) are not visited; every updated row is. May commit the
  /// updates applied so far (as Commit() does) before reading.
  virtual Status Scan(uint64_t table_id, const RowVisitor& fn) = 0;
  /// Scan limited to the rows of `slots` (resharding: the slots that move). Default: Scan,
  /// filtered; the RocksDB engine reads only those slots' key ranges from disk.
  virtual Status ScanSlots(uint64_t table_id, std::span<const uint32_t> slots,
                           const RowVisitor& fn) {
    const std::vector<bool> wanted = SlotMask(slots);
    return Scan(table_id, [&](uint64_t key, const float* value, const float* state,
                              const RowMeta& meta) {
      return !wanted[SlotOfKey(key)] || fn(key, value, state, meta);
    });
  }

  virtual StoreStats stats() const = 0;
  /// The memory tier by table (every table of the lane, in no particular order); the sums are
  /// stats()' rows_in_memory and bytes_in_memory.
  virtual std::vector<TableMemory> TableStats() const = 0;

  /// Records that every request-log entry up to `seq` has been applied to this lane; the next
  /// Commit() or WriteBack() stores the mark atomically with the rows (see
  /// StorageEngine::AppendLog).
  virtual void SetAppliedSeq(uint64_t seq) { (void)seq; }
  /// The mark durable with the rows (recovered on open; advanced by Commit() and by the
  /// engine's flushes of what WriteBack() handed off); 0 if none.
  virtual uint64_t committed_seq() const { return 0; }

  /// Housekeeping the lane calls on a schedule, between request batches (suggested: every 1 s;
  /// the relaxed mode's WAL flushes do not depend on it): deletes the rows of sparse
  /// tables whose eviction policy says they are idle (ctx.step and ctx.now_s are the current
  /// push counter and time; a row is idle when ctx.step - last_step > max_idle_steps or
  /// ctx.now_s - last_update_s > max_idle_seconds; rows not yet durable wait for their write),
  /// and returns memory the tier no longer needs. Large tables on disk are swept incrementally:
  /// each call examines a bounded number of rows and carries on where the previous call
  /// stopped. Default: no-op.
  virtual Status Maintain(const ApplyContext& ctx) {
    (void)ctx;
    return Status::OK();
  }

  // ---- Snapshot and restore (checkpoints, resharding). Rows are value then optimizer state.

  /// The lane's rows as they are now, to be read later from any thread while the lane goes on
  /// (checkpoints without a stall). Cheap: memory rows are shared copy-on-write; a RocksDB lane
  /// takes a RocksDB snapshot and copies only its rows not yet written back.
  virtual Result<std::unique_ptr<LaneSnapshot>> TakeSnapshot() {
    return Status::FailedPrecondition("this storage engine cannot take snapshots");
  }
  /// TakeSnapshot for a scan of the rows of `slots` only (a slot copy read off the lane):
  /// its Scan visits at least those slots' rows, maybe others (the reader filters by slot).
  /// Default: TakeSnapshot; the RocksDB engine reads only those slots' key ranges from disk.
  virtual Result<std::unique_ptr<LaneSnapshot>> TakeSlotSnapshot(std::span<const uint32_t> slots) {
    (void)slots;
    return TakeSnapshot();
  }

  /// Visits every materialized chunk of a dense table: `row` holds `len` values then the
  /// optimizer state. Stops early when `fn` returns false.
  using ChunkVisitor =
      std::function<bool(uint64_t chunk, const float* row, uint32_t len, const RowMeta& meta)>;
  virtual Status ScanDense(uint64_t table_id, const ChunkVisitor& fn) {
    (void)table_id, (void)fn;
    return Status::FailedPrecondition("this storage engine cannot scan dense tables");
  }
  /// Writes whole rows (dim values + StateFloats(dim) state each) with their metadata,
  /// replacing existing rows. Durable like an Apply (after Commit).
  virtual Status PutRows(uint64_t table_id, std::span<const uint64_t> keys,
                         std::span<const float* const> rows, std::span<const RowMeta> metas) {
    (void)table_id, (void)keys, (void)rows, (void)metas;
    return Status::FailedPrecondition("this storage engine cannot restore rows");
  }
  /// Deletes the rows of `keys` (keys without a row are skipped), from memory and disk, and
  /// makes the deletes durable (resharding: a slot's rows leave the server that gave it up,
  /// and a slot that comes back is cleared before its rows are copied in).
  virtual Status DeleteRows(uint64_t table_id, std::span<const uint64_t> keys) {
    (void)table_id, (void)keys;
    return Status::FailedPrecondition("this storage engine cannot delete rows");
  }
  /// Deletes every row of `slots` (slots of other lanes are skipped) of sparse table
  /// `table_id`, from memory and disk, durably (SlotDrop). Returns the rows it deleted where it
  /// counts them: the RocksDB engine deletes each slot's key range with one range tombstone,
  /// without reading it (a scan of a range full of earlier deletes' tombstones held the lane
  /// for seconds), and counts only the rows it had in memory. Default: ScanSlots, then
  /// DeleteRows.
  virtual Result<uint64_t> DropSlots(uint64_t table_id, std::span<const uint32_t> slots) {
    std::vector<uint64_t> keys;
    TESSERA_RETURN_IF_ERROR(ScanSlots(table_id, slots,
                                      [&](uint64_t key, const float*, const float*,
                                          const RowMeta&) {
                                        keys.push_back(key);
                                        return true;
                                      }));
    TESSERA_RETURN_IF_ERROR(DeleteRows(table_id, keys));
    return static_cast<uint64_t>(keys.size());
  }
  /// Forgets table `table_id` on this lane (DropTable): its rows and chunks leave memory, and
  /// what the lane had not written to disk yet goes to disk first (a write-back still in flight
  /// would otherwise write rows after StorageEngine::DropTableData deleted them). Later calls
  /// naming the table get NotFound until AddTable. A table the lane does not know: OK.
  virtual Status DropTable(uint64_t table_id) {
    (void)table_id;
    return Status::FailedPrecondition("this storage engine cannot drop tables");
  }
  /// Writes a whole dense chunk (values + state), replacing it.
  virtual Status PutDenseChunk(uint64_t table_id, uint64_t chunk, const float* row,
                               const RowMeta& meta) {
    (void)table_id, (void)chunk, (void)row, (void)meta;
    return Status::FailedPrecondition("this storage engine cannot restore dense chunks");
  }
};

/// A lane's rows frozen by LaneStore::TakeSnapshot(). Thread-safe to read (one reader at a
/// time); outlives nothing: release it before its engine. Scan and ScanDense behave as
/// LaneStore's (rows only looked up are not visited); each table is scanned at most once (a
/// snapshot may let go of rows as it visits them: FailedPrecondition the second time).
class LaneSnapshot {
 public:
  virtual ~LaneSnapshot() = default;
  virtual Status Scan(uint64_t table_id, const LaneStore::RowVisitor& fn) = 0;
  virtual Status ScanDense(uint64_t table_id, const LaneStore::ChunkVisitor& fn) = 0;
};

/// One server's storage: hands out a LaneStore per lane and keeps small metadata records
/// (table specs, worker clocks and positions). Thread-safe.
/// One record of StorageEngine::WriteMeta.
struct MetaWrite {
  std::string key;
  std::optional<std::string> value;  ///< empty: delete the record
};

class StorageEngine {
 public:
  virtual ~StorageEngine() = default;

  /// Opens the store of lane `lane` of `num_lanes`. Each lane is opened once.
  virtual Result<std::unique_ptr<LaneStore>> OpenLane(uint32_t lane, uint32_t num_lanes) = 0;

  /// Durable small records (strict mode: durable when this returns).
  virtual Status PutMeta(std::string_view key, std::string_view value) = 0;
  virtual Result<std::optional<std::string>> GetMeta(std::string_view key) = 0;
  /// Deletes every row and chunk of table `table_id` on disk and its layout record, durably,
  /// once every lane has dropped it (LaneStore::DropTable): a table created again under the
  /// same name starts empty, with any spec. OK for a table with nothing stored. Engines that
  /// keep nothing across restarts: a no-op.
  virtual Status DropTableData(uint64_t table_id) {
    (void)table_id;
    return Status::OK();
  }
  /// Visits every record whose key starts with `prefix`.
  virtual Status ScanMeta(
      std::string_view prefix,
      const std::function<void(std::string_view key, std::string_view value)>& fn) = 0;
  /// Puts (`value` set) and deletes (`value` empty) several records in one durable write:
  /// all or none where the engine batches (RocksDB, memory). Default: one PutMeta each, and
  /// FailedPrecondition for a delete.
  virtual Status WriteMeta(std::span<const MetaWrite> writes) {
    for (const MetaWrite& w : writes) {
      if (!w.value) {
        return Status::FailedPrecondition("this storage engine cannot delete '" + w.key + "'");
      }
      TESSERA_RETURN_IF_ERROR(PutMeta(w.key, *w.value));
    }
    return Status::OK();
  }

  // ---- Request log. A push that spans several lanes is logged whole before any lane applies
  // it; each lane stores the last sequence number it applied with its rows. After a crash the
  // server replays, per lane, the entries after that lane's mark: every push is then applied
  // wholly or not at all, and an acknowledged push is never lost.

  /// Whether this engine keeps anything across restarts (false: the log calls are no-ops).
  virtual bool durable() const { return false; }
  /// Named figures of the engine itself, e.g. RocksDB's memory by kind (name, value).
  virtual std::vector<std::pair<std::string, uint64_t>> EngineStats() const { return {}; }
  /// Appends entry `seq` (increasing), durable per the durability mode when this returns.
  virtual Status AppendLog(uint64_t seq, std::string_view entry) {
    (void)seq, (void)entry;
    return Status::OK();
  }
  /// Appends entries of increasing seq at once (group commit: one write, one fdatasync with
  /// fsync); on an error none of them is in the log. Engines with a log write the parts
  /// without copying them together.
  virtual Status AppendLogGroup(std::span<const LogEntry> entries) {
    for (const LogEntry& e : entries) {
      std::string entry;
      for (std::string_view p : e.parts) entry.append(p);
      TESSERA_RETURN_IF_ERROR(AppendLog(e.seq, entry));
    }
    return Status::OK();
  }
  /// Visits entries with sequence number > `after`, in order.
  virtual Status ScanLog(uint64_t after,
                         const std::function<Status(uint64_t seq, std::string_view entry)>& fn) {
    (void)after, (void)fn;
    return Status::OK();
  }
  /// Deletes entries with sequence number <= `upto`.
  virtual Status TruncateLog(uint64_t upto) {
    (void)upto;
    return Status::OK();
  }

  /// Writes a consistent, openable copy of everything committed so far (every lane's Commit()
  /// returned) to `dir`, which must not exist: a RocksDB checkpoint made of hard links where the
  /// file system allows (cheap), copies otherwise. Opening `dir` as a data_dir restores it. To
  /// get a cut where no push is half applied, the server commits every lane and holds pushes
  /// while this runs. Errors: FailedPrecondition for the memory-only engine, IOError.
  virtual Status CreateCheckpoint(const std::string& dir) {
    return Status::FailedPrecondition("this storage engine cannot checkpoint to '" + dir + "'");
  }
};

/// Rows in memory only: nothing survives the process. For tests and scratch clusters.
std::unique_ptr<StorageEngine> NewMemoryStorageEngine();

/// When an acknowledged push is durable.
enum class Durability : uint8_t {
  /// Acknowledged pushes survive kill -9 of the server process (WAL written before the ack,
  /// group-committed per lane batch).
  kStrict = 0,
  /// Pushes reach the WAL at most relaxed_window_ms after they were acknowledged.
  kRelaxed = 1,
};

struct StorageOptions {
  /// Directory of the server's RocksDB. Empty: memory only (nothing survives the process).
  std::string data_dir;
  /// Directory of the request log's segment files. Empty: DATA_DIR/request-log. Another file
  /// system (device) keeps pushes from waiting behind the rows' and checkpoints' fsyncs, as a
  /// database keeps its WAL apart. Default: empty.
  std::string log_dir;
  /// Bytes the memory tier may hold across all lanes, the write-back copies of changed rows
  /// included; rows beyond live in RocksDB only. 0: unbounded. Default: 0.
  /// The memory-only engine ignores it (it has nowhere to spill to).
  uint64_t memory_budget_bytes = 0;
  /// Durable storage: bytes of changed rows not yet durable, over all lanes, beyond which a
  /// lane hands its rows off at once and waits for the writer (pushes slow down; none fails).
  /// With a budget this much of it is kept back for the write-back copies (the rows get the
  /// rest). 0: MaxDirtyBytesPerLane's default. Default: 0.
  uint64_t max_dirty_bytes = 0;
  /// When an acknowledged push is durable. Default: kStrict.
  Durability durability = Durability::kStrict;
  /// Relaxed mode: the longest time, in milliseconds, an acknowledged push may be lost on a
  /// process crash. Default: 100.
  uint32_t relaxed_window_ms = 100;
  /// Also fsync the WAL before acknowledging (survives machine crashes). Default: false.
  bool fsync = false;
  /// RocksDB block cache (uncompressed data, index and filter blocks), bytes, shared by all
  /// tables of the server; used by reads of rows that are not in the memory tier. Default: 64 MiB.
  uint64_t block_cache_bytes = uint64_t{64} << 20;
  /// RocksDB memtables of every column family together, bytes (one WriteBufferManager, charged
  /// to the block cache, whose capacity grows by this much): RocksDB's memory stays near
  /// block_cache_bytes + write_buffer_bytes however many tables there are. Default: 64 MiB.
  uint64_t write_buffer_bytes = uint64_t{64} << 20;
  /// Durable storage: the longest time, in milliseconds, rows written back stay in RocksDB's
  /// memtables before a flush makes them durable (a lane's Commit() flushes at once, and RocksDB
  /// flushes by itself when the memtables are full). Until then they are read from the
  /// memtables, the lanes' durable log marks stay behind, and a restart replays the request log
  /// from those marks. Longer: fewer and larger files for RocksDB to compact (a flush per
  /// write-back made the files of a 10M-row fill 8 MB each; docs/storage.md). 0: a flush after
  /// every write-back. Default: 5000.
  uint32_t row_flush_interval_ms = 5000;
  /// RocksDB background threads (flushes and compactions). Default: 2.
  int background_jobs = 2;
  /// Extra RocksDB column-family options for table families, in RocksDB's option-string format
  /// (e.g. "compression=kLZ4Compression;block_based_table_factory={block_size=16384}"), applied
  /// over Tessera's tuning (docs/storage.md). For experiments; a bad string, or one giving an
  /// option a negative value (RocksDB reads unsigned ones modulo 2^64), fails the open with
  /// InvalidArgument. Default: empty.
  std::string rocksdb_table_options;
};

/// One lane's share of max_dirty_bytes. Its default: with a budget, a quarter of the lane's
/// budget, at most kMaxDefaultDirtyBytesPerLane (a hand-off copies the dirty rows on the lane);
/// without one, 1 GiB over all lanes.
inline constexpr uint64_t kMaxDefaultDirtyBytesPerLane = uint64_t{64} << 20;
uint64_t MaxDirtyBytesPerLane(const StorageOptions& options, uint32_t num_lanes);

/// Opens the engine the options ask for: memory-only when data_dir is empty, else RocksDB
/// (recovering whatever the directory holds).
Result<std::unique_ptr<StorageEngine>> OpenStorageEngine(const StorageOptions& options);

/// Repairs the request log of the (stopped) server that `options` describe (log_dir, else
/// DATA_DIR/request-log): keeps every record whose checksum verifies, puts a hole in place of
/// each one lost between them (replay skips it), cuts a damaged tail. Returns one line per
/// damaged range or run of lost records, then a summary line. InvalidArgument without a
/// data_dir or log_dir; IOError when a file cannot be read or rewritten.
Result<std::vector<std::string>> RepairRequestLog(const StorageOptions& options);

}  // namespace tessera
