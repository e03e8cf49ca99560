// StorageEngine over RocksDB: a byte-bounded memory tier (CLOCK) over one RocksDB per server,
// a column family per table, group-committed WriteBatches with the WAL on. See docs/storage.md.
#include <absl/container/flat_hash_map.h>
#include <absl/container/flat_hash_set.h>
#include <glog/logging.h>
#include <rocksdb/db.h>
#include <rocksdb/options.h>
#include <rocksdb/utilities/checkpoint.h>
#include <rocksdb/write_batch.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "ps/initializer.h"
#include "ps/optimizer.h"
#include "ps/routing.h"
#include "storage/copy_on_write_internal.h"
#include "storage/log_file_internal.h"
#include "storage/rocksdb_engine_internal.h"
#include "storage/rocksdb_tuning_internal.h"
#include "storage/row_cache_internal.h"
#include "storage/row_codec_internal.h"
#include "storage/row_table_internal.h"

namespace tessera {
namespace {

using internal::CachedRows;
using internal::kPrefetchAhead;

constexpr char kMetaFamily[] = "meta";
constexpr char kLogFamily[] = "log";
// Meta key of a lane's applied-log mark: "storage/lane/<num_lanes>/<lane>".
std::string LaneMarkKey(uint32_t lane, uint32_t num_lanes) {
  return "storage/lane/" + std::to_string(num_lanes) + "/" + std::to_string(lane);
}
std::string SeqKey(uint64_t seq) {
  std::string k(8, '\0');
  for (int i = 7; i >= 0; --i, seq >>= 8) k[i] = static_cast<char>(seq & 0xff);
  return k;
}
uint64_t SeqOfKey(const rocksdb::Slice& k) {
  uint64_t seq = 0;
  for (size_t i = 0; i < 8 && i < k.size(); ++i) seq = (seq << 8) | static_cast<uint8_t>(k[i]);
  return seq;
}
// Meta records the engine itself keeps (the server must not use this prefix).
constexpr char kLayoutPrefix[] = "storage/layout/";
// Rows examined per table by one Maintain() call's sweep of the rows on disk.
constexpr size_t kSweepRowsPerCall = 65536;
// Cold reads are fetched with MultiGet in batches of this many keys (rows of one 4 KiB block
// are read once a batch: replaying a request log after a restart, 8192 took 25-27 ms an entry
// of 100k keys against 39-54 ms with 1024).
constexpr size_t kFetchBatch = 8192;
// Index bytes charged to the budget per cached row (SwissTable of 4-byte slots, at a typical
// load; MemoryBytes() reports the real figure).
constexpr size_t kIndexBytesPerRow = 8;
// A WriteBatch record's bytes beyond its key and value, at most: tag, column family, lengths.
constexpr size_t kBatchRecordBytes = 10;

Status FromRocks(const rocksdb::Status& s, std::string_view what) {
  if (s.ok()) return Status::OK();
  std::string msg = std::string(what) + ": " + s.ToString();
  if (s.IsCorruption()) return Status::Corruption(std::move(msg));
  if (s.IsNotFound()) return Status::NotFound(std::move(msg));
  if (s.IsInvalidArgument() || s.IsNotSupported()) return Status::InvalidArgument(std::move(msg));
  if (s.IsBusy() || s.IsTryAgain() || s.IsTimedOut()) return Status::Unavailable(std::move(msg));
  if (s.IsIOError() || s.IsNoSpace() || s.IsPathNotFound()) return Status::IOError(std::move(msg));
  return Status::IOError(std::move(msg));
}

std::string FamilyName(uint64_t table_id) { return std::to_string(table_id); }

bool ParseFamilyName(const std::string& name, uint64_t* id) {
  if (name.empty() || name.size() > 20) return false;
  auto [p, ec] = std::from_chars(name.data(), name.data() + name.size(), *id);
  return ec == std::errc() && p == name.data() + name.size() && *id != 0;
}

// What the rows of a table look like on disk: a table reopened with another layout would
// misread them.
std::string LayoutOf(const TableSpec& spec, uint32_t floats_per_row) {
  return std::string(spec.kind == TableKind::kSparse ? "sparse" : "dense") +
         " dim=" + std::to_string(spec.dim) + " length=" + std::to_string(spec.length) +
         " optimizer=" + std::string(OptimizerKindName(spec.optimizer.kind)) +
         " floats=" + std::to_string(floats_per_row);
}

using internal::IdleRow;

class RocksDbEngine;

// One lane's rows (and applied mark) handed to the engine's writer thread. The lane copies the
// rows out (the copy is the snapshot the writer writes); the writer sorts and batches them.
// Reused by the lane once done, so its buffers do not fault in fresh pages every time.
struct WriteBackJob {
  static constexpr int kQueued = 0, kDone = 1, kFailed = 2;
  // Sparse rows of one column family: the lane's arena frozen at the hand-off and the slots of
  // the rows to write. The writer encodes them and lets the arena go.
  struct Family {
    rocksdb::ColumnFamilyHandle* cf = nullptr;
    uint32_t floats = 0;
    CachedRows::Frozen frozen;
    std::vector<uint32_t> slots;
  };
  std::vector<Family> families;
  size_t used_families = 0;
  // The lane's applied mark and its dense chunks; the writer appends the sparse rows.
  rocksdb::WriteBatch batch;
  // The writer's: sparse rows encoded, before they go into `batch` (not zeroed when allocated:
  // a write-back of a million rows spent a tenth of the writer's time in memset and faults).
  std::unique_ptr<char[]> records;
  size_t records_capacity = 0;
  char* Records(size_t bytes) {
    if (bytes > records_capacity) {
      records.reset(new char[bytes]);
      records_capacity = bytes;
    }
    return records.get();
  }
  Status error;         // set before state leaves kQueued
  std::atomic<int> state{kQueued};

  void Reset() {
    ReleaseRows();
    for (Family& f : families) f.slots.clear();
    used_families = 0;
    batch.Clear();
    error = Status::OK();
    state.store(kQueued, std::memory_order_relaxed);
  }
  // Lets the lane's arena go: its next change to a block need not copy it.
  void ReleaseRows() {
    for (Family& f : families) f.frozen = CachedRows::Frozen();
  }
  Family& NextFamily(rocksdb::ColumnFamilyHandle* cf, uint32_t floats) {
    if (used_families == families.size()) families.emplace_back();
    Family& f = families[used_families++];
    f.cf = cf;
    f.floats = floats;
    return f;
  }
  // Encodes the sparse rows, releasing the arena, and appends them to `batch` in key order (a
  // memtable insert in order starts its skiplist search where the previous key went; measured:
  // the unsorted inserts were a quarter of a durable server's CPU).
  Status AppendSortedRows();
  // The lane's copy at the hand-off (budgeted lanes): `slots` of `rows` appended to `batch` in
  // key order, encoded straight into it (no arena is frozen, so no push copies a block).
  rocksdb::Status CopySortedRows(const CachedRows& rows, rocksdb::ColumnFamilyHandle* cf,
                                 std::span<const uint32_t> slots);
  // Frees `records` (and `batch`) when large.
  void TrimBuffers(bool batch_too);
  void Wait() {
    for (int s = state.load(std::memory_order_acquire); s == kQueued;
         s = state.load(std::memory_order_acquire)) {
      state.wait(s, std::memory_order_acquire);
    }
  }
};

// A sparse row's place in a write-back batch: its encoded key's bytes (slot prefix, then the key,
// big-endian), compared as two integers, and where its record is (`pos`). Sorting by it puts
// the rows in the memtable's key order.
struct KeyOrder {
  uint64_t hi;  // key bytes 0..7, big-endian: slot and the key's high 48 bits
  uint32_t lo;  // key bytes 8..9
  uint32_t pos;
  static KeyOrder Of(const internal::SparseKey& k, uint32_t pos) {
    return {internal::GetBigEndian64(k.bytes),
            (uint32_t{static_cast<uint8_t>(k.bytes[8])} << 8) | static_cast<uint8_t>(k.bytes[9]),
            pos};
  }
  bool operator<(const KeyOrder& o) const { return hi != o.hi ? hi < o.hi : lo < o.lo; }
};

Status WriteBackJob::AppendSortedRows() {
  std::vector<KeyOrder> order;
  for (size_t f = 0; f < used_families; ++f) {
    Family& fam = families[f];
    // Encoded in arena order, so that each block goes back to the lane as soon as it is read
    // (a push to a block still held copies it).
    const size_t rec = internal::kSparseKeyBytes + internal::RowBytes(fam.floats);
    char* const records_at = Records(fam.slots.size() * rec);
    order.clear();
    char* out = records_at;
    fam.frozen.VisitAndRelease(fam.slots, [&](uint32_t slot) {
      const auto k = internal::EncodeSparseKey(fam.frozen.key(slot));
      std::memcpy(out, k.bytes, internal::kSparseKeyBytes);
      internal::EncodeRowTo(fam.frozen.row(slot), fam.floats, fam.frozen.meta(slot),
                            out + internal::kSparseKeyBytes);
      order.push_back(KeyOrder::Of(k, static_cast<uint32_t>(order.size())));
      out += rec;
    });
    std::sort(order.begin(), order.end());
    for (const KeyOrder& o : order) {
      const char* r = records_at + size_t{o.pos} * rec;
      auto s =
          batch.Put(fam.cf, rocksdb::Slice(r, internal::kSparseKeyBytes),
                    rocksdb::Slice(r + internal::kSparseKeyBytes, rec - internal::kSparseKeyBytes));
      if (!s.ok()) return FromRocks(s, "building the write-back batch");  // Reap releases
    }
  }
  TrimBuffers(/*batch_too=*/false);
  return Status::OK();
}

rocksdb::Status WriteBackJob::CopySortedRows(const CachedRows& rows,
                                             rocksdb::ColumnFamilyHandle* cf,
                                             std::span<const uint32_t> slots) {
  std::vector<KeyOrder> order(slots.size());
  for (size_t i = 0; i < slots.size(); ++i) {
    order[i] = KeyOrder::Of(internal::EncodeSparseKey(rows.header(slots[i]).key), slots[i]);
  }
  std::sort(order.begin(), order.end());
  const size_t row_bytes = internal::RowBytes(rows.floats());
  char* const row = Records(row_bytes);
  for (const KeyOrder& o : order) {
    const auto k = internal::EncodeSparseKey(rows.header(o.pos).key);
    internal::EncodeRowTo(rows.row(o.pos), rows.floats(), rows.header(o.pos).meta, row);
    auto s = batch.Put(cf, rocksdb::Slice(k.bytes, internal::kSparseKeyBytes),
                       rocksdb::Slice(row, row_bytes));
    if (!s.ok()) return s;
  }
  return rocksdb::Status::OK();
}

void WriteBackJob::TrimBuffers(bool batch_too) {
  // Large buffers go back to the system between hand-offs (they are mmap'd chunks): kept, two
  // copies of the largest hand-off stayed in every lane's memory for good.
  constexpr size_t kKeepBytes = size_t{1} << 20;
  if (records_capacity > kKeepBytes) {
    records.reset();
    records_capacity = 0;
  }
  if (batch_too && batch.GetDataSize() > kKeepBytes) batch = rocksdb::WriteBatch();
}

// ------------------------------------------------------------------------------------ lane
class RocksDbLaneStore final : public LaneStore {
 public:
  RocksDbLaneStore(RocksDbEngine* engine, uint32_t lane, uint32_t num_lanes, uint64_t budget,
                   uint64_t max_dirty);
  ~RocksDbLaneStore() override;

