#include <algorithm>

#include "storage/rocksdb_engine_internal.h"
#include "storage/storage.h"

namespace tessera {

uint64_t MaxDirtyBytesPerLane(const StorageOptions& options, uint32_t num_lanes) {
  const uint64_t lanes = std::max<uint32_t>(num_lanes, 1);
  if (options.max_dirty_bytes != 0) return std::max<uint64_t>(options.max_dirty_bytes / lanes, 1);
  if (options.memory_budget_bytes != 0) {
    return std::clamp<uint64_t>(options.memory_budget_bytes / lanes / 4, 1,
                                kMaxDefaultDirtyBytesPerLane);
  }
  return std::max<uint64_t>((uint64_t{1} << 30) / lanes, 1);
}

Result<std::unique_ptr<StorageEngine>> OpenStorageEngine(const StorageOptions& options) {
  if (options.data_dir.empty()) return NewMemoryStorageEngine();
  return internal::OpenRocksDbStorageEngine(options);
}

}  // namespace tessera
