// The memory tier's block memory: BlockPool pieces and the huge-page allocations under them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <set>
#include <thread>
#include <vector>

#include "ps/optimizer.h"
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

}  // namespace
}  // namespace tessera::internal
