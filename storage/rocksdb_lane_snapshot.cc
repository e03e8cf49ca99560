// Snapshots of a RocksDB engine's lane (LaneStore::TakeSnapshot) and the scans that read
// through one: RocksDbLaneSnapshot, and the lane store's members that freeze its rows into one.
#include <absl/container/flat_hash_map.h>
#include <absl/container/flat_hash_set.h>
#include <rocksdb/db.h>
#include <rocksdb/options.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ps/optimizer.h"
#include "ps/routing.h"
#include "storage/copy_on_write_internal.h"
#include "storage/rocksdb_common_internal.h"
#include "storage/rocksdb_engine_impl_internal.h"
#include "storage/rocksdb_lane_store_internal.h"
#include "storage/row_cache_internal.h"
#include "storage/row_codec_internal.h"
#include "storage/row_table_internal.h"

namespace tessera::internal {
namespace {

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

}  // namespace

Result<std::unique_ptr<LaneSnapshot>> RocksDbLaneStore::TakeSnapshot() {
  return Freeze(lane_slots_);
}

Result<std::unique_ptr<LaneSnapshot>> RocksDbLaneStore::TakeSlotSnapshot(
    std::span<const uint32_t> slots) {
  // Only the disk ranges of the slots asked for (a seek each), not every slot of the lane.
  std::vector<uint32_t> mine;
  for (uint32_t s : slots) {
    if (s < kNumSlots && LaneOfSlot(s, num_lanes_) == lane_) mine.push_back(s);
  }
  std::sort(mine.begin(), mine.end());
  mine.erase(std::unique(mine.begin(), mine.end()), mine.end());
  return Freeze(std::move(mine));
}

Status RocksDbLaneStore::ScanSlots(uint64_t table_id, std::span<const uint32_t> slots,
                                   const RowVisitor& fn) {
  TESSERA_RETURN_IF_ERROR(Get(table_id, TableKind::kSparse).status());
  const std::vector<bool> wanted = SlotMask(slots);
  TESSERA_ASSIGN_OR_RETURN(auto snapshot, TakeSlotSnapshot(slots));
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

}  // namespace tessera::internal
