// Checkpoint files: rows and dense chunks of one lane, with a checksum (docs/operations.md).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ps/status.h"
#include "ps/table_spec.h"
#include "storage/storage.h"

namespace tessera::internal {

/// One record of a snapshot file: a sparse row or a dense chunk (value then optimizer state).
struct SnapshotRecord {
  enum Kind : uint8_t { kEnd = 0, kSparseRow = 1, kDenseChunk = 2 };
  Kind kind = kEnd;
  uint64_t table_id = 0;
  uint64_t key = 0;  ///< Sparse: the key. Dense: the chunk index.
  RowMeta meta;
  std::vector<float> row;
};

/// Writes every row and chunk `store` holds of `tables` to `path` (then fsyncs it).
Status WriteLaneSnapshot(LaneStore& store, const std::vector<std::pair<uint64_t, TableSpec>>& tables,
                         const std::string& path);

/// Verifies the checksum of `path`, then calls `fn` for every record. Corruption if the file
/// is truncated, altered or not a snapshot.
Status ReadSnapshot(const std::string& path,
                    const std::function<Status(const SnapshotRecord&)>& fn);

/// Small length-prefixed blob files (table specs, metadata records).
Status WriteBlobs(const std::string& path, const std::vector<std::string>& blobs);
Result<std::vector<std::string>> ReadBlobs(const std::string& path);

}  // namespace tessera::internal
