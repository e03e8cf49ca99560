// Lane snapshots for checkpoints and serving exports (server side).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ps/record_file_internal.h"
#include "ps/table_spec.h"
#include "storage/storage.h"

namespace tessera::internal {

struct SnapshotOptions {
  /// Write values only (serving export), not the optimizer state.
  bool values_only = false;
  /// Only rows updated at or after this time (seconds since the epoch); 0: every row.
  uint32_t min_update_s = 0;
};

/// Writes the rows and chunks `snapshot` holds of `tables` to the record file `path` (fsync'd).
/// Runs on any thread (the file writer's): the lane that took the snapshot goes on meanwhile.
Status WriteLaneSnapshot(LaneSnapshot& snapshot,
                         const std::vector<std::pair<uint64_t, TableSpec>>& tables,
                         const std::string& path, const SnapshotOptions& options = {});

}  // namespace tessera::internal
