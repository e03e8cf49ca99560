// StorageEngine with rows in memory only.
#include <cstring>
#include <map>
#include <vector>

#include "ps/mutex.h"
#include "storage/copy_on_write_internal.h"
#include "storage/dense_runs_internal.h"
#include "storage/row_table_internal.h"
#include "storage/storage.h"

namespace tessera {
namespace {

using internal::Admitted;
using internal::DenseChunkLength;
using internal::DenseRuns;
using internal::SparseRows;

// Calls a ChunkVisitor with dense chunk `chunk` as one row (values, then optimizer state):
// the values themselves when the optimizer keeps no state, else a copy in `*row`.
bool VisitDenseChunk(const TableSpec& spec, const Optimizer& opt, uint64_t chunk,
                     const float* values, const float* state, const RowMeta& meta,
                     std::vector<float>* row, const LaneStore::ChunkVisitor& fn) {
  const uint32_t len = DenseChunkLength(spec.length, chunk);
  const uint32_t state_floats = opt.StateFloats(len);
  if (state_floats == 0) return fn(chunk, values, len, meta);
  row->resize(size_t{len} + state_floats);
  std::memcpy(row->data(), values, sizeof(float) * len);
  std::memcpy(row->data() + len, state, sizeof(float) * state_floats);
  return fn(chunk, row->data(), len, meta);
}

class MemoryLaneStore final : public LaneStore {
 public:
  MemoryLaneStore(uint32_t lane, uint32_t lanes) : lane_(lane), lanes_(lanes) {}

  Status AddTable(uint64_t table_id, const TableSpec& spec) override {
    if (tables_.contains(table_id)) return Status::OK();
    auto t = std::make_unique<Table>();
    t->spec = spec;
    t->opt = Optimizer::Make(spec.optimizer);
    if (spec.kind == TableKind::kSparse) {
      t->rows = std::make_unique<SparseRows>(spec, t->opt.get());
    } else {
      t->dense = std::make_unique<DenseRuns>(spec, t->opt.get(), table_id, lane_, lanes_);
    }
    tables_.emplace(table_id, std::move(t));
    return Status::OK();
  }

  Status DropTable(uint64_t table_id) override {
    tables_.erase(table_id);  // a snapshot keeps what it froze (copy-on-write blocks)
    return Status::OK();
  }

  Status Lookup(uint64_t table_id, std::span<const uint64_t> keys,
                std::span<float* const> out) override {
    TESSERA_ASSIGN_OR_RETURN(Table * t, Get(table_id, TableKind::kSparse));
    const uint32_t dim = t->spec.dim;
    const bool gated = t->spec.admission.min_count > 1 || t->spec.admission.probability < 1;
    for (size_t i = 0; i < keys.size(); ++i) {
      internal::PrefetchAhead(*t->rows, keys, i);
      ++stats_.lookups;
      const float* row = t->rows->Find(keys[i]);
      if (row != nullptr) {
        ++stats_.memory_hits;
      } else if (gated) {
        InitializeValues(t->spec.initializer, keys[i], 0, dim, out[i]);
        continue;
      } else {
        bool created;
        row = t->rows->FindOrCreate(keys[i], &created);
      }
      std::memcpy(out[i], row, sizeof(float) * dim);
    }
    return Status::OK();
  }

  Status Apply(uint64_t table_id, std::span<const uint64_t> keys,
               std::span<const float* const> grads, const ApplyContext& ctx) override {
    TESSERA_ASSIGN_OR_RETURN(Table * t, Get(table_id, TableKind::kSparse));
    const uint32_t dim = t->spec.dim;
    const bool gated = t->spec.admission.min_count > 1 || t->spec.admission.probability < 1;
    for (size_t i = 0; i < keys.size(); ++i) {
      internal::PrefetchAhead(*t->rows, keys, i);
      if (gated && t->rows->Find(keys[i]) == nullptr) {
        uint32_t& count = t->pending[keys[i]];
        ++count;
        if (!Admitted(t->spec.admission, keys[i], count)) continue;
        t->pending.erase(keys[i]);
      }
      bool created;
      RowMeta* m;
      float* row = t->rows->FindOrCreate(keys[i], &created, &m);
      RowMeta& meta = *m;
      ++meta.update_count;
      meta.last_step = static_cast<uint32_t>(ctx.step);
      meta.last_update_s = ctx.now_s;
      t->opt->Apply(row, row + dim, grads[i], dim, 0, dim, meta.update_count, ctx.lr_scale);
      ++stats_.applies;
    }
    return Status::OK();
  }

