// The RocksDB storage engine's factory with the hooks tests need (fault-injecting environments).
#pragma once

#include <rocksdb/env.h>

#include <memory>

#include "ps/status.h"
#include "storage/storage.h"

namespace tessera::internal {

/// Test hooks of the RocksDB engine.
struct RocksDbHooks {
  /// Environment (file system) the DB uses; borrowed, must outlive the engine. nullptr: the
  /// default environment.
  rocksdb::Env* env = nullptr;
};

/// Opens (creating or recovering) the RocksDB engine in options.data_dir, which must be
/// non-empty. Errors: InvalidArgument (bad options), IOError (directory not usable, disk),
/// Corruption (damaged files), FailedPrecondition (a table's stored layout differs).
Result<std::unique_ptr<StorageEngine>> OpenRocksDbStorageEngine(const StorageOptions& options,
                                                                const RocksDbHooks& hooks = {});

/// Writes every memtable of an engine made by OpenRocksDbStorageEngine to SST files (tests that
/// need data in table files). InvalidArgument for other engines.
Status FlushMemtablesForTest(StorageEngine* engine);

}  // namespace tessera::internal
