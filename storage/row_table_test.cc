// The memory tier's block memory: BlockPool pieces and the huge-page allocations under them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "ps/optimizer.h"
#include "ps/table_spec.h"
#include "storage/storage.h"
#include "storage/huge_pages_internal.h"
#include "storage/row_table_internal.h"

namespace tessera::internal {
namespace {

TEST(HugePageableTest, LargeAllocationsAreHugePageAlignedSmallOnesLineAligned) {
  for (size_t bytes : {size_t{1}, size_t{100}, size_t{4096}, kHugePageBytes - 1}) {
    void* p = AllocateHugePageable(bytes);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u) << bytes << " bytes";
    std::memset(p, 1, bytes);
    FreeHugePageable(p);
  }
  for (size_t bytes : {kHugePageBytes, 3 * kHugePageBytes + 5}) {
    void* p = AllocateHugePageable(bytes);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % kHugePageBytes, 0u) << bytes << " bytes";
    std::memset(p, 1, bytes);
    FreeHugePageable(p);
  }
}

// Pieces across several slab sizes (the first slabs small, then huge pages): each line-aligned,
// none overlapping another (each keeps its own pattern), and freed ones come back before any
// new slab is taken.
TEST(BlockPoolTest, PiecesAreAlignedDisjointAndReusedAfterFree) {
  constexpr size_t kBytes = 1352;  // a block of 16 Adagrad rows of dim 8, not a multiple of 64
  BlockPool pool(kBytes);
  ASSERT_GE(pool.piece_bytes(), kBytes);
  std::vector<std::byte*> pieces;
  for (int i = 0; i < 5000; ++i) {  // past 2 MiB of slabs
    std::byte* p = pool.Allocate();
    ASSERT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u) << "piece " << i;
    std::memset(p, i % 251, kBytes);
    pieces.push_back(p);
  }
  EXPECT_GE(pool.SlabBytes(), 5000 * kBytes);
  for (size_t i = 0; i < pieces.size(); ++i) {
    const auto want = static_cast<std::byte>(i % 251);
    ASSERT_TRUE(std::all_of(pieces[i], pieces[i] + kBytes, [&](std::byte b) { return b == want; }))
        << "piece " << i << " was overwritten by another";
  }
  const uint64_t slabs = pool.SlabBytes();
  std::set<std::byte*> freed;
  for (size_t i = 0; i < pieces.size(); i += 2) {
    pool.Free(pieces[i]);
    freed.insert(pieces[i]);
  }
  for (size_t i = 0; i < freed.size(); ++i) {
    ASSERT_EQ(freed.count(pool.Allocate()), 1u) << "allocation " << i << " is not a freed piece";
  }
  EXPECT_EQ(pool.SlabBytes(), slabs);
}

// A frozen view keeps its blocks, and so their pool's slabs, after the rows are gone, and it
// may give them back on another thread (a snapshot's writer).
TEST(BlockPoolTest, FrozenViewOutlivesItsRowsOnAnotherThread) {
  OptimizerSpec spec;
  spec.kind = OptimizerKind::kAdagrad;
  const TableSpec table = TableSpec::Sparse("t", 8, spec);
  auto opt = Optimizer::Make(spec);
  auto rows = std::make_unique<SparseRows>(table, opt.get());
  constexpr uint64_t kRows = 40000;  // about 3.4 MB of blocks: huge-page slabs
  for (uint64_t k = 0; k < kRows; ++k) {
    bool created;
    float* row = rows->FindOrCreate(k, &created);
    ASSERT_TRUE(created);
    for (uint32_t j = 0; j < 8; ++j) row[j] = static_cast<float>(k * 8 + j);
  }
  SparseRows::Frozen frozen = rows->Freeze();
  rows.reset();
  uint64_t seen = 0, wrong = 0;
  std::thread reader([&] {
    frozen.ForEachAndRelease([&](uint64_t key, const float* row, const RowMeta&) {
      ++seen;
      for (uint32_t j = 0; j < 8; ++j) wrong += row[j] != static_cast<float>(key * 8 + j);
      return true;
    });
  });
  reader.join();
  EXPECT_EQ(seen, kRows);
  EXPECT_EQ(wrong, 0u);
}

