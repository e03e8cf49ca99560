// The RocksDB engine: persistence, recovery (including after kill -9), the bounded memory tier,
// disk errors.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <rocksdb/file_system.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "ps/initializer.h"
#include "ps/routing.h"
#include "storage/rocksdb_engine_internal.h"
#include "storage/storage.h"
#include "storage/test_util_internal.h"

extern char** environ;

namespace tessera {
namespace {

using internal::MustLane;
using internal::MustOpen;
using internal::TempDir;

ApplyContext Ctx(uint64_t step) { return {step, static_cast<uint32_t>(1000 + step)}; }

// A deterministic gradient for (step, key, element).
float Grad(uint64_t step, uint64_t key, uint32_t j) {
  const uint64_t h = Mix64(step * 1000003 + key * 31 + j);
  return static_cast<float>((h >> 11) * 0x1.0p-53 * 2.0 - 1.0);
}

// Pushes `steps` batches of `batch` keys drawn (skewed) from [0, universe) into `lane`.
void Train(LaneStore* lane, uint64_t id, uint32_t dim, uint64_t universe, int steps, int batch,
           uint64_t first_step, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint64_t> keys(batch);
  std::vector<std::vector<float>> g(batch, std::vector<float>(dim));
  std::vector<const float*> gp(batch);
  for (int s = 0; s < steps; ++s) {
    const uint64_t step = first_step + s;
    for (int i = 0; i < batch; ++i) {
      const double u = (rng() >> 11) * 0x1.0p-53;
      keys[i] = static_cast<uint64_t>(u * u * universe) * 0x9e3779b97f4a7c15ULL;  // skewed
      for (uint32_t j = 0; j < dim; ++j) g[i][j] = Grad(step, keys[i], j);
      gp[i] = g[i].data();
    }
    Status st = lane->Apply(id, keys, gp, Ctx(step));
    ASSERT_TRUE(st.ok()) << st.ToString();
    st = lane->Commit();
    ASSERT_TRUE(st.ok()) << st.ToString();
  }
}

struct Row {
  std::vector<float> value, state;
  RowMeta meta;
  bool operator==(const Row& o) const {
    return value == o.value && state == o.state && meta.update_count == o.meta.update_count &&
           meta.last_step == o.meta.last_step && meta.last_update_s == o.meta.last_update_s;
  }
};
std::map<uint64_t, Row> Dump(LaneStore* lane, uint64_t id, uint32_t dim, uint32_t state) {
  std::map<uint64_t, Row> rows;
  Status s = lane->Scan(id, [&](uint64_t k, const float* v, const float* st, const RowMeta& m) {
    rows[k] = Row{{v, v + dim}, {st, st + state}, m};
    return true;
  });
  EXPECT_TRUE(s.ok()) << s.ToString();
  return rows;
}

TEST(RocksDbEngineTest, RowsDenseChunksAndStateSurviveReopen) {
  TempDir dir;
  OptimizerSpec adam{OptimizerKind::kAdam, 0.01f};
  const auto sparse = TableSpec::Sparse("emb", 8, adam, {InitializerKind::kNormal, 0, 0.1f, 3});
  const auto dense =
      TableSpec::Dense("mlp", 3 * kDenseChunkFloats / 2, {OptimizerKind::kMomentum, 0.1f});
  const uint64_t sid = TableIdForName("emb"), did = TableIdForName("mlp");
  const uint32_t half = kDenseChunkFloats / 2;
  std::vector<float> g(half, 0.25f);

  // Reference: the same pushes into the memory engine, without a restart in between.
  auto mem = NewMemoryStorageEngine();
  auto ref = MustLane(mem.get());
  ASSERT_TRUE(ref->AddTable(sid, sparse).ok());
  ASSERT_TRUE(ref->AddTable(did, dense).ok());
  Train(ref.get(), sid, 8, 3000, 20, 256, 1, 42);
  ASSERT_TRUE(ref->DenseApply(did, 1, 0, half, g.data(), Ctx(1)).ok());
  Train(ref.get(), sid, 8, 3000, 20, 256, 21, 43);
  ASSERT_TRUE(ref->DenseApply(did, 1, 0, half, g.data(), Ctx(2)).ok());

  {
    auto engine = MustOpen(dir.path());
    auto lane = MustLane(engine.get());
    ASSERT_TRUE(lane->AddTable(sid, sparse).ok());
    ASSERT_TRUE(lane->AddTable(did, dense).ok());
    Train(lane.get(), sid, 8, 3000, 20, 256, 1, 42);
    ASSERT_TRUE(lane->DenseApply(did, 1, 0, half, g.data(), Ctx(1)).ok());
    ASSERT_TRUE(lane->Commit().ok());
    ASSERT_TRUE(engine->PutMeta("table/x", "spec").ok());
  }
  // The server re-reads its specs from the meta records and adds the tables again.
  auto engine = MustOpen(dir.path());
  auto spec = engine->GetMeta("table/x");
  ASSERT_TRUE(spec.ok());
  EXPECT_EQ(spec->value_or(""), "spec");
  auto lane = MustLane(engine.get());
  ASSERT_TRUE(lane->AddTable(sid, sparse).ok());
  ASSERT_TRUE(lane->AddTable(did, dense).ok());
  // Training carries on from the recovered values, Adam moments and per-row step counts.
  Train(lane.get(), sid, 8, 3000, 20, 256, 21, 43);
  ASSERT_TRUE(lane->DenseApply(did, 1, 0, half, g.data(), Ctx(2)).ok());
  const auto got = Dump(lane.get(), sid, 8, 16);
  const auto want = Dump(ref.get(), sid, 8, 16);
  ASSERT_GT(got.size(), 1000u);
  ASSERT_EQ(got.size(), want.size());
  EXPECT_TRUE(got == want) << "values, Adam moments or step counts differ after reopen";
  std::vector<float> a(half), b(half);
  ASSERT_TRUE(lane->DenseRead(did, 1, 0, half, a.data()).ok());
  ASSERT_TRUE(ref->DenseRead(did, 1, 0, half, b.data()).ok());
  EXPECT_EQ(a, b) << "dense values or momentum differ after reopen";
  EXPECT_NE(a[0], 0.0f);
}

// WriteMeta puts and deletes records in one durable write (the server's spilled push marks,
// PushDedup); they survive a reopen, and ScanMeta sees what is left.
TEST(RocksDbEngineTest, WriteMetaPutsAndDeletesInOneWrite) {
  TempDir dir;
  {
    auto engine = MustOpen(dir.path());
    std::vector<MetaWrite> puts = {{"d/1", "a"}, {"d/2", "b"}, {"d/3", "c"}};
    ASSERT_TRUE(engine->WriteMeta(puts).ok());
    std::vector<MetaWrite> mixed = {{"d/1", std::nullopt}, {"d/3", "c2"}};
    ASSERT_TRUE(engine->WriteMeta(mixed).ok());
  }
  auto engine = MustOpen(dir.path());
  std::vector<std::string> seen;
  auto collect = [&](std::string_view k, std::string_view v) {
    seen.push_back(std::string(k) + "=" + std::string(v));
  };
  ASSERT_TRUE(engine->ScanMeta("d/", collect).ok());
  EXPECT_EQ(seen, (std::vector<std::string>{"d/2=b", "d/3=c2"}));
}

// The engine's own figures: RocksDB's memory by kind, read back after rows went to disk and
// came back through the block cache.
TEST(RocksDbEngineTest, EngineStatsReportRocksDbMemory) {
  TempDir dir;
  auto engine = MustOpen(dir.path());
  const uint64_t sid = TableIdForName("emb");
  std::vector<uint64_t> keys(3000);
  for (uint64_t k = 0; k < keys.size(); ++k) keys[k] = k * 0x9e3779b97f4a7c15ULL;
  std::vector<float> rows(keys.size() * 8, 0.5f);
  std::vector<float*> out(keys.size());
  std::vector<const float*> grads(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) grads[i] = out[i] = rows.data() + i * 8;
  const TableSpec spec = TableSpec::Sparse("emb", 8, {OptimizerKind::kSgd, 0.1f});
  {
    auto lane = MustLane(engine.get());
    ASSERT_TRUE(lane->AddTable(sid, spec).ok());
    ASSERT_TRUE(lane->Apply(sid, keys, grads, Ctx(1)).ok());
    ASSERT_TRUE(lane->Commit().ok());
  }
  {
    // A new lane has nothing in memory: every lookup reads RocksDB.
    auto lane = MustLane(engine.get());
    ASSERT_TRUE(lane->AddTable(sid, spec).ok());
    ASSERT_TRUE(lane->Lookup(sid, keys, out).ok());
  }
  std::map<std::string, uint64_t> stats;
  for (const auto& [name, value] : engine->EngineStats()) stats[name] = value;
  for (const char* name :
       {"rocksdb_block_cache_bytes", "rocksdb_block_cache_pinned_bytes", "rocksdb_memtable_bytes",
        "rocksdb_table_readers_bytes", "request_log_bytes", "request_log_appended_bytes"}) {
    EXPECT_TRUE(stats.contains(name)) << name;
  }
  EXPECT_GT(stats["rocksdb_block_cache_bytes"], 0u);
  EXPECT_TRUE(NewMemoryStorageEngine()->EngineStats().empty());
}

// The sparse Adagrad table the budget tests train (far larger than their budgets).
TableSpec BigTable(uint32_t dim) {
  return TableSpec::Sparse("big", dim, {OptimizerKind::kAdagrad, 0.05f},
                           {InitializerKind::kUniform, -0.1f, 0.1f, 9});
}

// A budgeted lane keeps its dirty bound out of the budget for the copies a hand-off makes: the
// rows in memory (arena and index, as MemoryBytes counts them) stay within the rest while the
// lane trains and writes back as a server lane does (at once past the dirty bound).
TEST(RocksDbEngineTest, BudgetKeepsRoomForTheWriteBackCopy) {
  TempDir dir;
  constexpr uint32_t kDim = 8;
  const auto spec = BigTable(kDim);
  const uint64_t id = TableIdForName(spec.name);
  StorageOptions o;
  o.memory_budget_bytes = 2000000;
  const uint64_t reserve = MaxDirtyBytesPerLane(o, 1);
  ASSERT_EQ(reserve, o.memory_budget_bytes / 4);
  auto engine = MustOpen(dir.path(), o);
  auto lane = MustLane(engine.get());
  ASSERT_TRUE(lane->AddTable(id, spec).ok());
  std::mt19937_64 rng(3);
  std::vector<uint64_t> keys(512);
  std::vector<float> g(keys.size() * kDim, 0.01f);
  std::vector<const float*> gp(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) gp[i] = &g[i * kDim];
  uint64_t most = 0;
  for (int step = 1; step <= 400; ++step) {
    for (auto& k : keys) k = rng() % 200000;  // ~19 MB of rows: ten times the budget
    ASSERT_TRUE(lane->Apply(id, keys, gp, Ctx(step)).ok());
    ASSERT_TRUE(lane->WriteBack(/*wait=*/lane->dirty_bytes() > reserve, /*flush_soon=*/false).ok());
    most = std::max(most, lane->stats().bytes_in_memory);
  }
  ASSERT_TRUE(lane->Commit().ok());
  EXPECT_GT(lane->stats().budget_evictions, 0u);
  // One step's rows (512 x 96 bytes) may be pinned beyond the rows' share until handed off, and
  // the index's real bytes a row run a little over the 8 charged for it.
  EXPECT_LE(most, o.memory_budget_bytes - reserve + 512 * 96 + o.memory_budget_bytes / 50)
      << "reserve " << reserve;
  EXPECT_GT(most, (o.memory_budget_bytes - reserve) / 2);
}

TEST(RocksDbEngineTest, TableTenTimesTheBudgetTrainsLikeAnUnboundedOne) {
  TempDir dir;
  constexpr uint32_t kDim = 8;
  constexpr uint64_t kUniverse = 60000;
  const auto spec = BigTable(kDim);
  const uint64_t id = TableIdForName(spec.name);
  // A row costs 24 + 64 bytes of slot + 8 of index: ~96 bytes; the table over 4.8 MB.
  StorageOptions o;
  o.memory_budget_bytes = 480000;
  auto engine = MustOpen(dir.path(), o);
  auto lane = MustLane(engine.get());
  ASSERT_TRUE(lane->AddTable(id, spec).ok());
  auto mem = NewMemoryStorageEngine();
  auto ref = MustLane(mem.get());
  ASSERT_TRUE(ref->AddTable(id, spec).ok());

  Train(lane.get(), id, kDim, kUniverse, 150, 1024, 1, 5);
  Train(ref.get(), id, kDim, kUniverse, 150, 1024, 1, 5);

  const StoreStats st = lane->stats();
  EXPECT_GT(st.budget_evictions, 0u);
  EXPECT_GT(st.disk_reads, 0u);
  EXPECT_LE(st.bytes_in_memory, o.memory_budget_bytes * 13 / 10) << st.rows_in_memory;
  const auto got = Dump(lane.get(), id, kDim, kDim);
  const auto want = Dump(ref.get(), id, kDim, kDim);
  EXPECT_GE(got.size() * 96, 10 * o.memory_budget_bytes) << "table rows: " << got.size();
  ASSERT_EQ(got.size(), want.size());
  EXPECT_TRUE(got == want);
  // Lookups agree too, in memory or not.
  std::vector<uint64_t> keys;
  for (uint64_t k = 0; k < kUniverse; k += 7) keys.push_back(k * 0x9e3779b97f4a7c15ULL);
  std::vector<float> a(keys.size() * kDim), b(keys.size() * kDim);
  std::vector<float*> pa, pb;
  for (size_t i = 0; i < keys.size(); ++i) {
    pa.push_back(&a[i * kDim]);
    pb.push_back(&b[i * kDim]);
  }
  ASSERT_TRUE(lane->Lookup(id, keys, pa).ok());
  ASSERT_TRUE(ref->Lookup(id, keys, pb).ok());
  EXPECT_EQ(a, b);
}

TEST(RocksDbEngineTest, MemoryPerRowWithinOneAndAHalfTimesTheRawBytes) {
  TempDir dir;
  auto engine = MustOpen(dir.path());
  auto lane = MustLane(engine.get());
  const uint64_t id = TableIdForName("m");
  ASSERT_TRUE(lane->AddTable(id, TableSpec::Sparse("m", 16, {OptimizerKind::kAdagrad})).ok());
  std::vector<float> g(16, 0.1f);
  std::vector<uint64_t> keys(10000);
  std::vector<const float*> gp(keys.size(), g.data());
  for (uint64_t b = 0; b < 20; ++b) {
    for (size_t i = 0; i < keys.size(); ++i) keys[i] = Mix64(b * keys.size() + i);
    ASSERT_TRUE(lane->Apply(id, keys, gp, Ctx(b)).ok());
    ASSERT_TRUE(lane->Commit().ok());
  }
  const StoreStats st = lane->stats();
  ASSERT_EQ(st.rows_in_memory, 200000u);
  const double raw = (16 + 16) * sizeof(float);
  const double per_row = static_cast<double>(st.bytes_in_memory) / st.rows_in_memory;
  EXPECT_LE(per_row, 1.5 * raw) << per_row << " bytes per row";
}

TEST(RocksDbEngineTest, LanesOwnTheirSlotsAndAnyLaneCountReadsThemBack) {
  TempDir dir;
  const auto spec = TableSpec::Sparse("t", 1, {OptimizerKind::kSgd, 1.0f});
  const uint64_t id = TableIdForName("t");
  std::vector<uint64_t> all;
  {
    auto engine = MustOpen(dir.path());
    std::vector<std::unique_ptr<LaneStore>> lanes;
    for (uint32_t l = 0; l < 3; ++l) {
      lanes.push_back(MustLane(engine.get(), l, 3));
      ASSERT_TRUE(lanes.back()->AddTable(id, spec).ok());
    }
    EXPECT_EQ(engine->OpenLane(1, 3).status().code(), StatusCode::kAlreadyExists);
    const float g = 1;
    const float* gp[] = {&g};
    for (uint64_t k = 1; k <= 300; ++k) {
      auto& lane = lanes[LaneOfSlot(SlotOfKey(k), 3)];
      ASSERT_TRUE(lane->Apply(id, std::span<const uint64_t>(&k, 1), gp, Ctx(k)).ok());
      all.push_back(k);
    }
    size_t total = 0;
    for (uint32_t l = 0; l < 3; ++l) {
      ASSERT_TRUE(lanes[l]->Commit().ok());
      auto rows = Dump(lanes[l].get(), id, 1, 0);
      for (auto& [k, r] : rows) EXPECT_EQ(LaneOfSlot(SlotOfKey(k), 3), l) << k;
      total += rows.size();
    }
    EXPECT_EQ(total, 300u);
  }
  auto engine = MustOpen(dir.path());
  auto lane = MustLane(engine.get(), 0, 1);
  ASSERT_TRUE(lane->AddTable(id, spec).ok());
  auto rows = Dump(lane.get(), id, 1, 0);
  ASSERT_EQ(rows.size(), 300u);
  for (auto& [k, r] : rows) EXPECT_EQ(r.value[0], -1.0f);
}

TEST(RocksDbEngineTest, ChangedLayoutIsRefused) {
  TempDir dir;
  const uint64_t id = TableIdForName("t");
  {
    auto engine = MustOpen(dir.path());
    auto lane = MustLane(engine.get());
    ASSERT_TRUE(lane->AddTable(id, TableSpec::Sparse("t", 4)).ok());
  }
  auto engine = MustOpen(dir.path());
  auto lane = MustLane(engine.get());
  Status s = lane->AddTable(id, TableSpec::Sparse("t", 8));
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  EXPECT_NE(s.message().find("dim=4"), std::string::npos) << s.ToString();
  s = lane->AddTable(id, TableSpec::Sparse("t", 4, {OptimizerKind::kAdam}));
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
}

TEST(RocksDbEngineTest, CheckpointOpensAsADataDir) {
  TempDir dir;
  const auto spec = TableSpec::Sparse("t", 2, {OptimizerKind::kSgd, 1.0f});
  const uint64_t id = TableIdForName("t");
  auto engine = MustOpen(dir.Sub("db"));
  auto lane = MustLane(engine.get());
  ASSERT_TRUE(lane->AddTable(id, spec).ok());
  Train(lane.get(), id, 2, 1000, 5, 100, 1, 1);
  const auto at_checkpoint = Dump(lane.get(), id, 2, 0);
  ASSERT_TRUE(engine->CreateCheckpoint(dir.Sub("cp")).ok());
  EXPECT_FALSE(engine->CreateCheckpoint(dir.Sub("cp")).ok()) << "an existing dir is refused";
  Train(lane.get(), id, 2, 1000, 5, 100, 6, 2);
  auto cp = MustOpen(dir.Sub("cp"));
  auto cp_lane = MustLane(cp.get());
  ASSERT_TRUE(cp_lane->AddTable(id, spec).ok());
  EXPECT_TRUE(Dump(cp_lane.get(), id, 2, 0) == at_checkpoint);
  EXPECT_FALSE(Dump(lane.get(), id, 2, 0) == at_checkpoint);
}

TEST(RocksDbEngineTest, UnusableDirectoryIsAnIOError) {
  TempDir dir;
  std::ofstream(dir.Sub("file")) << "not a directory";
  StorageOptions o;
  o.data_dir = dir.Sub("file/db");
  auto r = OpenStorageEngine(o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kIOError) << r.status().ToString();
  EXPECT_NE(r.status().message().find(o.data_dir), std::string::npos) << r.status().ToString();
  o.data_dir = dir.path();
  o.rocksdb_table_options = "no_such_option=1";
  EXPECT_EQ(OpenStorageEngine(o).status().code(), StatusCode::kInvalidArgument);
}

TEST(RocksDbEngineTest, CorruptTableFileIsReportedNeverServed) {
  TempDir dir;
  const auto spec = TableSpec::Sparse("t", 8, {OptimizerKind::kSgd, 1.0f});
  const uint64_t id = TableIdForName("t");
  std::vector<uint64_t> keys;
  for (uint64_t k = 0; k < 5000; ++k) keys.push_back(k);
  {
    auto engine = MustOpen(dir.path());
    auto lane = MustLane(engine.get());
    ASSERT_TRUE(lane->AddTable(id, spec).ok());
    std::vector<float> g(8, 1.0f);
    std::vector<const float*> gp(keys.size(), g.data());
    ASSERT_TRUE(lane->Apply(id, keys, gp, Ctx(1)).ok());
    ASSERT_TRUE(lane->Commit().ok());
    lane.reset();
    ASSERT_TRUE(internal::FlushMemtablesForTest(engine.get()).ok());
  }
  int corrupted = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    if (e.path().extension() != ".sst" || e.file_size() < 100000) continue;
    std::fstream f(e.path(), std::ios::in | std::ios::out | std::ios::binary);
    for (uint64_t off = e.file_size() / 10; off < e.file_size() * 7 / 10; off += 4096) {
      f.seekp(static_cast<std::streamoff>(off));
      f.write("\xde\xad\xbe\xef\xde\xad\xbe\xef", 8);
    }
    ++corrupted;
  }
  ASSERT_GT(corrupted, 0);
  StorageOptions o;
  o.data_dir = dir.path();
  auto engine = OpenStorageEngine(o);
  if (!engine.ok()) {
    EXPECT_EQ(engine.status().code(), StatusCode::kCorruption) << engine.status().ToString();
    return;
  }
  auto lane = MustLane(engine->get());
  ASSERT_TRUE(lane->AddTable(id, spec).ok());
  std::vector<float> out(keys.size() * 8);
  std::vector<float*> po;
  for (size_t i = 0; i < keys.size(); ++i) po.push_back(&out[i * 8]);
  Status s = lane->Lookup(id, keys, po);
  EXPECT_EQ(s.code(), StatusCode::kCorruption) << s.ToString();
  // A push touching damaged rows is refused as a whole.
  std::vector<float> g(8, 1.0f);
  std::vector<const float*> gp(keys.size(), g.data());
  EXPECT_EQ(lane->Apply(id, keys, gp, Ctx(2)).code(), StatusCode::kCorruption);
}

// A file system whose writes fail with "no space" while `full` is set.
class FullDiskFs : public rocksdb::FileSystemWrapper {
 public:
  explicit FullDiskFs(const std::shared_ptr<rocksdb::FileSystem>& base) : FileSystemWrapper(base) {}
  static const char* kClassName() { return "FullDiskFs"; }
  const char* Name() const override { return kClassName(); }

