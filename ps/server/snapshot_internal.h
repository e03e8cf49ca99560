// Lane snapshots for checkpoints and serving exports (server side).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ps/record_file_internal.h"
#include "ps/routing.h"
#include "ps/table_spec.h"
#include "storage/storage.h"

namespace tessera::internal {

/// Which rows and dense chunks a server writes into a snapshot or keeps from a checkpoint: in
/// a cluster that follows a map, those of the slots and dense parts it serves (as primary, or
/// also as backup), so that every row is written once, by its primary. Immutable once built;
/// read on the file writer's thread.
struct RowFilter {
  /// Per slot: kept (kNumSlots entries).
  std::vector<bool> slots;
  /// The dense floats kept: [begin, end) of table `table_id`; a chunk is kept when its first
  /// float is (a chunk lies in the part of its first float, as DenseRangeOfServer cuts).
  struct DenseSpan {
    uint64_t table_id, begin, end;
  };
  std::vector<DenseSpan> dense;
  bool KeepRow(uint64_t key) const { return slots[SlotOfKey(key)]; }
  bool KeepChunk(uint64_t table_id, uint64_t chunk) const;
};

struct SnapshotOptions {
  /// Write values only (serving export), not the optimizer state.
  bool values_only = false;
  /// Only rows updated at or after this time (seconds since the epoch); 0: every row.
  uint32_t min_update_s = 0;
  /// Null: every row and chunk the lanes hold.
  std::shared_ptr<const RowFilter> filter;
};

/// Writes the rows and chunks `snapshot` holds of `tables` to the record file `path` (fsync'd).
/// Runs on any thread (the file writer's): the lane that took the snapshot goes on meanwhile.
Status WriteLaneSnapshot(LaneSnapshot& snapshot,
                         const std::vector<std::pair<uint64_t, TableSpec>>& tables,
                         const std::string& path, const SnapshotOptions& options = {});

}  // namespace tessera::internal
