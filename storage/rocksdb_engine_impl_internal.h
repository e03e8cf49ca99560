// The RocksDB storage engine's class: one RocksDB per server, a column family per table, the
// request log, and the writer thread of the lanes' write-backs. Defined in rocksdb_engine.cc,
// except the writer thread (Submit, WriterLoop, WriteRound) in rocksdb_write_back.cc. Lanes are
// RocksDbLaneStore (rocksdb_lane_store_internal.h). Opened through OpenRocksDbStorageEngine.
#pragma once

#include <rocksdb/db.h>
#include <rocksdb/options.h>
#include <rocksdb/write_batch.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "ps/mutex.h"
#include "ps/status.h"
#include "storage/log_file_internal.h"
#include "storage/rocksdb_engine_internal.h"
#include "storage/storage.h"

namespace tessera::internal {

struct WriteBackJob;

class RocksDbEngine final : public StorageEngine {
 public:
  static Result<std::unique_ptr<RocksDbEngine>> Open(const StorageOptions& options,
                                                     const internal::RocksDbHooks& hooks);
  ~RocksDbEngine() override;

  Result<std::unique_ptr<LaneStore>> OpenLane(uint32_t lane, uint32_t num_lanes) override;
  Status PutMeta(std::string_view key, std::string_view value) override;
  Result<std::optional<std::string>> GetMeta(std::string_view key) override;
  Status WriteMeta(std::span<const MetaWrite> writes) override;
  Status ScanMeta(std::string_view prefix,
                  const std::function<void(std::string_view, std::string_view)>& fn) override;
  Status CreateCheckpoint(const std::string& dir) override;
  Status DropTableData(uint64_t table_id) override;
  bool durable() const override { return true; }
  Status AppendLog(uint64_t seq, std::string_view entry) override;
  Status AppendLogGroup(std::span<const LogEntry> entries) override;
  Status ScanLog(uint64_t after,
                 const std::function<Status(uint64_t, std::string_view)>& fn) override;
  Status TruncateLog(uint64_t upto) override;
  std::vector<std::pair<std::string, uint64_t>> EngineStats() const override;

  // For lanes.
  rocksdb::ColumnFamilyHandle* meta_cf() const { return meta_cf_; }
  rocksdb::DB* db() const { return db_; }
  const std::string& dir() const { return options_.data_dir; }
  // The column family of a table, created on first use; checks the stored layout.
  Result<rocksdb::ColumnFamilyHandle*> TableFamily(uint64_t table_id, const std::string& layout);
  // Writes a batch with the WAL, as durably as the mode asks.
  Status Write(rocksdb::WriteBatch* batch);
  // Writes rows without the WAL: durable at the next memtable flush (atomic across families).
  Status WriteRows(rocksdb::WriteBatch* batch);
  // Queues a lane's hand-off for the writer thread.
  void Submit(std::shared_ptr<WriteBackJob> job);
  void ReleaseLane(uint32_t lane) {
    MutexLock l(mu_);
    open_lanes_.erase(lane);
  }
  Status FlushMemtables();
  // Every write-back round up to this one is durable (its rows and marks flushed).
  uint64_t flushed_round() const { return flushed_round_.load(std::memory_order_acquire); }

 private:
  RocksDbEngine(const StorageOptions& options) : options_(options) {}
  Status DurableMetaWrite(rocksdb::WriteBatch* batch);
  // Open: notes the families DB::Open opened (`names`, in the order of handles_).
  void AdoptFamilies(const std::vector<std::string>& names) ABSL_LOCKS_EXCLUDED(mu_);
  void FlusherLoop() ABSL_LOCKS_EXCLUDED(flusher_mu_, mu_);
  void WriterLoop() ABSL_LOCKS_EXCLUDED(writer_mu_);
  // Writes a round of hand-offs, then flushes every memtable: their rows and marks are on disk
  // together or not at all.
  void WriteRound(std::vector<std::shared_ptr<WriteBackJob>>& round);
  // Flushes the memtables (writer thread): every round written so far becomes durable.
  Status FlushRounds();
  Status BackgroundError() {
    if (!has_bg_error_.load(std::memory_order_acquire)) return Status::OK();
    MutexLock l(mu_);
    return bg_error_;
  }

  const StorageOptions options_;
  rocksdb::ColumnFamilyOptions table_cf_options_;
  rocksdb::DB* db_ = nullptr;
  rocksdb::ColumnFamilyHandle* meta_cf_ = nullptr;
  rocksdb::ColumnFamilyHandle* log_cf_ = nullptr;

  mutable Mutex mu_;
  // Owned; every family opened.
  std::vector<rocksdb::ColumnFamilyHandle*> handles_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, rocksdb::ColumnFamilyHandle*> families_ ABSL_GUARDED_BY(mu_);
  std::set<uint32_t> open_lanes_ ABSL_GUARDED_BY(mu_);
  Status bg_error_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> has_bg_error_{false};

  // The request log (docs/storage.md); the "log" family holds entries of older versions only.
  std::unique_ptr<internal::LogFile> log_file_;
  bool legacy_log_ = false;

  // The writer thread of write-back hand-offs.
  std::thread writer_;
  Mutex writer_mu_;
  std::condition_variable writer_cv_;
  std::vector<std::shared_ptr<WriteBackJob>> jobs_ ABSL_GUARDED_BY(writer_mu_);
  bool writer_stop_ ABSL_GUARDED_BY(writer_mu_) = false;
  bool resume_ = false;  // writer thread only (not annotated): the last round failed
  // Write-back rounds: the last one written (writer thread only), the last one flushed, and
  // when the oldest unflushed one was written (writer thread only).
  uint64_t written_round_ = 0;
  std::atomic<uint64_t> flushed_round_{0};
  std::chrono::steady_clock::time_point first_unflushed_;
  // Writer thread only: a round written since the last flush carried a flush_soon hand-off.
  bool flush_soon_ = false;

  // Relaxed mode: a thread flushes the log buffer (and the WAL) every relaxed_window_ms / 2.
  std::thread flusher_;
  Mutex flusher_mu_;
  std::condition_variable flusher_cv_;
  bool stop_ ABSL_GUARDED_BY(flusher_mu_) = false;
};

}  // namespace tessera::internal
