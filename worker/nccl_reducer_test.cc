// The NCCL group against the CPU group, and its aborts (suites named Gpu*: label gpu, skipped
// with the reason where there is no GPU), for min(GPU count, 2) ranks; and the choice and the
// refusals of a node's reducer, which need no GPU (label unit).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <random>
#include <thread>

#ifdef TESSERA_WITH_CUDA
#include <cuda_runtime.h>
#endif

#include "worker/backend.h"
#include "worker/backend_test_util.h"
#include "worker/local_ranks.h"
#include "worker/local_reducer.h"

namespace tessera::worker {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

TEST(NodeReducer, ChoiceDevicesAndDescription) {
  EXPECT_EQ(ChooseReducer("cpu", 1), ReducerKind::kNone);
  EXPECT_EQ(ChooseReducer("cuda", 1), ReducerKind::kNone);
  EXPECT_EQ(ChooseReducer("cpu", 2), ReducerKind::kCpu);
  EXPECT_EQ(ChooseReducer("cuda", 2), ReducerKind::kNccl);
  EXPECT_EQ(DeviceOfLocalRank(0, 1), 0);
  EXPECT_EQ(DeviceOfLocalRank(3, 2), 1);
  EXPECT_EQ(DeviceOfLocalRank(5, 8), 5);
  EXPECT_EQ(DescribeReducer(ReducerKind::kCpu, 4), "reducer: cpu (4 local ranks on CPU threads)");
  EXPECT_EQ(DescribeReducer(ReducerKind::kNone, 1), "reducer: none (1 local rank)");
}

// Without enough GPUs the NCCL group is refused at once, saying how many of each there are.
TEST(NodeReducer, NcclRefusedWithoutAGpuPerRank) {
  auto count = CudaDeviceCount();
  const uint32_t ranks = count.ok() ? static_cast<uint32_t>(*count) + 1 : 2;
  const auto start = Clock::now();
  auto group = CreateReduceGroup(ReducerKind::kNccl, ranks);
  EXPECT_LT(SecondsSince(start), 10.0);
  ASSERT_FALSE(group.ok());
  EXPECT_EQ(group.status().code(), StatusCode::kFailedPrecondition);
  if (count.ok()) {
    EXPECT_NE(group.status().message().find(std::to_string(ranks) + " local ranks need"),
              std::string::npos)
        << group.status().ToString();
    EXPECT_NE(group.status().message().find("this machine has " + std::to_string(*count)),
              std::string::npos)
        << group.status().ToString();
  } else {
    EXPECT_NE(group.status().message().find("GPU"), std::string::npos) << group.status().ToString();
  }
  NcclReduceGroupOptions o;
  o.size = 0;
  EXPECT_FALSE(CreateNcclReduceGroup(o).ok());
}

// min(GPU count, 2) NCCL ranks, or a skip with the reason.
uint32_t NcclRanksOrSkip(std::string* why) {
  auto count = CudaDeviceCount();
  if (!count.ok()) {
    *why = count.status().message();
    return 0;
  }
  return static_cast<uint32_t>(std::min(*count, 2));
}

// Runs fn(rank, member) on one thread per rank of `group`.
template <typename Fn>
void OnRanks(ReduceGroup* group, Fn fn) {
  std::vector<std::thread> threads;
  for (uint32_t r = 0; r < group->size(); ++r) {
    threads.emplace_back([&, r] {
      auto m = group->Join(r);
      ASSERT_TRUE(m.ok()) << m.status().ToString();
      fn(r, m->get());
    });
  }
  for (auto& t : threads) t.join();
}

// What one rank saw of a fixed script of collectives.
struct Seen {
  std::vector<uint64_t> keys, gathered, sparse_keys;
  std::vector<float> sum, broadcast, sparse;
};

Seen Script(uint32_t r, LocalReducer* red) {
  Seen s;
  const std::vector<uint64_t> keys = {100 + r, 7, 50, 1000 * (r + 1)};
  EXPECT_TRUE(red->UnionKeys(keys, &s.keys).ok());
  s.sum = {1.5f * (r + 1), -2.0f, 0.25f * r, 3.0f};
  EXPECT_TRUE(red->ReduceSum(s.sum).ok());
  s.broadcast = {r == 0 ? 42.0f : -1.0f, 7.0f * r};
  EXPECT_TRUE(red->Broadcast(s.broadcast).ok());
  EXPECT_TRUE(red->AllGather(r * 10 + 3, &s.gathered).ok());
  const std::vector<uint64_t> sk = {7, 100 + r};
  const std::vector<float> sg = {1, 2, float(r), float(r) + 0.5f};
  EXPECT_TRUE(red->ReduceSparse(sk, sg, 2, &s.sparse_keys, &s.sparse).ok());
  std::vector<float> empty;
  EXPECT_TRUE(red->ReduceSum(empty).ok());
  return s;
}

TEST(GpuNcclReducer, CollectivesEqualTheCpuReducer) {
  std::string why;
  const uint32_t n = NcclRanksOrSkip(&why);
  if (n == 0) GTEST_SKIP() << "no GPU for NCCL: " << why;
  NcclReduceGroupOptions o;
  o.size = n;
  auto nccl = CreateNcclReduceGroup(o);
  ASSERT_TRUE(nccl.ok()) << nccl.status().ToString();
  auto cpu = CpuReduceGroup::Create(n);
  std::vector<Seen> a(n), b(n);
  OnRanks(nccl->get(), [&](uint32_t r, LocalReducer* red) {
    EXPECT_EQ(red->device(), static_cast<int>(r));
    a[r] = Script(r, red);
  });
  OnRanks(cpu->get(), [&](uint32_t r, LocalReducer* red) { b[r] = Script(r, red); });
  for (uint32_t r = 0; r < n; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    EXPECT_EQ(a[r].keys, b[r].keys);
    EXPECT_EQ(a[r].gathered, b[r].gathered);
    EXPECT_EQ(a[r].broadcast, b[r].broadcast);
    if (r == 0) {  // the sums are defined on the leader only
      EXPECT_EQ(a[r].sum, b[r].sum);
      EXPECT_EQ(a[r].sparse_keys, b[r].sparse_keys);
      EXPECT_EQ(a[r].sparse, b[r].sparse);
    }
  }
}

// UnionKeys sorts and dedupes on the GPU: unsorted keys with repeats, the extremes of the key
// space, lists of different lengths (one empty when there are 2 ranks), and rounds in which every
// list is empty, equal to the CPU group's union, on every rank, round after round (the
// buffers grow and shrink).
TEST(GpuNcclReducer, UnionOfManyKeysEqualsTheCpuReducer) {
  std::string why;
  const uint32_t n = NcclRanksOrSkip(&why);
  if (n == 0) GTEST_SKIP() << "no GPU for NCCL: " << why;
  const std::vector<size_t> sizes = {100000, 0, 7, 250000, 1};
  auto keys_of = [&](uint32_t rank, size_t round) {
    std::vector<uint64_t> k;
    if (rank == 1 && round % 2 == 0) return k;  // an empty rank
    std::mt19937_64 rng(round * 31 + rank);
    const size_t len = sizes[round] + rank * 13 * (sizes[round] > 0);
    for (size_t i = 0; i < len; ++i) {
      // A quarter from a small range (repeats within and across ranks), the rest anywhere.
      k.push_back(i % 4 == 0 ? rng() % 1000 : rng());
    }
    if (len > 2) {
      k[1] = 0;
      k[2] = ~uint64_t{0};
    }
    return k;
  };
  auto run = [&](ReduceGroup* group) {
    std::vector<std::vector<std::vector<uint64_t>>> seen(n);
    OnRanks(group, [&](uint32_t r, LocalReducer* red) {
      for (size_t round = 0; round < sizes.size(); ++round) {
        std::vector<uint64_t> out = {42};
        const Status s = red->UnionKeys(keys_of(r, round), &out);
        EXPECT_TRUE(s.ok()) << s.ToString();
        seen[r].push_back(out);
      }
    });
    return seen;
  };
  NcclReduceGroupOptions o;
  o.size = n;
  auto nccl = CreateNcclReduceGroup(o);
  ASSERT_TRUE(nccl.ok()) << nccl.status().ToString();
  auto cpu = CpuReduceGroup::Create(n);
  const auto a = run(nccl->get());
  const auto b = run(cpu->get());
  for (uint32_t r = 0; r < n; ++r) {
    for (size_t round = 0; round < sizes.size(); ++round) {
      SCOPED_TRACE("rank " + std::to_string(r) + ", round " + std::to_string(round));
      ASSERT_EQ(a[r].size(), sizes.size());
      EXPECT_EQ(a[r][round].size(), b[r][round].size());
      EXPECT_TRUE(a[r][round] == b[r][round]);
      EXPECT_TRUE(std::is_sorted(a[r][round].begin(), a[r][round].end()));
      EXPECT_TRUE(std::adjacent_find(a[r][round].begin(), a[r][round].end()) == a[r][round].end());
    }
  }
  EXPECT_TRUE(a[0][1].empty());  // round 1: every list is empty
}

// One training step per rank with the gradients reduced on the GPUs (CUDA backend + NCCL)
// equals the same step on CPU backends reduced by the CPU group, also with the batch staged
// before the step.
TEST(GpuNcclReducer, DeviceReductionOfAStepEqualsTheCpuPath) {
  std::string why;
  const uint32_t n = NcclRanksOrSkip(&why);
  if (n == 0) GTEST_SKIP() << "no GPU for NCCL: " << why;
  const testing::BackendCase c = testing::BackendCases()[2];  // mean pooling, weighted bags
  auto layout = ModelLayout::Create(c.config);
  ASSERT_TRUE(layout.ok());
  // Every rank has its own batch over the same rows (the node's union of keys).
  std::vector<testing::StepInput> steps;
  for (uint32_t r = 0; r < n; ++r) {
    testing::BackendCase mine = c;
    mine.seed += 100 * r;
    mine.rows = {c.rows[1], c.rows[1]};
    steps.push_back(testing::MakeStep(*layout, mine, 1));
    steps.back().params = steps[0].params;
    steps.back().emb = steps[0].emb;
    steps.back().wide = steps[0].wide;
  }
  // staged: the batch is staged (Backend::Stage) before the step, as a pipelined trainer does.
  auto run = [&](ReduceGroup* group, bool gpu, bool staged = false) {
    std::vector<testing::Outputs> out(n);
    OnRanks(group, [&](uint32_t r, LocalReducer* red) {
      auto backend =
          gpu ? CreateCudaBackend(*layout, static_cast<int>(r)) : CreateCpuBackend(*layout);
      ASSERT_TRUE(backend.ok()) << backend.status().ToString();
      if (staged) {
        ASSERT_TRUE((*backend)->Stage(steps[r].Input()).ok());
      }
      out[r].probs.resize(steps[r].batch);
      Status s = (*backend)->ForwardBackwardReduced(steps[r].Input(), 0.5f, out[r].probs.data(),
                                                    &out[r].grads, red);
      EXPECT_TRUE(s.ok()) << s.ToString();
    });
    return out;
  };
  NcclReduceGroupOptions o;
  o.size = n;
  auto nccl = CreateNcclReduceGroup(o);
  ASSERT_TRUE(nccl.ok()) << nccl.status().ToString();
  auto cpu = CpuReduceGroup::Create(n);
  const auto a = run(nccl->get(), true);
  const auto b = run(cpu->get(), false);
  EXPECT_EQ(testing::CompareOutputs(*layout, b[0], a[0]), "");
  for (uint32_t r = 1; r < n; ++r) {
    EXPECT_TRUE(a[r].grads.params.empty()) << "a non-leader copied gradients back";
  }
  auto nccl2 = CreateNcclReduceGroup(o);
  ASSERT_TRUE(nccl2.ok()) << nccl2.status().ToString();
  const auto staged = run(nccl2->get(), true, true);
  EXPECT_EQ(testing::CompareOutputs(*layout, b[0], staged[0]), "") << "batch staged first";
}

// Abort from any rank ends every other rank's wait within a second: in a collective that the
// aborting rank never joins, and in Join itself (a rank whose set-up failed).
TEST(GpuNcclReducer, AbortFromAnyRankEndsAllWithinASecond) {
  std::string why;
  const uint32_t n = NcclRanksOrSkip(&why);
  if (n < 2) GTEST_SKIP() << "needs 2 GPUs (the 1-GPU case: AbortEndsAWaitForTheDevice): " << why;
  for (uint32_t aborter = 0; aborter < n; ++aborter) {
    SCOPED_TRACE("aborting rank " + std::to_string(aborter));
    NcclReduceGroupOptions o;
    o.size = n;
    auto group = CreateNcclReduceGroup(o);
    ASSERT_TRUE(group.ok()) << group.status().ToString();
    std::atomic<double> aborted_at{0};
    const auto t0 = Clock::now();
    OnRanks(group->get(), [&](uint32_t r, LocalReducer* red) {
      std::vector<uint64_t> out;
      ASSERT_TRUE(red->AllGather(r, &out).ok());  // everyone is in
      if (r == aborter) {
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        aborted_at = SecondsSince(t0);
        red->Abort(Status::Internal("rank " + std::to_string(r) + " failed on purpose"));
        return;
      }
      std::vector<float> v(1 << 20, 1.0f);
      Status s = red->ReduceSum(v);  // waits for the aborter, which never comes
      EXPECT_EQ(s.code(), StatusCode::kCancelled) << s.ToString();
      EXPECT_NE(s.message().find("failed on purpose"), std::string::npos) << s.ToString();
      EXPECT_LT(SecondsSince(t0) - aborted_at, 1.0);
    });
  }
  // A rank that never joins: the others' Join ends with its reason.
  NcclReduceGroupOptions o;
  o.size = n;
  auto group = CreateNcclReduceGroup(o);
  ASSERT_TRUE(group.ok());
  std::vector<std::thread> threads;
  const auto t0 = Clock::now();
  for (uint32_t r = 1; r < n; ++r) {
    threads.emplace_back([&, r] {
      auto m = (*group)->Join(r);
      EXPECT_EQ(m.status().code(), StatusCode::kCancelled) << m.status().ToString();
      EXPECT_LT(SecondsSince(t0), 1.5);
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  (*group)->Abort(Status::FailedPrecondition("local rank 0: cudaSetDevice failed (simulated)"));
  for (auto& t : threads) t.join();
}

#ifdef TESSERA_WITH_CUDA
// With one GPU: a rank waiting for its device (a stream kept busy for 2 s) returns Cancelled
// within a second of an abort from another thread, without waiting for the device.
TEST(GpuNcclReducer, AbortEndsAWaitForTheDevice) {
  std::string why;
  const uint32_t n = NcclRanksOrSkip(&why);
  if (n == 0) GTEST_SKIP() << "no GPU for NCCL: " << why;
  NcclReduceGroupOptions o;
  o.size = 1;
  auto group = CreateNcclReduceGroup(o);
  ASSERT_TRUE(group.ok()) << group.status().ToString();
  auto member = (*group)->Join(0);
  ASSERT_TRUE(member.ok()) << member.status().ToString();
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(
      cudaLaunchHostFunc(
          stream, [](void*) { std::this_thread::sleep_for(std::chrono::seconds(2)); }, nullptr),
      cudaSuccess);
  const auto t0 = Clock::now();
  std::thread aborter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    (*group)->Abort(Status::Internal("another rank failed"));
  });
  Status s = (*member)->WaitDevice(stream);
  const double waited = SecondsSince(t0);
  aborter.join();
  EXPECT_EQ(s.code(), StatusCode::kCancelled) << s.ToString();
  EXPECT_LT(waited, 1.2);
  std::vector<float> one = {1.0f};
  EXPECT_EQ((*member)->ReduceSum(one).code(), StatusCode::kCancelled);
  cudaStreamSynchronize(stream);
  cudaStreamDestroy(stream);
}
#endif

}  // namespace
}  // namespace tessera::worker