  Status AddTable(uint64_t table_id, const TableSpec& spec) override;
  Status Lookup(uint64_t table_id, std::span<const uint64_t> keys,
                std::span<float* const> out) override;
  Status Apply(uint64_t table_id, std::span<const uint64_t> keys,
               std::span<const float* const> grads, const ApplyContext& ctx) override;
  Status DenseRead(uint64_t table_id, uint64_t chunk, uint32_t begin, uint32_t end,
                   float* out) override;
  Status DenseApply(uint64_t table_id, uint64_t chunk, uint32_t begin, uint32_t end,
                    const float* grad, const ApplyContext& ctx) override;
  Status Commit() override;
  Status WriteBack(bool wait) override;
  uint64_t dirty_bytes() const override;
  bool write_back_busy() const override {
    return flight_ && flight_->state.load(std::memory_order_acquire) == WriteBackJob::kQueued;
  }
  Status Scan(uint64_t table_id, const RowVisitor& fn) override;
  Status ScanSlots(uint64_t table_id, std::span<const uint32_t> slots,
                   const RowVisitor& fn) override;
  Result<std::unique_ptr<LaneSnapshot>> TakeSnapshot() override;
  // TakeSnapshot with the disk rows of `slots` only (the rows pinned in memory: all of them).
  Result<std::unique_ptr<LaneSnapshot>> Freeze(std::vector<uint32_t> slots);
  StoreStats stats() const override;
  std::vector<TableMemory> TableStats() const override;
  Status Maintain(const ApplyContext& ctx) override;
  Status ScanDense(uint64_t table_id, const ChunkVisitor& fn) override;
  Status PutRows(uint64_t table_id, std::span<const uint64_t> keys,
                 std::span<const float* const> rows, std::span<const RowMeta> metas) override;
  Status PutDenseChunk(uint64_t table_id, uint64_t chunk, const float* row,
                       const RowMeta& meta) override;
  Status DeleteRows(uint64_t table_id, std::span<const uint64_t> keys) override;
  void SetAppliedSeq(uint64_t seq) override { applied_seq_ = std::max(applied_seq_, seq); }
  uint64_t committed_seq() const override { return committed_seq_; }

 private:
  struct DenseChunk {
    std::vector<float> data;  // value then state
    RowMeta meta;
    uint32_t len = 0;
    bool dirty = false;
  };
  struct Table {
    uint64_t id = 0;
    TableSpec spec;
    std::unique_ptr<Optimizer> opt;
    rocksdb::ColumnFamilyHandle* cf = nullptr;
    uint32_t floats = 0;  // sparse: value + state per row
    bool gated = false;   // admission needs counting
    std::unique_ptr<CachedRows> rows;
    // Slot numbers of the dirty rows, and of the rows handed to the writer (pinned until it is
    // done; CachedRows tracks both by generation): the arena is compacted only while both are
    // empty (Compact moves rows).
    std::vector<uint32_t> dirty_slots;
    std::vector<uint32_t> flight_slots;
    absl::flat_hash_map<uint64_t, uint32_t> pending;  // pushes seen of keys not yet admitted
    absl::flat_hash_map<uint64_t, DenseChunk> dense;
    std::vector<uint64_t> dirty_chunks;
    std::vector<uint64_t> flight_chunks;
    // Incremental disk sweep of Maintain(): index into the lane's slots and the key to resume at.
    size_t sweep_slot = 0;
    std::string sweep_from;
  };

  Result<Table*> Get(uint64_t table_id, TableKind kind);
  size_t RowCost(const Table& t) const { return t.rows->slot_bytes() + kIndexBytesPerRow; }
  // Evicts unpinned rows (CLOCK, tables in turn) until a row of `t` fits the budget.
  void MakeRoom(const Table& t);
  uint32_t InsertRow(Table* t, uint64_t key);
  void EraseRow(Table* t, uint32_t slot);
  // A changed row stays pinned in memory until the writer has made it durable.
  void MarkDirty(Table* t, uint32_t slot) {
    if (t->rows->MarkDirty(slot)) t->dirty_slots.push_back(slot);
  }
  void MarkChunkDirty(Table* t, uint64_t chunk, DenseChunk* c) {
    if (!c->dirty) {
      c->dirty = true;
      t->dirty_chunks.push_back(chunk);
    }
  }
  // Reads the rows of keys[misses[..]] from disk (deduplicated) into fetched_*; validates them.
  Status Fetch(Table* t, std::span<const uint64_t> keys, const std::vector<uint32_t>& misses);
  // After Fetch: the stored row of `key`, or an empty view when it is not on disk.
  std::string_view Fetched(uint64_t key) const {
    auto it = fetch_pos_.find(key);
    if (it == fetch_pos_.end() || fetch_len_[it->second] == 0) return {};
    return std::string_view(fetch_bytes_.data() + fetch_off_[it->second], fetch_len_[it->second]);
  }
  Result<DenseChunk*> GetChunk(Table* t, uint64_t chunk);
  bool HasDirty() const;
  // Bytes of the write-back batch of the dirty rows and chunks, at most (its reservation).
  size_t WriteBackBytes() const;
  // Encodes the dirty rows and the applied mark into a batch for the writer; the rows stay
  // pinned until Reap().
  Status HandOff();
  // After the writer finished the hand-off in flight: unpins its rows (ok) or marks them dirty
  // again (failed: they go out with the next hand-off). Returns the writer's status.
  Status Reap();
  // Lane's slots, in order.
  const std::vector<uint32_t>& lane_slots() const { return lane_slots_; }
  Status SweepDisk(Table* t, const ApplyContext& ctx, rocksdb::WriteBatch* batch);

  RocksDbEngine* engine_;
  uint32_t lane_;
  uint32_t num_lanes_;
  // Bytes; 0 = unbounded. The rows' share: the budget less what it keeps back for the copies of
  // a hand-off (at most the lane's dirty bound, which the lane keeps to): a budgeted lane copies
  // its dirty rows into the write-back batch, so rows + copies stay within the budget. (Freezing
  // the arena instead let pushes copy nearly every block during a write-back: measured, a lane
  // held 2.5x its budget.)
  uint64_t budget_;
  uint64_t row_budget_;
  uint64_t charged_ = 0;  // rows in memory x their cost
  absl::flat_hash_map<uint64_t, std::unique_ptr<Table>> tables_;
  std::vector<Table*> sparse_tables_;  // eviction turns
  size_t evict_turn_ = 0;
  std::vector<uint32_t> lane_slots_;
  StoreStats stats_;
  // Scratch buffers reused across calls.
  std::vector<uint32_t> misses_;
  std::vector<uint32_t> found_;  // Apply: the slot of each key in memory at its first pass
  absl::flat_hash_map<uint64_t, uint32_t> fetch_pos_;
  std::vector<internal::SparseKey> fetch_keys_;
  std::vector<size_t> fetch_off_;
  std::vector<uint32_t> fetch_len_;
  std::string fetch_bytes_;
  rocksdb::WriteBatch batch_;
  std::string encode_buf_;
  std::vector<float> scratch_row_;
  uint64_t applied_seq_ = 0;              // request-log entries applied (in memory)
  uint64_t committed_seq_ = 0;            // ... and durable with the rows
  std::shared_ptr<WriteBackJob> flight_;  // the hand-off being written, if any
  std::shared_ptr<WriteBackJob> spare_;   // the last one, for its buffers
  uint64_t flight_seq_ = 0;               // the mark it carries
  uint64_t flight_rows_ = 0;
};

// ------------------------------------------------------------------------------------ engine
class RocksDbEngine final : public StorageEngine {
 public:
  static Result<std::unique_ptr<RocksDbEngine>> Open(const StorageOptions& options,
                                                     const internal::RocksDbHooks& hooks);
  ~RocksDbEngine() override;

  Result<std::unique_ptr<LaneStore>> OpenLane(uint32_t lane, uint32_t num_lanes) override;
  Status PutMeta(std::string_view key, std::string_view value) override;
  Result<std::optional<std::string>> GetMeta(std::string_view key) override;
  Status ScanMeta(std::string_view prefix,
                  const std::function<void(std::string_view, std::string_view)>& fn) override;
  Status CreateCheckpoint(const std::string& dir) override;
  bool durable() const override { return true; }
  Status AppendLog(uint64_t seq, std::string_view entry) override;
  Status AppendLogGroup(std::span<const LogEntry> entries) override;
  Status ScanLog(uint64_t after,
                 const std::function<Status(uint64_t, std::string_view)>& fn) override;
  Status TruncateLog(uint64_t upto) override;
  std::vector<std::pair<std::string, uint64_t>> EngineStats() const override;

