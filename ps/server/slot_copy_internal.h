// What a slot copy (SlotExport/SlotImport, reshard_ops.cc and backup_fill.cc) carries: the
// `count` values for dense parts, and the rows it brings for one lane.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "ps/slot_rows.h"
#include "storage/storage.h"

namespace tessera::internal {

/// SlotExport's and SlotImport's `count` for dense parts (a backup rebuild): the chunks of
/// [parts]; SlotImport 3: [parts][chunks], 4: [parts] done.
constexpr uint64_t kExportDenseFill = 3;
constexpr uint64_t kExportDenseMove = 4;  // dense parts moving away from this server
constexpr uint64_t kImportDenseRows = 3;
constexpr uint64_t kImportDenseDone = 4;

/// Rows a SlotImport brings for one lane, in arrival order: each one's table, key (a dense
/// table's chunk index for dense chunks), metadata and floats (value, then optimizer state)
/// at its offset in `floats`.
struct RowBatch {
  std::vector<uint64_t> tables, keys;
  std::vector<RowMeta> metas;
  std::vector<float> floats;
  std::vector<size_t> offsets;

  /// Appends a row of `n` floats read from `data` (unaligned).
  void Add(uint64_t table, uint64_t key, const SlotRowMeta& m, const char* data, uint32_t n) {
    tables.push_back(table);
    keys.push_back(key);
    metas.push_back(RowMeta{m.update_count, m.last_step, m.last_update_s});
    offsets.push_back(floats.size());
    floats.resize(floats.size() + n);
    std::memcpy(floats.data() + offsets.back(), data, size_t{n} * sizeof(float));
  }
};

}  // namespace tessera::internal
