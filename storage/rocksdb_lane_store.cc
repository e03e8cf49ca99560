// A lane of the RocksDB engine (class in rocksdb_lane_store_internal.h): its tables, the memory
// tier's budget and eviction, reads and pushes of sparse rows and dense chunks, rows put and
// deleted, Maintain's idle-row sweeps, and its statistics. Snapshots and scans are in
// rocksdb_lane_snapshot.cc; the write-back to disk in rocksdb_write_back.cc. See docs/storage.md.
#include <glog/logging.h>
#include <rocksdb/db.h>
#include <rocksdb/options.h>
#include <rocksdb/write_batch.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ps/initializer.h"
#include "ps/optimizer.h"
#include "ps/routing.h"
#include "storage/rocksdb_common_internal.h"
#include "storage/rocksdb_engine_impl_internal.h"
#include "storage/rocksdb_lane_store_internal.h"
#include "storage/row_cache_internal.h"
#include "storage/row_codec_internal.h"
#include "storage/row_table_internal.h"

namespace tessera::internal {
namespace {

// Rows examined per table by one Maintain() call's sweep of the rows on disk.
constexpr size_t kSweepRowsPerCall = 65536;
// Cold reads are fetched with MultiGet in batches of this many keys (rows of one 4 KiB block
// are read once a batch: replaying a request log after a restart, 8192 took 25-27 ms an entry
// of 100k keys against 39-54 ms with 1024).
constexpr size_t kFetchBatch = 8192;
// With admission by frequency, an eviction takes the first row CLOCK offers that was seen at
// most kColdCount times lately, else the one seen least often of kVictimSample offers (the
// others keep their place): one offer alone was a hot row often enough that a stream of cold
// pushes read a third of a hot set back from disk in a test (4 offers: 5% of it a round).
constexpr size_t kVictimSample = 16;
constexpr uint32_t kColdCount = 1;

// What the rows of a table look like on disk: a table reopened with another layout would
// misread them.
std::string LayoutOf(const TableSpec& spec, uint32_t floats_per_row) {
  return std::string(spec.kind == TableKind::kSparse ? "sparse" : "dense") +
         " dim=" + std::to_string(spec.dim) + " length=" + std::to_string(spec.length) +
         " optimizer=" + std::string(OptimizerKindName(spec.optimizer.kind)) +
         " floats=" + std::to_string(floats_per_row);
}

}  // namespace

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
    committed_seq_ = written_seq_ = applied_seq_ = SeqOfKey(mark);
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
    if (budget_ != 0 && !sketch_) {
      sketch_ = std::make_unique<FrequencySketch>(row_budget_ / RowCost(*t));
    }
  }
  tables_.emplace(table_id, std::move(t));
  return Status::OK();
}

std::pair<RocksDbLaneStore::Table*, uint32_t> RocksDbLaneStore::PickVictim() {
  Table* best = nullptr;
  uint32_t best_slot = CachedRows::kNoSlot, best_count = 0;
  for (size_t n = 0; n < (sketch_ ? kVictimSample : 1); ++n) {
    for (size_t tries = 0; tries < sparse_tables_.size(); ++tries) {
      Table* v = sparse_tables_[evict_turn_++ % sparse_tables_.size()];
      const uint32_t slot = v->rows->NextVictim();
      if (slot == CachedRows::kNoSlot) continue;
      const uint32_t count =
          sketch_ ? sketch_->Estimate(KeyHash(*v, v->rows->header(slot).key)) : 0;
      if (best == nullptr || count < best_count) {
        best = v;
        best_slot = slot;
        best_count = count;
      }
      break;
    }
    if (best != nullptr && best_count <= kColdCount) break;
  }
  return {best, best_slot};
}

void RocksDbLaneStore::MakeRoom(const Table& t) {
  if (budget_ == 0) return;
  const size_t need = RowCost(t);
  while (charged_ + need > row_budget_) {
    const auto [v, slot] = PickVictim();
    // Everything left is pinned by the uncommitted batch: the budget is exceeded until Commit.
    if (v == nullptr) return;
    EraseRow(v, slot);
    ++stats_.budget_evictions;
  }
}

uint32_t RocksDbLaneStore::InsertRow(Table* t, uint64_t key) {
  MakeRoom(*t);
  charged_ += RowCost(*t);
  return t->rows->Insert(key);
}

bool RocksDbLaneStore::Admit(Table* t, uint64_t key) {
  if (!sketch_ || charged_ + RowCost(*t) <= row_budget_) return true;
  const auto [v, slot] = PickVictim();
  if (v != nullptr && sketch_->Estimate(KeyHash(*t, key)) >
                          sketch_->Estimate(KeyHash(*v, v->rows->header(slot).key))) {
    EraseRow(v, slot);
    ++stats_.budget_evictions;
    return true;
  }
  ++stats_.admission_rejects;
  return false;
}