  // For lanes.
  rocksdb::ColumnFamilyHandle* meta_cf() const { return meta_cf_; }
  rocksdb::DB* db() const { return db_; }
  const std::string& dir() const { return options_.data_dir; }
  // The column family of a table, created on first use; checks the stored layout.
  Result<rocksdb::ColumnFamilyHandle*> TableFamily(uint64_t table_id, const std::string& layout);
  // Writes a batch with the WAL, as durably as the mode asks.
  Status Write(rocksdb::WriteBatch* batch);
  // Writes rows without the WAL: durable at the next memtable flush (atomic across families).
  Status WriteRows(rocksdb::WriteBatch* batch);
  // Queues a lane's hand-off for the writer thread.
  void Submit(std::shared_ptr<WriteBackJob> job);
  void ReleaseLane(uint32_t lane) {
    std::lock_guard<std::mutex> l(mu_);
    open_lanes_.erase(lane);
  }
  Status FlushMemtables();

 private:
  RocksDbEngine(const StorageOptions& options) : options_(options) {}
  Status DurableMetaWrite(rocksdb::WriteBatch* batch);
  void FlusherLoop();
  void WriterLoop();
  // Writes a round of hand-offs, then flushes every memtable: their rows and marks are on disk
  // together or not at all.
  void WriteRound(std::vector<std::shared_ptr<WriteBackJob>>& round);
  Status BackgroundError() {
    if (!has_bg_error_.load(std::memory_order_acquire)) return Status::OK();
    std::lock_guard<std::mutex> l(mu_);
    return bg_error_;
  }

  const StorageOptions options_;
  rocksdb::ColumnFamilyOptions table_cf_options_;
  rocksdb::DB* db_ = nullptr;
  rocksdb::ColumnFamilyHandle* meta_cf_ = nullptr;
  rocksdb::ColumnFamilyHandle* log_cf_ = nullptr;
  std::vector<rocksdb::ColumnFamilyHandle*> handles_;  // owned; every family opened

  mutable std::mutex mu_;
  std::map<uint64_t, rocksdb::ColumnFamilyHandle*> families_;  // guarded by mu_
  std::set<uint32_t> open_lanes_;                              // guarded by mu_
  Status bg_error_;                                            // guarded by mu_
  std::atomic<bool> has_bg_error_{false};

  // The request log (docs/storage.md); the "log" family holds entries of older versions only.
  std::unique_ptr<internal::LogFile> log_file_;
  bool legacy_log_ = false;

  // The writer thread of write-back hand-offs.
  std::thread writer_;
  std::mutex writer_mu_;
  std::condition_variable writer_cv_;
  std::vector<std::shared_ptr<WriteBackJob>> jobs_;  // guarded by writer_mu_
  bool writer_stop_ = false;                         // guarded by writer_mu_
  bool resume_ = false;                              // writer thread: the last round failed

  // Relaxed mode: a thread flushes the log buffer (and the WAL) every relaxed_window_ms / 2.
  std::thread flusher_;
  std::mutex flusher_mu_;
  std::condition_variable flusher_cv_;
  bool stop_ = false;  // guarded by flusher_mu_
};

Result<std::unique_ptr<RocksDbEngine>> RocksDbEngine::Open(const StorageOptions& options,
                                                           const internal::RocksDbHooks& hooks) {
  if (options.data_dir.empty()) return Status::InvalidArgument("data_dir is empty");
  if (options.background_jobs < 1) {
    return Status::InvalidArgument("background_jobs must be at least 1");
  }
  if (options.durability == Durability::kRelaxed && options.relaxed_window_ms == 0) {
    return Status::InvalidArgument("relaxed_window_ms must be positive in the relaxed mode");
  }
  std::unique_ptr<RocksDbEngine> engine(new RocksDbEngine(options));
  rocksdb::Env* env = hooks.env != nullptr ? hooks.env : rocksdb::Env::Default();

  // Parents first: RocksDB only creates the last path component.
  const std::filesystem::path dir(options.data_dir);
  if (dir.has_parent_path()) {
    std::error_code ec;
    std::filesystem::create_directories(dir.parent_path(), ec);
    if (ec) {
      return Status::IOError("cannot create the parent of data_dir '" + options.data_dir +
                             "': " + ec.message());
    }
  }

  // The tuning (docs/storage.md) lives in rocksdb_tuning.cc, shared with bench_storage.
  TESSERA_ASSIGN_OR_RETURN(internal::RocksDbTuning tuning, internal::TuneRocksDb(options));
  rocksdb::DBOptions db_opts = std::move(tuning.db);
  db_opts.env = env;
  engine->table_cf_options_ = std::move(tuning.table);

  std::vector<std::string> names;
  const bool exists = env->FileExists(options.data_dir + "/CURRENT").ok();
  if (exists) {
    auto s = rocksdb::DB::ListColumnFamilies(db_opts, options.data_dir, &names);
    if (!s.ok()) return FromRocks(s, "listing the column families of '" + options.data_dir + "'");
  } else {
    names.push_back(rocksdb::kDefaultColumnFamilyName);
  }
  if (std::find(names.begin(), names.end(), kMetaFamily) == names.end()) {
    names.push_back(kMetaFamily);
  }
  if (std::find(names.begin(), names.end(), kLogFamily) == names.end()) {
    names.push_back(kLogFamily);
  }
  std::vector<rocksdb::ColumnFamilyDescriptor> descs;
  for (const auto& n : names) {
    uint64_t id;
    descs.emplace_back(
        n, ParseFamilyName(n, &id) ? engine->table_cf_options_ : rocksdb::ColumnFamilyOptions());
  }
  auto s = rocksdb::DB::Open(db_opts, options.data_dir, descs, &engine->handles_, &engine->db_);
  if (!s.ok()) return FromRocks(s, "opening RocksDB in '" + options.data_dir + "'");
  for (size_t i = 0; i < names.size(); ++i) {
    uint64_t id;
    if (names[i] == kMetaFamily) {
      engine->meta_cf_ = engine->handles_[i];
    } else if (names[i] == kLogFamily) {
      engine->log_cf_ = engine->handles_[i];
    } else if (ParseFamilyName(names[i], &id)) {
      engine->families_[id] = engine->handles_[i];
    }
  }
  {
    // Entries an older version logged into the "log" family are replayed once, then deleted.
    std::unique_ptr<rocksdb::Iterator> it(
        engine->db_->NewIterator(rocksdb::ReadOptions(), engine->log_cf_));
    it->SeekToFirst();
    engine->legacy_log_ = it->Valid();
  }
  internal::LogFileOptions lo;
  lo.dir = options.log_dir.empty() ? options.data_dir + "/request-log" : options.log_dir;
  lo.fsync = options.fsync;
  lo.buffered = options.durability == Durability::kRelaxed;
  TESSERA_ASSIGN_OR_RETURN(engine->log_file_, internal::LogFile::Open(lo));
  engine->writer_ = std::thread([e = engine.get()] { e->WriterLoop(); });
  if (options.durability == Durability::kRelaxed) {
    engine->flusher_ = std::thread([e = engine.get()] { e->FlusherLoop(); });
  }
  return engine;
}

RocksDbEngine::~RocksDbEngine() {
  if (writer_.joinable()) {
    {
      std::lock_guard<std::mutex> l(writer_mu_);
      writer_stop_ = true;
    }
    writer_cv_.notify_all();
    writer_.join();
  }
  if (flusher_.joinable()) {
    {
      std::lock_guard<std::mutex> l(flusher_mu_);
      stop_ = true;
    }
    flusher_cv_.notify_all();
    flusher_.join();
  }
  log_file_.reset();  // writes what the relaxed mode buffered
  if (db_ == nullptr) return;
  if (options_.durability == Durability::kRelaxed) {
    auto s = db_->FlushWAL(options_.fsync);
    if (!s.ok()) LOG(ERROR) << "flushing the WAL of " << options_.data_dir << ": " << s.ToString();
  }
  for (auto* h : handles_) db_->DestroyColumnFamilyHandle(h).PermitUncheckedError();
  auto s = db_->Close();
  if (!s.ok()) LOG(ERROR) << "closing RocksDB in " << options_.data_dir << ": " << s.ToString();
  delete db_;
}

void RocksDbEngine::FlusherLoop() {
  const auto period =
      std::chrono::milliseconds(std::max<uint32_t>(1, options_.relaxed_window_ms / 2));
  std::unique_lock<std::mutex> l(flusher_mu_);
  while (!stop_) {
    flusher_cv_.wait_for(l, period, [this] { return stop_; });
    if (stop_) break;
    l.unlock();
    Status s = log_file_->Flush();
    if (s.ok()) s = FromRocks(db_->FlushWAL(options_.fsync), "flushing the WAL");
    if (!s.ok()) {
      std::lock_guard<std::mutex> g(mu_);
      if (bg_error_.ok()) {
        bg_error_ = s.WithContext("'" + options_.data_dir + "'");
        LOG(ERROR) << bg_error_.ToString();
      }
      has_bg_error_.store(true, std::memory_order_release);
    }
    l.lock();
  }
}

Status RocksDbEngine::Write(rocksdb::WriteBatch* batch) {
  TESSERA_RETURN_IF_ERROR(BackgroundError());
  rocksdb::WriteOptions wo;
  wo.sync = options_.fsync && options_.durability == Durability::kStrict;
  return FromRocks(db_->Write(wo, batch), "writing to '" + options_.data_dir + "'");
}

Status RocksDbEngine::WriteRows(rocksdb::WriteBatch* batch) {
  rocksdb::WriteOptions wo;
  wo.disableWAL = true;
  return FromRocks(db_->Write(wo, batch), "writing rows to '" + options_.data_dir + "'");
}

void RocksDbEngine::Submit(std::shared_ptr<WriteBackJob> job) {
  {
    std::lock_guard<std::mutex> l(writer_mu_);
    jobs_.push_back(std::move(job));
  }
  writer_cv_.notify_one();
}

void RocksDbEngine::WriterLoop() {
  std::vector<std::shared_ptr<WriteBackJob>> round;
  for (;;) {
    {
      std::unique_lock<std::mutex> l(writer_mu_);
      writer_cv_.wait(l, [this] { return writer_stop_ || !jobs_.empty(); });
      if (jobs_.empty()) return;  // stopping, nothing left
      round.swap(jobs_);
    }
    WriteRound(round);
    round.clear();
  }
}

void RocksDbEngine::WriteRound(std::vector<std::shared_ptr<WriteBackJob>>& round) {
  Status s;
  if (resume_) {
    // The last round failed and RocksDB may refuse writes until it recovers (space freed).
    // Busy: its own recovery runs; the writes below tell whether it is done.
    const rocksdb::Status r = db_->Resume();
    if (!r.ok() && !r.IsBusy()) {
      s = FromRocks(r, "resuming '" + options_.data_dir + "' after a failed write");
    }
  }
  // Write-ahead: the rows carry their lanes' applied marks, so every log entry up to them must
  // be in the log file first. In relaxed mode entries wait in the log's buffer; a mark stored
  // ahead of the file, then a kill -9, left the next entry after a gap that made every later
  // start fail (Corruption: record N follows M).
  if (s.ok() && log_file_ != nullptr) s = log_file_->Flush();
  for (auto& job : round) {
    if (s.ok()) s = job->AppendSortedRows();
    if (s.ok()) s = WriteRows(&job->batch);
    // In the memtables now (or failed: Reap marks the rows dirty again): the batch's bytes go
    // before the flush, not after the round.
    job->TrimBuffers(/*batch_too=*/true);
  }
  // Rows went in without the WAL: they and their marks are durable once every memtable is
  // flushed, atomically across the column families (atomic_flush).
  if (s.ok()) s = FlushMemtables();
  resume_ = !s.ok();
  if (!s.ok()) LOG(WARNING) << "write-back: " << s.ToString();
  for (auto& job : round) {
    job->error = s;
    job->state.store(s.ok() ? WriteBackJob::kDone : WriteBackJob::kFailed,
                     std::memory_order_release);
    job->state.notify_all();
  }
}

Status RocksDbEngine::DurableMetaWrite(rocksdb::WriteBatch* batch) {
  rocksdb::WriteOptions wo;
  wo.sync = options_.fsync;
  TESSERA_RETURN_IF_ERROR(
      FromRocks(db_->Write(wo, batch), "writing metadata to '" + options_.data_dir + "'"));
  // Metadata is durable on return in both modes.
  if (options_.durability == Durability::kRelaxed) {
    TESSERA_RETURN_IF_ERROR(FromRocks(db_->FlushWAL(options_.fsync), "flushing the WAL"));
  }
  return Status::OK();
}

Result<std::unique_ptr<LaneStore>> RocksDbEngine::OpenLane(uint32_t lane, uint32_t num_lanes) {
  if (num_lanes == 0 || lane >= num_lanes) {
    return Status::InvalidArgument("lane " + std::to_string(lane) + " of " +
                                   std::to_string(num_lanes));
  }
  {
    std::lock_guard<std::mutex> l(mu_);
    if (!open_lanes_.insert(lane).second) {
      return Status::AlreadyExists("lane " + std::to_string(lane) + " is already open");
    }
  }
  const uint64_t budget = options_.memory_budget_bytes / num_lanes;
  // An explicit budget never rounds down to "unbounded".
  return std::unique_ptr<LaneStore>(new RocksDbLaneStore(
      this, lane, num_lanes, options_.memory_budget_bytes != 0 ? std::max<uint64_t>(budget, 1) : 0,
      MaxDirtyBytesPerLane(options_, num_lanes)));
}

Result<rocksdb::ColumnFamilyHandle*> RocksDbEngine::TableFamily(uint64_t table_id,
                                                                const std::string& layout) {
  std::lock_guard<std::mutex> l(mu_);
  const std::string layout_key = kLayoutPrefix + std::to_string(table_id);
  std::string stored;
  auto s = db_->Get(rocksdb::ReadOptions(), meta_cf_, layout_key, &stored);
  if (s.ok() && stored != layout) {
    return Status::FailedPrecondition("table id " + std::to_string(table_id) + " in '" +
                                      options_.data_dir + "' was stored as '" + stored +
                                      "', the spec now gives '" + layout + "'");
  }
  if (!s.ok() && !s.IsNotFound()) return FromRocks(s, "reading table layout");
  auto it = families_.find(table_id);
  rocksdb::ColumnFamilyHandle* h = nullptr;
  if (it != families_.end()) {
    h = it->second;
  } else {
    auto cs = db_->CreateColumnFamily(table_cf_options_, FamilyName(table_id), &h);
    if (!cs.ok())
      return FromRocks(cs, "creating the column family of table " + std::to_string(table_id));
    handles_.push_back(h);
    families_[table_id] = h;
  }
  if (s.IsNotFound()) {
    rocksdb::WriteBatch b;
    auto ps = b.Put(meta_cf_, layout_key, layout);
    if (!ps.ok()) return FromRocks(ps, "recording table layout");
    TESSERA_RETURN_IF_ERROR(DurableMetaWrite(&b));
  }
  return h;
}

Status RocksDbEngine::PutMeta(std::string_view key, std::string_view value) {
  rocksdb::WriteBatch b;
  auto s = b.Put(meta_cf_, rocksdb::Slice(key.data(), key.size()),
                 rocksdb::Slice(value.data(), value.size()));
  if (!s.ok()) return FromRocks(s, "PutMeta");
  return DurableMetaWrite(&b);
}

Result<std::optional<std::string>> RocksDbEngine::GetMeta(std::string_view key) {
  std::string v;
  auto s = db_->Get(rocksdb::ReadOptions(), meta_cf_, rocksdb::Slice(key.data(), key.size()), &v);
  if (s.IsNotFound()) return std::optional<std::string>();
  if (!s.ok()) return FromRocks(s, "GetMeta '" + std::string(key) + "'");
  return std::optional<std::string>(std::move(v));
}

Status RocksDbEngine::ScanMeta(std::string_view prefix,
                               const std::function<void(std::string_view, std::string_view)>& fn) {
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), meta_cf_));
  for (it->Seek(rocksdb::Slice(prefix.data(), prefix.size())); it->Valid(); it->Next()) {
    const std::string_view k(it->key().data(), it->key().size());
    if (!k.starts_with(prefix)) break;
    fn(k, std::string_view(it->value().data(), it->value().size()));
  }
  return FromRocks(it->status(), "ScanMeta");
}

