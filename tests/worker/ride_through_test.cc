// Training jobs ride through server crashes (label faults): tessera-worker processes on a
// 2-server cluster with RocksDB (strict durability), bulk-synchronous. Each server is killed
// with SIGKILL once during training and restarted about a second later; no worker is
// restarted. The workers' clients retry calls to the dead server and a retried push applies
// exactly once (client id + per-server sequence number, logged with the request log).
//  - 2 workers: both exit 0 by themselves, and the test AUC is within 0.003 of the same run
//    without faults.
//  - 1 worker: every row and dense chunk, optimizer state included, is bit-identical to the
//    same run without faults (read from a checkpoint taken after training).
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ps/record_file_internal.h"
#include "tests/worker/worker_cluster_fixture.h"

namespace tessera {
namespace {

using testing::ChildProcess;
using testing::LocalCluster;

constexpr uint32_t kServers = 2;

// Pushes server `rank` has applied since it started (its stats line), or -1 when unreachable.
int64_t Pushes(Client* admin, uint32_t rank) { return testing::ServerStat(*admin, rank, "pushes"); }

// Every row and dense chunk of a checkpoint: (table, kind, key) -> value and optimizer state.
using Rows = std::map<std::tuple<uint64_t, int, uint64_t>, std::vector<float>>;

struct JobResult {
  std::map<std::string, double> report;  // worker 0's
  Rows rows;                             // 1 worker only: the final parameters
  uint64_t retried_pushes = 0;           // pushes the servers answered as retries
};

// The job: `workers` tessera-worker processes, BSP, on a fresh 2-server cluster with data
// dirs. With `faults`, server 0 is killed once it has applied a third of `pushes_of_clean`
// (its count in the run without faults) and server 1 at two thirds of its count, each
// restarted about a second later.
JobResult RunJob(uint32_t workers, bool faults, const std::vector<int64_t>& pushes_of_clean) {
  testing::LocalClusterOptions copts = testing::Servers(kServers);
  copts.with_data_dirs = true;
  LocalCluster cluster(copts);
  JobResult result;
  Status s = cluster.Start();
  if (!s.ok()) {
    ADD_FAILURE() << s.ToString();
    return result;
  }
  const std::string servers = testing::ServerList(cluster);
  std::vector<std::unique_ptr<ChildProcess>> procs;
  for (uint32_t w = 0; w < workers; ++w) {
    const std::vector<std::string> argv = {TESSERA_WORKER_BINARY,
                                           "--servers=" + servers,
                                           "--worker_id=" + std::to_string(w),
                                           "--num_workers=" + std::to_string(workers),
                                           "--consistency=bsp",
                                           "--job=rt",
                                           "--train_samples=120000",
                                           "--test_samples=20000",
                                           "--batch_size=512",
                                           "--synthetic_max_cardinality=5000",
                                           "--embedding_dim=8",
                                           "--bottom_mlp=16",
                                           "--top_mlp=16",
                                           "--progress_interval_s=2",
                                           "--retry_for_ms=120000"};
    procs.push_back(std::make_unique<ChildProcess>());
    if (!procs.back()->Start(argv, cluster.dir() + "/worker" + std::to_string(w) + ".log")) {
      ADD_FAILURE() << "fork failed";
      return result;
    }
  }
  auto admin = testing::ConnectObserver(cluster);
  if (!admin.ok()) {
    ADD_FAILURE() << admin.status().ToString();
    return result;
  }
  std::vector<int64_t> pushes(kServers, 0);
  if (faults) {
    const double fraction[kServers] = {1.0 / 3, 2.0 / 3};
    for (uint32_t r = 0; r < kServers; ++r) {
      const int64_t at = static_cast<int64_t>(pushes_of_clean[r] * fraction[r]);
      // Progress, not time: wait until the server has applied that many pushes.
      while (Pushes(admin->get(), r) < at) {
        bool alive = false;
        for (auto& p : procs) alive |= p->Running();
        if (!alive) {
          ADD_FAILURE() << "the workers ended before server " << r << " was killed";
          return result;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      pushes[r] += Pushes(admin->get(), r);
      cluster.Kill(r);
      std::this_thread::sleep_for(std::chrono::seconds(1));
      s = cluster.Restart(r);
      if (!s.ok()) {
        ADD_FAILURE() << "restarting server " << r << ": " << s.ToString();
        return result;
      }
    }
  }
  for (uint32_t w = 0; w < workers; ++w) {
    // No wall-clock bar of our own: ctest's timeout is the limit.
    const int rc = procs[w]->Wait(1e9);
    const std::string out = procs[w]->Output();
    if (rc != 0) {
      ADD_FAILURE() << "worker " << w << " exit code " << rc << ":\n" << out;
      return result;
    }
    if (w == 0) {
      result.report = testing::ParseWorkerReport(out);
      if (result.report.count("test_auc") == 0) ADD_FAILURE() << "no report in:\n" << out;
    }
  }
  for (uint32_t r = 0; r < kServers; ++r) {
    const int64_t retried = testing::ServerStat(**admin, r, "retried_pushes");
    if (retried < 0) continue;
    result.retried_pushes += static_cast<uint64_t>(retried);
    pushes[r] += Pushes(admin->get(), r);
  }
  result.report["pushes_server0"] = static_cast<double>(pushes[0]);
  result.report["pushes_server1"] = static_cast<double>(pushes[1]);
  if (workers == 1) {
    auto cut = (*admin)->Checkpoint("final", DeadlineAfterMs(60000));
    if (!cut.ok()) {
      ADD_FAILURE() << "checkpoint: " << cut.status().ToString();
      return result;
    }
    for (uint32_t r = 0; r < kServers; ++r) {
      const std::string dir = cluster.admin_root() + "/final/server-" + std::to_string(r);
      for (int lane = 0;; ++lane) {
        const std::string path = dir + "/lane-" + std::to_string(lane);
        if (!std::filesystem::exists(path)) break;
        Status rs = internal::ReadRecordFile(path, [&](const internal::Record& rec) {
          result.rows[{rec.table_id, static_cast<int>(rec.kind), rec.key}] = rec.row;
          return Status::OK();
        });
        if (!rs.ok()) ADD_FAILURE() << rs.ToString();
      }
    }
  }
  return result;
}

TEST(RideThroughTest, TwoWorkersFinishThroughServerCrashesWithTheSameQuality) {
  const JobResult clean = RunJob(2, false, {});
  ASSERT_TRUE(clean.report.count("test_auc"));
  const JobResult faulted = RunJob(2, true,
                                   {static_cast<int64_t>(clean.report.at("pushes_server0")),
                                    static_cast<int64_t>(clean.report.at("pushes_server1"))});
  ASSERT_TRUE(faulted.report.count("test_auc"));
  const double gap = std::abs(faulted.report.at("test_auc") - clean.report.at("test_auc"));
  std::printf(
      "test AUC without faults %.5f, with 2 server crashes %.5f (gap %.5f, bar 0.003); "
      "pushes answered as retries: %llu\n",
      clean.report.at("test_auc"), faulted.report.at("test_auc"), gap,
      static_cast<unsigned long long>(faulted.retried_pushes));
  EXPECT_LE(gap, 0.003);
}

TEST(RideThroughTest, OneWorkerBulkSynchronousEndsBitIdentical) {
  const JobResult clean = RunJob(1, false, {});
  ASSERT_FALSE(clean.rows.empty());
  const JobResult faulted = RunJob(1, true,
                                   {static_cast<int64_t>(clean.report.at("pushes_server0")),
                                    static_cast<int64_t>(clean.report.at("pushes_server1"))});
  ASSERT_FALSE(faulted.rows.empty());
  ASSERT_EQ(faulted.rows.size(), clean.rows.size());
  size_t differ = 0;
  for (const auto& [key, row] : clean.rows) {
    auto it = faulted.rows.find(key);
    if (it == faulted.rows.end() || it->second.size() != row.size() ||
        std::memcmp(it->second.data(), row.data(), row.size() * sizeof(float)) != 0) {
      ++differ;
    }
  }
  std::printf("%zu rows and chunks compared, %zu differ; pushes answered as retries: %llu\n",
              clean.rows.size(), differ, static_cast<unsigned long long>(faulted.retried_pushes));
  EXPECT_EQ(differ, 0u);
  EXPECT_EQ(faulted.report.at("test_auc"), clean.report.at("test_auc"));
}

}  // namespace
}  // namespace tessera
