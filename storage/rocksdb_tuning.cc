// The RocksDB configuration of the storage engine (rocksdb_tuning_internal.h).
#include <rocksdb/convenience.h>
#include <rocksdb/filter_policy.h>
#include <rocksdb/slice_transform.h>
#include <rocksdb/table.h>
#include <rocksdb/write_buffer_manager.h>

#include <algorithm>
#include <string>

#include "storage/rocksdb_tuning_internal.h"
#include "storage/row_codec_internal.h"

namespace tessera::internal {
namespace {

// The memtable insert hint (memtable_insert_with_hint_prefix_extractor) for sparse rows. A
// write-back inserts a lane's rows in key order into memtables that hold earlier versions of the
// same keys and the other lanes' rows between them; RocksDB's own cursor of the previous insert
// (seq_splice_) is used only when the next key falls right beside it, and every other insert
// searches the skiplist from the top (O(log N), cache misses on each level). A hint is walked up
// only as far as the key is from the previous one (O(log D)): the splice searches fell from 17%
// to 6% of the CPU of bench_elastic's durable servers (docs/storage.md, "RocksDB tuning").
// Only 10-byte sparse row keys are in the domain, and all share one hint per memtable (empty
// prefix: a hint costs ~250 bytes of the memtable's arena; one per slot would be 4 MiB).
// Range tombstones must stay out of it: RocksDB 7.8 keys the hints of a memtable's point
// entries and of its range tombstones in one map, so a DeleteRange (a slot drop's 2-byte
// bounds, a table drop's empty one) given the same prefix as rows reuses a position in the
// other skiplist: an assertion (Debian's build keeps them) or a corrupt memtable
// (StoreConformanceTest.DropSlotsDeletesTheirRowsAndOnlyThose aborts so with every key in the
// domain).
class SparseRowInsertHint : public rocksdb::SliceTransform {
 public:
  static const char* kClassName() { return "tessera.SparseRowInsertHint"; }
  const char* Name() const override { return kClassName(); }
  rocksdb::Slice Transform(const rocksdb::Slice& key) const override {
    return rocksdb::Slice(key.data(), 0);
  }
  bool InDomain(const rocksdb::Slice& key) const override {
    return key.size() == kSparseKeyBytes;
  }
};

// InvalidArgument when `text` (StorageOptions::rocksdb_table_options) gives an option a negative
// value: RocksDB reads unsigned options modulo 2^64 ("write_buffer_size=-1" opened with a
// 16 EiB memtable), and the options worth tuning here are counts, sizes and ratios.
Status CheckNoNegativeValue(const std::string& text, const std::string& shown) {
  for (size_t at = text.find('='); at != std::string::npos; at = text.find('=', at + 1)) {
    const size_t value = text.find_first_not_of(" \t", at + 1);
    if (value != std::string::npos && text[value] == '-') {
      return Status::InvalidArgument("rocksdb_table_options '" + shown +
                                     "': a negative value (RocksDB would read an unsigned "
                                     "option modulo 2^64)");
    }
  }
  return Status::OK();
}

}  // namespace

rocksdb::ColumnFamilyOptions TunedTableOptions(const std::shared_ptr<rocksdb::Cache>& block_cache) {
  rocksdb::ColumnFamilyOptions cf;
  rocksdb::BlockBasedTableOptions t;
  t.block_cache = block_cache;
  // Rows are 50-300 bytes; 4 KiB blocks keep the bytes read per point lookup low.
  t.block_size = 4096;
  // Most cold reads are point lookups, many of keys never stored: whole-key bloom filters on
  // every level (not optimize_filters_for_hits) let misses skip files.
  t.filter_policy.reset(rocksdb::NewBloomFilterPolicy(10));
  t.whole_key_filtering = true;
  t.optimize_filters_for_memory = true;
  // Index and filter blocks count against the block cache (bounded memory); L0's stay pinned.
  t.cache_index_and_filter_blocks = true;
  t.pin_l0_filter_and_index_blocks_in_cache = true;
  // A hash index inside each data block: one probe instead of a binary search.
  t.data_block_index_type = rocksdb::BlockBasedTableOptions::kDataBlockBinaryAndHash;
  t.format_version = 5;
  cf.table_factory.reset(rocksdb::NewBlockBasedTableFactory(t));
  // Float embeddings and optimizer state barely compress (measured in docs/storage.md);
  // compression would only cost CPU on every cold read.
  cf.compression = rocksdb::kNoCompression;
  cf.bottommost_compression = rocksdb::kNoCompression;
  cf.write_buffer_size = 64 << 20;
  cf.max_write_buffer_number = 3;
  // A bloom filter over the memtable: reads of absent keys skip the skiplist search.
  cf.memtable_prefix_bloom_size_ratio = 0.02;
  cf.memtable_whole_key_filtering = true;
  cf.memtable_insert_with_hint_prefix_extractor = std::make_shared<SparseRowInsertHint>();
  cf.level_compaction_dynamic_level_bytes = true;
  cf.target_file_size_base = 64 << 20;
  cf.max_bytes_for_level_base = 256 << 20;
  return cf;
}

rocksdb::DBOptions TunedDbOptions(const StorageOptions& options) {
  rocksdb::DBOptions db;
  db.create_if_missing = true;
  db.create_missing_column_families = true;
  db.paranoid_checks = true;
  // A kill -9 can leave only a torn last WAL record (a batch never acknowledged); anything else
  // damaged in the WAL is reported as Corruption rather than silently cut.
  db.wal_recovery_mode = rocksdb::WALRecoveryMode::kTolerateCorruptedTailRecords;
  db.manual_wal_flush = options.durability == Durability::kRelaxed;
  db.max_background_jobs = options.background_jobs;
  db.bytes_per_sync = 1 << 20;
  // Rows are written without the WAL (the request log holds what they lack); a memtable flush
  // must then persist every column family at the same point, or a lane's rows could reach disk
  // without the applied-log mark written in the same batch (docs/storage.md).
  db.atomic_flush = true;
  // The WAL holds only small metadata records now.
  db.max_total_wal_size = uint64_t{64} << 20;
  db.keep_log_file_num = 4;
  db.info_log_level = rocksdb::InfoLogLevel::WARN_LEVEL;
  return db;
}

Result<RocksDbTuning> TuneRocksDb(const StorageOptions& options) {
  RocksDbTuning tuning;
  tuning.db = TunedDbOptions(options);
  const uint64_t buffers = std::max<uint64_t>(options.write_buffer_bytes, 4 << 20);
  auto cache =
      rocksdb::NewLRUCache(std::max<uint64_t>(options.block_cache_bytes, 1 << 20) + buffers);
  // Memtables of all families share one budget, charged to the cache: memory stays bounded
  // however many tables there are (each family alone would take up to 3 x 64 MiB).
  tuning.db.write_buffer_manager = std::make_shared<rocksdb::WriteBufferManager>(buffers, cache);
  tuning.table = TunedTableOptions(cache);
  if (!options.rocksdb_table_options.empty()) {
    const std::string& text = options.rocksdb_table_options;
    // Errors quote the string, cut short: a megabyte of options is not echoed back whole.
    const std::string shown = text.size() <= 200 ? text
                                                 : text.substr(0, 200) + "... (" +
                                                       std::to_string(text.size()) + " bytes)";
    TESSERA_RETURN_IF_ERROR(CheckNoNegativeValue(text, shown));
    rocksdb::ConfigOptions config;
    config.ignore_unknown_options = false;
    rocksdb::ColumnFamilyOptions overridden;
    auto s = rocksdb::GetColumnFamilyOptionsFromString(config, tuning.table, text, &overridden);
    if (!s.ok()) {
      std::string why = s.ToString();
      if (why.size() > 300) why = why.substr(0, 300) + "...";
      return Status::InvalidArgument("rocksdb_table_options '" + shown + "': " + why);
    }
    tuning.table = overridden;
  }
  return tuning;
}

}  // namespace tessera::internal
