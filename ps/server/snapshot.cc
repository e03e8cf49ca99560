#include <cerrno>
#include <cstring>

#include "ps/optimizer.h"
#include "ps/server/snapshot_internal.h"

namespace tessera::internal {

bool RowFilter::KeepChunk(uint64_t table_id, uint64_t chunk) const {
  const uint64_t first = chunk * kDenseChunkFloats;
  for (const DenseSpan& r : dense) {
    if (r.table_id == table_id && first >= r.begin && first < r.end) return true;
  }
  return false;
}

namespace {
Status WriteRows(LaneSnapshot& store, const std::vector<std::pair<uint64_t, TableSpec>>& tables,
                 const SnapshotOptions& options, RecordWriter& w) {
  auto meta_of = [](const RowMeta& m) {
    return RecordMeta{m.update_count, m.last_step, m.last_update_s};
  };
  for (const auto& table : tables) {
    // Not a structured binding: the lambdas below capture these (clang 14 cannot).
    const uint64_t id = table.first;
    const TableSpec& spec = table.second;
    auto opt = Optimizer::Make(spec.optimizer);
    if (spec.kind == TableKind::kSparse) {
      const uint32_t state = opt->StateFloats(spec.dim);
      const uint32_t n = options.values_only ? spec.dim : spec.dim + state;
      std::vector<float> row(n);
      TESSERA_RETURN_IF_ERROR(store.Scan(
          id, [&](uint64_t key, const float* value, const float* st, const RowMeta& meta) {
            if (meta.last_update_s < options.min_update_s) return true;
            if (options.filter && !options.filter->KeepRow(key)) return true;
            std::memcpy(row.data(), value, sizeof(float) * spec.dim);
            if (!options.values_only) std::memcpy(row.data() + spec.dim, st, sizeof(float) * state);
            w.Put(Record::kSparseRow, id, key, meta_of(meta), row.data(), n);
            return w.ok();
          }));
    } else {
      TESSERA_RETURN_IF_ERROR(store.ScanDense(
          id, [&](uint64_t chunk, const float* row, uint32_t len, const RowMeta& meta) {
            if (meta.last_update_s < options.min_update_s) return true;
            if (options.filter && !options.filter->KeepChunk(id, chunk)) return true;
            w.Put(Record::kDenseChunk, id, chunk, meta_of(meta), row,
                  options.values_only ? len : len + opt->StateFloats(len));
            return w.ok();
          }));
    }
  }
  return w.Finish();
}
}  // namespace

Status WriteLaneSnapshot(LaneSnapshot& snapshot,
                         const std::vector<std::pair<uint64_t, TableSpec>>& tables,
                         const std::string& path, const SnapshotOptions& options) {
  RecordWriter w(path);
  if (!w.ok()) return Status::IOError("cannot create '" + path + "': " + std::strerror(errno));
  return WriteRows(snapshot, tables, options, w);
}

}  // namespace tessera::internal
