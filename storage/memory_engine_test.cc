// LaneStore conformance: the same behaviour from the memory engine and the RocksDB engine (with
// an unbounded memory tier, and with one so small that nearly every row is read back from disk).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <set>
#include <thread>
#include <vector>

#include "ps/initializer.h"
#include "ps/routing.h"
#include "storage/row_table_internal.h"
#include "storage/storage.h"
#include "storage/test_util_internal.h"

namespace tessera {
namespace {

using internal::TempDir;

enum class EngineKind { kMemory, kRocksDb, kRocksDbTinyBudget };

class StoreConformanceTest : public ::testing::TestWithParam<EngineKind> {
 protected:
  void SetUp() override {
    StorageOptions o;
    if (GetParam() == EngineKind::kMemory) {
      engine_ = NewMemoryStorageEngine();
    } else {
      o.data_dir = dir_.Sub("db");
      // About a dozen rows of dim 4: nearly every access misses the memory tier.
      if (GetParam() == EngineKind::kRocksDbTinyBudget) o.memory_budget_bytes = 1024;
      auto r = OpenStorageEngine(o);
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      engine_ = std::move(r).value();
    }
    auto lane = engine_->OpenLane(0, 1);
    ASSERT_TRUE(lane.ok()) << lane.status().ToString();
    lane_ = std::move(lane).value();
  }
  void TearDown() override {
    lane_.reset();
    engine_.reset();
  }

  uint64_t AddSparse(TableSpec spec) {
    const uint64_t id = TableIdForName(spec.name);
    EXPECT_TRUE(lane_->AddTable(id, spec).ok());
    return id;
  }
  std::vector<float> Lookup1(uint64_t id, uint64_t key, uint32_t dim) {
    std::vector<float> v(dim);
    float* out[] = {v.data()};
    Status s = lane_->Lookup(id, std::span<const uint64_t>(&key, 1), out);
    EXPECT_TRUE(s.ok()) << s.ToString();
    return v;
  }
  Status Apply(uint64_t id, const std::vector<uint64_t>& keys,
               const std::vector<std::vector<float>>& grads, uint64_t step, uint32_t now = 1000) {
    std::vector<const float*> g;
    for (auto& x : grads) g.push_back(x.data());
    ApplyContext ctx{step, now};
    Status s = lane_->Apply(id, keys, g, ctx);
    if (!s.ok()) return s;
    return lane_->Commit();
  }
  // Keys 1..400 of a dim-2 table and a gradient each: 1, then the key (SGD, lr 1: the row
  // reads -1, -key after one push).
  static void KeysOneTo400(std::vector<uint64_t>* keys, std::vector<std::vector<float>>* grads) {
    for (uint64_t k = 1; k <= 400; ++k) {
      keys->push_back(k);
      grads->push_back({1.0f, static_cast<float>(k)});
    }
  }
  std::map<uint64_t, std::vector<float>> ScanAll(uint64_t id, uint32_t dim) {
    std::map<uint64_t, std::vector<float>> rows;
    Status s = lane_->Scan(id, [&](uint64_t key, const float* v, const float*, const RowMeta&) {
      EXPECT_FALSE(rows.contains(key)) << "key visited twice: " << key;
      rows[key] = std::vector<float>(v, v + dim);
      return true;
    });
    EXPECT_TRUE(s.ok()) << s.ToString();
    return rows;
  }

  // Closes the RocksDB engine and opens its data dir again (default options), lane 0 of 1.
  void ReopenRocksDb() {
    lane_.reset();
    engine_.reset();
    StorageOptions o;
    o.data_dir = dir_.Sub("db");
    auto r = OpenStorageEngine(o);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    engine_ = std::move(r).value();
    lane_ = std::move(engine_->OpenLane(0, 1)).value();
  }

