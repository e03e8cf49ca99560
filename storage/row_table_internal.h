// In-memory row tables shared by the storage engines (the memory tier).
#pragma once

#include <absl/container/flat_hash_map.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <new>
#include <span>
#include <vector>

#include "ps/initializer.h"
#include "ps/mutex.h"
#include "ps/optimizer.h"
#include "ps/routing.h"
#include "ps/table_spec.h"
#include "storage/huge_pages_internal.h"
#include "storage/prefetch_internal.h"
#include "storage/slot_index_internal.h"
#include "storage/storage.h"

namespace tessera::internal {

/// Pieces of memory of one size (a table's blocks), carved from slabs that grow from a few
/// pieces to a huge page each (AllocateHugePageable): the rows of a large table then lie in a
/// few huge pages, and a request's random rows cost a cache miss each but rarely a TLB miss.
/// A freed piece is reused by the next Allocate; slabs are freed with the pool. Thread-safe
/// (a frozen view may free blocks on another thread).
class BlockPool {
 public:
  /// Pieces of `bytes` (rounded up to a cache line), each line-aligned.
  explicit BlockPool(size_t bytes);
  ~BlockPool();
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  std::byte* Allocate() ABSL_LOCKS_EXCLUDED(mu_);
  void Free(std::byte* p) ABSL_LOCKS_EXCLUDED(mu_);
  size_t piece_bytes() const { return piece_; }
  /// Bytes of the slabs allocated so far.
  uint64_t SlabBytes() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const size_t piece_;
  mutable Mutex mu_;
  std::vector<std::byte*> slabs_ ABSL_GUARDED_BY(mu_);
  std::vector<std::byte*> free_ ABSL_GUARDED_BY(mu_);
  uint64_t slab_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  size_t last_slab_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // The newest slab's unused tail: [next_, end_).
  std::byte* next_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::byte* end_ ABSL_GUARDED_BY(mu_) = nullptr;
};

/// Rows of one sparse table in one lane: a hash map from key to a row slot in a block arena.
/// Each slot holds dim values, then the optimizer state. Blocks are shared with snapshots
/// (Freeze()) and copied before their first change after one (copy-on-write), so a snapshot
/// costs a pointer per block of 32 rows. Not thread-safe; a frozen view may be
/// read from another thread.
class SparseRows {
 public:
  // Small blocks keep copy-on-write cheap: uniform pushes right after a snapshot touch nearly
  // every block, so a block copies at most kRowsPerBlock rows per key pushed (4096-row blocks
  // made the first push after a snapshot copy the whole table: a 200 ms pause at 1M rows).
  static constexpr uint32_t kRowsPerBlock = 16;
  /// Gives a block's memory back to its table's pool (which it keeps alive: a frozen view
  /// may hold blocks after the table is gone).
  struct PoolDelete {
    std::shared_ptr<BlockPool> pool;
    void operator()(std::byte* p) const { pool->Free(p); }
  };
  /// kRowsPerBlock slots: key, floats, metadata and a live flag each, in one piece of the
  /// table's BlockPool (a copy-on-write copy is one piece and one memcpy).
  struct Block {
    std::unique_ptr<std::byte[], PoolDelete> mem;
    size_t bytes = 0;
    uint64_t* keys = nullptr;
    float* rows = nullptr;
    RowMeta* metas = nullptr;
    uint8_t* live = nullptr;
  };
  /// The rows at Freeze() time.
  struct Frozen {
    std::vector<std::shared_ptr<const Block>> blocks;
    uint32_t slots = 0;  // slots handed out: [0, slots)
    uint32_t dim = 0;
    uint32_t stride = 0;
    /// Visits every live row, fn(key, row, meta) -> bool (false stops), letting go of each
    /// block once visited (the owner then changes it in place, no copy) and of every block at
    /// the end: the view is empty after.
    template <typename Fn>
    void ForEachAndRelease(Fn&& fn) {
      bool go = true;
      for (uint32_t s = 0; s < slots && go; ++s) {
        const Block& b = *blocks[s / kRowsPerBlock];
        const uint32_t i = s % kRowsPerBlock;
        if (b.live[i] != 0) go = fn(b.keys[i], b.rows + size_t{i} * stride, b.metas[i]);
        if (i + 1 == kRowsPerBlock) blocks[s / kRowsPerBlock].reset();
      }
      blocks.clear();
      slots = 0;
    }
  };

