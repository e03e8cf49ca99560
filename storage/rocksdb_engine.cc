// StorageEngine over RocksDB: a byte-bounded memory tier (CLOCK) over one RocksDB per server,
// a column family per table, group-committed WriteBatches with the WAL on. See docs/storage.md.
// The engine's class is declared in rocksdb_engine_impl_internal.h; its lanes are in
// rocksdb_lane_store.cc, their snapshots in rocksdb_lane_snapshot.cc, the write-back (the
// writer thread and the lanes' hand-offs) in rocksdb_write_back.cc.
#include <glog/logging.h>
#include <rocksdb/db.h>
#include <rocksdb/options.h>
#include <rocksdb/utilities/checkpoint.h>
#include <rocksdb/write_batch.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <filesystem>

#include "ps/thread_name_internal.h"
#include "storage/log_file_internal.h"
#include "storage/rocksdb_common_internal.h"
#include "storage/rocksdb_engine_impl_internal.h"
#include "storage/rocksdb_engine_internal.h"
#include "storage/rocksdb_lane_store_internal.h"
#include "storage/rocksdb_tuning_internal.h"

namespace tessera::internal {
namespace {

constexpr char kMetaFamily[] = "meta";
constexpr char kLogFamily[] = "log";
// Meta records the engine itself keeps (the server must not use this prefix).
constexpr char kLayoutPrefix[] = "storage/layout/";

std::string FamilyName(uint64_t table_id) { return std::to_string(table_id); }

bool ParseFamilyName(const std::string& name, uint64_t* id) {
  if (name.empty() || name.size() > 20) return false;
  auto [p, ec] = std::from_chars(name.data(), name.data() + name.size(), *id);
  return ec == std::errc() && p == name.data() + name.size() && *id != 0;
}

}  // namespace

Result<std::unique_ptr<RocksDbEngine>> RocksDbEngine::Open(const StorageOptions& options,
                                                           const internal::RocksDbHooks& hooks) {
  if (options.data_dir.empty()) return Status::InvalidArgument("data_dir is empty");
  if (options.background_jobs < 1) {
    return Status::InvalidArgument("background_jobs must be at least 1");
  }
  if (options.durability == Durability::kRelaxed && options.relaxed_window_ms == 0) {
    return Status::InvalidArgument("relaxed_window_ms must be positive in the relaxed mode");
  }
  std::unique_ptr<RocksDbEngine> engine(new RocksDbEngine(options));
  rocksdb::Env* env = hooks.env != nullptr ? hooks.env : rocksdb::Env::Default();

  // Parents first: RocksDB only creates the last path component.
  const std::filesystem::path dir(options.data_dir);
  if (dir.has_parent_path()) {
    std::error_code ec;
    std::filesystem::create_directories(dir.parent_path(), ec);
    if (ec) {
      return Status::IOError("cannot create the parent of data_dir '" + options.data_dir +
                             "': " + ec.message());
    }
  }

  // The tuning (docs/storage.md) lives in rocksdb_tuning.cc, shared with bench_storage.
  TESSERA_ASSIGN_OR_RETURN(internal::RocksDbTuning tuning, internal::TuneRocksDb(options));
  rocksdb::DBOptions db_opts = std::move(tuning.db);
  db_opts.env = env;
  engine->table_cf_options_ = std::move(tuning.table);

  std::vector<std::string> names;
  const bool exists = env->FileExists(options.data_dir + "/CURRENT").ok();
  if (exists) {
    auto s = rocksdb::DB::ListColumnFamilies(db_opts, options.data_dir, &names);
    if (!s.ok()) return FromRocks(s, "listing the column families of '" + options.data_dir + "'");
  } else {
    names.push_back(rocksdb::kDefaultColumnFamilyName);
  }
  if (std::find(names.begin(), names.end(), kMetaFamily) == names.end()) {
    names.push_back(kMetaFamily);
  }
  if (std::find(names.begin(), names.end(), kLogFamily) == names.end()) {
    names.push_back(kLogFamily);
  }
  std::vector<rocksdb::ColumnFamilyDescriptor> descs;
  for (const auto& n : names) {
    uint64_t id;
    descs.emplace_back(
        n, ParseFamilyName(n, &id) ? engine->table_cf_options_ : rocksdb::ColumnFamilyOptions());
  }
  auto s = rocksdb::DB::Open(db_opts, options.data_dir, descs, &engine->handles_, &engine->db_);
  if (!s.ok()) return FromRocks(s, "opening RocksDB in '" + options.data_dir + "'");
  engine->AdoptFamilies(names);
  {
    // Entries an older version logged into the "log" family are replayed once, then deleted.
    std::unique_ptr<rocksdb::Iterator> it(
        engine->db_->NewIterator(rocksdb::ReadOptions(), engine->log_cf_));
    it->SeekToFirst();
    engine->legacy_log_ = it->Valid();
  }
  internal::LogFileOptions lo;
  lo.dir = options.log_dir.empty() ? options.data_dir + "/request-log" : options.log_dir;
  lo.fsync = options.fsync;
  lo.buffered = options.durability == Durability::kRelaxed;
  TESSERA_ASSIGN_OR_RETURN(engine->log_file_, internal::LogFile::Open(lo));
  engine->writer_ = std::thread([e = engine.get()] { e->WriterLoop(); });
  if (options.durability == Durability::kRelaxed) {
    engine->flusher_ = std::thread([e = engine.get()] { e->FlusherLoop(); });
  }
  return engine;
}

RocksDbEngine::~RocksDbEngine() {
  if (writer_.joinable()) {
    {
      MutexLock l(writer_mu_);
      writer_stop_ = true;
    }
    writer_cv_.notify_all();
    writer_.join();
    // Rounds written back and not flushed yet (the lanes commit theirs when they close).
    if (db_ != nullptr && written_round_ != flushed_round()) {
      Status s = FlushRounds();
      if (!s.ok()) LOG(ERROR) << "flushing the rows of " << options_.data_dir << ": " << s.ToString();
    }
  }
  if (flusher_.joinable()) {
    {
      MutexLock l(flusher_mu_);
      stop_ = true;
    }
    flusher_cv_.notify_all();
    flusher_.join();
  }
  log_file_.reset();  // writes what the relaxed mode buffered
  if (db_ == nullptr) return;
  if (options_.durability == Durability::kRelaxed) {
    auto s = db_->FlushWAL(options_.fsync);
    if (!s.ok()) LOG(ERROR) << "flushing the WAL of " << options_.data_dir << ": " << s.ToString();
  }
  for (auto* h : handles_) db_->DestroyColumnFamilyHandle(h).PermitUncheckedError();
  auto s = db_->Close();
  if (!s.ok()) LOG(ERROR) << "closing RocksDB in " << options_.data_dir << ": " << s.ToString();
  delete db_;
}

void RocksDbEngine::FlusherLoop() {
  NameThisThread("log-flusher");
  const auto period =
      std::chrono::milliseconds(std::max<uint32_t>(1, options_.relaxed_window_ms / 2));
  MutexLock l(flusher_mu_);
  while (!stop_) {
    // flusher_cv_.wait_for(l, period, stop_), spelled out so the analysis sees the lock held.
    const auto deadline = std::chrono::steady_clock::now() + period;
    while (!stop_ && flusher_cv_.wait_until(l.native(), deadline) != std::cv_status::timeout) {
    }
    if (stop_) break;
    l.Unlock();
    Status s = log_file_->Flush();
    if (s.ok()) s = FromRocks(db_->FlushWAL(options_.fsync), "flushing the WAL");
    if (!s.ok()) {
      MutexLock g(mu_);
      if (bg_error_.ok()) {
        bg_error_ = s.WithContext("'" + options_.data_dir + "'");
        LOG(ERROR) << bg_error_.ToString();
      }
      has_bg_error_.store(true, std::memory_order_release);
    }
    l.Lock();
  }
}

Status RocksDbEngine::Write(rocksdb::WriteBatch* batch) {
  TESSERA_RETURN_IF_ERROR(BackgroundError());
  rocksdb::WriteOptions wo;
  wo.sync = options_.fsync && options_.durability == Durability::kStrict;
  return FromRocks(db_->Write(wo, batch), "writing to '" + options_.data_dir + "'");
}

Status RocksDbEngine::WriteRows(rocksdb::WriteBatch* batch) {
  rocksdb::WriteOptions wo;
  wo.disableWAL = true;
  return FromRocks(db_->Write(wo, batch), "writing rows to '" + options_.data_dir + "'");
}

Status RocksDbEngine::DurableMetaWrite(rocksdb::WriteBatch* batch) {
  rocksdb::WriteOptions wo;
  wo.sync = options_.fsync;
  TESSERA_RETURN_IF_ERROR(
      FromRocks(db_->Write(wo, batch), "writing metadata to '" + options_.data_dir + "'"));
  // Metadata is durable on return in both modes.
  if (options_.durability == Durability::kRelaxed) {
    TESSERA_RETURN_IF_ERROR(FromRocks(db_->FlushWAL(options_.fsync), "flushing the WAL"));
  }
  return Status::OK();
}

Result<std::unique_ptr<LaneStore>> RocksDbEngine::OpenLane(uint32_t lane, uint32_t num_lanes) {
  if (num_lanes == 0 || lane >= num_lanes) {
    return Status::InvalidArgument("lane " + std::to_string(lane) + " of " +
                                   std::to_string(num_lanes));
  }
  {
    MutexLock l(mu_);
    if (!open_lanes_.insert(lane).second) {
      return Status::AlreadyExists("lane " + std::to_string(lane) + " is already open");
    }
  }
  const uint64_t budget = options_.memory_budget_bytes / num_lanes;
  // An explicit budget never rounds down to "unbounded".
  return std::unique_ptr<LaneStore>(new RocksDbLaneStore(
      this, lane, num_lanes, options_.memory_budget_bytes != 0 ? std::max<uint64_t>(budget, 1) : 0,
      MaxDirtyBytesPerLane(options_, num_lanes)));
}

Status RocksDbEngine::DropTableData(uint64_t table_id) {
  rocksdb::ColumnFamilyHandle* h = nullptr;
  {
    MutexLock l(mu_);
    auto it = families_.find(table_id);
    if (it != families_.end()) h = it->second;
  }
  // One range tombstone over every key of the table's family (sparse keys have 10 bytes, dense
  // chunk keys 8: all sort below 16 bytes of 0xff), and the layout record, in one durable
  // write: nothing is read, and the space returns with compaction. The family itself stays (a
  // table created again under the name reuses it).
  rocksdb::WriteBatch b;
  if (h != nullptr) {
    auto s = b.DeleteRange(h, rocksdb::Slice(), std::string(16, '\xff'));
    if (!s.ok()) return FromRocks(s, "dropping the rows of table " + std::to_string(table_id));
  }
  auto s = b.Delete(meta_cf_, kLayoutPrefix + std::to_string(table_id));
  if (!s.ok()) return FromRocks(s, "dropping the layout of table " + std::to_string(table_id));
  return DurableMetaWrite(&b);
}

Result<rocksdb::ColumnFamilyHandle*> RocksDbEngine::TableFamily(uint64_t table_id,
                                                                const std::string& layout) {
  MutexLock l(mu_);
  const std::string layout_key = kLayoutPrefix + std::to_string(table_id);
  std::string stored;
  auto s = db_->Get(rocksdb::ReadOptions(), meta_cf_, layout_key, &stored);
  if (s.ok() && stored != layout) {
    return Status::FailedPrecondition("table id " + std::to_string(table_id) + " in '" +
                                      options_.data_dir + "' was stored as '" + stored +
                                      "', the spec now gives '" + layout + "'");
  }
  if (!s.ok() && !s.IsNotFound()) return FromRocks(s, "reading table layout");
  auto it = families_.find(table_id);
  rocksdb::ColumnFamilyHandle* h = nullptr;
  if (it != families_.end()) {
    h = it->second;
  } else {
    auto cs = db_->CreateColumnFamily(table_cf_options_, FamilyName(table_id), &h);
    if (!cs.ok())
      return FromRocks(cs, "creating the column family of table " + std::to_string(table_id));
    handles_.push_back(h);
    families_[table_id] = h;
  }
  if (s.IsNotFound()) {
    rocksdb::WriteBatch b;
    auto ps = b.Put(meta_cf_, layout_key, layout);
    if (!ps.ok()) return FromRocks(ps, "recording table layout");
    TESSERA_RETURN_IF_ERROR(DurableMetaWrite(&b));
  }
  return h;
}

Status RocksDbEngine::PutMeta(std::string_view key, std::string_view value) {
  rocksdb::WriteBatch b;
  auto s = b.Put(meta_cf_, rocksdb::Slice(key.data(), key.size()),
                 rocksdb::Slice(value.data(), value.size()));
  if (!s.ok()) return FromRocks(s, "PutMeta");
  return DurableMetaWrite(&b);
}

Status RocksDbEngine::WriteMeta(std::span<const MetaWrite> writes) {
  rocksdb::WriteBatch b;
  for (const MetaWrite& w : writes) {
    auto s = w.value ? b.Put(meta_cf_, w.key, *w.value) : b.Delete(meta_cf_, w.key);
    if (!s.ok()) return FromRocks(s, "WriteMeta");
  }
  return DurableMetaWrite(&b);
}

Result<std::optional<std::string>> RocksDbEngine::GetMeta(std::string_view key) {
  std::string v;
  auto s = db_->Get(rocksdb::ReadOptions(), meta_cf_, rocksdb::Slice(key.data(), key.size()), &v);
  if (s.IsNotFound()) return std::optional<std::string>();
  if (!s.ok()) return FromRocks(s, "GetMeta '" + std::string(key) + "'");
  return std::optional<std::string>(std::move(v));
}

Status RocksDbEngine::ScanMeta(std::string_view prefix,
                               const std::function<void(std::string_view, std::string_view)>& fn) {
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), meta_cf_));
  for (it->Seek(rocksdb::Slice(prefix.data(), prefix.size())); it->Valid(); it->Next()) {
    const std::string_view k(it->key().data(), it->key().size());
    if (!k.starts_with(prefix)) break;
    fn(k, std::string_view(it->value().data(), it->value().size()));
  }
  return FromRocks(it->status(), "ScanMeta");
}

