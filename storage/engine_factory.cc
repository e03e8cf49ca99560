#include "storage/storage.h"

namespace tessera {

Result<std::unique_ptr<StorageEngine>> OpenStorageEngine(const StorageOptions& options) {
  if (options.data_dir.empty()) return NewMemoryStorageEngine();
  return Status::FailedPrecondition("the RocksDB storage engine is not built yet (data_dir '" +
                                    options.data_dir + "')");
}

}  // namespace tessera