  rocksdb::IOStatus NewWritableFile(const std::string& f, const rocksdb::FileOptions& o,
                                    std::unique_ptr<rocksdb::FSWritableFile>* r,
                                    rocksdb::IODebugContext* dbg) override {
    if (full) return rocksdb::IOStatus::NoSpace("injected: disk full");
    std::unique_ptr<rocksdb::FSWritableFile> file;
    auto s = target()->NewWritableFile(f, o, &file, dbg);
    if (s.ok()) r->reset(new File(std::move(file), this));
    return s;
  }

  std::atomic<bool> full{false};

 private:
  class File : public rocksdb::FSWritableFileOwnerWrapper {
   public:
    File(std::unique_ptr<rocksdb::FSWritableFile>&& f, FullDiskFs* fs)
        : FSWritableFileOwnerWrapper(std::move(f)), fs_(fs) {}
    rocksdb::IOStatus Append(const rocksdb::Slice& data, const rocksdb::IOOptions& o,
                             rocksdb::IODebugContext* dbg) override {
      if (fs_->full) return rocksdb::IOStatus::NoSpace("injected: disk full");
      return target()->Append(data, o, dbg);
    }
    rocksdb::IOStatus Append(const rocksdb::Slice& data, const rocksdb::IOOptions& o,
                             const rocksdb::DataVerificationInfo& v,
                             rocksdb::IODebugContext* dbg) override {
      if (fs_->full) return rocksdb::IOStatus::NoSpace("injected: disk full");
      return target()->Append(data, o, v, dbg);
    }