  Status DenseRead(uint64_t table_id, uint64_t chunk, uint32_t begin, uint32_t end,
                   float* out) override {
    TESSERA_ASSIGN_OR_RETURN(Table * t, Get(table_id, TableKind::kDense));
    TESSERA_RETURN_IF_ERROR(CheckChunk(*t, chunk));
    uint32_t len;
    const float* row = t->dense->Read(chunk, &len);
    if (end > len || begin > end) return Status::InvalidArgument("dense range out of chunk");
    std::memcpy(out, row + begin, sizeof(float) * (end - begin));
    return Status::OK();
  }

  Result<std::shared_ptr<const float>> DenseShare(uint64_t table_id, uint64_t chunk,
                                                 uint32_t* len) override {
    TESSERA_ASSIGN_OR_RETURN(Table * t, Get(table_id, TableKind::kDense));
    TESSERA_RETURN_IF_ERROR(CheckChunk(*t, chunk));
    return t->dense->Share(chunk, len);
  }

  Status DenseApply(uint64_t table_id, uint64_t chunk, uint32_t begin, uint32_t end,
                    const float* grad, const ApplyContext& ctx) override {
    TESSERA_ASSIGN_OR_RETURN(Table * t, Get(table_id, TableKind::kDense));
    TESSERA_RETURN_IF_ERROR(CheckChunk(*t, chunk));
    if (end > DenseChunkLength(t->spec.length, chunk) || begin > end) {
      return Status::InvalidArgument("dense range out of chunk");
    }
    const DenseRuns::Chunk c = t->dense->Get(chunk);
    RowMeta& meta = *c.meta;
    ++meta.update_count;
    meta.last_step = static_cast<uint32_t>(ctx.step);
    meta.last_update_s = ctx.now_s;
    t->opt->Apply(c.values, c.state, grad, c.len, begin, end, meta.update_count, ctx.lr_scale);
    ++stats_.applies;
    return Status::OK();
  }

  Status Commit() override { return Status::OK(); }

  Status Scan(uint64_t table_id, const RowVisitor& fn) override {
    TESSERA_ASSIGN_OR_RETURN(Table * t, Get(table_id, TableKind::kSparse));
    const uint32_t dim = t->spec.dim;
    t->rows->ForEach([&](uint64_t key, const float* row, const RowMeta& meta) {
      // Rows only created by a lookup hold the initializer's value (see LaneStore::Scan).
      return meta.update_count == 0 || fn(key, row, row + dim, meta);
    });
    return Status::OK();
  }

  Status Maintain(const ApplyContext& ctx) override {
    std::vector<uint64_t> idle;
    for (auto& [id, t] : tables_) {
      if (!t->rows) continue;
      const EvictionSpec& e = t->spec.eviction;
      if (e.max_idle_steps == 0 && e.max_idle_seconds == 0) continue;
      idle.clear();
      t->rows->ForEach([&](uint64_t key, const float*, const RowMeta& meta) {
        if (internal::IdleRow(e, meta, ctx)) idle.push_back(key);
        return true;
      });
      for (uint64_t key : idle) {
        if (t->rows->MetaOf(key).update_count > 0) ++stats_.evicted_rows;
        t->rows->Erase(key);
      }
    }
    return Status::OK();
  }

  Status ScanSlots(uint64_t table_id, std::span<const uint32_t> slots,
                   const RowVisitor& fn) override {
    // Scan with the slot test inline: a move reads a few slots of every row's lane, and the
    // rows of other slots must cost a hash and a bit, not a call through fn.
    TESSERA_ASSIGN_OR_RETURN(Table * t, Get(table_id, TableKind::kSparse));
    const std::vector<bool> wanted = SlotMask(slots);
    const uint32_t dim = t->spec.dim;
    t->rows->ForEach([&](uint64_t key, const float* row, const RowMeta& meta) {
      // The key first: it lies in the index being walked; the metadata is a load elsewhere.
      return !wanted[SlotOfKey(key)] || meta.update_count == 0 || fn(key, row, row + dim, meta);
    });
    return Status::OK();
  }