Status RocksDbEngine::CreateCheckpoint(const std::string& dir) {
  TESSERA_RETURN_IF_ERROR(BackgroundError());
  if (options_.durability == Durability::kRelaxed) {
    TESSERA_RETURN_IF_ERROR(FromRocks(db_->FlushWAL(options_.fsync), "flushing the WAL"));
  }
  // Rows written back but not flushed are in no WAL: flushed first, or the checkpoint would
  // lack them.
  TESSERA_RETURN_IF_ERROR(FlushMemtables());
  rocksdb::Checkpoint* raw = nullptr;
  TESSERA_RETURN_IF_ERROR(FromRocks(rocksdb::Checkpoint::Create(db_, &raw), "checkpoint"));
  std::unique_ptr<rocksdb::Checkpoint> cp(raw);
  // Memtables hold only what the WAL holds now: a small WAL is copied (and replayed when the
  // checkpoint is opened) rather than flushed again.
  return FromRocks(cp->CreateCheckpoint(dir, /*log_size_for_flush=*/uint64_t{64} << 20),
                   "creating checkpoint '" + dir + "'");
}

Status RocksDbEngine::AppendLog(uint64_t seq, std::string_view entry) {
  TESSERA_RETURN_IF_ERROR(BackgroundError());
  return log_file_->Append(seq, entry);
}

