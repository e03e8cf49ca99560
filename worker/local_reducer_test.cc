#include "worker/local_reducer.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "worker/local_ranks.h"

namespace tessera::worker {
namespace {

// Runs fn(rank, member) on n threads.
template <typename Fn>
void RunGroup(uint32_t n, Fn fn) {
  auto group = CpuReduceGroup::Create(n);
  ASSERT_TRUE(group.ok());
  std::vector<std::thread> threads;
  for (uint32_t r = 0; r < n; ++r) {
    auto m = (*group)->Join(r);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    threads.emplace_back([&, r, m = std::move(*m)]() mutable { fn(r, m.get()); });
  }
  for (auto& t : threads) t.join();
}

class CpuReducer : public ::testing::TestWithParam<uint32_t> {};

TEST_P(CpuReducer, CollectivesHaveTheirSemantics) {
  const uint32_t n = GetParam();
  RunGroup(n, [n](uint32_t r, LocalReducer* red) {
    EXPECT_EQ(red->size(), n);
    EXPECT_EQ(red->leader(), r == 0);
    for (int round = 0; round < 3; ++round) {
      std::vector<uint64_t> keys = {100 + r, 7, 50};
      std::vector<uint64_t> all;
      ASSERT_TRUE(red->UnionKeys(keys, &all).ok());
      EXPECT_EQ(all.size(), 2 + n);
      EXPECT_TRUE(std::is_sorted(all.begin(), all.end()));

      std::vector<float> v = {1.0f * (r + 1), 2.0f};
      ASSERT_TRUE(red->ReduceSum(v).ok());
      if (r == 0) {
        EXPECT_FLOAT_EQ(v[0], n * (n + 1) / 2.0f);
        EXPECT_FLOAT_EQ(v[1], 2.0f * n);
      }
      std::vector<float> b = {r == 0 ? 42.0f : -1.0f};
      ASSERT_TRUE(red->Broadcast(b).ok());
      EXPECT_EQ(b[0], 42.0f);

      std::vector<uint64_t> g;
      ASSERT_TRUE(red->AllGather(r * 10, &g).ok());
      ASSERT_EQ(g.size(), n);
      for (uint32_t i = 0; i < n; ++i) EXPECT_EQ(g[i], i * 10);

      // Sparse merge: key 7 from everyone, key 100+r from rank r alone.
      std::vector<uint64_t> sk = {7, 100 + r};
      std::vector<float> sg = {1, 1, float(r), float(r)};
      std::vector<uint64_t> ok;
      std::vector<float> og;
      ASSERT_TRUE(red->ReduceSparse(sk, sg, 2, &ok, &og).ok());
      if (r == 0) {
        ASSERT_EQ(ok.size(), 1 + n);
        EXPECT_EQ(ok[0], 7u);
        EXPECT_FLOAT_EQ(og[0], float(n));
        for (uint32_t i = 0; i < n; ++i) EXPECT_FLOAT_EQ(og[2 * (1 + i)], float(i));
      }
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, CpuReducer, ::testing::Values(1u, 2u, 4u));

TEST(CpuReducerErrors, MismatchedLengthsFailEverywhereAndAbortCancels) {
  RunGroup(2, [](uint32_t r, LocalReducer* red) {
    std::vector<float> v(r == 0 ? 3 : 4);
    EXPECT_EQ(red->ReduceSum(v).code(), StatusCode::kInvalidArgument);
    if (r == 1) red->Abort(Status::Internal("rank 1 broke"));
    std::vector<uint64_t> g;
    Status s = red->AllGather(1, &g);
    // Rank 0 may have arrived before the abort; either way the group fails.
    if (r == 1) {
      EXPECT_EQ(s.code(), StatusCode::kCancelled);
      EXPECT_NE(s.message().find("rank 1 broke"), std::string::npos) << s.ToString();
    }
    EXPECT_EQ(red->Broadcast(v).code(), StatusCode::kCancelled);
  });
  EXPECT_FALSE(CpuReduceGroup::Create(0).ok());
  auto group = CpuReduceGroup::Create(2);
  EXPECT_EQ((*group)->Join(2).status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE((*group)->abort_reason().ok());
}

// A rank that fails before it joins (its backend or reader could not be set up) ends the ranks
// already waiting in a collective, and the node reports that rank's error: the hang of
// --backend=cuda --local_ranks=2 on a 1-GPU machine, on CPU ranks.
TEST(RunLocalRanks, ASetUpFailureEndsEveryRankWithItsMessage) {
  for (uint32_t failing : {0u, 1u, 3u}) {
    auto group = CpuReduceGroup::Create(4);
    ASSERT_TRUE(group.ok());
    const auto start = std::chrono::steady_clock::now();
    Status s = RunLocalRanks(4, group->get(), [&](uint32_t r) -> Status {
      if (r == failing) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        return Status::FailedPrecondition("GPU " + std::to_string(r) + " is missing");
      }
      TESSERA_ASSIGN_OR_RETURN(auto member, (*group)->Join(r));
      std::vector<uint64_t> all;
      return member->AllGather(r, &all);  // waits for the failing rank
    });
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
    EXPECT_EQ(s.message(), "local rank " + std::to_string(failing) + ": GPU " +
                               std::to_string(failing) + " is missing");
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  }
  // Without a group (one rank) the rank's error comes back as it is.
  EXPECT_EQ(RunLocalRanks(1, nullptr, [](uint32_t) { return Status::Internal("x"); }).message(),
            "x");
  EXPECT_TRUE(RunLocalRanks(3, nullptr, [](uint32_t) { return Status::OK(); }).ok());
}

}  // namespace
}  // namespace tessera::worker