  Status DeleteRows(uint64_t table_id, std::span<const uint64_t> keys) override {
    TESSERA_ASSIGN_OR_RETURN(Table * t, Get(table_id, TableKind::kSparse));
    for (uint64_t key : keys) {
      t->rows->Erase(key);
      t->pending.erase(key);
    }
    return Status::OK();
  }

  Status ScanDense(uint64_t table_id, const ChunkVisitor& fn) override {
    TESSERA_ASSIGN_OR_RETURN(Table * t, Get(table_id, TableKind::kDense));
    bool go = true;
    std::vector<float> row;
    t->dense->ForEach([&](uint64_t chunk, const float* values, const float* state,
                          const RowMeta& meta) {
      if (go) go = VisitDenseChunk(t->spec, *t->opt, chunk, values, state, meta, &row, fn);
    });
    return Status::OK();
  }

  Status PutRows(uint64_t table_id, std::span<const uint64_t> keys,
                 std::span<const float* const> rows, std::span<const RowMeta> metas) override {
    TESSERA_ASSIGN_OR_RETURN(Table * t, Get(table_id, TableKind::kSparse));
    for (size_t i = 0; i < keys.size(); ++i) {
      t->rows->Put(keys[i], rows[i], metas[i]);
      t->pending.erase(keys[i]);
    }
    return Status::OK();
  }

  Status PutDenseChunk(uint64_t table_id, uint64_t chunk, const float* row,
                       const RowMeta& meta) override {
    TESSERA_ASSIGN_OR_RETURN(Table * t, Get(table_id, TableKind::kDense));
    TESSERA_RETURN_IF_ERROR(CheckChunk(*t, chunk));
    const DenseRuns::Chunk c = t->dense->Get(chunk);
    std::memcpy(c.values, row, sizeof(float) * c.len);
    std::memcpy(c.state, row + c.len, sizeof(float) * t->opt->StateFloats(c.len));
    *c.meta = meta;
    return Status::OK();
  }

  Result<std::unique_ptr<LaneSnapshot>> TakeSnapshot() override;

  StoreStats stats() const override {
    StoreStats s = stats_;
    for (const TableMemory& t : TableStats()) {
      s.rows_in_memory += t.rows_in_memory;
      s.bytes_in_memory += t.bytes_in_memory;
    }
    return s;
  }

  std::vector<TableMemory> TableStats() const override {
    std::vector<TableMemory> out;
    out.reserve(tables_.size());
    for (auto& [id, t] : tables_) {
      if (t->rows) {
        out.push_back({id, t->rows->size(), t->rows->MemoryBytes()});
      } else {
        out.push_back({id, 0, t->dense->MemoryBytes()});
      }
    }
    return out;
  }

 private:
  struct Table {
    TableSpec spec;
    std::unique_ptr<Optimizer> opt;
    std::unique_ptr<SparseRows> rows;
    std::unique_ptr<DenseRuns> dense;
    absl::flat_hash_map<uint64_t, uint32_t> pending;  // push counts of keys not yet admitted
  };

  static Status CheckChunk(const Table& t, uint64_t chunk) {
    if (chunk >= (t.spec.length + kDenseChunkFloats - 1) / kDenseChunkFloats) {
      return Status::InvalidArgument("table '" + t.spec.name + "' has no dense chunk " +
                                     std::to_string(chunk));
    }
    return Status::OK();
  }

  Result<Table*> Get(uint64_t table_id, TableKind kind) {
    return internal::FindLaneTable(tables_, table_id, kind);
  }

  const uint32_t lane_, lanes_;  // which lane of how many (DenseRuns groups its chunks)
  absl::flat_hash_map<uint64_t, std::unique_ptr<Table>> tables_;
  StoreStats stats_;
};

// The lane's tables frozen: blocks and chunks shared copy-on-write with the lane.
class MemoryLaneSnapshot final : public LaneSnapshot {
 public:
  struct Table {
    TableSpec spec;
    SparseRows::Frozen rows;
    DenseRuns::Frozen dense;
    std::unique_ptr<Optimizer> opt;  // its state's size (ScanDense)
    bool scanned = false;
  };
  explicit MemoryLaneSnapshot(absl::flat_hash_map<uint64_t, Table> tables)
      : tables_(std::move(tables)) {}