Status RocksDbEngine::CreateCheckpoint(const std::string& dir) {
  TESSERA_RETURN_IF_ERROR(BackgroundError());
  if (options_.durability == Durability::kRelaxed) {
    TESSERA_RETURN_IF_ERROR(FromRocks(db_->FlushWAL(options_.fsync), "flushing the WAL"));
  }
  rocksdb::Checkpoint* raw = nullptr;
  TESSERA_RETURN_IF_ERROR(FromRocks(rocksdb::Checkpoint::Create(db_, &raw), "checkpoint"));
  std::unique_ptr<rocksdb::Checkpoint> cp(raw);
  // Memtables are flushed only when the WAL is large; a small WAL is copied instead (a shorter
  // pause), and replayed when the checkpoint is opened.
  return FromRocks(cp->CreateCheckpoint(dir, /*log_size_for_flush=*/uint64_t{64} << 20),
                   "creating checkpoint '" + dir + "'");
}

Status RocksDbEngine::AppendLog(uint64_t seq, std::string_view entry) {
  TESSERA_RETURN_IF_ERROR(BackgroundError());
  return log_file_->Append(seq, entry);
}

Status RocksDbEngine::AppendLogGroup(std::span<const LogEntry> entries) {
  TESSERA_RETURN_IF_ERROR(BackgroundError());
  return log_file_->Append(entries);
}

Status RocksDbEngine::ScanLog(uint64_t after,
                              const std::function<Status(uint64_t, std::string_view)>& fn) {
  if (legacy_log_) {
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), log_cf_));
    for (it->Seek(SeqKey(after + 1)); it->Valid(); it->Next()) {
      if (it->key().size() != 8) return Status::Corruption("malformed request-log key");
      const uint64_t seq = SeqOfKey(it->key());
      TESSERA_RETURN_IF_ERROR(fn(seq, std::string_view(it->value().data(), it->value().size())));
      after = std::max(after, seq);
    }
    TESSERA_RETURN_IF_ERROR(FromRocks(it->status(), "reading the request log"));
  }
  return log_file_->Scan(after, fn);
}

std::vector<std::pair<std::string, uint64_t>> RocksDbEngine::EngineStats() const {
  // RocksDB's memory by kind (docs/operations.md, "Capacity"): over every column family.
  std::vector<std::pair<std::string, uint64_t>> out;
  auto add = [&](const char* name, const std::string& property) {
    uint64_t v = 0;
    if (db_->GetAggregatedIntProperty(property, &v)) out.emplace_back(name, v);
  };
  // The tables share one block cache (the default family has its own): the largest figure.
  uint64_t cache = 0, pinned = 0;
  {
    std::lock_guard<std::mutex> l(mu_);
    for (const auto& [id, h] : families_) {
      uint64_t v = 0;
      if (db_->GetIntProperty(h, rocksdb::DB::Properties::kBlockCacheUsage, &v)) {
        cache = std::max(cache, v);
      }
      if (db_->GetIntProperty(h, rocksdb::DB::Properties::kBlockCachePinnedUsage, &v)) {
        pinned = std::max(pinned, v);
      }
    }
  }
  out.emplace_back("rocksdb_block_cache_bytes", cache);
  out.emplace_back("rocksdb_block_cache_pinned_bytes", pinned);
  add("rocksdb_memtable_bytes", rocksdb::DB::Properties::kSizeAllMemTables);
  add("rocksdb_table_readers_bytes", rocksdb::DB::Properties::kEstimateTableReadersMem);
  out.emplace_back("request_log_bytes", log_file_ ? log_file_->bytes() : 0);
  return out;
}

Status RocksDbEngine::TruncateLog(uint64_t upto) {
  if (upto == 0) return Status::OK();
  if (legacy_log_) {
    rocksdb::WriteBatch b;
    auto s = b.DeleteRange(log_cf_, SeqKey(0), SeqKey(upto + 1));
    if (!s.ok()) return FromRocks(s, "truncating the request log");
    TESSERA_RETURN_IF_ERROR(Write(&b));
  }
  return log_file_->Truncate(upto);
}

Status RocksDbEngine::FlushMemtables() {
  std::vector<rocksdb::ColumnFamilyHandle*> all;
  {
    std::lock_guard<std::mutex> l(mu_);
    all = handles_;
  }
  rocksdb::FlushOptions fo;
  fo.wait = true;
  return FromRocks(db_->Flush(fo, all), "flush");
}

