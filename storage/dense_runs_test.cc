// The memory engine's dense chunks in runs (DenseRuns): neighbouring chunks of one lane are
// adjacent in memory and shared as one block; copy-on-write by run keeps what a holder got.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "ps/routing.h"
#include "storage/storage.h"
#include "storage/test_util_internal.h"

namespace tessera {
namespace {

constexpr uint64_t kC = kDenseChunkFloats;

// Lane `lane` of 2 of a memory engine, with dense table `name` of `length` floats (SGD step 1,
// constant 2) whose id is returned in `*id`.
std::unique_ptr<LaneStore> LaneWithTable(uint32_t lane, const std::string& name, uint64_t length,
                                         OptimizerSpec opt, uint64_t* id) {
  static auto engine = NewMemoryStorageEngine();
  auto store = engine->OpenLane(lane, 2);
  EXPECT_TRUE(store.ok());
  *id = TableIdForName(name);
  EXPECT_TRUE(
      (*store)
          ->AddTable(*id, TableSpec::Dense(name, length, opt, {InitializerKind::kConstant, 2.0f}))
          .ok());
  return std::move(*store);
}

// The first chunk >= `from` that lane 0 of 2 serves for table `id`.
uint64_t LaneZeroChunk(uint64_t id, uint64_t from) {
  return LaneOfChunk(id, from, 2) == 0 ? from : from + 1;
}

TEST(DenseRunsTest, NeighbouringChunksOfALaneAreOneBlockAndCopiedTogether) {
  uint64_t id = 0;
  auto store = LaneWithTable(0, "runs", 40 * kC + 7, {OptimizerKind::kSgd, 1.0f}, &id);
  const uint64_t a = LaneZeroChunk(id, 0), b = a + 2;  // slots 0 and 1 of the lane's first run
  uint32_t len_a = 0, len_b = 0;
  auto sa = store->DenseShare(id, a, &len_a);
  auto sb = store->DenseShare(id, b, &len_b);
  ASSERT_TRUE(sa.ok() && sb.ok());
  ASSERT_EQ(len_a, kC);
  EXPECT_EQ(sa->get() + len_a, sb->get()) << "neighbouring lane chunks are not adjacent";
  EXPECT_FALSE(sa->owner_before(*sb) || sb->owner_before(*sa)) << "not one block";
  // A push to b while both are held: the holders keep 2.0 everywhere, a new share sees it.
  const std::vector<float> g(kC, 0.5f);
  ASSERT_TRUE(store->DenseApply(id, b, 0, kC, g.data(), {1, 1}).ok());
  EXPECT_EQ(std::vector<float>(sb->get(), sb->get() + kC), std::vector<float>(kC, 2.0f));
  EXPECT_EQ(std::vector<float>(sa->get(), sa->get() + kC), std::vector<float>(kC, 2.0f));
  auto nb = store->DenseShare(id, b, &len_b);
  auto na = store->DenseShare(id, a, &len_a);
  ASSERT_TRUE(na.ok() && nb.ok());
  EXPECT_EQ((*nb).get()[kC - 1], 1.5f);
  EXPECT_EQ((*na).get()[0], 2.0f);
  EXPECT_NE(na->get(), sa->get()) << "the run a holder had was written in place";
  EXPECT_EQ(na->get() + kC, nb->get());
  // A chunk of the next run is not adjacent to the last of this one; the table's last chunk
  // (7 floats) is readable whichever lane it falls to in this store.
  const uint64_t last = 40;
  std::vector<float> out(7);
  ASSERT_TRUE(store->DenseRead(id, last, 0, 7, out.data()).ok());
  EXPECT_EQ(out, std::vector<float>(7, 2.0f));
}

TEST(DenseRunsTest, ChunksOfAnotherLaneAndScansWithOptimizerState) {
  uint64_t id = 0;
  OptimizerSpec adagrad;
  adagrad.kind = OptimizerKind::kAdagrad;
  adagrad.learning_rate = 0.1f;
  auto store = LaneWithTable(0, "adagrad", 3 * kC + 5, adagrad, &id);
  // Every chunk, also those another lane would serve: applied and read back independently.
  std::vector<float> g(kC);
  for (uint64_t c = 0; c < 4; ++c) {
    const uint32_t n = c == 3 ? 5 : kC;
    for (uint32_t i = 0; i < n; ++i) g[i] = static_cast<float>(c + 1);
    ASSERT_TRUE(store->DenseApply(id, c, 0, n, g.data(), {c + 1, 1}).ok());
  }
  std::vector<std::vector<float>> rows(4);
  ASSERT_TRUE(store
                  ->ScanDense(id,
                              [&](uint64_t c, const float* row, uint32_t len, const RowMeta& m) {
                                EXPECT_EQ(m.update_count, 1u);
                                rows[c].assign(row, row + 2 * len);  // values, then state
                                return true;
                              })
                  .ok());
  for (uint64_t c = 0; c < 4; ++c) {
    ASSERT_FALSE(rows[c].empty()) << "chunk " << c << " not scanned";
    const size_t n = rows[c].size() / 2;
    EXPECT_LT(rows[c][0], 2.0f) << "chunk " << c;  // moved against a positive gradient
    EXPECT_EQ(rows[c][n - 1], rows[c][0]) << "chunk " << c;
    EXPECT_GT(rows[c][n], 0.0f) << "chunk " << c << ": no Adagrad state";
  }
  EXPECT_NE(rows[0][kC], rows[1][kC]) << "two chunks share their state";
  // What a scan gives, put into a fresh lane, scans the same.
  uint64_t id2 = 0;
  auto copy = LaneWithTable(1, "adagrad", 3 * kC + 5, adagrad, &id2);
  ASSERT_EQ(id, id2);
  for (uint64_t c = 0; c < 4; ++c) {
    RowMeta m;
    m.update_count = 1;
    ASSERT_TRUE(copy->PutDenseChunk(id, c, rows[c].data(), m).ok());
  }
  ASSERT_TRUE(copy->ScanDense(id,
                              [&](uint64_t c, const float* row, uint32_t len, const RowMeta&) {
                                EXPECT_EQ(std::vector<float>(row, row + 2 * len), rows[c])
                                    << "chunk " << c;
                                return true;
                              })
                  .ok());
  // A snapshot keeps its moment while the lane goes on.
  auto snap = store->TakeSnapshot();
  ASSERT_TRUE(snap.ok());
  ASSERT_TRUE(store->DenseApply(id, 0, 0, kC, g.data(), {9, 1}).ok());
  ASSERT_TRUE((*snap)
                  ->ScanDense(id,
                              [&](uint64_t c, const float* row, uint32_t len, const RowMeta&) {
                                EXPECT_EQ(std::vector<float>(row, row + 2 * len), rows[c])
                                    << "chunk " << c << " changed in the snapshot";
                                return true;
                              })
                  .ok());
}

}  // namespace
}  // namespace tessera
