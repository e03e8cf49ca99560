#include <algorithm>

#include "storage/log_file_internal.h"
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

Result<std::vector<std::string>> RepairRequestLog(const StorageOptions& options) {
  if (options.data_dir.empty() && options.log_dir.empty()) {
    return Status::InvalidArgument("a memory-only server keeps no request log to repair");
  }
  // The same default as the engine's.
  const std::string dir =
      options.log_dir.empty() ? options.data_dir + "/request-log" : options.log_dir;
  TESSERA_ASSIGN_OR_RETURN(internal::LogRepairReport r, internal::LogFile::Repair(dir));
  std::vector<std::string> lines = std::move(r.lines);
  lines.push_back("request log " + dir + ": kept " + std::to_string(r.kept) + " records, lost " +
                  std::to_string(r.lost_records) + ", dropped " +
                  std::to_string(r.dropped_bytes) + " bytes");
  return lines;
}

}  // namespace tessera