   private:
    FullDiskFs* fs_;
  };
};

TEST(RocksDbEngineTest, FullDiskFailsTheCommitLosesNothingAndResumesWhenSpaceIsBack) {
  TempDir dir;
  const auto spec = TableSpec::Sparse("t", 2, {OptimizerKind::kSgd, 1.0f});
  const uint64_t id = TableIdForName("t");
  std::vector<uint64_t> keys = {1, 2, 3, 4, 5};
  std::vector<float> g(2, 1.0f);
  std::vector<const float*> gp(keys.size(), g.data());
  std::vector<float> out(keys.size() * 2);
  std::vector<float*> po;
  for (size_t i = 0; i < keys.size(); ++i) po.push_back(&out[i * 2]);
  {
    auto fs = std::make_shared<FullDiskFs>(rocksdb::FileSystem::Default());
    auto env = rocksdb::NewCompositeEnv(fs);
    StorageOptions o;
    o.data_dir = dir.path();
    internal::RocksDbHooks hooks;
    hooks.env = env.get();
    auto engine = internal::OpenRocksDbStorageEngine(o, hooks);
    ASSERT_TRUE(engine.ok()) << engine.status().ToString();
    auto lane = MustLane(engine->get());
    ASSERT_TRUE(lane->AddTable(id, spec).ok());
    ASSERT_TRUE(lane->Apply(id, keys, gp, Ctx(1)).ok());
    ASSERT_TRUE(lane->Commit().ok());
    fs->full = true;
    ASSERT_TRUE(lane->Apply(id, keys, gp, Ctx(2)).ok());
    Status s = lane->Commit();
    EXPECT_EQ(s.code(), StatusCode::kIOError) << s.ToString();
    EXPECT_FALSE(lane->Commit().ok());  // again: still full
    // The rows stay in memory, pinned (a server's request log holds their pushes): served as
    // they are, never dropped.
    ASSERT_TRUE(lane->Lookup(id, keys, po).ok());
    EXPECT_EQ(out, std::vector<float>(10, -2.0f));
    EXPECT_GT(lane->dirty_bytes(), 0u);
    EXPECT_EQ((*engine)->PutMeta("k", "v").code(), StatusCode::kIOError);
    // Space is back: a later write-back, once RocksDB has recovered, writes them.
    fs->full = false;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!(s = lane->Commit()).ok() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    EXPECT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(lane->dirty_bytes(), 0u);
    lane.reset();
    engine->reset();
  }
  auto engine = MustOpen(dir.path());
  auto lane = MustLane(engine.get());
  ASSERT_TRUE(lane->AddTable(id, spec).ok());
  ASSERT_TRUE(lane->Lookup(id, keys, po).ok());
  EXPECT_EQ(out, std::vector<float>(10, -2.0f));
}

// ---------------------------------------------------------------------------- kill -9
struct Ack {
  uint64_t batch;
  long long ms;
};

long long MonotonicMs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<long long>(ts.tv_sec) * 1000 + ts.tv_nsec / 1000000;
}