// ------------------------------------------------------------------------------------ lane impl
RocksDbLaneStore::RocksDbLaneStore(RocksDbEngine* engine, uint32_t lane, uint32_t num_lanes,
                                   uint64_t budget, uint64_t max_dirty)
    : engine_(engine),
      lane_(lane),
      num_lanes_(num_lanes),
      budget_(budget),
      row_budget_(budget == 0 ? 0
                              : std::max<uint64_t>(budget - std::min(max_dirty, budget / 2), 1)) {
  for (uint32_t s = 0; s < kNumSlots; ++s) {
    if (LaneOfSlot(s, num_lanes) == lane) lane_slots_.push_back(s);
  }
  std::string mark;
  if (engine_->db()
          ->Get(rocksdb::ReadOptions(), engine_->meta_cf(), LaneMarkKey(lane, num_lanes), &mark)
          .ok() &&
      mark.size() == 8) {
    committed_seq_ = applied_seq_ = SeqOfKey(mark);
  }
}

RocksDbLaneStore::~RocksDbLaneStore() {
  // Whole pushes applied but not committed yet: best effort (they were never acknowledged).
  Status s = Commit();
  if (!s.ok()) LOG(WARNING) << "lane " << lane_ << ": final commit: " << s.ToString();
  engine_->ReleaseLane(lane_);
}

Result<RocksDbLaneStore::Table*> RocksDbLaneStore::Get(uint64_t table_id, TableKind kind) {
  return internal::FindLaneTable(tables_, table_id, kind);
}

Status RocksDbLaneStore::AddTable(uint64_t table_id, const TableSpec& spec) {
  if (tables_.contains(table_id)) return Status::OK();
  TESSERA_RETURN_IF_ERROR(ValidateStoredTableSpec(spec));  // a stored table opens as it was
  auto t = std::make_unique<Table>();
  t->id = table_id;
  t->spec = spec;
  t->opt = Optimizer::Make(spec.optimizer);
  uint32_t floats = 0;
  if (spec.kind == TableKind::kSparse) {
    floats = spec.dim + t->opt->StateFloats(spec.dim);
  } else {
    floats = t->opt->StateFloats(1);  // per element for the layout record
  }
  TESSERA_ASSIGN_OR_RETURN(t->cf, engine_->TableFamily(table_id, LayoutOf(spec, floats)));
  t->floats = floats;
  t->gated = spec.admission.min_count > 1 || spec.admission.probability < 1;
  if (spec.kind == TableKind::kSparse) {
    t->rows = std::make_unique<CachedRows>(floats);
    sparse_tables_.push_back(t.get());
  }
  tables_.emplace(table_id, std::move(t));
  return Status::OK();
}

void RocksDbLaneStore::MakeRoom(const Table& t) {
  if (budget_ == 0) return;
  const size_t need = RowCost(t);
  while (charged_ + need > row_budget_) {
    bool evicted = false;
    for (size_t tries = 0; tries < sparse_tables_.size() && !evicted; ++tries) {
      Table* v = sparse_tables_[evict_turn_++ % sparse_tables_.size()];
      const uint32_t slot = v->rows->NextVictim();
      if (slot == CachedRows::kNoSlot) continue;
      EraseRow(v, slot);
      ++stats_.budget_evictions;
      evicted = true;
    }
    // Everything left is pinned by the uncommitted batch: the budget is exceeded until Commit.
    if (!evicted) return;
  }
}

uint32_t RocksDbLaneStore::InsertRow(Table* t, uint64_t key) {
  MakeRoom(*t);
  charged_ += RowCost(*t);
  return t->rows->Insert(key);
}

void RocksDbLaneStore::EraseRow(Table* t, uint32_t slot) {
  t->rows->Erase(slot);
  charged_ -= RowCost(*t);
}

Status RocksDbLaneStore::Fetch(Table* t, std::span<const uint64_t> keys,
                               const std::vector<uint32_t>& misses) {
  fetch_pos_.clear();
  fetch_keys_.clear();
  for (uint32_t i : misses) {
    if (fetch_pos_.try_emplace(keys[i], static_cast<uint32_t>(fetch_keys_.size())).second) {
      fetch_keys_.push_back(internal::EncodeSparseKey(keys[i]));
    }
  }
  const size_t n = fetch_keys_.size();
  fetch_off_.assign(n, 0);
  fetch_len_.assign(n, 0);
  fetch_bytes_.clear();
  const size_t row_bytes = internal::RowBytes(t->floats);
  std::vector<rocksdb::Slice> slices(std::min(n, kFetchBatch));
  std::vector<rocksdb::PinnableSlice> values(slices.size());
  std::vector<rocksdb::Status> statuses(slices.size());
  rocksdb::ReadOptions ro;
  // With a budget the memory tier is the row cache: a data block read for a row is not kept in
  // the block cache as well (one useful row in 4 KiB; the block cache keeps index and filter
  // blocks, and the blocks churning through it held a third of a budgeted server's heap).
  // Without one, every row read stays in memory anyway, and recovery's replay reads neighbours
  // of the same blocks.
  ro.fill_cache = budget_ == 0;
  for (size_t base = 0; base < n; base += kFetchBatch) {
    const size_t m = std::min(kFetchBatch, n - base);
    for (size_t j = 0; j < m; ++j) {
      slices[j] = rocksdb::Slice(fetch_keys_[base + j].bytes, internal::kSparseKeyBytes);
      values[j].Reset();
    }
    engine_->db()->MultiGet(ro, t->cf, m, slices.data(), values.data(), statuses.data());
    for (size_t j = 0; j < m; ++j) {
      if (statuses[j].IsNotFound()) continue;
      if (!statuses[j].ok()) {
        return FromRocks(statuses[j], "table '" + t->spec.name + "': reading rows");
      }
      if (values[j].size() != row_bytes) {
        uint64_t key = 0;
        internal::DecodeSparseKey(slices[j].ToStringView(), &key);
        return Status::Corruption("table '" + t->spec.name + "' key " + std::to_string(key) +
                                  ": stored row has " + std::to_string(values[j].size()) +
                                  " bytes, expected " + std::to_string(row_bytes));
      }
      fetch_off_[base + j] = fetch_bytes_.size();
      fetch_len_[base + j] = static_cast<uint32_t>(row_bytes);
      fetch_bytes_.append(values[j].data(), values[j].size());
      ++stats_.disk_reads;
    }
  }
  for (auto& v : values) v.Reset();
  return Status::OK();
}

Status RocksDbLaneStore::Lookup(uint64_t table_id, std::span<const uint64_t> keys,
                                std::span<float* const> out) {
  TESSERA_ASSIGN_OR_RETURN(Table * t, Get(table_id, TableKind::kSparse));
  if (out.size() != keys.size()) return Status::InvalidArgument("Lookup: keys and out differ");
  const uint32_t dim = t->spec.dim;
  CachedRows& rows = *t->rows;
  misses_.clear();
  for (size_t i = 0; i < keys.size(); ++i) {
    ++stats_.lookups;
    if (i + kPrefetchAhead < keys.size()) rows.Prefetch(keys[i + kPrefetchAhead]);
    const uint32_t slot = rows.Find(keys[i]);
    if (slot == CachedRows::kNoSlot) {
      misses_.push_back(static_cast<uint32_t>(i));
      continue;
    }
    ++stats_.memory_hits;
    rows.flags(slot) |= CachedRows::kReferenced;
    std::memcpy(out[i], rows.row(slot), sizeof(float) * dim);
  }
  if (misses_.empty()) return Status::OK();
  TESSERA_RETURN_IF_ERROR(Fetch(t, keys, misses_));
  for (uint32_t i : misses_) {
    const uint64_t key = keys[i];
    uint32_t slot = rows.Find(key);  // a duplicate of an earlier miss
    if (slot == CachedRows::kNoSlot) {
      const std::string_view stored = Fetched(key);
      if (stored.empty() && t->gated) {
        InitializeValues(t->spec.initializer, key, 0, dim, out[i]);
        continue;
      }
      slot = InsertRow(t, key);
      if (!stored.empty()) {
        // Size checked by Fetch.
        internal::DecodeRow(stored, t->floats, rows.mutable_row(slot), &rows.mutable_meta(slot), "")
            .IgnoreError();
      } else {
        float* row = rows.mutable_row(slot);
        InitializeValues(t->spec.initializer, key, 0, dim, row);
        t->opt->InitState(row + dim, dim);
      }
    }
    std::memcpy(out[i], rows.row(slot), sizeof(float) * dim);
  }
  return Status::OK();
}

Status RocksDbLaneStore::Apply(uint64_t table_id, std::span<const uint64_t> keys,
                               std::span<const float* const> grads, const ApplyContext& ctx) {
  TESSERA_ASSIGN_OR_RETURN(Table * t, Get(table_id, TableKind::kSparse));
  if (grads.size() != keys.size()) return Status::InvalidArgument("Apply: keys and grads differ");
  const uint32_t dim = t->spec.dim;
  CachedRows& rows = *t->rows;
  // Pass 1 pins the rows already in memory and finds the misses; the misses are read and
  // checked before anything is changed, so a push that fails changes nothing.
  // The slots found stay valid for pass 2: MarkDirty pins them, so no insert evicts them. (Two
  // Finds a key, each a chain of cache misses, were a third of a strict server's CPU.)
  misses_.clear();
  found_.resize(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    if (i + kPrefetchAhead < keys.size()) rows.Prefetch(keys[i + kPrefetchAhead]);
    const uint32_t slot = rows.Find(keys[i]);
    found_[i] = slot;
    if (slot == CachedRows::kNoSlot) {
      misses_.push_back(static_cast<uint32_t>(i));
    } else {
      ++stats_.apply_memory_hits;
      MarkDirty(t, slot);
    }
  }
  if (!misses_.empty()) TESSERA_RETURN_IF_ERROR(Fetch(t, keys, misses_));
  for (size_t i = 0; i < keys.size(); ++i) {
    const uint64_t key = keys[i];
    uint32_t slot = found_[i];
    if (slot == CachedRows::kNoSlot) slot = rows.Find(key);  // an earlier duplicate inserted it
    if (slot == CachedRows::kNoSlot) {
      const std::string_view stored = Fetched(key);
      if (stored.empty() && t->gated) {
        uint32_t& count = t->pending[key];
        ++count;
        if (!internal::Admitted(t->spec.admission, key, count)) continue;
        t->pending.erase(key);
      }
      slot = InsertRow(t, key);
      float* row = rows.mutable_row(slot);
      if (!stored.empty()) {
        internal::DecodeRow(stored, t->floats, row, &rows.mutable_meta(slot), "").IgnoreError();
      } else {
        InitializeValues(t->spec.initializer, key, 0, dim, row);
        t->opt->InitState(row + dim, dim);
      }
      MarkDirty(t, slot);
    }
    RowMeta& meta = rows.mutable_meta(slot);
    ++meta.update_count;
    meta.last_step = static_cast<uint32_t>(ctx.step);
    meta.last_update_s = ctx.now_s;
    rows.flags(slot) |= CachedRows::kReferenced;
    float* row = rows.mutable_row(slot);
    t->opt->Apply(row, row + dim, grads[i], dim, 0, dim, meta.update_count, ctx.lr_scale);
    ++stats_.applies;
  }
  return Status::OK();
}