  SparseRows(const TableSpec& spec, const Optimizer* opt);

  uint32_t dim() const { return dim_; }
  uint32_t stride() const { return stride_; }
  size_t size() const { return index_.size(); }

  /// The row of `key` for reading, or nullptr.
  const float* Find(uint64_t key) const {
    const uint32_t* slot = index_.Find(key);
    return slot == nullptr ? nullptr : RowAt(*slot);
  }
  /// The row of `key`, which the caller may change; created with the initializer and initial
  /// state if absent.
  float* FindOrCreate(uint64_t key, bool* created);
  /// Like FindOrCreate, also returning the row's metadata (writable): one hash probe for both.
  float* FindOrCreate(uint64_t key, bool* created, RowMeta** meta);
  /// Prefetching for a batch of keys (a sparse request touches each row once, in no order the
  /// caches can guess): PrefetchIndex(key) some keys ahead of its Find/FindOrCreate, then
  /// PrefetchRow(key) fewer keys ahead, when its index entry is cached. Each key then finds its
  /// hash probe, row and metadata in cache instead of a chain of dependent misses.
  void PrefetchIndex(uint64_t key) const { index_.Prefetch(key); }
  void PrefetchRow(uint64_t key) const {
    const uint32_t* slot = index_.Find(key);
    if (slot == nullptr) return;
    const std::byte* mem = mem_[*slot / kRowsPerBlock];
    const uint32_t i = *slot % kRowsPerBlock;
    const std::byte* row = mem + rows_offset_ + size_t{i} * stride_ * sizeof(float);
    // A row of up to 3 cache lines (blocks are line-aligned: a 64- or 128-byte row takes 1 or 2).
    PrefetchLine(row);
    if (stride_ * sizeof(float) > 64) PrefetchLine(row + 64);
    PrefetchLine(row + stride_ * sizeof(float) - 1);
    PrefetchLine(mem + metas_offset_ + size_t{i} * sizeof(RowMeta));
  }
  /// The metadata of the row of `key`, which must exist.
  const RowMeta& MetaOf(uint64_t key) const;
  /// Inserts or overwrites a row (value + state) with its metadata.
  void Put(uint64_t key, const float* row, const RowMeta& meta);
  /// Deletes a row; returns whether it existed.
  bool Erase(uint64_t key);
  /// Bytes used: arena, metadata and hash map.
  uint64_t MemoryBytes() const;

  template <typename Fn>
  void ForEach(Fn&& fn) const {
    index_.ForEach([&](uint64_t key, uint32_t slot) {
      const Block& b = *blocks_[slot / kRowsPerBlock];
      return fn(key, RowAt(slot), b.metas[slot % kRowsPerBlock]);
    });
  }

  /// Shares every block with the returned view: later changes copy a shared block first.
  Frozen Freeze() const;

 private:
  const float* RowAt(uint32_t slot) const {
    return reinterpret_cast<const float*>(mem_[slot / kRowsPerBlock] + rows_offset_) +
           size_t{slot % kRowsPerBlock} * stride_;
  }
  // The block of `slot`, copied first when a frozen view shares it.
  Block& Own(uint32_t slot);
  Block NewBlock() const;
  uint32_t Allocate();
  // A new slot for `key` with the initializer's values and initial state.
  uint32_t Create(uint64_t key);

