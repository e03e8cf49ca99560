// In-memory row tables shared by the storage engines (the memory tier).
#pragma once

#include <absl/container/flat_hash_map.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "ps/initializer.h"
#include "ps/optimizer.h"
#include "ps/routing.h"
#include "ps/table_spec.h"
#include "storage/storage.h"

namespace tessera::internal {

/// Rows of one sparse table in one lane: a hash map from key to a row slot in a block arena.
/// Each slot holds dim values, then the optimizer state. Not thread-safe.
class SparseRows {
 public:
  SparseRows(const TableSpec& spec, const Optimizer* opt);

  uint32_t dim() const { return dim_; }
  uint32_t stride() const { return stride_; }
  size_t size() const { return index_.size(); }

  /// The row of `key`, or nullptr.
  float* Find(uint64_t key) {
    auto it = index_.find(key);
    return it == index_.end() ? nullptr : RowAt(it->second);
  }
  /// The row of `key`, created with the initializer and initial state if absent.
  float* FindOrCreate(uint64_t key, bool* created);
  /// Like FindOrCreate, also returning the row's metadata: one hash probe for both.
  float* FindOrCreate(uint64_t key, bool* created, RowMeta** meta);
  RowMeta& MetaOf(uint64_t key);
  /// Inserts or overwrites a row (value + state) with its metadata.
  void Put(uint64_t key, const float* row, const RowMeta& meta);
  /// Deletes a row; returns whether it existed.
  bool Erase(uint64_t key);
  /// Bytes used: arena, metadata and hash map.
  uint64_t MemoryBytes() const;

  template <typename Fn>
  void ForEach(Fn&& fn) {
    for (auto& [key, slot] : index_) {
      if (!fn(key, RowAt(slot), metas_[slot])) return;
    }
  }

  /// Slot-level access for engines that track rows themselves.
  float* RowAt(uint32_t slot) {
    return blocks_[slot / kRowsPerBlock].get() + size_t{slot % kRowsPerBlock} * stride_;
  }

 private:
  static constexpr uint32_t kRowsPerBlock = 4096;
  uint32_t Allocate();

  TableSpec spec_;
  const Optimizer* opt_;
  uint32_t dim_;
  uint32_t stride_;
  absl::flat_hash_map<uint64_t, uint32_t> index_;
  std::vector<std::unique_ptr<float[]>> blocks_;
  std::vector<RowMeta> metas_;
  std::vector<uint32_t> free_;
  uint32_t next_slot_ = 0;
};

/// One dense table's chunks owned by a lane: value then state per chunk, created lazily.
class DenseChunks {
 public:
  DenseChunks(const TableSpec& spec, const Optimizer* opt) : spec_(spec), opt_(opt) {}
  /// Chunk `chunk`'s row (value then state), created with the initializer if absent.
  float* Get(uint64_t chunk, uint32_t* len);
  RowMeta& Meta(uint64_t chunk) { return chunks_[chunk].meta; }
  template <typename Fn>
  void ForEach(Fn&& fn) {
    for (auto& [c, ch] : chunks_) fn(c, ch.data.data(), ch.meta);
  }
  uint64_t MemoryBytes() const;

 private:
  struct Chunk {
    std::vector<float> data;
    RowMeta meta;
  };
  TableSpec spec_;
  const Optimizer* opt_;
  absl::flat_hash_map<uint64_t, Chunk> chunks_;
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
