// The tessera-worker binary's choice of reducer and of GPUs: the line that names the reducer a
// run uses, the refusal of --backend=cuda where the GPUs are missing (at once, never a hang),
// and, on a GPU machine (suites named Gpu*: label gpu), a CUDA run that trains like the CPU one
// and a multi-GPU node that reduces with NCCL.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <regex>
#include <string>
#include <vector>

#include "tests/cluster_fixture.h"
#include "tests/worker/worker_process.h"
#include "worker/backend.h"

#ifndef TESSERA_WORKER_BINARY
#error "TESSERA_WORKER_BINARY must name the tessera-worker executable"
#endif

namespace tessera {
namespace {

using testing::ChildProcess;
using testing::LocalCluster;

// A short BSP training run of one node: 20 steps of 256 samples per local rank.
std::vector<std::string> Args(const std::string& servers, const std::string& job,
                              const std::string& backend, uint32_t local_ranks) {
  return {TESSERA_WORKER_BINARY,
          "--servers=" + servers,
          "--job=" + job,
          "--backend=" + backend,
          "--local_ranks=" + std::to_string(local_ranks),
          "--consistency=bsp",
          "--train_samples=40000",
          "--test_samples=1000",
          "--batch_size=256",
          "--max_steps=20",
          "--synthetic_max_cardinality=2000",
          "--bottom_mlp=16",
          "--top_mlp=16",
          "--evaluate=false",
          "--request_timeout_ms=20000"};
}

struct WorkerRun {
  int rc = -1;
  double seconds = 0;
  std::string out;
};

WorkerRun RunWorker(const std::vector<std::string>& argv, const std::string& log,
                    double timeout_s) {
  ChildProcess p;
  WorkerRun r;
  const auto start = std::chrono::steady_clock::now();
  if (!p.Start(argv, log)) return r;
  r.rc = p.Wait(timeout_s);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  r.out = p.Output();
  return r;
}

// The mean training loss the worker reports; NaN when there is no such line.
double TrainLoss(const std::string& out) {
  std::smatch m;
  if (!std::regex_search(out, m, std::regex(R"(train loss ([0-9.]+))"))) return std::nan("");
  return std::stod(m[1]);
}

TEST(WorkerCli, ReducerLineNamesTheCpuReducer) {
  LocalCluster cluster(testing::Servers(1));
  ASSERT_TRUE(cluster.Start().ok());
  const std::string servers = cluster.endpoints()[0];
  WorkerRun two = RunWorker(Args(servers, "cli2", "cpu", 2), cluster.dir() + "/two.log", 120);
  ASSERT_EQ(two.rc, 0) << two.out;
  EXPECT_NE(two.out.find("reducer: cpu (2 local ranks on CPU threads)"), std::string::npos)
      << two.out;
  EXPECT_NE(two.out.find("20 steps"), std::string::npos) << two.out;
  WorkerRun one = RunWorker(Args(servers, "cli1", "cpu", 1), cluster.dir() + "/one.log", 120);
  ASSERT_EQ(one.rc, 0) << one.out;
  EXPECT_NE(one.out.find("reducer: none (1 local rank)"), std::string::npos) << one.out;
}

// No GPU here: --backend=cuda is refused before the worker connects anywhere (no server runs at
// that address), with the reason, for one rank and for an NCCL node.
TEST(WorkerCli, CudaBackendRefusedAtOnceWithoutAGpu) {
  std::string why;
  if (worker::CudaBackendAvailable(&why)) {
    GTEST_SKIP() << "a GPU is present: WorkerCliGpu covers --backend=cuda";
  }
  for (uint32_t ranks : {1u, 2u}) {
    WorkerRun r = RunWorker(Args("tcp://127.0.0.1:9", "nogpu", "cuda", ranks),
                            ::testing::TempDir() + "/nogpu.log", 30);
    EXPECT_EQ(r.rc, 1) << r.out;
    EXPECT_LT(r.seconds, 10.0) << r.out;
    EXPECT_NE(r.out.find("--backend=cuda: no usable GPU"), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("reducer:"), std::string::npos) << r.out;
  }
  WorkerRun bad =
      RunWorker(Args("tcp://127.0.0.1:9", "bad", "tpu", 1), ::testing::TempDir() + "/bad.log", 30);
  EXPECT_EQ(bad.rc, 1) << bad.out;
  EXPECT_NE(bad.out.find("--backend must be cpu or cuda"), std::string::npos) << bad.out;
}

// On a GPU: the CUDA backend trains the same 20 BSP steps to the CPU's loss; with 2 GPUs or more
// a node of 2 local ranks reduces with NCCL, with one GPU it is refused at once.
TEST(WorkerCliGpu, CudaRunsTrainLikeCpuAndMultiGpuNodesUseNccl) {
  auto gpus = worker::CudaDeviceCount();
  if (!gpus.ok()) GTEST_SKIP() << "no GPU: " << gpus.status().message();
  LocalCluster cluster(testing::Servers(1));
  ASSERT_TRUE(cluster.Start().ok());
  const std::string servers = cluster.endpoints()[0];
  WorkerRun cpu = RunWorker(Args(servers, "gcpu", "cpu", 1), cluster.dir() + "/cpu.log", 300);
  WorkerRun cuda = RunWorker(Args(servers, "gcuda", "cuda", 1), cluster.dir() + "/cuda.log", 300);
  ASSERT_EQ(cpu.rc, 0) << cpu.out;
  ASSERT_EQ(cuda.rc, 0) << cuda.out;
  EXPECT_NE(cuda.out.find("reducer: none (1 local rank)"), std::string::npos) << cuda.out;
  EXPECT_NEAR(TrainLoss(cuda.out), TrainLoss(cpu.out), 2e-3 * TrainLoss(cpu.out))
      << cpu.out << cuda.out;
  if (*gpus >= 2) {
    WorkerRun cpu2 = RunWorker(Args(servers, "gcpu2", "cpu", 2), cluster.dir() + "/cpu2.log", 300);
    WorkerRun nccl = RunWorker(Args(servers, "gnccl", "cuda", 2), cluster.dir() + "/nccl.log", 300);
    ASSERT_EQ(cpu2.rc, 0) << cpu2.out;
    ASSERT_EQ(nccl.rc, 0) << nccl.out;
    EXPECT_NE(nccl.out.find("reducer: nccl (2 local ranks on GPUs 0,1)"), std::string::npos)
        << nccl.out;
    EXPECT_NEAR(TrainLoss(nccl.out), TrainLoss(cpu2.out), 2e-3 * TrainLoss(cpu2.out))
        << cpu2.out << nccl.out;
  } else {
    WorkerRun two = RunWorker(Args(servers, "g2", "cuda", 2), cluster.dir() + "/two.log", 30);
    EXPECT_EQ(two.rc, 1) << two.out;
    EXPECT_LT(two.seconds, 10.0) << two.out;
    EXPECT_NE(two.out.find("2 local ranks need 2 GPUs for NCCL"), std::string::npos) << two.out;
  }
}

}  // namespace
}  // namespace tessera
