// The RocksDB configuration of the storage engine (docs/storage.md, "RocksDB tuning"), in one
// place: the engine opens RocksDB with it, and bench_storage opens its raw-RocksDB baseline with
// it, so the comparison measures Tessera's layer and not a different configuration.
#pragma once

#include <rocksdb/cache.h>
#include <rocksdb/options.h>

#include <memory>

#include "ps/status.h"
#include "storage/storage.h"

namespace tessera::internal {

/// Options of every table's column family: 4 KiB blocks with an in-block hash index, whole-key
/// bloom filters (10 bits/key) on every level and over the memtable, index and filter blocks
/// charged to `block_cache` (L0's pinned), no compression, leveled compaction with dynamic level
/// sizes, 64 MiB memtables (3) and files, 256 MiB L1, an insert hint for sparse row keys (one per
/// memtable; range tombstones kept out of it). `block_cache` is shared, not copied; it may
/// be nullptr (RocksDB then makes a private 32 MiB cache per family). The meta and log families
/// keep RocksDB's defaults.
rocksdb::ColumnFamilyOptions TunedTableOptions(const std::shared_ptr<rocksdb::Cache>& block_cache);

/// The DB-wide options for `options`: creates the DB and missing families, paranoid checks, a torn
/// last WAL record tolerated on recovery (anything else in the WAL is Corruption), manual WAL
/// flush in the relaxed mode, options.background_jobs background jobs, 1 MiB bytes_per_sync,
/// atomic flushes across families, 64 MiB max_total_wal_size, 4 info log files at WARN level.
/// env is left at the default.
rocksdb::DBOptions TunedDbOptions(const StorageOptions& options);

/// The whole configuration the engine opens RocksDB with for `options`.
struct RocksDbTuning {
  /// TunedDbOptions(options).
  rocksdb::DBOptions db;
  /// TunedTableOptions over a new LRU block cache of max(options.block_cache_bytes, 1 MiB) +
  /// max(options.write_buffer_bytes, 4 MiB) bytes (shared by every family opened with these
  /// options; db.write_buffer_manager charges the memtables to it), then
  /// options.rocksdb_table_options applied over it.
  rocksdb::ColumnFamilyOptions table;
};

/// Builds the RocksDbTuning of `options`. Errors: InvalidArgument when
/// options.rocksdb_table_options does not parse or names an unknown option. Other fields of
/// `options` are not checked (OpenRocksDbStorageEngine checks them).
Result<RocksDbTuning> TuneRocksDb(const StorageOptions& options);

}  // namespace tessera::internal