Result<RocksDbLaneStore::DenseChunk*> RocksDbLaneStore::GetChunk(Table* t, uint64_t chunk) {
  auto it = t->dense.find(chunk);
  if (it != t->dense.end()) return &it->second;
  if (chunk >= (t->spec.length + kDenseChunkFloats - 1) / kDenseChunkFloats) {
    return Status::InvalidArgument("table '" + t->spec.name + "' has no dense chunk " +
                                   std::to_string(chunk));
  }
  const uint32_t len = internal::DenseChunkLength(t->spec.length, chunk);
  const uint32_t floats = len + t->opt->StateFloats(len);
  DenseChunk c;
  c.len = len;
  c.data.resize(floats);
  rocksdb::PinnableSlice v;
  const auto key = internal::EncodeDenseKey(chunk);
  auto s = engine_->db()->Get(rocksdb::ReadOptions(), t->cf,
                              rocksdb::Slice(key.bytes, internal::kDenseKeyBytes), &v);
  if (s.ok()) {
    TESSERA_RETURN_IF_ERROR(
        internal::DecodeRow(v.ToStringView(), floats, c.data.data(), &c.meta,
                            "table '" + t->spec.name + "' dense chunk " + std::to_string(chunk)));
    ++stats_.disk_reads;
  } else if (s.IsNotFound()) {
    InitializeValues(t->spec.initializer, 0, chunk * kDenseChunkFloats, len, c.data.data());
    t->opt->InitState(c.data.data() + len, len);
  } else {
    return FromRocks(s, "table '" + t->spec.name + "': reading dense chunk");
  }
  return &t->dense.emplace(chunk, std::move(c)).first->second;
}

Status RocksDbLaneStore::DenseRead(uint64_t table_id, uint64_t chunk, uint32_t begin, uint32_t end,
                                   float* out) {
  TESSERA_ASSIGN_OR_RETURN(Table * t, Get(table_id, TableKind::kDense));
  TESSERA_ASSIGN_OR_RETURN(DenseChunk * c, GetChunk(t, chunk));
  if (end > c->len || begin > end) return Status::InvalidArgument("dense range out of chunk");
  std::memcpy(out, c->data.data() + begin, sizeof(float) * (end - begin));
  return Status::OK();
}

Status RocksDbLaneStore::DenseApply(uint64_t table_id, uint64_t chunk, uint32_t begin, uint32_t end,
                                    const float* grad, const ApplyContext& ctx) {
  TESSERA_ASSIGN_OR_RETURN(Table * t, Get(table_id, TableKind::kDense));
  TESSERA_ASSIGN_OR_RETURN(DenseChunk * c, GetChunk(t, chunk));
  if (end > c->len || begin > end) return Status::InvalidArgument("dense range out of chunk");
  ++c->meta.update_count;
  c->meta.last_step = static_cast<uint32_t>(ctx.step);
  c->meta.last_update_s = ctx.now_s;
  t->opt->Apply(c->data.data(), c->data.data() + c->len, grad, c->len, begin, end,
                c->meta.update_count, ctx.lr_scale);
  MarkChunkDirty(t, chunk, c);
  ++stats_.applies;
  return Status::OK();
}

bool RocksDbLaneStore::HasDirty() const {
  for (const auto& [id, t] : tables_) {
    if (!t->dirty_slots.empty() || !t->dirty_chunks.empty()) return true;
  }
  return false;
}

size_t RocksDbLaneStore::WriteBackBytes() const {
  size_t bytes = 64;  // the lane mark
  for (const auto& [id, t] : tables_) {
    if (t->rows) {
      bytes += t->dirty_slots.size() *
               (internal::kSparseKeyBytes + internal::RowBytes(t->floats) + kBatchRecordBytes);
    }
    bytes += t->dirty_chunks.size() *
             (internal::kDenseKeyBytes +
              internal::RowBytes(static_cast<uint32_t>(kDenseChunkFloats * (1 + t->floats))) +
              kBatchRecordBytes);
  }
  return bytes;
}

uint64_t RocksDbLaneStore::dirty_bytes() const {
  uint64_t bytes = 0;
  for (const auto& [id, t] : tables_) {
    if (t->rows) bytes += (t->dirty_slots.size() + t->flight_slots.size()) * t->rows->slot_bytes();
    // Dense: t->floats is the state per element.
    bytes += (t->dirty_chunks.size() + t->flight_chunks.size()) * sizeof(float) *
             kDenseChunkFloats * (1 + t->floats);
  }
  return bytes;
}

Status RocksDbLaneStore::HandOff() {
  std::shared_ptr<WriteBackJob> job = std::move(spare_);
  if (job) {
    job->Reset();
  } else {
    job = std::make_shared<WriteBackJob>();
  }
  // Reserved at its final size (a WriteBatch grows by doubling: the copies and page faults of a
  // million-row write-back were a fifth of the writer's time). Allocated here, touched by
  // whoever encodes the rows.
  job->batch = rocksdb::WriteBatch(WriteBackBytes());
  // The applied-log mark goes in the same batch as the rows it describes.
  auto s = job->batch.Put(engine_->meta_cf(), LaneMarkKey(lane_, num_lanes_), SeqKey(applied_seq_));
  uint64_t rows = 0;
  for (auto& [id, t] : tables_) {
    rows += t->dirty_slots.size() + t->dirty_chunks.size();
    if (!t->dirty_slots.empty()) {
      if (budget_ != 0) {
        // Copied here, into the batch: the rows' bytes come out of the budget's reserve.
        if (s.ok()) s = job->CopySortedRows(*t->rows, t->cf, t->dirty_slots);
      } else {
        // No row is copied here: the writer encodes them from the frozen arena, and a push that
        // changes one meanwhile copies its block.
        WriteBackJob::Family& f = job->NextFamily(t->cf, t->floats);
        f.frozen = t->rows->Freeze();
        f.slots.assign(t->dirty_slots.begin(), t->dirty_slots.end());
      }
      // The rows stay pinned (in flight) until Reap.
      t->rows->BeginFlight();
      t->flight_slots.swap(t->dirty_slots);  // flight_slots was empty: reaped before
    }
    for (uint64_t chunk : t->dirty_chunks) {
      DenseChunk& c = t->dense.at(chunk);
      internal::EncodeRow(c.data.data(), static_cast<uint32_t>(c.data.size()), c.meta,
                          &encode_buf_);
      const auto key = internal::EncodeDenseKey(chunk);
      if (s.ok()) {
        s = job->batch.Put(t->cf, rocksdb::Slice(key.bytes, internal::kDenseKeyBytes), encode_buf_);
      }
      c.dirty = false;
      t->flight_chunks.push_back(chunk);
    }
    t->dirty_slots.clear();
    t->dirty_chunks.clear();
  }
  flight_ = job;
  flight_seq_ = applied_seq_;
  flight_rows_ = rows;
  if (!s.ok()) {
    // A batch RocksDB cannot hold (over its 4 GiB limit): nothing goes out, rows stay dirty.
    job->error = FromRocks(s, "building the write-back batch");
    job->state.store(WriteBackJob::kFailed);
    return Reap();
  }
  engine_->Submit(std::move(job));
  return Status::OK();
}

Status RocksDbLaneStore::Reap() {
  std::shared_ptr<WriteBackJob> job = std::move(flight_);
  const bool ok = job->state.load(std::memory_order_acquire) == WriteBackJob::kDone;
  job->ReleaseRows();  // when the writer failed before encoding them
  for (auto& [id, t] : tables_) {
    if (t->rows) {
      if (!ok) {
        for (uint32_t slot : t->flight_slots) MarkDirty(t.get(), slot);  // pinned: not moved
      }
      t->rows->EndFlight();
    }
    t->flight_slots.clear();
    // No slot numbers are held now (unless rows changed again meanwhile): rows may move.
    if (t->rows && t->dirty_slots.empty()) t->rows->Compact();
    if (!ok) {
      for (uint64_t chunk : t->flight_chunks) MarkChunkDirty(t.get(), chunk, &t->dense.at(chunk));
    }
    t->flight_chunks.clear();
  }
  const Status error = job->error;
  spare_ = std::move(job);
  if (!ok) return error;
  committed_seq_ = flight_seq_;
  ++stats_.commits;
  stats_.rows_written += flight_rows_;
  return Status::OK();
}

Status RocksDbLaneStore::WriteBack(bool wait) {
  Status reaped;
  if (flight_) {
    if (!wait && flight_->state.load(std::memory_order_acquire) == WriteBackJob::kQueued) {
      return Status::OK();  // one hand-off at a time
    }
    flight_->Wait();
    reaped = Reap();
  }
  if (!HasDirty() && applied_seq_ == committed_seq_) return reaped;
  Status s = HandOff();
  return reaped.ok() ? s : reaped;
}

Status RocksDbLaneStore::Commit() {
  (void)WriteBack(/*wait=*/true);  // a failed earlier hand-off goes out again with this one
  if (!flight_) return Status::OK();
  flight_->Wait();
  return Reap();
}

