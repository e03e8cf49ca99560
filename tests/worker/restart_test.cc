// A tessera-worker process killed with SIGKILL mid-training and restarted with the same rank
// carries on from the position and clock it stored on the servers: no sample is trained twice
// beyond the uncommitted steps (at most --max_pushes_in_flight), and training completes.
#include <gtest/gtest.h>

#include <chrono>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/worker/worker_cluster_fixture.h"

namespace tessera {
namespace {

using testing::ChildProcess;
using testing::LocalCluster;

constexpr uint64_t kTrainSamples = 150000;
constexpr uint64_t kBatch = 256;
constexpr uint64_t kTotalSteps = (kTrainSamples + kBatch - 1) / kBatch;
// Pushes per step on a one-server cluster: the embedding and wide tables, and the dense tables
// bias, bottom0, bottom1 (the bottom MLP's output layer), top0, top1 (the logit layer).
constexpr uint64_t kPushesPerStep = 7;
// --max_pushes_in_flight: steps pushed and not yet committed, redone after a restart.
constexpr uint64_t kInFlight = 2;

struct Position {
  uint64_t step = 0;
  int64_t clock = -1;
  uint64_t pos = 0;
};

// Parses "step=S clock=C pos=P" (one local rank).
bool ParsePosition(const std::string& s, Position* p) {
  std::smatch m;
  if (!std::regex_match(s, m, std::regex(R"(step=(\d+) clock=(-?\d+) pos=(\d+))"))) return false;
  p->step = std::stoull(m[1]);
  p->clock = std::stoll(m[2]);
  p->pos = std::stoull(m[3]);
  return true;
}

// Pushes the server has applied since it started.
uint64_t Pushes(Client* admin) {
  const int64_t n = testing::ServerStat(*admin, 0, "pushes");
  EXPECT_GE(n, 0) << "no pushes line in the server's stats";
  return n < 0 ? 0 : static_cast<uint64_t>(n);
}

TEST(WorkerRestartTest, SigkilledWorkerResumesFromItsStoredPosition) {
  LocalCluster cluster(testing::Servers(1));
  ASSERT_TRUE(cluster.Start().ok());
  auto admin_or = testing::ConnectObserver(cluster);
  ASSERT_TRUE(admin_or.ok()) << admin_or.status().ToString();
  Client* admin = admin_or->get();

  const std::vector<std::string> argv = {TESSERA_WORKER_BINARY,
                                         "--servers=" + cluster.endpoints()[0],
                                         "--worker_id=0",
                                         "--num_workers=1",
                                         "--job=rs",
                                         "--train_samples=" + std::to_string(kTrainSamples),
                                         "--test_samples=5000",
                                         "--batch_size=" + std::to_string(kBatch),
                                         "--synthetic_max_cardinality=2000",
                                         "--embedding_dim=8",
                                         "--bottom_mlp=16",
                                         "--top_mlp=16",
                                         "--progress_interval_s=1",
                                         "--request_timeout_ms=20000",
                                         "--max_pushes_in_flight=" + std::to_string(kInFlight)};
  const std::string meta_key = "rs/pos/0";

  // First run: kill it once it has committed a quarter of the steps.
  ChildProcess worker;
  ASSERT_TRUE(worker.Start(argv, cluster.dir() + "/worker-run1.log"));
  Position killed;
  bool seen = false;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < until && worker.Running()) {
    auto meta = admin->GetMeta(meta_key);
    ASSERT_TRUE(meta.ok()) << meta.status().ToString();
    if (meta->has_value()) {
      ASSERT_TRUE(ParsePosition(**meta, &killed)) << **meta;
      if (killed.step >= kTotalSteps / 4) {
        seen = true;
        break;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_TRUE(seen) << "the worker ended or stalled before a quarter of its steps:\n"
                    << worker.Output();
  ASSERT_TRUE(worker.Running()) << "finished before the kill:\n" << worker.Output();
  worker.Kill();
  // The record now is the last step the killed worker committed.
  auto meta = admin->GetMeta(meta_key);
  ASSERT_TRUE(meta.ok() && meta->has_value());
  ASSERT_TRUE(ParsePosition(**meta, &killed)) << **meta;
  ASSERT_LT(killed.step, kTotalSteps) << "killed too late to test a resume";
  EXPECT_EQ(killed.clock, static_cast<int64_t>(killed.step));  // one Clock() per step
  EXPECT_EQ(killed.pos, killed.step * kBatch);                 // one rank, full batches
  const uint64_t pushes_run1 = Pushes(admin);
  // Every committed step was pushed; at most kInFlight more steps' pushes were in flight.
  EXPECT_GE(pushes_run1, killed.step * kPushesPerStep);
  EXPECT_LE(pushes_run1, (killed.step + kInFlight) * kPushesPerStep);

  // Second run, same rank: resumes there and completes.
  ASSERT_TRUE(worker.Start(argv, cluster.dir() + "/worker-run2.log"));
  const int rc = worker.Wait(120);
  const std::string out = worker.Output();
  ASSERT_EQ(rc, 0) << out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(
      out, m, std::regex(R"(trained (\d+) samples .* (\d+) steps \((\d+) resumed\))")))
      << out;
  const uint64_t samples2 = std::stoull(m[1]), steps = std::stoull(m[2]),
                 resumed = std::stoull(m[3]);
  EXPECT_EQ(resumed, killed.step) << out;
  EXPECT_EQ(steps, kTotalSteps) << out;
  EXPECT_EQ(samples2, kTrainSamples - killed.pos) << out;  // nothing before the record again
  EXPECT_NE(out.find("\"test_auc\":"), std::string::npos) << out;

  Position done;
  meta = admin->GetMeta(meta_key);
  ASSERT_TRUE(meta.ok() && meta->has_value());
  ASSERT_TRUE(ParsePosition(**meta, &done)) << **meta;
  EXPECT_EQ(done.step, kTotalSteps);
  EXPECT_EQ(done.clock, static_cast<int64_t>(kTotalSteps));  // the clock carried on
  EXPECT_EQ(done.pos, kTrainSamples);

  // Server side: the second run pushed exactly its own steps; over both runs at most kInFlight
  // steps (the uncommitted ones) were pushed twice.
  const uint64_t pushes_total = Pushes(admin);
  EXPECT_EQ(pushes_total - pushes_run1, (kTotalSteps - killed.step) * kPushesPerStep);
  EXPECT_LE(pushes_total, (kTotalSteps + kInFlight) * kPushesPerStep);
  EXPECT_GE(pushes_total, kTotalSteps * kPushesPerStep);
}

}  // namespace
}  // namespace tessera
