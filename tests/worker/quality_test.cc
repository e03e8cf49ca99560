// Training quality on the CPU path, through real processes: 2 tessera-server and tessera-worker
// processes on 127.0.0.1, as examples/ctr/run_local.sh runs them.
//  - Generated data, the default run (about 1 minute on 2 cores): test AUC within 0.01 of the
//    oracle AUC, asynchronous, bulk-synchronous and bounded staleness (2 clocks).
//  - The same for DeepFM and DCN-v2 (--model=deepfm, --model=dcn), asynchronous.
//  - MovieLens ml-latest-small: DLRM's test AUC beats the wide-only model's by a margin.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include "tests/worker/worker_cluster_fixture.h"

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
// worker 0's report (empty on failure, with the failure recorded). No time limit of its own
// short of ctest's (a quality bar must not depend on the machine's speed or load).
std::map<std::string, double> RunJob(const std::vector<std::string>& flags, uint32_t workers = 2,
                                     double timeout_s = 3600,
                                     const std::vector<std::string>& server_flags = {}) {
  testing::LocalClusterOptions co = testing::Servers(2);
  co.extra_flags = server_flags;
  LocalCluster cluster(co);
  Status s = cluster.Start();
  if (!s.ok()) {
    ADD_FAILURE() << s.ToString();
    return {};
  }
  const std::string servers = testing::ServerList(cluster);
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
  double trained = 0;  // the samples of every worker's "worker W trained N samples" line
  for (uint32_t w = 0; w < workers; ++w) {
    const double left =
        timeout_s - std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const int rc = procs[w]->Wait(std::max(left, 1.0));
    const std::string out = procs[w]->Output();
    if (rc != 0) {
      ADD_FAILURE() << "worker " << w << " exit code " << rc << ":\n" << out;
      return {};  // the others are killed by their destructors
    }
    std::smatch m;
    if (std::regex_search(out, m, std::regex("worker [0-9]+ trained ([0-9]+) samples"))) {
      trained += std::stod(m[1]);
    }
    if (w == 0) {
      report = testing::ParseWorkerReport(out);
      if (report.count("test_auc") == 0) ADD_FAILURE() << "no report in:\n" << out;
      const size_t p = out.rfind("test samples");
      std::printf("%s", out.substr(p == std::string::npos ? 0 : p).c_str());
    }
  }
  // The report's totals are the job's: every worker's samples.
  if (report.count("train_samples")) {
    EXPECT_EQ(report.at("train_samples"), trained);
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

// DeepFM and DCN-v2 (--model) on the default run's data (2.5 M samples), with the same bar and
// RunJob's time limit (none short of ctest's). Each changes one or two flags from the defaults,
// measured in docs/worker.md ("Models"):
//  - DeepFM with --emb_lr=0.02: at the default 0.05 the FM term's first steps blow the loss up
//    (2.2 over the first 13 steps) and the gap was 0.008-0.010 over three runs (0.007 at 0.02).
//  - DCN-v2 with --dense_lr=0.001: at 0.003 the bottom MLP died (every output ReLU off, the
//    dense features ignored, test AUC 0.678) in most runs; and one cross layer: three (the
//    default) trained 1.6 times as long on the shared 2 cores for the same gap.
TEST(WorkerQualityTest, DeepFmWithinBarOfOracle) {
  ExpectNearOracle(RunJob({"--consistency=async", "--model=deepfm", "--emb_lr=0.02"}),
                   kDefaultRunGap);
}

TEST(WorkerQualityTest, DcnWithinBarOfOracle) {
  ExpectNearOracle(
      RunJob({"--consistency=async", "--model=dcn", "--cross_layers=1", "--dense_lr=0.001"}),
      kDefaultRunGap);
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

// MovieLens with --epochs=50: validation after each epoch (its part the latest tenth of the
// training part, by time as the test split) stops the job by itself, and the state tested is the
// best round's, kept as a checkpoint under --admin_root and restored: scored on the validation
// part again it gives the best round's AUC exactly.
TEST(WorkerQualityTest, MovieLensEarlyStoppingRestoresTheBestState) {
  const std::string dir = TESSERA_MOVIELENS_DIR;
  if (!std::filesystem::exists(dir + "/ratings.csv")) {
    GTEST_SKIP() << "MovieLens ml-latest-small not found at " << dir
                 << " (download it there to run this test)";
  }
  const std::string admin = (std::filesystem::temp_directory_path() /
                             ("tessera-early-stop-" + std::to_string(getpid())))
                                .string();
  std::filesystem::create_directories(admin);
  const auto r = RunJob({"--data=movielens:" + dir, "--epochs=50", "--batch_size=256",
                         "--shuffle_buffer=20000", "--admin_root=" + admin,
                         "--out_dir=" + admin + "/out"},
                        2, 3600, {"--admin_root=" + admin});
  std::filesystem::remove_all(admin);
  ASSERT_TRUE(r.count("test_auc")) << "no report";
  ASSERT_TRUE(r.count("early_stopped") && r.count("best_validation_step"));
  std::printf("MovieLens early stopping: %g steps, best step %g (validation auc %.4f), test auc "
              "%.4f\n",
              r.at("steps"), r.at("best_validation_step"), r.at("best_validation_auc"),
              r.at("test_auc"));
  // The 50 epochs would be about 7,000 steps of 256 per worker; it over-fits within a few.
  EXPECT_EQ(r.at("early_stopped"), 1) << "did not stop by itself";
  EXPECT_LT(r.at("steps"), 7000 / 4);
  EXPECT_EQ(r.at("tested_step"), r.at("best_validation_step"));
  if (r.at("best_validation_step") < r.at("steps")) {
    ASSERT_TRUE(r.count("restored_validation_auc")) << "the best state was not restored";
    EXPECT_NEAR(r.at("restored_validation_auc"), r.at("best_validation_auc"), 1e-9);
  }
  EXPECT_GT(r.at("test_auc"), 0.65);
}

}  // namespace
}  // namespace tessera
