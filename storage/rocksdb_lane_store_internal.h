// A lane of the RocksDB engine: its rows in a byte-bounded memory tier (CLOCK) over the lane's
// share of the engine's RocksDB. Defined in three files: rocksdb_lane_store.cc (tables, reads,
// pushes, eviction, stats), rocksdb_lane_snapshot.cc (TakeSnapshot, Freeze and the scans over a
// snapshot), rocksdb_write_back.cc (HandOff, Reap, WriteBack, Commit: the rows going to disk).
#pragma once

#include <absl/container/flat_hash_map.h>
#include <rocksdb/write_batch.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ps/optimizer.h"
#include "ps/routing.h"
#include "ps/status.h"
#include "storage/frequency_sketch_internal.h"
#include "storage/rocksdb_write_back_internal.h"
#include "storage/row_cache_internal.h"
#include "storage/row_codec_internal.h"
#include "storage/storage.h"

namespace tessera::internal {

// Index bytes charged to the budget per cached row (SwissTable of 4-byte slots, at a typical
// load; MemoryBytes() reports the real figure).
inline constexpr size_t kIndexBytesPerRow = 8;

class RocksDbEngine;

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
  Status WriteBack(bool wait, bool flush_soon) override;
  uint64_t dirty_bytes() const override;
  bool write_back_busy() const override {
    return flight_ && flight_->state.load(std::memory_order_acquire) == WriteBackJob::kQueued;
  }
  Status Scan(uint64_t table_id, const RowVisitor& fn) override;
  Status ScanSlots(uint64_t table_id, std::span<const uint32_t> slots,
                   const RowVisitor& fn) override;
  Result<std::unique_ptr<LaneSnapshot>> TakeSnapshot() override;
  Result<std::unique_ptr<LaneSnapshot>> TakeSlotSnapshot(std::span<const uint32_t> slots) override;
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
  Result<uint64_t> DropSlots(uint64_t table_id, std::span<const uint32_t> slots) override;
  Status DropTable(uint64_t table_id) override;
  void SetAppliedSeq(uint64_t seq) override { applied_seq_ = std::max(applied_seq_, seq); }
  uint64_t committed_seq() const override;

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
    // Rows pushed while the tier refused them (Admit), oldest first: each stays in memory only
    // until it is durable, then is the first to go (InsertCold). An entry whose slot no longer
    // holds its key unreferenced (evicted, or used again: promoted) is skipped.
    struct ColdRow {
      uint32_t slot;
      uint64_t key;
    };
    std::deque<ColdRow> cold;
    absl::flat_hash_map<uint64_t, DenseChunk> dense;
    std::vector<uint64_t> dirty_chunks;
    std::vector<uint64_t> flight_chunks;
    // Incremental disk sweep of Maintain(): index into the lane's slots and the key to resume at.
    size_t sweep_slot = 0;
    std::string sweep_from;
  };

  Result<Table*> Get(uint64_t table_id, TableKind kind);
  size_t RowCost(const Table& t) const { return t.rows->slot_bytes() + kIndexBytesPerRow; }
  // The row to evict next: CLOCK's offer (tables in turn), or with admission the one seen least
  // often lately of several offers. {nullptr, kNoSlot} when every row is pinned.
  std::pair<Table*, uint32_t> PickVictim();
  // Evicts unpinned rows (PickVictim) until a row of `t` fits the budget.
  void MakeRoom(const Table& t);
  uint32_t InsertRow(Table* t, uint64_t key);
  // Admission by frequency (TinyLFU): counts an access of `key`.
  void Touch(const Table& t, uint64_t key) {
    if (sketch_) sketch_->Add(KeyHash(t, key));
  }
  // For CachedRows::FindEach: loads the sketch's counters of a key some keys before its Touch.
  auto TouchAhead(const Table& t) const {
    return [this, &t](uint64_t key) {
      if (sketch_) sketch_->Prefetch(KeyHash(t, key));
    };
  }
  uint64_t KeyHash(const Table& t, uint64_t key) const { return Mix64(key ^ Mix64(t.id)); }
  // Whether a missed row of `t` may enter the memory tier: always while the budget has room;
  // else when `key` was seen more often lately than the row CLOCK would evict for it (which is
  // then evicted). A scan of cold keys thus leaves the hot rows in memory.
  bool Admit(Table* t, uint64_t key);
  // A pushed row that Admit refused: it must stay in memory until durable (pinned, dirty), so
  // it takes the place of an earlier such row that is durable now, else of a CLOCK victim, and
  // is not marked referenced.
  uint32_t InsertCold(Table* t, uint64_t key);
  // Compacts t's arena (slot numbers change: the cold list is dropped; its rows are CLOCK's).
  void CompactRows(Table* t) {
    if (t->rows->Compact()) t->cold.clear();
  }
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
  // Encodes the dirty rows and the applied mark into a batch for the writer (`flush`: made
  // durable before the writer is done with it; `flush_soon`: WriteBack's); the rows stay pinned
  // until Reap().
  Status HandOff(bool flush, bool flush_soon);
  // After the writer finished the hand-off in flight: unpins its rows (ok: they are in
  // RocksDB's memtables, durable once the writer flushes its round) or marks them dirty again
  // (failed: they go out with the next hand-off). Returns the writer's status.
  Status Reap();
  // Moves committed_seq_ on past the rounds the writer has flushed since.
  void PruneUnflushed();
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
  // Access counts for admission; with a budget only (made with the first sparse table, sized
  // to the rows the budget holds).
  std::unique_ptr<FrequencySketch> sketch_;
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
  uint64_t written_seq_ = 0;              // ... and in RocksDB with the rows (memtables)
  uint64_t committed_seq_ = 0;            // ... and durable with the rows
  // Hand-offs written but not known to be flushed: the writer's round and the mark they carry.
  struct Unflushed {
    uint64_t round;
    uint64_t seq;
  };
  std::deque<Unflushed> unflushed_;
  std::shared_ptr<WriteBackJob> flight_;  // the hand-off being written, if any
  std::shared_ptr<WriteBackJob> spare_;   // the last one, for its buffers
  uint64_t flight_seq_ = 0;               // the mark it carries
  uint64_t flight_rows_ = 0;
};

}  // namespace tessera::internal