// Runs the crash helper from `first`, kills it with SIGKILL after `run_ms`, returns its acks.
std::vector<Ack> RunAndKill(const std::string& dir, const std::string& mode, uint32_t window_ms,
                            uint64_t first, int run_ms, long long* kill_ms) {
  int fds[2];
  EXPECT_EQ(pipe(fds), 0);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 1);
  posix_spawn_file_actions_addclose(&actions, fds[0]);
  const std::string window = std::to_string(window_ms), start = std::to_string(first);
  const char* argv[] = {TESSERA_STORAGE_CRASH_HELPER,
                        dir.c_str(),
                        mode.c_str(),
                        window.c_str(),
                        start.c_str(),
                        nullptr};
  pid_t pid;
  EXPECT_EQ(posix_spawn(&pid, TESSERA_STORAGE_CRASH_HELPER, &actions, nullptr,
                        const_cast<char* const*>(argv), environ),
            0);
  posix_spawn_file_actions_destroy(&actions);
  close(fds[1]);
  std::string text;
  char buf[4096];
  // The kill comes `run_ms` after the first acknowledgement (recovery at start-up takes a while),
  // or after 30 s without one.
  long long deadline = MonotonicMs() + 30000;
  bool started = false, killed = false;
  for (;;) {
    if (!started && !text.empty()) {
      started = true;
      deadline = MonotonicMs() + run_ms;
    }
    const long long now = MonotonicMs();
    if (!killed && now >= deadline) {
      *kill_ms = MonotonicMs();
      kill(pid, SIGKILL);
      killed = true;
    }
    pollfd p{fds[0], POLLIN, 0};
    poll(&p, 1, killed ? 1000 : static_cast<int>(std::max<long long>(1, deadline - now)));
    if ((p.revents & (POLLIN | POLLHUP)) == 0) continue;
    const ssize_t n = read(fds[0], buf, sizeof(buf));
    if (n <= 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  close(fds[0]);
  int wstatus = 0;
  waitpid(pid, &wstatus, 0);
  EXPECT_TRUE(WIFSIGNALED(wstatus) && WTERMSIG(wstatus) == SIGKILL)
      << "helper exited on its own: " << wstatus;
  std::vector<Ack> acks;
  std::istringstream in(text);
  std::string tag;
  Ack a;
  while (in >> tag >> a.batch >> a.ms) acks.push_back(a);
  return acks;
}

// The batch B such that the table holds exactly batches [0, B] (B = -1: none); fails the test
// when the table matches no prefix of whole batches.
int64_t RecoveredPrefix(const std::string& dir, int64_t lower, int64_t upper) {
  constexpr uint64_t kStride = 50, kKeys = 200;  // as storage_crash_helper.cc
  auto engine = MustOpen(dir);
  auto lane = MustLane(engine.get());
  const auto spec = TableSpec::Sparse("crash", 4, {OptimizerKind::kSgd, 1.0f});
  const uint64_t id = TableIdForName("crash");
  EXPECT_TRUE(lane->AddTable(id, spec).ok());
  const uint64_t universe = static_cast<uint64_t>(upper + 2) * kStride + kKeys;
  std::vector<uint64_t> keys(universe);
  for (uint64_t k = 0; k < universe; ++k) keys[k] = k;
  std::vector<float> out(universe * 4);
  std::vector<float*> po;
  for (uint64_t k = 0; k < universe; ++k) po.push_back(&out[k * 4]);
  Status s = lane->Lookup(id, keys, po);
  EXPECT_TRUE(s.ok()) << s.ToString();
  for (int64_t b = lower; b <= upper + 1; ++b) {
    // Expected value of key k after batches [0, b]: -sum of (c + 1) over batches c covering k.
    bool match = true;
    for (uint64_t k = 0; k < universe && match; ++k) {
      double want = 0;
      const int64_t c_first = k < kKeys ? 0 : static_cast<int64_t>((k - kKeys) / kStride + 1);
      const int64_t c_last = std::min<int64_t>(b, static_cast<int64_t>(k / kStride));
      for (int64_t c = c_first; c <= c_last; ++c) want -= static_cast<double>(c + 1);
      for (int j = 0; j < 4; ++j) match = match && out[k * 4 + j] == static_cast<float>(want);
    }
    if (match) return b;
  }
  int64_t actual = -2;
  for (int64_t b = -1; b < lower && actual == -2; ++b) {
    bool match = true;
    for (uint64_t k = 0; k < universe && match; ++k) {
      double want = 0;
      const int64_t c_first = k < kKeys ? 0 : static_cast<int64_t>((k - kKeys) / kStride + 1);
      const int64_t c_last = std::min<int64_t>(b, static_cast<int64_t>(k / kStride));
      for (int64_t c = c_first; c <= c_last; ++c) want -= static_cast<double>(c + 1);
      for (int j = 0; j < 4; ++j) match = match && out[k * 4 + j] == static_cast<float>(want);
    }
    if (match) actual = b;
  }
  ADD_FAILURE() << "the recovered table is no prefix of whole batches in [" << lower << ", "
                << upper + 1 << "]; it holds batches [0, " << actual << "] (-2: no prefix)";
  return lower;
}

TEST(RocksDbEngineTest, StrictModeLosesNoAcknowledgedPushOnKill9) {
  TempDir dir;
  std::mt19937 rng(11);
  int64_t recovered = -1;
  for (int round = 0; round < 3; ++round) {
    long long kill_ms = 0;
    auto acks = RunAndKill(dir.path(), "strict", 100, static_cast<uint64_t>(recovered + 1),
                           20 + static_cast<int>(rng() % 300), &kill_ms);
    ASSERT_FALSE(acks.empty()) << "round " << round << ": the helper acknowledged nothing";
    const int64_t last_ack = static_cast<int64_t>(acks.back().batch);
    // Every acknowledged batch is there; at most the one in flight besides, and whole.
    recovered = RecoveredPrefix(dir.path(), last_ack, last_ack);
    EXPECT_GE(recovered, last_ack) << "round " << round;
  }
}

TEST(RocksDbEngineTest, RelaxedModeLosesAtMostTheWindowOnKill9) {
  TempDir dir;
  constexpr uint32_t kWindowMs = 50;
  std::mt19937 rng(12);
  int64_t recovered = -1;
  for (int round = 0; round < 3; ++round) {
    long long kill_ms = 0;
    auto acks = RunAndKill(dir.path(), "relaxed", kWindowMs, static_cast<uint64_t>(recovered + 1),
                           20 + static_cast<int>(rng() % 300), &kill_ms);
    ASSERT_FALSE(acks.empty());
    // Acknowledged more than the window (plus scheduling slack: the flusher is a thread like
    // any other, and CI machines run tests side by side) before the kill: durable.
    constexpr long long kSlackMs = 500;
    int64_t must_have = recovered;
    for (const Ack& a : acks) {
      if (a.ms + kWindowMs + kSlackMs < kill_ms) must_have = static_cast<int64_t>(a.batch);
    }
    recovered = RecoveredPrefix(dir.path(), std::max<int64_t>(must_have, recovered),
                                static_cast<int64_t>(acks.back().batch));
    EXPECT_GE(recovered, must_have) << "round " << round;
  }
}

}  // namespace
}  // namespace tessera