// A lane's rows at one point: a RocksDB snapshot (every row written back by then) with the rows
// not yet durable (dirty or in flight: pinned in memory) laid over it: sparse rows frozen in the
// lane's arena (copy-on-write), dense chunks copied.
class RocksDbLaneSnapshot final : public LaneSnapshot {
 public:
  struct Table {
    TableSpec spec;
    rocksdb::ColumnFamilyHandle* cf = nullptr;
    uint32_t floats = 0;  // sparse: value + state per row
    // Sparse: the arena as it was and the slots of its pinned rows (a slot may be listed twice:
    // dirty and in flight). Indexed by the reader (pinned), not by the lane. Scanned once: the
    // scan lets go of the arena as it goes.
    CachedRows::Frozen frozen;
    std::vector<uint32_t> slots;
    absl::flat_hash_set<uint64_t> pinned;
    bool scanned = false;
    // Dense: chunks copied at the cut, one after the other: u64 chunk, u32 length, then the
    // chunk encoded as on disk. Indexed by the reader (copied).
    std::string bytes;
    absl::flat_hash_map<uint64_t, std::pair<size_t, size_t>> copied;
    std::unique_ptr<Optimizer> opt;  // dense: the state floats of a chunk
    void Index() {
      if (pinned.empty() && !slots.empty() && !frozen.empty()) {
        pinned.reserve(slots.size());
        for (uint32_t slot : slots) pinned.insert(frozen.key(slot));
      }
      if (!copied.empty() || bytes.empty()) return;
      for (size_t at = 0; at + 12 <= bytes.size();) {
        uint64_t key;
        uint32_t len;
        std::memcpy(&key, bytes.data() + at, 8);
        std::memcpy(&len, bytes.data() + at + 8, 4);
        copied[key] = {at + 12, len};
        at += 12 + len;
      }
    }
  };
  RocksDbLaneSnapshot(rocksdb::DB* db, std::vector<uint32_t> slots, uint32_t lane,
                      uint32_t num_lanes, absl::flat_hash_map<uint64_t, Table> tables)
      : db_(db),
        snapshot_(db->GetSnapshot()),
        slots_(std::move(slots)),
        lane_(lane),
        num_lanes_(num_lanes),
        tables_(std::move(tables)) {}
  ~RocksDbLaneSnapshot() override { db_->ReleaseSnapshot(snapshot_); }

  Status Scan(uint64_t table_id, const LaneStore::RowVisitor& fn) override;
  Status ScanDense(uint64_t table_id, const LaneStore::ChunkVisitor& fn) override;

 private:
  Result<Table*> Get(uint64_t id, TableKind kind) {
    auto it = tables_.find(id);
    if (it == tables_.end() || it->second.spec.kind != kind) {
      return Status::NotFound("table id " + std::to_string(id) + " not in the snapshot");
    }
    return &it->second;
  }
  std::unique_ptr<rocksdb::Iterator> NewIterator(const Table& t) {
    rocksdb::ReadOptions ro;
    ro.snapshot = snapshot_;
    ro.fill_cache = false;  // a scan must not push the hot rows out
    return std::unique_ptr<rocksdb::Iterator>(db_->NewIterator(ro, t.cf));
  }

  rocksdb::DB* const db_;
  const rocksdb::Snapshot* const snapshot_;
  const std::vector<uint32_t> slots_;
  const uint32_t lane_, num_lanes_;
  absl::flat_hash_map<uint64_t, Table> tables_;
  std::vector<float> row_;
};

Status RocksDbLaneSnapshot::Scan(uint64_t table_id, const LaneStore::RowVisitor& fn) {
  TESSERA_ASSIGN_OR_RETURN(Table * t, Get(table_id, TableKind::kSparse));
  TESSERA_RETURN_IF_ERROR(internal::ClaimScan(&t->scanned, t->spec.name));
  t->Index();
  const uint32_t dim = t->spec.dim;
  row_.resize(t->floats);
  RowMeta meta;
  auto visit = [&](uint64_t key, std::string_view stored, bool* go) -> Status {
    TESSERA_RETURN_IF_ERROR(
        internal::DecodeRow(stored, t->floats, row_.data(), &meta,
                            "table '" + t->spec.name + "' key " + std::to_string(key)));
    *go = meta.update_count == 0 || fn(key, row_.data(), row_.data() + dim, meta);
    return Status::OK();
  };
  // The rows pinned in memory first, in arena order, letting go of each block once read.
  bool go = true;
  t->frozen.VisitAndRelease(t->slots, [&](uint32_t slot) {
    const RowMeta& m = t->frozen.meta(slot);
    const float* row = t->frozen.row(slot);
    if (go && m.update_count != 0) go = fn(t->frozen.key(slot), row, row + dim, m);
  });
  if (!go) return Status::OK();
  auto it = NewIterator(*t);
  for (uint32_t slot : slots_) {
    const std::string prefix = internal::SlotPrefix(slot);
    for (it->Seek(prefix); go && it->Valid() && it->key().starts_with(prefix); it->Next()) {
      uint64_t key;
      if (!internal::DecodeSparseKey(it->key().ToStringView(), &key)) {
        return Status::Corruption("table '" + t->spec.name + "': malformed stored key");
      }
      if (t->pinned.contains(key)) continue;  // newer in memory
      TESSERA_RETURN_IF_ERROR(visit(key, it->value().ToStringView(), &go));
    }
    TESSERA_RETURN_IF_ERROR(FromRocks(it->status(), "table '" + t->spec.name + "': scan"));
    if (!go) return Status::OK();
  }
  return Status::OK();
}

Status RocksDbLaneSnapshot::ScanDense(uint64_t table_id, const LaneStore::ChunkVisitor& fn) {
  TESSERA_ASSIGN_OR_RETURN(Table * t, Get(table_id, TableKind::kDense));
  t->Index();
  const uint64_t chunks = (t->spec.length + kDenseChunkFloats - 1) / kDenseChunkFloats;
  RowMeta meta;
  auto visit = [&](uint64_t chunk, std::string_view stored, bool* go) -> Status {
    const uint32_t len = internal::DenseChunkLength(t->spec.length, chunk);
    row_.resize(size_t{len} + t->opt->StateFloats(len));
    TESSERA_RETURN_IF_ERROR(
        internal::DecodeRow(stored, static_cast<uint32_t>(row_.size()), row_.data(), &meta,
                            "table '" + t->spec.name + "' dense chunk " + std::to_string(chunk)));
    *go = fn(chunk, row_.data(), len, meta);
    return Status::OK();
  };
  bool go = true;
  auto it = NewIterator(*t);
  for (it->SeekToFirst(); go && it->Valid(); it->Next()) {
    if (it->key().size() != internal::kDenseKeyBytes) {
      return Status::Corruption("table '" + t->spec.name + "': malformed dense chunk key");
    }
    const uint64_t chunk = internal::GetBigEndian64(it->key().data());
    if (chunk >= chunks) {
      return Status::Corruption("table '" + t->spec.name + "': stored chunk " +
                                std::to_string(chunk) + " is beyond the table's length");
    }
    if (LaneOfChunk(table_id, chunk, num_lanes_) != lane_ || t->copied.contains(chunk)) continue;
    TESSERA_RETURN_IF_ERROR(visit(chunk, it->value().ToStringView(), &go));
  }
  TESSERA_RETURN_IF_ERROR(FromRocks(it->status(), "table '" + t->spec.name + "': dense scan"));
  for (const auto& [chunk, at] : t->copied) {
    if (!go) break;
    TESSERA_RETURN_IF_ERROR(
        visit(chunk, std::string_view(t->bytes).substr(at.first, at.second), &go));
  }
  return Status::OK();
}

Result<std::unique_ptr<LaneSnapshot>> RocksDbLaneStore::TakeSnapshot() {
  return Freeze(lane_slots_);
}

Status RocksDbLaneStore::ScanSlots(uint64_t table_id, std::span<const uint32_t> slots,
                                   const RowVisitor& fn) {
  TESSERA_RETURN_IF_ERROR(Get(table_id, TableKind::kSparse).status());
  // Only the disk ranges of the slots asked for (a seek each), not every slot of the lane.
  std::vector<uint32_t> mine;
  for (uint32_t s : slots) {
    if (LaneOfSlot(s, num_lanes_) == lane_) mine.push_back(s);
  }
  std::sort(mine.begin(), mine.end());
  mine.erase(std::unique(mine.begin(), mine.end()), mine.end());
  std::vector<bool> wanted(kNumSlots, false);
  for (uint32_t s : mine) wanted[s] = true;
  TESSERA_ASSIGN_OR_RETURN(auto snapshot, Freeze(std::move(mine)));
  // The rows pinned in memory are visited whatever their slot: keep the slots asked for.
  return snapshot->Scan(table_id, [&](uint64_t key, const float* value, const float* state,
                                      const RowMeta& meta) {
    return !wanted[SlotOfKey(key)] || fn(key, value, state, meta);
  });
}

Result<std::unique_ptr<LaneSnapshot>> RocksDbLaneStore::Freeze(std::vector<uint32_t> slots) {
  absl::flat_hash_map<uint64_t, RocksDbLaneSnapshot::Table> tables;
  // The lane only appends (memcpy speed); the reader indexes the copies.
  auto copy = [](RocksDbLaneSnapshot::Table& f, uint64_t key, const float* row, uint32_t floats,
                 const RowMeta& meta) {
    const uint32_t len = static_cast<uint32_t>(internal::RowBytes(floats));
    const size_t at = f.bytes.size();
    f.bytes.resize(at + 12 + len);
    std::memcpy(f.bytes.data() + at, &key, 8);
    std::memcpy(f.bytes.data() + at + 8, &len, 4);
    internal::EncodeRowTo(row, floats, meta, f.bytes.data() + at + 12);
  };
  for (auto& [id, t] : tables_) {
    RocksDbLaneSnapshot::Table& f = tables[id];
    f.spec = t->spec;
    f.cf = t->cf;
    f.floats = t->floats;
    f.opt = Optimizer::Make(t->spec.optimizer);
    // Pinned rows (dirty, or handed to the writer) may be newer than RocksDB: frozen in the
    // arena, a pointer per block; the reader drops the slots listed twice.
    if (t->rows) {
      f.frozen = t->rows->Freeze();
      f.slots.reserve(t->dirty_slots.size() + t->flight_slots.size());
      f.slots.assign(t->dirty_slots.begin(), t->dirty_slots.end());
      f.slots.insert(f.slots.end(), t->flight_slots.begin(), t->flight_slots.end());
    }
    for (uint64_t chunk : t->dirty_chunks) {
      const DenseChunk& c = t->dense.at(chunk);
      copy(f, chunk, c.data.data(), static_cast<uint32_t>(c.data.size()), c.meta);
    }
    for (uint64_t chunk : t->flight_chunks) {
      const DenseChunk& c = t->dense.at(chunk);
      if (!c.dirty) copy(f, chunk, c.data.data(), static_cast<uint32_t>(c.data.size()), c.meta);
    }
  }
  // The RocksDB snapshot is taken now, on the lane's thread: every row not copied above was
  // written back before, and later writes of this lane (rows, eviction deletes) are newer.
  return std::unique_ptr<LaneSnapshot>(
      new RocksDbLaneSnapshot(engine_->db(), std::move(slots), lane_, num_lanes_, std::move(tables)));
}