  TempDir dir_;
  std::unique_ptr<StorageEngine> engine_;
  std::unique_ptr<LaneStore> lane_;
};

TEST_P(StoreConformanceTest, LookupGivesInitializerValues) {
  InitializerSpec init{InitializerKind::kUniform, -0.5f, 0.5f, 7};
  const uint64_t id = AddSparse(TableSpec::Sparse("t", 4, {}, init));
  for (uint64_t key : {1ull, 2ull, 0xffffffffffffffffull}) {
    std::vector<float> want(4);
    InitializeValues(init, key, 0, 4, want.data());
    EXPECT_EQ(Lookup1(id, key, 4), want);
    EXPECT_EQ(Lookup1(id, key, 4), want) << "second lookup of " << key;
  }
}

TEST_P(StoreConformanceTest, SgdAppliesEveryGradientIncludingDuplicates) {
  OptimizerSpec sgd{OptimizerKind::kSgd, 0.5f};
  const uint64_t id = AddSparse(TableSpec::Sparse("t", 2, sgd));
  ASSERT_TRUE(Apply(id, {10, 11, 10}, {{1, 2}, {4, 4}, {1, 0}}, 1).ok());
  EXPECT_EQ(Lookup1(id, 10, 2), (std::vector<float>{-1.0f, -1.0f}));
  EXPECT_EQ(Lookup1(id, 11, 2), (std::vector<float>{-2.0f, -2.0f}));
  // Many other keys push key 10 out of a small memory tier; its value comes back from disk.
  std::vector<uint64_t> keys;
  std::vector<std::vector<float>> grads;
  for (uint64_t k = 100; k < 300; ++k) {
    keys.push_back(k);
    grads.push_back({1, 1});
  }
  ASSERT_TRUE(Apply(id, keys, grads, 2).ok());
  EXPECT_EQ(Lookup1(id, 10, 2), (std::vector<float>{-1.0f, -1.0f}));
  EXPECT_EQ(Lookup1(id, 299, 2), (std::vector<float>{-0.5f, -0.5f}));
}

// Resharding's storage calls: ScanSlots visits exactly the updated rows of the slots asked for;
// DeleteRows removes rows (a later lookup gives the initializer's value again, a scan skips
// them), and a RocksDB lane keeps the deletes across a reopen.
TEST_P(StoreConformanceTest, ScanSlotsAndDeleteRows) {
  const uint64_t id = AddSparse(TableSpec::Sparse("emb", 2, {OptimizerKind::kSgd, 1.0f}));
  std::vector<uint64_t> keys;
  std::vector<std::vector<float>> grads;
  KeysOneTo400(&keys, &grads);
  ASSERT_TRUE(Apply(id, keys, grads, 1).ok());
  (void)Lookup1(id, 1000, 2);  // looked up only: never visited
  std::set<uint32_t> slots = {SlotOfKey(5), SlotOfKey(77), SlotOfKey(300)};
  const std::vector<uint32_t> list(slots.begin(), slots.end());
  std::set<uint64_t> want;
  for (uint64_t k : keys) {
    if (slots.count(SlotOfKey(k))) want.insert(k);
  }
  std::set<uint64_t> seen;
  ASSERT_TRUE(lane_->ScanSlots(id, list, [&](uint64_t key, const float* v, const float*,
                                             const RowMeta& m) {
                      EXPECT_TRUE(seen.insert(key).second) << "visited twice: " << key;
                      EXPECT_EQ(v[1], -static_cast<float>(key));
                      EXPECT_EQ(m.update_count, 1u);
                      return true;
                    }).ok());
  EXPECT_EQ(seen, want);

  const std::vector<uint64_t> gone(want.begin(), want.end());
  ASSERT_TRUE(lane_->DeleteRows(id, gone).ok());
  const auto rows = ScanAll(id, 2);
  EXPECT_EQ(rows.size(), keys.size() - gone.size());
  for (uint64_t k : gone) {
    EXPECT_FALSE(rows.contains(k)) << k;
    EXPECT_EQ(Lookup1(id, k, 2), (std::vector<float>{0.0f, 0.0f})) << k;
  }
  seen.clear();
  ASSERT_TRUE(lane_->ScanSlots(id, list, [&](uint64_t key, const float*, const float*,
                                             const RowMeta&) {
                      seen.insert(key);
                      return true;
                    }).ok());
  EXPECT_TRUE(seen.empty()) << seen.size() << " deleted rows still scanned";
  if (GetParam() == EngineKind::kMemory) return;
  ASSERT_NO_FATAL_FAILURE(ReopenRocksDb());
  ASSERT_TRUE(lane_->AddTable(id, TableSpec::Sparse("emb", 2, {OptimizerKind::kSgd, 1.0f})).ok());
  const auto reopened = ScanAll(id, 2);
  EXPECT_EQ(reopened.size(), keys.size() - gone.size());
  for (uint64_t k : gone) EXPECT_FALSE(reopened.contains(k)) << k << " came back after a reopen";
}

// A slot copy read off the lane (TakeSlotSnapshot): the snapshot holds every updated row of
// the slots asked for as it was when taken, whatever the lane applies and commits after it;
// rows of other slots may be visited too (the reader filters).
TEST_P(StoreConformanceTest, ASlotSnapshotReadsTheRowsAsTheyWereWhenTaken) {
  const uint64_t id = AddSparse(TableSpec::Sparse("emb", 2, {OptimizerKind::kSgd, 1.0f}));
  std::vector<uint64_t> keys;
  std::vector<std::vector<float>> grads;
  KeysOneTo400(&keys, &grads);
  ASSERT_TRUE(Apply(id, keys, grads, 1).ok());
  ASSERT_TRUE(Apply(id, {5, 77}, {{1.0f, 5.0f}, {1.0f, 77.0f}}, 2).ok());
  const std::vector<uint32_t> list = {SlotOfKey(5), SlotOfKey(77), SlotOfKey(300)};
  std::set<uint64_t> want;
  for (uint64_t k : keys) {
    if (std::find(list.begin(), list.end(), SlotOfKey(k)) != list.end()) want.insert(k);
  }
  auto snapshot = lane_->TakeSlotSnapshot(list);
  ASSERT_TRUE(snapshot.ok()) << snapshot.status().ToString();
  // The lane goes on: an update of every row, and a row created, after the snapshot.
  ASSERT_TRUE(Apply(id, keys, grads, 3).ok());
  uint64_t fresh = 401;  // a key of a slot asked for, first updated after the snapshot
  while (std::find(list.begin(), list.end(), SlotOfKey(fresh)) == list.end()) ++fresh;
  ASSERT_TRUE(Apply(id, {fresh}, {{1.0f, 1.0f}}, 3).ok());
  std::set<uint64_t> seen;
  ASSERT_TRUE((*snapshot)
                  ->Scan(id, [&](uint64_t key, const float* v, const float*, const RowMeta& m) {
                    if (std::find(list.begin(), list.end(), SlotOfKey(key)) == list.end()) {
                      return true;  // another slot's row: the reader's to skip
                    }
                    EXPECT_TRUE(seen.insert(key).second) << "visited twice: " << key;
                    const float times = key == 5 || key == 77 ? 2.0f : 1.0f;
                    EXPECT_EQ(v[1], -times * static_cast<float>(key)) << key;
                    EXPECT_EQ(m.update_count, static_cast<uint32_t>(times)) << key;
                    return true;
                  })
                  .ok());
  EXPECT_EQ(seen, want);
}

// SlotDrop's storage call: DropSlots deletes every row of the slots asked for (rows written
// back, rows only in memory, the last slot), no other row; a row written after the drop is
// kept; a RocksDB lane (which deletes key ranges without reading them) keeps exactly that
// across a reopen.
TEST_P(StoreConformanceTest, DropSlotsDeletesTheirRowsAndOnlyThose) {
  const uint64_t id = AddSparse(TableSpec::Sparse("emb", 2, {OptimizerKind::kSgd, 1.0f}));
  uint64_t last = 1;
  while (SlotOfKey(last) != kNumSlots - 1) ++last;
  std::vector<uint64_t> keys = {last};
  for (uint64_t k = 1; k <= 3000; ++k) keys.push_back(k);
  std::vector<std::vector<float>> grads(keys.size(), std::vector<float>{1.0f, 2.0f});
  ASSERT_TRUE(Apply(id, std::vector<uint64_t>(keys.begin(), keys.begin() + 1500),
                    std::vector<std::vector<float>>(grads.begin(), grads.begin() + 1500), 1)
                  .ok());
  ASSERT_TRUE(lane_->Commit().ok());  // on disk (and, with the tiny budget, evicted)
  // Dirty: only in memory (not committed).
  std::vector<const float*> g;
  for (size_t i = 1500; i < keys.size(); ++i) g.push_back(grads[i].data());
  ASSERT_TRUE(lane_->Apply(id, std::span<const uint64_t>(keys.data() + 1500, keys.size() - 1500),
                           g, ApplyContext{2, 1000})
                  .ok());
  std::set<uint32_t> dropped = {SlotOfKey(last), SlotOfKey(7), SlotOfKey(2999)};
  for (uint64_t k = 1; k <= 3000; k += 97) dropped.insert(SlotOfKey(k));
  const std::vector<uint32_t> list(dropped.begin(), dropped.end());
  std::set<uint64_t> kept;
  for (uint64_t k : keys) {
    if (!dropped.count(SlotOfKey(k))) kept.insert(k);
  }
  ASSERT_LT(kept.size(), keys.size());
  auto n = lane_->DropSlots(id, list);
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_LE(*n, keys.size() - kept.size());
  const auto check = [&](const char* when) {
    const auto rows = ScanAll(id, 2);
    EXPECT_EQ(rows.size(), kept.size()) << when;
    for (uint64_t k : kept) EXPECT_TRUE(rows.contains(k)) << k << " " << when;
    std::set<uint64_t> seen;
    EXPECT_TRUE(lane_->ScanSlots(id, list, [&](uint64_t key, const float*, const float*,
                                               const RowMeta&) {
                        seen.insert(key);
                        return true;
                      }).ok());
    EXPECT_TRUE(seen.empty()) << seen.size() << " dropped rows still scanned " << when;
  };
  check("after the drop");
  EXPECT_EQ(Lookup1(id, last, 2), (std::vector<float>{0.0f, 0.0f}));
  // A row of a dropped slot written again after the drop is a new row, and stays.
  ASSERT_TRUE(Apply(id, {7}, {{1.0f, 1.0f}}, 3).ok());
  ASSERT_TRUE(lane_->Commit().ok());
  kept.insert(7);
  EXPECT_EQ(Lookup1(id, 7, 2), (std::vector<float>{-1.0f, -1.0f}));
  if (GetParam() == EngineKind::kMemory) return;
  ASSERT_NO_FATAL_FAILURE(ReopenRocksDb());
  ASSERT_TRUE(lane_->AddTable(id, TableSpec::Sparse("emb", 2, {OptimizerKind::kSgd, 1.0f})).ok());
  const auto rows = ScanAll(id, 2);
  EXPECT_EQ(rows.size(), kept.size()) << "after a reopen";
  for (uint64_t k : keys) {
    EXPECT_EQ(rows.contains(k), kept.count(k) > 0) << k << " after a reopen";
  }
  EXPECT_EQ(Lookup1(id, 7, 2), (std::vector<float>{-1.0f, -1.0f}));
}

TEST_P(StoreConformanceTest, ErrorsNameTheProblem) {
  const uint64_t id = AddSparse(TableSpec::Sparse("t", 2));
  const uint64_t dense = TableIdForName("d");
  ASSERT_TRUE(lane_->AddTable(dense, TableSpec::Dense("d", 10)).ok());
  std::vector<float> v(2);
  float* out[] = {v.data()};
  uint64_t key = 1;
  EXPECT_EQ(lane_->Lookup(12345, std::span<const uint64_t>(&key, 1), out).code(),
            StatusCode::kNotFound);
  EXPECT_EQ(lane_->Lookup(dense, std::span<const uint64_t>(&key, 1), out).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(lane_->DenseRead(id, 0, 0, 1, v.data()).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(lane_->DenseRead(dense, 0, 0, 11, v.data()).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(lane_->DenseRead(dense, 1, 0, 1, v.data()).code(), StatusCode::kInvalidArgument);
  // AddTable again with the same spec: no-op.
  EXPECT_TRUE(lane_->AddTable(id, TableSpec::Sparse("t", 2)).ok());
}

TEST_P(StoreConformanceTest, DenseChunksReadAndApply) {
  const uint64_t length = kDenseChunkFloats + 100;  // two chunks, the second short
  OptimizerSpec sgd{OptimizerKind::kSgd, 1.0f};
  InitializerSpec init{InitializerKind::kConstant, 2.0f};
  const uint64_t id = TableIdForName("dense");
  ASSERT_TRUE(lane_->AddTable(id, TableSpec::Dense("dense", length, sgd, init)).ok());
  std::vector<float> out(100);
  ASSERT_TRUE(lane_->DenseRead(id, 1, 0, 100, out.data()).ok());
  EXPECT_EQ(out, std::vector<float>(100, 2.0f));
  std::vector<float> g(10, 0.5f);
  ASSERT_TRUE(lane_->DenseApply(id, 1, 90, 100, g.data(), {1, 1}).ok());
  ASSERT_TRUE(lane_->Commit().ok());
  ASSERT_TRUE(lane_->DenseRead(id, 1, 85, 100, out.data()).ok());
  for (int i = 0; i < 15; ++i) EXPECT_EQ(out[i], i < 5 ? 2.0f : 1.5f) << i;
  EXPECT_EQ(lane_->DenseApply(id, 1, 95, 101, g.data(), {2, 1}).code(),
            StatusCode::kInvalidArgument);
}

TEST_P(StoreConformanceTest, AdmissionByCount) {
  TableSpec spec =
      TableSpec::Sparse("t", 2, {OptimizerKind::kSgd, 1.0f}, {InitializerKind::kConstant, 3.0f});
  spec.admission.min_count = 3;
  const uint64_t id = AddSparse(spec);
  ASSERT_TRUE(Apply(id, {5}, {{1, 1}}, 1).ok());
  ASSERT_TRUE(Apply(id, {5}, {{1, 1}}, 2).ok());
  // Two pushes: counted, not stored; a pull gets the initializer's value.
  EXPECT_EQ(Lookup1(id, 5, 2), (std::vector<float>{3, 3}));
  EXPECT_TRUE(ScanAll(id, 2).empty());
  // The third push admits the key and applies its own gradient (only).
  ASSERT_TRUE(Apply(id, {5}, {{1, 1}}, 3).ok());
  EXPECT_EQ(Lookup1(id, 5, 2), (std::vector<float>{2, 2}));
  ASSERT_TRUE(Apply(id, {5}, {{1, 1}}, 4).ok());
  EXPECT_EQ(Lookup1(id, 5, 2), (std::vector<float>{1, 1}));
  auto rows = ScanAll(id, 2);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[5], (std::vector<float>{1, 1}));
}

TEST_P(StoreConformanceTest, AdmissionByProbabilityIsTheDeterministicCoin) {
  TableSpec spec = TableSpec::Sparse("t", 1, {OptimizerKind::kSgd, 1.0f});
  spec.admission.probability = 0.25f;
  const uint64_t id = AddSparse(spec);
  std::vector<uint64_t> keys;
  std::vector<std::vector<float>> grads;
  for (uint64_t k = 1; k <= 2000; ++k) {
    keys.push_back(k);
    grads.push_back({1});
  }
  ASSERT_TRUE(Apply(id, keys, grads, 1).ok());
  auto rows = ScanAll(id, 1);
  size_t expected = 0;
  for (uint64_t k : keys) {
    const bool admitted = internal::Admitted(spec.admission, k, 1);
    expected += admitted;
    EXPECT_EQ(rows.contains(k), admitted) << k;
  }
  EXPECT_EQ(rows.size(), expected);
  EXPECT_GT(expected, 400u);
  EXPECT_LT(expected, 600u);
}

TEST_P(StoreConformanceTest, EvictionByIdleSteps) {
  TableSpec spec = TableSpec::Sparse("t", 1, {OptimizerKind::kSgd, 1.0f});
  spec.eviction.max_idle_steps = 10;
  const uint64_t id = AddSparse(spec);
  std::vector<uint64_t> old_keys, new_keys;
  std::vector<std::vector<float>> grads;
  for (uint64_t k = 1; k <= 50; ++k) {
    old_keys.push_back(k);
    new_keys.push_back(k + 1000);
    grads.push_back({1});
  }
  ASSERT_TRUE(Apply(id, old_keys, grads, 5).ok());
  ASSERT_TRUE(Apply(id, new_keys, grads, 12).ok());
  ASSERT_TRUE(lane_->Maintain({15, 1000}).ok());  // 10 steps idle at most: nothing goes
  EXPECT_EQ(ScanAll(id, 1).size(), 100u);
  ASSERT_TRUE(lane_->Maintain({16, 1000}).ok());  // old keys: 11 steps idle
  auto rows = ScanAll(id, 1);
  EXPECT_EQ(rows.size(), 50u);
  for (uint64_t k : new_keys) EXPECT_TRUE(rows.contains(k)) << k;
  EXPECT_EQ(lane_->stats().evicted_rows, 50u);
  // An evicted key starts over from its initializer.
  EXPECT_EQ(Lookup1(id, 1, 1), (std::vector<float>{0}));
}

TEST_P(StoreConformanceTest, EvictionByIdleSeconds) {
  TableSpec spec = TableSpec::Sparse("t", 1, {OptimizerKind::kSgd, 1.0f});
  spec.eviction.max_idle_seconds = 60;
  const uint64_t id = AddSparse(spec);
  ASSERT_TRUE(Apply(id, {1, 2}, {{1}, {1}}, 1, /*now=*/1000).ok());
  ASSERT_TRUE(Apply(id, {2}, {{1}}, 2, /*now=*/1050).ok());
  ASSERT_TRUE(lane_->Maintain({3, 1060}).ok());
  EXPECT_EQ(ScanAll(id, 1).size(), 2u);
  ASSERT_TRUE(lane_->Maintain({3, 1061}).ok());
  auto rows = ScanAll(id, 1);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[2], (std::vector<float>{-2}));
}

TEST_P(StoreConformanceTest, ScanVisitsUpdatedRowsOnly) {
  const uint64_t id = AddSparse(TableSpec::Sparse("t", 3, {OptimizerKind::kAdagrad, 0.1f}));
  std::vector<uint64_t> keys;
  std::vector<std::vector<float>> grads;
  for (uint64_t k = 0; k < 300; ++k) {
    keys.push_back(k * 7919);
    grads.push_back({1, 2, 3});
  }
  ASSERT_TRUE(Apply(id, keys, grads, 9, 77).ok());
  for (uint64_t k = 1; k < 50; ++k) Lookup1(id, k * 7919 + 1, 3);  // lookups make no rows
  std::set<uint64_t> seen;
  Status s =
      lane_->Scan(id, [&](uint64_t key, const float* v, const float* state, const RowMeta& meta) {
        seen.insert(key);
        EXPECT_EQ(meta.update_count, 1u);
        EXPECT_EQ(meta.last_step, 9u);
        EXPECT_EQ(meta.last_update_s, 77u);
        EXPECT_FLOAT_EQ(state[2], 9.0f);  // Adagrad accumulator of the third element
        EXPECT_LT(v[0], 0.0f);
        return true;
      });
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(seen, std::set<uint64_t>(keys.begin(), keys.end()));
  // A visitor that returns false stops the scan.
  int visits = 0;
  ASSERT_TRUE(lane_
                  ->Scan(id, [&](uint64_t, const float*, const float*,
                                 const RowMeta&) { return ++visits < 5; })
                  .ok());
  EXPECT_EQ(visits, 5);
}

TEST_P(StoreConformanceTest, PutRowsAndDenseChunksRestoreWhatScanSaw) {
  const auto spec = TableSpec::Sparse("t", 2, {OptimizerKind::kAdagrad, 0.1f});
  const uint64_t id = AddSparse(spec);
  const uint64_t did = TableIdForName("d");
  ASSERT_TRUE(lane_->AddTable(did, TableSpec::Dense("d", 5, {OptimizerKind::kAdagrad})).ok());
  // Rows: 2 values + 2 accumulators.
  const float r1[] = {1, 2, 3, 4}, r2[] = {5, 6, 7, 8};
  const float* rows[] = {r1, r2};
  const uint64_t keys[] = {11, 12};
  const RowMeta metas[] = {{3, 4, 5}, {6, 7, 8}};
  ASSERT_TRUE(lane_->PutRows(id, keys, rows, metas).ok());
  const float chunk[] = {1, 2, 3, 4, 5, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f};
  ASSERT_TRUE(lane_->PutDenseChunk(did, 0, chunk, {2, 2, 2}).ok());
  EXPECT_FALSE(lane_->PutDenseChunk(did, 1, chunk, {2, 2, 2}).ok());
  ASSERT_TRUE(lane_->Commit().ok());
  std::map<uint64_t, std::vector<float>> got;
  ASSERT_TRUE(lane_
                  ->Scan(id,
                         [&](uint64_t k, const float* v, const float* st, const RowMeta& m) {
                           got[k] = {v[0], v[1], st[0], st[1], static_cast<float>(m.update_count)};
                           return true;
                         })
                  .ok());
  EXPECT_EQ(got[11], (std::vector<float>{1, 2, 3, 4, 3}));
  EXPECT_EQ(got[12], (std::vector<float>{5, 6, 7, 8, 6}));
  std::vector<float> seen;
  ASSERT_TRUE(lane_
                  ->ScanDense(did,
                              [&](uint64_t c, const float* row, uint32_t len, const RowMeta& m) {
                                EXPECT_EQ(c, 0u);
                                EXPECT_EQ(m.update_count, 2u);
                                seen.assign(row, row + 2 * len);
                                return true;
                              })
                  .ok());
  EXPECT_EQ(seen, std::vector<float>(chunk, chunk + 10));
  // Training continues from the restored state: Adagrad's accumulator 3 + 1 = 4.
  ASSERT_TRUE(Apply(id, {11}, {{1, 0}}, 9).ok());
  EXPECT_NEAR(Lookup1(id, 11, 2)[0], 1.0f - 0.1f / 2.0f, 1e-6);
}

// A snapshot keeps the rows of its moment while the lane goes on changing them: rows durable,
// handed to the writer and dirty (RocksDB), across several copy-on-write blocks (memory).
TEST_P(StoreConformanceTest, SnapshotKeepsItsMomentWhileTheLaneGoesOn) {
  const uint64_t id = AddSparse(TableSpec::Sparse("t", 1, {OptimizerKind::kSgd, 1.0f}));
  const uint64_t did = TableIdForName("d");
  ASSERT_TRUE(lane_->AddTable(did, TableSpec::Dense("d", 3, {OptimizerKind::kSgd, 1.0f})).ok());
  constexpr uint64_t kRows = 10000;  // many copy-on-write blocks
  const float minus_one = -1.0f;
  auto push = [&](uint64_t from, uint64_t to, uint64_t step) {
    std::vector<uint64_t> keys;
    for (uint64_t k = from; k < to; ++k) keys.push_back(k);
    std::vector<const float*> g(keys.size(), &minus_one);
    ASSERT_TRUE(lane_->Apply(id, keys, g, {step, 1000}).ok());
    const float dg[] = {-1, -1, -1};
    ASSERT_TRUE(lane_->DenseApply(did, 0, 0, 3, dg, {step, 1000}).ok());
  };
  push(0, 4000, 1);
  ASSERT_TRUE(lane_->Commit().ok());                   // durable
  push(4000, 7000, 2);
  // Handed off (perhaps written already).
  ASSERT_TRUE(lane_->WriteBack(/*wait=*/false, /*flush_soon=*/false).ok());
  push(7000, kRows, 3);                                // dirty
  auto snapshot = lane_->TakeSnapshot();
  ASSERT_TRUE(snapshot.ok()) << snapshot.status().ToString();
  // The lane goes on: every row changes again and reaches the disk; one row goes.
  push(0, kRows, 4);
  ASSERT_TRUE(lane_->Commit().ok());
  std::map<uint64_t, float> rows;
  ASSERT_TRUE((*snapshot)
                  ->Scan(id,
                         [&](uint64_t k, const float* v, const float*, const RowMeta& m) {
                           EXPECT_EQ(m.update_count, 1u) << k;
                           rows[k] = v[0];
                           return true;
                         })
                  .ok());
  ASSERT_EQ(rows.size(), kRows);
  for (const auto& [k, v] : rows) ASSERT_EQ(v, 1.0f) << "key " << k;
  // The scan let go of the rows as it read them: a second one is refused, not wrong.
  EXPECT_EQ((*snapshot)
                ->Scan(id, [](uint64_t, const float*, const float*, const RowMeta&) { return true; })
                .code(),
            StatusCode::kFailedPrecondition);
  std::vector<float> dense;
  ASSERT_TRUE((*snapshot)
                  ->ScanDense(did,
                              [&](uint64_t, const float* row, uint32_t len, const RowMeta&) {
                                dense.assign(row, row + len);
                                return true;
                              })
                  .ok());
  EXPECT_EQ(dense, std::vector<float>(3, 3.0f));  // pushes 1-3
  snapshot->reset();
  // The lane itself has moved on.
  EXPECT_EQ(Lookup1(id, 7, 1)[0], 2.0f);
  EXPECT_EQ(Lookup1(id, kRows - 1, 1)[0], 2.0f);
}

TEST_P(StoreConformanceTest, MetaRecords) {
  ASSERT_TRUE(engine_->PutMeta("table/1", "a").ok());
  ASSERT_TRUE(engine_->PutMeta("table/2", "b").ok());
  ASSERT_TRUE(engine_->PutMeta("worker/1", "c").ok());
  ASSERT_TRUE(engine_->PutMeta("table/1", "a2").ok());
  auto v = engine_->GetMeta("table/1");
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v->value_or(""), "a2");
  auto missing = engine_->GetMeta("table/3");
  ASSERT_TRUE(missing.ok());
  EXPECT_FALSE(missing->has_value());
  std::vector<std::string> keys;
  ASSERT_TRUE(
      engine_
          ->ScanMeta("table/", [&](std::string_view k, std::string_view) { keys.emplace_back(k); })
          .ok());
  EXPECT_EQ(keys, (std::vector<std::string>{"table/1", "table/2"}));
}

INSTANTIATE_TEST_SUITE_P(Engines, StoreConformanceTest,
                         ::testing::Values(EngineKind::kMemory, EngineKind::kRocksDb,
                                           EngineKind::kRocksDbTinyBudget),
                         [](const ::testing::TestParamInfo<EngineKind>& info) {
                           switch (info.param) {
                             case EngineKind::kMemory:
                               return std::string("Memory");
                             case EngineKind::kRocksDb:
                               return std::string("RocksDb");
                             case EngineKind::kRocksDbTinyBudget:
                               return std::string("RocksDbTinyBudget");
                           }
                           return std::string("Unknown");
                         });

TEST(MemoryEngineTest, CheckpointIsRefused) {
  auto engine = NewMemoryStorageEngine();
  EXPECT_EQ(engine->CreateCheckpoint("/tmp/nowhere").code(), StatusCode::kFailedPrecondition);
}

// A shared chunk (what a dense pull reply sends) keeps the values it had while pushes change
// the chunk, and a chunk no one holds any more is written in place again.
TEST(MemoryEngineTest, DenseShareKeepsItsMomentWhilePushesGoOn) {
  auto engine = NewMemoryStorageEngine();
  auto lane = engine->OpenLane(0, 1);
  ASSERT_TRUE(lane.ok());
  LaneStore& store = **lane;
  const uint64_t length = kDenseChunkFloats + 100;  // two chunks, the second short
  const uint64_t id = TableIdForName("dense");
  ASSERT_TRUE(store
                  .AddTable(id, TableSpec::Dense("dense", length, {OptimizerKind::kSgd, 1.0f},
                                                 {InitializerKind::kConstant, 2.0f}))
                  .ok());
  uint32_t len = 0;
  auto first = store.DenseShare(id, 1, &len);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  ASSERT_NE(*first, nullptr);
  EXPECT_EQ(len, 100u);
  const std::vector<float> g(10, 0.5f);
  ASSERT_TRUE(store.DenseApply(id, 1, 90, 100, g.data(), {1, 1}).ok());
  EXPECT_EQ(std::vector<float>(first->get(), first->get() + 100), std::vector<float>(100, 2.0f))
      << "a push changed a chunk a holder still had";
  std::vector<float> out(100);
  ASSERT_TRUE(store.DenseRead(id, 1, 0, 100, out.data()).ok());
  EXPECT_EQ(out[89], 2.0f);
  EXPECT_EQ(out[90], 1.5f);
  auto second = store.DenseShare(id, 1, &len);
  ASSERT_TRUE(second.ok());
  EXPECT_EQ((*second).get()[99], 1.5f);
  const float* where = second->get();
  // The holders let go on another thread, as ZeroMQ's I/O thread does.
  std::thread([a = std::move(*first), b = std::move(*second)]() mutable {
    a.reset();
    b.reset();
  }).join();
  ASSERT_TRUE(store.DenseApply(id, 1, 90, 100, g.data(), {2, 1}).ok());
  auto third = store.DenseShare(id, 1, &len);
  ASSERT_TRUE(third.ok());
  EXPECT_EQ(third->get(), where) << "a chunk no one held was copied";
  EXPECT_EQ(third->get()[99], 1.0f);
  EXPECT_EQ(store.DenseShare(id, 2, &len).status().code(), StatusCode::kInvalidArgument);
  const uint64_t sparse = TableIdForName("sparse");
  ASSERT_TRUE(store.AddTable(sparse, TableSpec::Sparse("sparse", 2)).ok());
  EXPECT_EQ(store.DenseShare(sparse, 0, &len).status().code(), StatusCode::kInvalidArgument);
}

TEST(MemoryEngineTest, LanesAreIndependent) {
  auto engine = NewMemoryStorageEngine();
  auto a = engine->OpenLane(0, 2);
  auto b = engine->OpenLane(1, 2);
  ASSERT_TRUE(a.ok() && b.ok());
  const uint64_t id = TableIdForName("t");
  ASSERT_TRUE((*a)->AddTable(id, TableSpec::Sparse("t", 1, {OptimizerKind::kSgd, 1.0f})).ok());
  ASSERT_TRUE((*b)->AddTable(id, TableSpec::Sparse("t", 1, {OptimizerKind::kSgd, 1.0f})).ok());
  const uint64_t key = 3;
  const float g = 1;
  const float* grads[] = {&g};
  ASSERT_TRUE((*a)->Apply(id, std::span<const uint64_t>(&key, 1), grads, {1, 1}).ok());
  float v = 0;
  float* out[] = {&v};
  ASSERT_TRUE((*b)->Lookup(id, std::span<const uint64_t>(&key, 1), out).ok());
  EXPECT_EQ(v, 0.0f);
}

}  // namespace
}  // namespace tessera
