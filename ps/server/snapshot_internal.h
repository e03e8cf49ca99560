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

/// Writes the rows and chunks `store` holds of `tables` to the record file `path`.
Status WriteLaneSnapshot(LaneStore& store,
                         const std::vector<std::pair<uint64_t, TableSpec>>& tables,
                         const std::string& path, const SnapshotOptions& options = {});
/// The same file's bytes, built in memory (the lane pauses only for this; the write and fsync
/// can happen elsewhere).
Status SerializeLaneSnapshot(LaneStore& store,
                             const std::vector<std::pair<uint64_t, TableSpec>>& tables,
                             const SnapshotOptions& options, std::string* out);

}  // namespace tessera::internal