  TableSpec spec_;
  const Optimizer* opt_;
  uint32_t dim_;
  uint32_t stride_;
  SlotIndex index_;
  std::shared_ptr<BlockPool> pool_;
  std::vector<std::shared_ptr<Block>> blocks_;
  // blocks_[b]->mem.get(), without the two dependent loads (PrefetchRow); kept by Allocate and
  // Own. Rows and metadata lie at these offsets of a block's memory.
  std::vector<std::byte*> mem_;
  size_t rows_offset_ = 0;
  size_t metas_offset_ = 0;
  // Per block: 1 while a Frozen taken since its last Own() may share it.
  mutable std::vector<uint8_t> frozen_;
  std::vector<uint32_t> free_;
  uint32_t next_slot_ = 0;
};

/// The prefetches at key i's turn in a loop over `keys`: the index of a key further ahead,
/// the row of a nearer one (SparseRows::PrefetchIndex, PrefetchRow).
inline void PrefetchAhead(const SparseRows& rows, std::span<const uint64_t> keys, size_t i) {
  constexpr size_t kRowAhead = 8, kIndexAhead = 24;
  if (i + kIndexAhead < keys.size()) rows.PrefetchIndex(keys[i + kIndexAhead]);
  if (i + kRowAhead < keys.size()) rows.PrefetchRow(keys[i + kRowAhead]);
}

/// One dense table's chunks owned by a lane: value then state per chunk, created lazily, shared
/// copy-on-write with frozen views (like SparseRows' blocks) and with pull replies (Share).
class DenseChunks {
 public:
  struct Chunk {
    std::vector<float> data;
    RowMeta meta;
  };
  using Frozen = std::vector<std::pair<uint64_t, std::shared_ptr<const Chunk>>>;

  DenseChunks(const TableSpec& spec, const Optimizer* opt) : spec_(spec), opt_(opt) {}
  /// Chunk `chunk`'s row (value then state) and metadata, which the caller may change; created
  /// with the initializer if absent.
  float* Get(uint64_t chunk, uint32_t* len, RowMeta** meta = nullptr);
  /// The same for reading.
  const float* Read(uint64_t chunk, uint32_t* len);
  /// Chunk `chunk`'s row as it is now, for a holder on any thread: Get() copies the chunk
  /// before a write while the returned pointer (or a Freeze()) holds it, so what it points to
  /// never changes. Created like Get() if absent.
  std::shared_ptr<const float> Share(uint64_t chunk, uint32_t* len);
  template <typename Fn>
  void ForEach(Fn&& fn) const {
    for (auto& [c, ch] : chunks_) fn(c, ch->data.data(), ch->meta);
  }
  uint64_t MemoryBytes() const;
  Frozen Freeze() const;

 private:
  std::shared_ptr<Chunk>& Slot(uint64_t chunk, uint32_t* len);
  TableSpec spec_;
  const Optimizer* opt_;
  absl::flat_hash_map<uint64_t, std::shared_ptr<Chunk>> chunks_;
};

/// Length of dense chunk `chunk` of a tensor of `length` floats.
inline uint32_t DenseChunkLength(uint64_t length, uint64_t chunk) {
  const uint64_t begin = chunk * kDenseChunkFloats;
  return static_cast<uint32_t>(std::min<uint64_t>(kDenseChunkFloats, length - begin));
}

/// The table `table_id` of a lane's table map (values: unique_ptr to a struct with a `spec`),
/// checked to be of `kind`: NotFound or InvalidArgument otherwise.
template <typename TableMap>
auto FindLaneTable(TableMap& tables, uint64_t table_id, TableKind kind)
    -> Result<decltype(tables.begin()->second.get())> {
  auto it = tables.find(table_id);
  if (it == tables.end()) {
    return Status::NotFound("table id " + std::to_string(table_id) + " not in this lane");
  }
  if (it->second->spec.kind != kind) {
    return Status::InvalidArgument("table '" + it->second->spec.name + "' is " +
                                   (kind == TableKind::kSparse ? "dense" : "sparse"));
  }
  return it->second.get();
}

/// Whether key `key`, seen `count` times, is admitted under `spec`.
bool Admitted(const AdmissionSpec& spec, uint64_t key, uint32_t count);

/// Whether a row with `meta` is idle under `spec` at `ctx`: not updated for more than
/// max_idle_steps pushes (the step counter compared modulo 2^32, as RowMeta stores it) or
/// max_idle_seconds. A rule set to 0 is off.
inline bool IdleRow(const EvictionSpec& spec, const RowMeta& meta, const ApplyContext& ctx) {
  if (spec.max_idle_steps != 0 &&
      uint64_t{static_cast<uint32_t>(ctx.step) - meta.last_step} > spec.max_idle_steps) {
    return true;
  }
  return spec.max_idle_seconds != 0 && ctx.now_s > meta.last_update_s &&
         uint64_t{ctx.now_s - meta.last_update_s} > spec.max_idle_seconds;
}

}  // namespace tessera::internal
