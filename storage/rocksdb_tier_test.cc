// The RocksDB engine's memory tier under skew: admission by frequency keeps the hot rows in
// memory through scans of cold keys (lookups and pushes), and rows it refuses lose nothing.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <thread>
#include <vector>

#include "ps/routing.h"
#include "storage/storage.h"
#include "storage/test_util_internal.h"

namespace tessera {
namespace {

using internal::MustLane;
using internal::MustOpen;
using internal::TempDir;

constexpr uint32_t kDim = 8;
// A row costs 24 + 64 bytes of slot + 8 of index = 96 bytes; of this budget the rows get
// three quarters (the rest is the write-back reserve): 3750 rows.
constexpr uint64_t kBudget = 480000;
constexpr uint64_t kHot = 2000;

TableSpec Spec() {
  return TableSpec::Sparse("tier", kDim, {OptimizerKind::kAdagrad, 0.05f},
                           {InitializerKind::kUniform, -0.1f, 0.1f, 9});
}
// Each row of a table: value, optimizer state and update count, by key.
using Rows = std::map<uint64_t, std::vector<float>>;
Rows AllRows(LaneStore& lane, uint64_t table) {
  Rows rows;
  Status s = lane.Scan(table, [&rows](uint64_t k, const float* v, const float* st,
                                      const RowMeta& meta) {
    std::vector<float>& r = rows[k];
    r.assign(v, v + kDim);
    r.insert(r.end(), st, st + kDim);
    r.push_back(static_cast<float>(meta.update_count));
    return true;
  });
  EXPECT_TRUE(s.ok()) << s.ToString();
  return rows;
}

ApplyContext Ctx(uint64_t step) { return {step, static_cast<uint32_t>(1000 + step)}; }
uint64_t HotKey(uint64_t i) { return Mix64(i); }
uint64_t ColdKey(uint64_t i) { return Mix64(i + (uint64_t{1} << 40)); }

struct Batch {
  std::vector<uint64_t> keys;
  std::vector<float> values;
  std::vector<float*> out;
  std::vector<const float*> grads;
  explicit Batch(std::vector<uint64_t> k) : keys(std::move(k)), values(keys.size() * kDim) {
    for (size_t i = 0; i < keys.size(); ++i) {
      // A gradient that differs by key, so that a row applied to the wrong key shows.
      for (uint32_t j = 0; j < kDim; ++j) values[i * kDim + j] = 0.001f * ((keys[i] >> j) % 7);
      out.push_back(&values[i * kDim]);
      grads.push_back(&values[i * kDim]);
    }
  }
};

std::vector<uint64_t> Range(uint64_t (*key)(uint64_t), uint64_t from, uint64_t n) {
  std::vector<uint64_t> keys;
  for (uint64_t i = from; i < from + n; ++i) keys.push_back(key(i));
  return keys;
}

uint64_t DiskReads(LaneStore& lane) { return lane.stats().disk_reads; }

// Lookups of the hot rows between lookups of cold keys seen once (a scan 20x the memory tier):
// afterwards the hot rows are still in memory (reading them reads nothing from disk), the cold
// rows were refused, and every value read equals a memory-only engine's.
TEST(RocksDbTierTest, ScanOfColdKeysLeavesTheHotRowsInMemory) {
  TempDir dir;
  StorageOptions o;
  o.memory_budget_bytes = kBudget;
  auto engine = MustOpen(dir.path(), o);
  auto lane = MustLane(engine.get());
  const uint64_t id = TableIdForName("tier");
  ASSERT_TRUE(lane->AddTable(id, Spec()).ok());
  auto mem = NewMemoryStorageEngine();
  auto ref = MustLane(mem.get());
  ASSERT_TRUE(ref->AddTable(id, Spec()).ok());
  // Every row on disk first: the hot ones and 80,000 cold ones, pushed once.
  for (uint64_t first = 0; first < 80000; first += 4000) {
    Batch b(Range(ColdKey, first, 4000));
    ASSERT_TRUE(lane->Apply(id, b.keys, b.grads, Ctx(1)).ok());
    ASSERT_TRUE(ref->Apply(id, b.keys, b.grads, Ctx(1)).ok());
    ASSERT_TRUE(lane->Commit().ok());
  }
  Batch hot(Range(HotKey, 0, kHot));
  for (int n = 0; n < 3; ++n) {
    ASSERT_TRUE(lane->Apply(id, hot.keys, hot.grads, Ctx(2 + n)).ok());
    ASSERT_TRUE(ref->Apply(id, hot.keys, hot.grads, Ctx(2 + n)).ok());
    ASSERT_TRUE(lane->Commit().ok());
  }
  Batch hot_read(hot.keys), hot_want(hot.keys);
  for (int n = 0; n < 3; ++n) ASSERT_TRUE(lane->Lookup(id, hot_read.keys, hot_read.out).ok());
  // The scan, with the hot rows read between its batches as training goes on.
  uint64_t hot_disk_reads = 0;
  for (uint64_t first = 0; first < 80000; first += 2000) {
    Batch scan(Range(ColdKey, first, 2000)), scan_want(scan.keys);
    ASSERT_TRUE(lane->Lookup(id, scan.keys, scan.out).ok());
    ASSERT_TRUE(ref->Lookup(id, scan_want.keys, scan_want.out).ok());
    ASSERT_EQ(scan.values, scan_want.values) << "cold rows from " << first;
    const uint64_t before = DiskReads(*lane);
    ASSERT_TRUE(lane->Lookup(id, hot_read.keys, hot_read.out).ok());
    hot_disk_reads += DiskReads(*lane) - before;
  }
  ASSERT_TRUE(ref->Lookup(id, hot_want.keys, hot_want.out).ok());
  EXPECT_EQ(hot_read.values, hot_want.values);
  // A few hot rows may share all four counters with cold keys; none of it is a flush.
  EXPECT_LE(hot_disk_reads, kHot / 50) << "hot rows read back from disk during the scan";
  EXPECT_GT(lane->stats().admission_rejects, 70000u);
  EXPECT_GE(lane->stats().rows_in_memory, kHot);
}

// Pushes of cold keys seen once, between pushes of the hot rows, written back as a server lane
// does: the hot rows stay in memory, each refused row is written and then the first to go, and
// every row (in memory, refused, or read after reopening) equals a memory-only engine's.
TEST(RocksDbTierTest, PushesOfColdKeysAreWrittenBackWithoutFlushingTheHotRows) {
  TempDir dir;
  StorageOptions o;
  o.memory_budget_bytes = kBudget;
  const uint64_t id = TableIdForName("tier");
  auto mem = NewMemoryStorageEngine();
  auto ref = MustLane(mem.get());
  ASSERT_TRUE(ref->AddTable(id, Spec()).ok());
  Batch hot(Range(HotKey, 0, kHot));
  uint64_t hot_disk_reads = 0;
  {
    auto engine = MustOpen(dir.path(), o);
    auto lane = MustLane(engine.get());
    ASSERT_TRUE(lane->AddTable(id, Spec()).ok());
    uint64_t step = 1;
    for (int n = 0; n < 4; ++n, ++step) {
      ASSERT_TRUE(lane->Apply(id, hot.keys, hot.grads, Ctx(step)).ok());
      ASSERT_TRUE(ref->Apply(id, hot.keys, hot.grads, Ctx(step)).ok());
      ASSERT_TRUE(lane->WriteBack(/*wait=*/true, /*flush_soon=*/false).ok());
    }
    for (uint64_t first = 0; first < 60000; first += 1500, ++step) {
      Batch cold(Range(ColdKey, first, 1500));
      ASSERT_TRUE(lane->Apply(id, cold.keys, cold.grads, Ctx(step)).ok());
      ASSERT_TRUE(ref->Apply(id, cold.keys, cold.grads, Ctx(step)).ok());
      const uint64_t before = DiskReads(*lane);
      ASSERT_TRUE(lane->Apply(id, hot.keys, hot.grads, Ctx(step)).ok());
      ASSERT_TRUE(ref->Apply(id, hot.keys, hot.grads, Ctx(step)).ok());
      hot_disk_reads += DiskReads(*lane) - before;
      ASSERT_TRUE(lane->Commit().ok());
    }
    ASSERT_TRUE(lane->Commit().ok());
    // Each cold push needs a slot until it is durable: a few take a hot row's place (when the
    // rows CLOCK offers are all hot), under 2% of the hot pushes here; without admission 30%.
    const uint64_t hot_pushes = kHot * (60000 / 1500);
    EXPECT_LE(hot_disk_reads, hot_pushes / 20) << "hot rows read back from disk during the pushes";
    // Refused unless seen more often than the victim (a cold row of an earlier period, or a
    // hot row: the scan's rows compete with each other, not with the hot set).
    EXPECT_GT(lane->stats().admission_rejects, 60000u / 4);
    EXPECT_LE(lane->stats().bytes_in_memory, kBudget * 13 / 10);
  }
  // Reopened: every row as the memory engine has it (the refused rows were written back).
  auto engine = MustOpen(dir.path(), o);
  auto lane = MustLane(engine.get());
  ASSERT_TRUE(lane->AddTable(id, Spec()).ok());
  const Rows got = AllRows(*lane, id), want = AllRows(*ref, id);
  EXPECT_EQ(got.size(), 60000u + kHot);
  EXPECT_TRUE(got == want);
}

// Rows written back wait in RocksDB's memtables for a flush (StorageOptions::
// row_flush_interval_ms): evicted meanwhile, they are read back from there with their optimizer
// state (pushed again, nothing is lost or reset); the durable mark stays behind until a flush,
// which Commit() forces (also when nothing is dirty) and the writer makes by itself once the
// interval is over; reopened, every row is there.
TEST(RocksDbTierTest, RowsWrittenBackAreServedFromTheMemtablesUntilFlushed) {
  TempDir dir;
  StorageOptions o;
  o.memory_budget_bytes = kBudget;
  o.row_flush_interval_ms = 3600 * 1000;  // no flush by time in this part
  const uint64_t id = TableIdForName("tier");
  auto mem = NewMemoryStorageEngine();
  auto ref = MustLane(mem.get());
  ASSERT_TRUE(ref->AddTable(id, Spec()).ok());
  constexpr uint64_t kRows = 20000;  // 5x what the budget holds
  uint64_t step = 1;
  {
    auto engine = MustOpen(dir.path(), o);
    auto lane = MustLane(engine.get());
    ASSERT_TRUE(lane->AddTable(id, Spec()).ok());
    // Every row pushed twice, written back after each push of 1000 rows: the second push of a
    // row reads it back (evicted since) from the memtables.
    for (int pass = 0; pass < 2; ++pass) {
      for (uint64_t first = 0; first < kRows; first += 1000, ++step) {
        Batch b(Range(ColdKey, first, 1000));
        ASSERT_TRUE(lane->Apply(id, b.keys, b.grads, Ctx(step)).ok());
        ASSERT_TRUE(ref->Apply(id, b.keys, b.grads, Ctx(step)).ok());
        lane->SetAppliedSeq(step);
        ASSERT_TRUE(lane->WriteBack(/*wait=*/true, /*flush_soon=*/false).ok());
      }
    }
    // The last hand-off reaped.
    ASSERT_TRUE(lane->WriteBack(/*wait=*/true, /*flush_soon=*/false).ok());
    EXPECT_EQ(lane->dirty_bytes(), 0u);
    EXPECT_GT(lane->stats().disk_reads, kRows / 2) << "the second pass read rows back";
    EXPECT_EQ(lane->committed_seq(), 0u) << "durable before any flush";
    Batch got(Range(ColdKey, 0, kRows)), want(Range(ColdKey, 0, kRows));
    ASSERT_TRUE(lane->Lookup(id, got.keys, got.out).ok());
    ASSERT_TRUE(ref->Lookup(id, want.keys, want.out).ok());
    EXPECT_TRUE(got.values == want.values);
    // Nothing dirty, every mark written: Commit still flushes.
    ASSERT_TRUE(lane->Commit().ok());
    EXPECT_EQ(lane->committed_seq(), step - 1);
  }
  {
    o.row_flush_interval_ms = 50;
    auto engine = MustOpen(dir.path(), o);
    auto lane = MustLane(engine.get());
    ASSERT_TRUE(lane->AddTable(id, Spec()).ok());
    EXPECT_EQ(lane->committed_seq(), step - 1);
    Batch b(Range(ColdKey, 0, 1000));
    ASSERT_TRUE(lane->Apply(id, b.keys, b.grads, Ctx(step)).ok());
    ASSERT_TRUE(ref->Apply(id, b.keys, b.grads, Ctx(step)).ok());
    lane->SetAppliedSeq(step);
    ASSERT_TRUE(lane->WriteBack(/*wait=*/true, /*flush_soon=*/false).ok());
    ASSERT_TRUE(lane->WriteBack(/*wait=*/true, /*flush_soon=*/false).ok());
    // The writer flushes by itself an interval after the write (generous bound for a loaded
    // machine; no Commit here).
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (lane->committed_seq() != step && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_EQ(lane->committed_seq(), step);
  }
  auto engine = MustOpen(dir.path(), o);
  auto lane = MustLane(engine.get());
  ASSERT_TRUE(lane->AddTable(id, Spec()).ok());
  const Rows got = AllRows(*lane, id), want = AllRows(*ref, id);
  EXPECT_EQ(got.size(), kRows);
  EXPECT_TRUE(got == want);
}

// A periodic hand-off (flush_soon, the server's interval) is durable once written: the writer
// flushes right after it. One forced by the dirty bound waits in the memtables for the row
// flush interval (or the next periodic one), so that such hand-offs make fewer, larger files.
TEST(RocksDbTierTest, APeriodicHandOffIsFlushedOnceWrittenAForcedOneWaits) {
  TempDir dir;
  StorageOptions o;
  o.row_flush_interval_ms = 3600 * 1000;  // no flush by time
  const uint64_t id = TableIdForName("tier");
  auto engine = MustOpen(dir.path(), o);
  auto lane = MustLane(engine.get());
  ASSERT_TRUE(lane->AddTable(id, Spec()).ok());
  uint64_t step = 1;
  auto push = [&](bool flush_soon) {
    Batch b(Range(ColdKey, 0, 1000));
    ASSERT_TRUE(lane->Apply(id, b.keys, b.grads, Ctx(step)).ok());
    lane->SetAppliedSeq(step++);
    ASSERT_TRUE(lane->WriteBack(/*wait=*/true, flush_soon).ok());
    // Reaps the hand-off (waits for the writer): nothing is dirty, nothing more goes out.
    ASSERT_TRUE(lane->WriteBack(/*wait=*/true, /*flush_soon=*/false).ok());
    ASSERT_EQ(lane->dirty_bytes(), 0u);
  };
  push(/*flush_soon=*/false);
  push(/*flush_soon=*/false);
  EXPECT_EQ(lane->committed_seq(), 0u) << "forced hand-offs wait for a flush";
  push(/*flush_soon=*/true);
  EXPECT_EQ(lane->committed_seq(), 3u) << "the periodic hand-off was flushed with the two before";
  push(/*flush_soon=*/false);
  EXPECT_EQ(lane->committed_seq(), 3u);
}

}  // namespace
}  // namespace tessera
