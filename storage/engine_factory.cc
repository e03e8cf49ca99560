#include "storage/rocksdb_engine_internal.h"
#include "storage/storage.h"

namespace tessera {

Result<std::unique_ptr<StorageEngine>> OpenStorageEngine(const StorageOptions& options) {
  if (options.data_dir.empty()) return NewMemoryStorageEngine();
  return internal::OpenRocksDbStorageEngine(options);
}

}  // namespace tessera