uint32_t RocksDbLaneStore::InsertCold(Table* t, uint64_t key) {
  CachedRows& rows = *t->rows;
  // Entries of rows evicted otherwise pile up behind a pinned front: dropped past this many.
  if (t->cold.size() > rows.size() + 1024) {
    t->cold.erase(t->cold.begin(),
                  t->cold.begin() + static_cast<std::ptrdiff_t>(t->cold.size() / 2));
  }
  while (charged_ + RowCost(*t) > row_budget_ && !t->cold.empty()) {
    const Table::ColdRow c = t->cold.front();
    const uint32_t f = rows.header(c.slot).flags;
    const bool same = (f & CachedRows::kLive) != 0 && rows.header(c.slot).key == c.key &&
                      (f & CachedRows::kReferenced) == 0;
    if (same && rows.pinned(c.slot)) break;  // not durable yet (nor, mostly, those behind it)
    t->cold.pop_front();
    if (!same) continue;
    EraseRow(t, c.slot);
    ++stats_.budget_evictions;
  }
  const uint32_t slot = InsertRow(t, key);
  rows.flags(slot) &= ~CachedRows::kReferenced;
  t->cold.push_back({slot, key});
  return slot;
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
  stats_.lookups += keys.size();
  rows.FindEach(keys, TouchAhead(*t), [&](size_t i, uint32_t slot) {
    Touch(*t, keys[i]);
    if (slot == CachedRows::kNoSlot) {
      misses_.push_back(static_cast<uint32_t>(i));
      return;
    }
    ++stats_.memory_hits;
    rows.flags(slot) |= CachedRows::kReferenced;
    std::memcpy(out[i], rows.row(slot), sizeof(float) * dim);
  });
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
      if (!Admit(t, key)) {
        // Served without a row in memory: the stored value, or the initializer's (what a row
        // made here would hold).
        if (stored.empty()) {
          InitializeValues(t->spec.initializer, key, 0, dim, out[i]);
        } else {
          scratch_row_.resize(t->floats);
          RowMeta meta;
          internal::DecodeRow(stored, t->floats, scratch_row_.data(), &meta, "").IgnoreError();
          std::memcpy(out[i], scratch_row_.data(), sizeof(float) * dim);
        }
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
  rows.FindEach(keys, TouchAhead(*t), [&](size_t i, uint32_t slot) {
    Touch(*t, keys[i]);
    found_[i] = slot;
    if (slot == CachedRows::kNoSlot) {
      misses_.push_back(static_cast<uint32_t>(i));
    } else {
      ++stats_.apply_memory_hits;
      rows.flags(slot) |= CachedRows::kReferenced;
      MarkDirty(t, slot);
    }
  });
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
      slot = Admit(t, key) ? InsertRow(t, key) : InsertCold(t, key);
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
    // Referenced: rows hit by the first pass (there), and rows admitted (InsertRow), not a row
    // that InsertCold made (nor its duplicates in this batch).
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

Result<uint64_t> RocksDbLaneStore::DropSlots(uint64_t table_id, std::span<const uint32_t> slots) {
  TESSERA_ASSIGN_OR_RETURN(Table * t, Get(table_id, TableKind::kSparse));
  std::vector<bool> wanted(kNumSlots, false);
  bool any = false;
  for (uint32_t s : slots) {
    if (s < kNumSlots && LaneOfSlot(s, num_lanes_) == lane_) wanted[s] = any = true;
  }
  if (!any) return uint64_t{0};
  // As DeleteRows: what changed goes to disk first, so no row is pinned by a hand-off and a
  // write-back in flight cannot bring a dropped row back.
  TESSERA_RETURN_IF_ERROR(Commit());
  std::vector<uint32_t> cached;
  t->rows->ForEachSlot([&](uint32_t at) {
    if (wanted[SlotOfKey(t->rows->header(at).key)]) cached.push_back(at);
    return true;
  });
  for (uint32_t at : cached) EraseRow(t, at);
  absl::erase_if(t->pending, [&](const auto& kv) { return wanted[SlotOfKey(kv.first)]; });
  // One range tombstone per slot (keys are the slot's 2 bytes, then the key): nothing is read.
  rocksdb::WriteBatch deletes;
  for (uint32_t s = 0; s < kNumSlots; ++s) {
    if (!wanted[s]) continue;
    const std::string from = internal::SlotPrefix(s), to = internal::SlotPrefix(s + 1);
    auto st = deletes.DeleteRange(t->cf, from, to);
    if (!st.ok()) return FromRocks(st, "drop slots");
  }
  // Through the WAL (synced in strict mode), as DeleteRows.
  TESSERA_RETURN_IF_ERROR(engine_->Write(&deletes));
  return static_cast<uint64_t>(cached.size());
}

Status RocksDbLaneStore::DropTable(uint64_t table_id) {
  auto it = tables_.find(table_id);
  if (it == tables_.end()) return Status::OK();
  // As DropSlots: what changed goes to disk first, so that no write-back in flight can write a
  // row of the table after the engine deleted them (DropTableData).
  TESSERA_RETURN_IF_ERROR(Commit());
  Table* t = it->second.get();
  if (t->rows) {
    std::vector<uint32_t> cached;
    t->rows->ForEachSlot([&](uint32_t at) {
      cached.push_back(at);
      return true;
    });
    for (uint32_t at : cached) EraseRow(t, at);  // gives the budget back
    sparse_tables_.erase(std::find(sparse_tables_.begin(), sparse_tables_.end(), t));
  }
  tables_.erase(it);
  return Status::OK();
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
    if (t->dirty_slots.empty() && t->flight_slots.empty()) CompactRows(t);
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

}  // namespace tessera::internal