// Every row of table `id` with its state and metadata, by key (updated rows: Scan's contract).
std::map<uint64_t, std::vector<float>> AllRows(LaneStore& lane, uint64_t id,
                                               const TableSpec& spec) {
  const uint32_t dim = spec.dim, state_floats = Optimizer::Make(spec.optimizer)->StateFloats(dim);
  std::map<uint64_t, std::vector<float>> rows;
  Status s = lane.Scan(id, [&](uint64_t key, const float* value, const float* state,
                               const RowMeta& meta) {
    std::vector<float>& r = rows[key];
    r.assign(value, value + dim);
    r.insert(r.end(), state, state + state_floats);
    r.push_back(static_cast<float>(meta.update_count));
    r.push_back(static_cast<float>(meta.last_step));
    return true;
  });
  EXPECT_TRUE(s.ok()) << s.ToString();
  return rows;
}

// The memory tier's Lookup and Apply of a whole request (whose loops load rows ahead of their
// turn) against the same keys one call per key: same rows out, same rows and state after, on
// random keys with repeats in a request, absent keys, rows created in the middle of a request,
// and a table whose admission (2 pushes) makes a row's existence depend on the order.
TEST(MemoryLaneStoreBatchTest, RequestsGiveWhatOneKeyCallsGive) {
  OptimizerSpec ada;
  ada.kind = OptimizerKind::kAdagrad;
  OptimizerSpec ftrl;
  ftrl.kind = OptimizerKind::kFtrl;
  TableSpec gated = TableSpec::Sparse("gated", 4, ada);
  gated.admission.min_count = 2;
  const std::vector<TableSpec> tables = {TableSpec::Sparse("emb", 8, ada),
                                         TableSpec::Sparse("wide", 1, ftrl), gated};
  auto batched_engine = NewMemoryStorageEngine(), single_engine = NewMemoryStorageEngine();
  auto batched = std::move(batched_engine->OpenLane(0, 1)).value();
  auto single = std::move(single_engine->OpenLane(0, 1)).value();
  for (size_t t = 0; t < tables.size(); ++t) {
    ASSERT_TRUE(batched->AddTable(t + 1, tables[t]).ok());
    ASSERT_TRUE(single->AddTable(t + 1, tables[t]).ok());
  }
  std::mt19937_64 rng(5);
  for (int round = 0; round < 40; ++round) {
    for (size_t t = 0; t < tables.size(); ++t) {
      const uint64_t id = t + 1;
      const uint32_t dim = tables[t].dim;
      std::vector<uint64_t> keys(1 + rng() % 400);
      for (uint64_t& k : keys) k = rng() % 3000;  // repeats; absent keys for many rounds
      std::vector<float> grads(keys.size() * dim);
      for (float& g : grads) g = static_cast<float>(static_cast<int>(rng() % 200) - 100) / 64;
      std::vector<const float*> grad_ptrs;
      for (size_t i = 0; i < keys.size(); ++i) grad_ptrs.push_back(&grads[i * dim]);
      const ApplyContext ctx{static_cast<uint64_t>(round + 1), 1000, 1.0f};
      if (round % 2 == 0) {  // pushes then pulls, and pulls only, in turn
        ASSERT_TRUE(batched->Apply(id, keys, grad_ptrs, ctx).ok());
        for (size_t i = 0; i < keys.size(); ++i) {
          ASSERT_TRUE(single->Apply(id, {&keys[i], 1}, {&grad_ptrs[i], 1}, ctx).ok());
        }
      }
      std::vector<float> got(keys.size() * dim), want(keys.size() * dim);
      std::vector<float*> got_ptrs, want_ptrs;
      for (size_t i = 0; i < keys.size(); ++i) {
        got_ptrs.push_back(&got[i * dim]);
        want_ptrs.push_back(&want[i * dim]);
      }
      ASSERT_TRUE(batched->Lookup(id, keys, got_ptrs).ok());
      for (size_t i = 0; i < keys.size(); ++i) {
        ASSERT_TRUE(single->Lookup(id, {&keys[i], 1}, {&want_ptrs[i], 1}).ok());
      }
      ASSERT_EQ(0, std::memcmp(got.data(), want.data(), sizeof(float) * got.size()))
          << "table " << tables[t].name << ", round " << round;
    }
  }
  for (size_t t = 0; t < tables.size(); ++t) {
    const auto want = AllRows(*single, t + 1, tables[t]);
    EXPECT_GT(want.size(), 100u);
    EXPECT_TRUE(AllRows(*batched, t + 1, tables[t]) == want) << "table " << tables[t].name;
    EXPECT_EQ(batched->stats().rows_in_memory, single->stats().rows_in_memory);
  }
}

}  // namespace
}  // namespace tessera::internal