Status RocksDbEngine::AppendLogGroup(std::span<const LogEntry> entries) {
  TESSERA_RETURN_IF_ERROR(BackgroundError());
  return log_file_->Append(entries);
}

Status RocksDbEngine::ScanLog(uint64_t after,
                              const std::function<Status(uint64_t, std::string_view)>& fn) {
  if (legacy_log_) {
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), log_cf_));
    for (it->Seek(SeqKey(after + 1)); it->Valid(); it->Next()) {
      if (it->key().size() != 8) return Status::Corruption("malformed request-log key");
      const uint64_t seq = SeqOfKey(it->key());
      TESSERA_RETURN_IF_ERROR(fn(seq, std::string_view(it->value().data(), it->value().size())));
      after = std::max(after, seq);
    }
    TESSERA_RETURN_IF_ERROR(FromRocks(it->status(), "reading the request log"));
  }
  return log_file_->Scan(after, fn);
}

std::vector<std::pair<std::string, uint64_t>> RocksDbEngine::EngineStats() const {
  // RocksDB's memory by kind (docs/operations.md, "Capacity"): over every column family.
  std::vector<std::pair<std::string, uint64_t>> out;
  auto add = [&](const char* name, const std::string& property) {
    uint64_t v = 0;
    if (db_->GetAggregatedIntProperty(property, &v)) out.emplace_back(name, v);
  };
  // The tables share one block cache (the default family has its own): the largest figure.
  uint64_t cache = 0, pinned = 0;
  {
    MutexLock l(mu_);
    for (const auto& [id, h] : families_) {
      uint64_t v = 0;
      if (db_->GetIntProperty(h, rocksdb::DB::Properties::kBlockCacheUsage, &v)) {
        cache = std::max(cache, v);
      }
      if (db_->GetIntProperty(h, rocksdb::DB::Properties::kBlockCachePinnedUsage, &v)) {
        pinned = std::max(pinned, v);
      }
    }
  }
  out.emplace_back("rocksdb_block_cache_bytes", cache);
  out.emplace_back("rocksdb_block_cache_pinned_bytes", pinned);
  add("rocksdb_memtable_bytes", rocksdb::DB::Properties::kSizeAllMemTables);
  add("rocksdb_table_readers_bytes", rocksdb::DB::Properties::kEstimateTableReadersMem);
  out.emplace_back("request_log_bytes", log_file_ ? log_file_->bytes() : 0);
  out.emplace_back("request_log_appended_bytes", log_file_ ? log_file_->appended_bytes() : 0);
  return out;
}

