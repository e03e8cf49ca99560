// The job's coordination through a fail-over (docs/elasticity.md, "The coordinating server"):
// barriers, GetTable and metadata records are served by the lowest live server of the map, and
// a map-following client writes metadata to every server. kill -9 of server 0, which held them,
// leaves the job going on server 1: a barrier waiting there completes, the records are there,
// and a tessera-worker job that commits its position every step finishes.
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <future>
#include <thread>

#include "tests/elastic/replicated_cluster.h"
#include "tests/worker/worker_process.h"

namespace tessera::testing {
namespace {

using std::chrono::seconds;

constexpr char kPrefix[] = "tessera/coordfail";

class CoordinatorFailoverTest : public ReplicatedClusterTest {
 protected:
  CoordinatorFailoverTest() : ReplicatedClusterTest(kPrefix) {}
};

TEST_F(CoordinatorFailoverTest, ServerZerosDeathKeepsBarriersTablesAndMetadata) {
  auto a = CoordinatorClient(0, 2), b = CoordinatorClient(1, 2);
  ASSERT_TRUE(a && b);
  const Table t = Sparse(*a, "emb");
  ASSERT_TRUE(a->PutMeta("job/position", "42").ok());
  // Every server holds the record (read from each directly).
  for (uint32_t r = 0; r < 3; ++r) {
    ClientOptions one;
    one.servers = {cluster_->endpoints()[r]};
    auto direct = Client::Create(one);
    ASSERT_TRUE(direct.ok());
    auto v = (*direct)->GetMeta("job/position");
    ASSERT_TRUE(v.ok()) << v.status().ToString();
    EXPECT_EQ(v->value_or("(none)"), "42") << "server " << r;
  }
  // Worker 0 waits at a barrier on server 0 when it dies.
  auto waiting = std::async(std::launch::async, [&] {
    return a->Barrier("after-kill", DeadlineAfterMs(60000));
  });
  ASSERT_TRUE(WaitFor([&] { return ServerStat(0, "barrier_waiters") == 1; }, seconds(30)))
      << "worker 0 is not waiting on server 0";
  cluster_->Kill(0);
  ASSERT_TRUE(WaitForPromotion(0, seconds(kTtlS + 30))) << "server 0 was not replaced";
  // Worker 1 arrives on server 1 (the lowest live id now); worker 0's wait went there too.
  Status arrived = b->Barrier("after-kill", DeadlineAfterMs(60000));
  EXPECT_TRUE(arrived.ok()) << arrived.ToString();
  ASSERT_EQ(waiting.wait_for(seconds(60)), std::future_status::ready);
  Status released = waiting.get();
  EXPECT_TRUE(released.ok()) << released.ToString();
  // The record and the table are there, and records go on being written.
  auto v = b->GetMeta("job/position");
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(v->value_or("(none)"), "42");
  auto found = b->GetTable("emb");
  ASSERT_TRUE(found.ok()) << found.status().ToString();
  EXPECT_EQ(found->id, t.id);
  ASSERT_TRUE(a->PutMeta("job/position", "43").ok());
  v = b->GetMeta("job/position");
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(v->value_or("(none)"), "43");
  auto later = std::async(std::launch::async, [&] { return a->Barrier("later"); });
  EXPECT_TRUE(b->Barrier("later").ok());
  EXPECT_TRUE(later.get().ok());
}

// The training job itself: tessera-worker --coordinator (BSP; it commits its data position with
// PutMeta every step) goes on after kill -9 of server 0 and finishes.
TEST_F(CoordinatorFailoverTest, WorkerJobFinishesAfterServerZeroIsKilled) {
  ChildProcess worker;
  ASSERT_TRUE(worker.Start({TESSERA_WORKER_BINARY, "--coordinator=" + url_, "--job=coordfail",
                            "--consistency=bsp", "--train_samples=2000000",
                            "--test_samples=2000", "--batch_size=128", "--max_steps=3000",
                            "--synthetic_max_cardinality=20000", "--bottom_mlp=8",
                            "--top_mlp=8", "--request_timeout_ms=2000", "--retry_for_ms=60000",
                            "--out_dir=" + cluster_->dir()},
                           cluster_->dir() + "/worker.log"));
  ASSERT_TRUE(WaitFor([&] { return ServerStat(0, "pushes") > 50 && ServerStat(1, "pushes") > 50; },
                      seconds(60)))
      << worker.Output();
  cluster_->Kill(0);
  ASSERT_TRUE(WaitForPromotion(0, seconds(kTtlS + 30))) << "server 0 was not replaced";
  ASSERT_TRUE(worker.Running())
      << "the worker ended before server 0 was failed over; raise --max_steps: "
      << worker.Output();
  const int64_t before = ServerStat(1, "pushes");
  ASSERT_EQ(worker.Wait(600), 0) << worker.Output();
  EXPECT_NE(worker.Output().find("3000 steps"), std::string::npos) << worker.Output();
  EXPECT_GT(ServerStat(1, "pushes"), before) << "server 1 took no push after the fail-over";
}

}  // namespace
}  // namespace tessera::testing
