// Training quality on the CPU path, through real processes: 2 tessera-server and tessera-worker
// processes on 127.0.0.1, as examples/ctr/run_local.sh runs them.
//  - Generated data, the default run (about 1 minute on 2 cores): test AUC within 0.01 of the
//    oracle AUC, asynchronous, bulk-synchronous and bounded staleness (2 clocks).
//  - MovieLens ml-latest-small: DLRM's test AUC beats the wide-only model's by a margin.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include "tests/cluster_fixture.h"
#include "tests/worker/worker_process.h"

#ifndef TESSERA_WORKER_BINARY
#error "TESSERA_WORKER_BINARY must name the tessera-worker executable"
#endif
#ifndef TESSERA_MOVIELENS_DIR
#error "TESSERA_MOVIELENS_DIR must name the ml-latest-small directory"
#endif

namespace tessera {
namespace {

using testing::ChildProcess;
using testing::LocalCluster;

// The bar of the default run.
constexpr double kDefaultRunGap = 0.01;

// Runs `workers` tessera-worker processes with `flags` on a fresh 2-server cluster; returns
// worker 0's report (empty on failure, with the failure recorded).
std::map<std::string, double> RunJob(const std::vector<std::string>& flags, uint32_t workers = 2,
                                     double timeout_s = 150) {
  LocalCluster cluster(testing::Servers(2));
  Status s = cluster.Start();
  if (!s.ok()) {
    ADD_FAILURE() << s.ToString();
    return {};
  }
  const std::string servers = cluster.endpoints()[0] + "," + cluster.endpoints()[1];
  std::vector<std::unique_ptr<ChildProcess>> procs;
  for (uint32_t w = 0; w < workers; ++w) {
    std::vector<std::string> argv = {TESSERA_WORKER_BINARY, "--servers=" + servers,
                                     "--worker_id=" + std::to_string(w),
                                     "--num_workers=" + std::to_string(workers)};
    argv.insert(argv.end(), flags.begin(), flags.end());
    procs.push_back(std::make_unique<ChildProcess>());
    if (!procs.back()->Start(argv, cluster.dir() + "/worker" + std::to_string(w) + ".log")) {
      ADD_FAILURE() << "fork failed";
      return {};
    }
  }
  const auto start = std::chrono::steady_clock::now();
  std::map<std::string, double> report;
  for (uint32_t w = 0; w < workers; ++w) {
    const double left =
        timeout_s - std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const int rc = procs[w]->Wait(std::max(left, 1.0));
    const std::string out = procs[w]->Output();
    if (rc != 0) {
      ADD_FAILURE() << "worker " << w << " exit code " << rc << ":\n" << out;
      return {};  // the others are killed by their destructors
    }
    if (w == 0) {
      report = testing::ParseWorkerReport(out);
      if (report.count("test_auc") == 0) ADD_FAILURE() << "no report in:\n" << out;
      const size_t p = out.rfind("test samples");
      std::printf("%s", out.substr(p == std::string::npos ? 0 : p).c_str());
    }
  }
  return report;
}

void ExpectNearOracle(const std::map<std::string, double>& r, double bar) {
  ASSERT_TRUE(r.count("test_auc") && r.count("oracle_auc"));
  const double gap = r.at("oracle_auc") - r.at("test_auc");
  std::printf("test_auc %.4f oracle_auc %.4f gap %.4f (bar %.3f) train %.1f s\n", r.at("test_auc"),
              r.at("oracle_auc"), gap, bar, r.at("train_seconds"));
  EXPECT_LE(gap, bar);
  EXPECT_GT(r.at("test_auc"), 0.6);  // not a degenerate run
}

// The main job's defaults: only the cluster and the worker's place in it are given.
TEST(WorkerQualityTest, DefaultRunAsyncWithinBarOfOracle) {
  ExpectNearOracle(RunJob({"--consistency=async"}), kDefaultRunGap);
}

// Bulk-synchronous and bounded staleness reach the same bar with the same default run.
TEST(WorkerQualityTest, DefaultRunBulkSynchronousWithinBarOfOracle) {
  ExpectNearOracle(RunJob({"--consistency=bsp"}), kDefaultRunGap);
}

TEST(WorkerQualityTest, DefaultRunBoundedStalenessWithinBarOfOracle) {
  ExpectNearOracle(RunJob({"--consistency=ssp", "--staleness=2"}), kDefaultRunGap);
}

// MovieLens ml-latest-small: DLRM (+ wide) vs wide only, same data, same split, same epochs.
constexpr double kMovieLensMargin = 0.003;

TEST(WorkerQualityTest, MovieLensDlrmBeatsWideOnly) {
  const std::string dir = TESSERA_MOVIELENS_DIR;
  if (!std::filesystem::exists(dir + "/ratings.csv")) {
    GTEST_SKIP() << "MovieLens ml-latest-small not found at " << dir
                 << " (download it there to run this test)";
  }
  const std::vector<std::string> common = {"--data=movielens:" + dir, "--epochs=4",
                                           "--batch_size=256", "--shuffle_buffer=20000"};
  auto with = [&](std::vector<std::string> more) {
    more.insert(more.begin(), common.begin(), common.end());
    return more;
  };
  const auto dlrm = RunJob(with({"--job=dlrm"}), 1);
  const auto wide = RunJob(with({"--job=wide", "--deep=false"}), 1);
  ASSERT_TRUE(dlrm.count("test_auc") && wide.count("test_auc"));
  const double margin = dlrm.at("test_auc") - wide.at("test_auc");
  std::printf("MovieLens test AUC: dlrm %.4f wide %.4f margin %.4f (bar %.3f)\n",
              dlrm.at("test_auc"), wide.at("test_auc"), margin, kMovieLensMargin);
  EXPECT_GE(margin, kMovieLensMargin);
}

}  // namespace
}  // namespace tessera