Status RocksDbLaneStore::Scan(uint64_t table_id, const RowVisitor& fn) {
  TESSERA_RETURN_IF_ERROR(Get(table_id, TableKind::kSparse).status());
  TESSERA_ASSIGN_OR_RETURN(auto snapshot, TakeSnapshot());
  return snapshot->Scan(table_id, fn);
}

Status RocksDbLaneStore::ScanDense(uint64_t table_id, const ChunkVisitor& fn) {
  TESSERA_RETURN_IF_ERROR(Get(table_id, TableKind::kDense).status());
  TESSERA_ASSIGN_OR_RETURN(auto snapshot, TakeSnapshot());
  return snapshot->ScanDense(table_id, fn);
}

Status RocksDbLaneStore::PutRows(uint64_t table_id, std::span<const uint64_t> keys,
                                 std::span<const float* const> rows,
                                 std::span<const RowMeta> metas) {
  TESSERA_ASSIGN_OR_RETURN(Table * t, Get(table_id, TableKind::kSparse));
  if (rows.size() != keys.size() || metas.size() != keys.size()) {
    return Status::InvalidArgument("PutRows: keys, rows and metas differ in length");
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    uint32_t slot = t->rows->Find(keys[i]);
    if (slot == CachedRows::kNoSlot) slot = InsertRow(t, keys[i]);
    std::memcpy(t->rows->mutable_row(slot), rows[i], sizeof(float) * t->floats);
    t->rows->mutable_meta(slot) = metas[i];
    MarkDirty(t, slot);
    t->pending.erase(keys[i]);
  }
  return Status::OK();
}

Status RocksDbLaneStore::DeleteRows(uint64_t table_id, std::span<const uint64_t> keys) {
  TESSERA_ASSIGN_OR_RETURN(Table * t, Get(table_id, TableKind::kSparse));
  // Everything changed so far goes to disk first: no row is pinned by a hand-off then, so a
  // write-back in flight cannot bring a deleted row back.
  TESSERA_RETURN_IF_ERROR(Commit());
  rocksdb::WriteBatch deletes;
  for (uint64_t key : keys) {
    const uint32_t slot = t->rows->Find(key);
    if (slot != CachedRows::kNoSlot) EraseRow(t, slot);
    t->pending.erase(key);
    const auto k = internal::EncodeSparseKey(key);
    auto s = deletes.Delete(t->cf, rocksdb::Slice(k.bytes, internal::kSparseKeyBytes));
    if (!s.ok()) return FromRocks(s, "delete rows");
  }
  // Through the WAL (synced in strict mode), unlike row writes: the deletes carry no log mark
  // that recovery would replay them from.
  return deletes.Count() > 0 ? engine_->Write(&deletes) : Status::OK();
}

Status RocksDbLaneStore::PutDenseChunk(uint64_t table_id, uint64_t chunk, const float* row,
                                       const RowMeta& meta) {
  TESSERA_ASSIGN_OR_RETURN(Table * t, Get(table_id, TableKind::kDense));
  if (chunk >= (t->spec.length + kDenseChunkFloats - 1) / kDenseChunkFloats) {
    return Status::InvalidArgument("table '" + t->spec.name + "' has no dense chunk " +
                                   std::to_string(chunk));
  }
  DenseChunk& c = t->dense[chunk];
  c.len = internal::DenseChunkLength(t->spec.length, chunk);
  c.data.assign(row, row + c.len + t->opt->StateFloats(c.len));
  c.meta = meta;
  MarkChunkDirty(t, chunk, &c);
  return Status::OK();
}

Status RocksDbLaneStore::SweepDisk(Table* t, const ApplyContext& ctx, rocksdb::WriteBatch* batch) {
  rocksdb::ReadOptions ro;
  ro.fill_cache = false;
  std::unique_ptr<rocksdb::Iterator> it(engine_->db()->NewIterator(ro, t->cf));
  size_t examined = 0;
  while (examined < kSweepRowsPerCall) {
    if (t->sweep_slot >= lane_slots_.size()) {
      t->sweep_slot = 0;  // a full pass is done; the next call starts over
      t->sweep_from.clear();
      return Status::OK();
    }
    const std::string prefix = internal::SlotPrefix(lane_slots_[t->sweep_slot]);
    it->Seek(t->sweep_from.empty() ? prefix : t->sweep_from);
    for (; it->Valid() && it->key().starts_with(prefix); it->Next()) {
      if (++examined > kSweepRowsPerCall) {
        t->sweep_from = it->key().ToString();
        return Status::OK();
      }
      uint64_t key;
      if (!internal::DecodeSparseKey(it->key().ToStringView(), &key)) {
        return Status::Corruption("table '" + t->spec.name + "': malformed stored key");
      }
      if (t->rows->Find(key) != CachedRows::kNoSlot) continue;  // the memory sweep decides
      const rocksdb::Slice v = it->value();
      if (v.size() != internal::RowBytes(t->floats)) {
        return Status::Corruption("table '" + t->spec.name + "' key " + std::to_string(key) +
                                  ": stored row has " + std::to_string(v.size()) + " bytes");
      }
      RowMeta meta;
      std::memcpy(&meta.update_count, v.data() + v.size() - internal::kMetaBytes, 4);
      std::memcpy(&meta.last_step, v.data() + v.size() - internal::kMetaBytes + 4, 4);
      std::memcpy(&meta.last_update_s, v.data() + v.size() - internal::kMetaBytes + 8, 4);
      if (IdleRow(t->spec.eviction, meta, ctx)) {
        auto s = batch->Delete(t->cf, it->key());
        if (!s.ok()) return FromRocks(s, "sweep");
        ++stats_.evicted_rows;
      }
    }
    TESSERA_RETURN_IF_ERROR(FromRocks(it->status(), "table '" + t->spec.name + "': sweep"));
    ++t->sweep_slot;
    t->sweep_from.clear();
  }
  return Status::OK();
}

Status RocksDbLaneStore::Maintain(const ApplyContext& ctx) {
  rocksdb::WriteBatch deletes;
  std::vector<uint32_t> idle;
  for (Table* t : sparse_tables_) {
    const EvictionSpec& e = t->spec.eviction;
    if (e.max_idle_steps == 0 && e.max_idle_seconds == 0) continue;
    // The disk sweep skips rows in memory (their newer metadata decides below).
    TESSERA_RETURN_IF_ERROR(SweepDisk(t, ctx, &deletes));
    idle.clear();
    t->rows->ForEachSlot([&](uint32_t slot) {
      const CachedRows::Header& h = t->rows->header(slot);
      // A pinned row is not durable yet; it goes once the writer is done with it.
      if (!t->rows->pinned(slot) && IdleRow(e, h.meta, ctx)) idle.push_back(slot);
      return true;
    });
    for (uint32_t slot : idle) {
      const CachedRows::Header& h = t->rows->header(slot);
      // Rows only ever looked up were never written.
      if (h.meta.update_count > 0) {
        const auto key = internal::EncodeSparseKey(h.key);
        auto s = deletes.Delete(t->cf, rocksdb::Slice(key.bytes, internal::kSparseKeyBytes));
        if (!s.ok()) return FromRocks(s, "eviction");
        ++stats_.evicted_rows;
      }
      EraseRow(t, slot);
    }
  }
  // Without the WAL, like the rows: a delete lost in a crash only brings an idle row back.
  if (deletes.Count() > 0) TESSERA_RETURN_IF_ERROR(engine_->WriteRows(&deletes));
  for (Table* t : sparse_tables_) {
    if (t->dirty_slots.empty() && t->flight_slots.empty()) t->rows->Compact();
  }
  return Status::OK();
}

StoreStats RocksDbLaneStore::stats() const {
  StoreStats s = stats_;
  for (const TableMemory& t : TableStats()) {
    s.rows_in_memory += t.rows_in_memory;
    s.bytes_in_memory += t.bytes_in_memory;
  }
  return s;
}

std::vector<TableMemory> RocksDbLaneStore::TableStats() const {
  std::vector<TableMemory> out;
  out.reserve(tables_.size());
  for (const auto& [id, t] : tables_) {
    TableMemory m{id, 0, 0};
    if (t->rows) {
      m.rows_in_memory = t->rows->size();
      m.bytes_in_memory = t->rows->MemoryBytes() + t->pending.capacity() * 13;
    }
    for (const auto& [c, ch] : t->dense) {
      m.bytes_in_memory += ch.data.capacity() * sizeof(float) + sizeof(ch);
    }
    out.push_back(m);
  }
  return out;
}

}  // namespace

namespace internal {

Result<std::unique_ptr<StorageEngine>> OpenRocksDbStorageEngine(const StorageOptions& options,
                                                                const RocksDbHooks& hooks) {
  TESSERA_ASSIGN_OR_RETURN(auto engine, RocksDbEngine::Open(options, hooks));
  return std::unique_ptr<StorageEngine>(std::move(engine));
}

Status FlushMemtablesForTest(StorageEngine* engine) {
  auto* e = dynamic_cast<RocksDbEngine*>(engine);
  if (e == nullptr) return Status::InvalidArgument("not a RocksDB storage engine");
  return e->FlushMemtables();
}

}  // namespace internal
}  // namespace tessera