Status RocksDbEngine::TruncateLog(uint64_t upto) {
  if (upto == 0) return Status::OK();
  if (legacy_log_) {
    rocksdb::WriteBatch b;
    auto s = b.DeleteRange(log_cf_, SeqKey(0), SeqKey(upto + 1));
    if (!s.ok()) return FromRocks(s, "truncating the request log");
    TESSERA_RETURN_IF_ERROR(Write(&b));
  }
  return log_file_->Truncate(upto);
}

void RocksDbEngine::AdoptFamilies(const std::vector<std::string>& names) {
  MutexLock l(mu_);  // not shared yet (Open): taken for the analysis
  for (size_t i = 0; i < names.size(); ++i) {
    uint64_t id;
    if (names[i] == kMetaFamily) {
      meta_cf_ = handles_[i];
    } else if (names[i] == kLogFamily) {
      log_cf_ = handles_[i];
    } else if (ParseFamilyName(names[i], &id)) {
      families_[id] = handles_[i];
    }
  }
}

Status RocksDbEngine::FlushMemtables() {
  std::vector<rocksdb::ColumnFamilyHandle*> all;
  {
    MutexLock l(mu_);
    all = handles_;
  }
  rocksdb::FlushOptions fo;
  fo.wait = true;
  return FromRocks(db_->Flush(fo, all), "flush");
}

Result<std::unique_ptr<StorageEngine>> OpenRocksDbStorageEngine(const StorageOptions& options,
                                                                const RocksDbHooks& hooks) {
  TESSERA_ASSIGN_OR_RETURN(auto engine, RocksDbEngine::Open(options, hooks));
  return std::unique_ptr<StorageEngine>(std::move(engine));
}

Status FlushMemtablesForTest(StorageEngine* engine) {
  auto* e = dynamic_cast<RocksDbEngine*>(engine);
  if (e == nullptr) return Status::InvalidArgument("not a RocksDB storage engine");
  return e->FlushMemtables();
}

}  // namespace tessera::internal