  Status Scan(uint64_t table_id, const LaneStore::RowVisitor& fn) override {
    TESSERA_ASSIGN_OR_RETURN(Table * t, Get(table_id, TableKind::kSparse));
    TESSERA_RETURN_IF_ERROR(internal::ClaimScan(&t->scanned, t->spec.name));
    const uint32_t dim = t->rows.dim;
    // Each block goes back to the lane once read: a push to it then copies nothing.
    t->rows.ForEachAndRelease([&](uint64_t key, const float* row, const RowMeta& meta) {
      return meta.update_count == 0 || fn(key, row, row + dim, meta);
    });
    return Status::OK();
  }

  Status ScanDense(uint64_t table_id, const LaneStore::ChunkVisitor& fn) override {
    TESSERA_ASSIGN_OR_RETURN(Table * t, Get(table_id, TableKind::kDense));
    bool go = true;
    std::vector<float> row;
    for (const auto& [run, present] : t->dense) {
      DenseRuns::VisitRun(*run, present, [&](uint64_t chunk, const float* values,
                                             const float* state, const RowMeta& meta) {
        if (go) go = VisitDenseChunk(t->spec, *t->opt, chunk, values, state, meta, &row, fn);
      });
    }
    return Status::OK();
  }

 private:
  Result<Table*> Get(uint64_t table_id, TableKind kind) {
    auto it = tables_.find(table_id);
    if (it == tables_.end() || it->second.spec.kind != kind) {
      return Status::NotFound("table id " + std::to_string(table_id) + " not in the snapshot");
    }
    return &it->second;
  }
  absl::flat_hash_map<uint64_t, Table> tables_;
};

Result<std::unique_ptr<LaneSnapshot>> MemoryLaneStore::TakeSnapshot() {
  absl::flat_hash_map<uint64_t, MemoryLaneSnapshot::Table> tables;
  for (auto& [id, t] : tables_) {
    MemoryLaneSnapshot::Table& f = tables[id];
    f.spec = t->spec;
    if (t->rows) f.rows = t->rows->Freeze();
    if (t->dense) {
      f.dense = t->dense->Freeze();
      f.opt = Optimizer::Make(t->spec.optimizer);
    }
  }
  return std::unique_ptr<LaneSnapshot>(new MemoryLaneSnapshot(std::move(tables)));
}

class MemoryEngine final : public StorageEngine {
 public:
  Result<std::unique_ptr<LaneStore>> OpenLane(uint32_t lane, uint32_t num_lanes) override {
    return std::unique_ptr<LaneStore>(new MemoryLaneStore(lane, num_lanes));
  }
  Status PutMeta(std::string_view key, std::string_view value) override {
    MutexLock l(mu_);
    meta_[std::string(key)] = std::string(value);
    return Status::OK();
  }
  Result<std::optional<std::string>> GetMeta(std::string_view key) override {
    MutexLock l(mu_);
    auto it = meta_.find(std::string(key));
    if (it == meta_.end()) return std::optional<std::string>();
    return std::optional<std::string>(it->second);
  }
  Status WriteMeta(std::span<const MetaWrite> writes) override {
    MutexLock l(mu_);
    for (const MetaWrite& w : writes) {
      if (w.value) {
        meta_[w.key] = *w.value;
      } else {
        meta_.erase(w.key);
      }
    }
    return Status::OK();
  }
  Status ScanMeta(std::string_view prefix,
                  const std::function<void(std::string_view, std::string_view)>& fn) override {
    MutexLock l(mu_);
    for (auto it = meta_.lower_bound(std::string(prefix));
         it != meta_.end() && it->first.starts_with(prefix); ++it) {
      fn(it->first, it->second);
    }
    return Status::OK();
  }

 private:
  Mutex mu_;
  std::map<std::string, std::string> meta_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::unique_ptr<StorageEngine> NewMemoryStorageEngine() {
  return std::unique_ptr<StorageEngine>(new MemoryEngine());
}

}  // namespace tessera
