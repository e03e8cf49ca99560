// The hot-row cache (--cache_rows, worker/row_cache.h) in training:
//  - RowCacheQuality (label quality): the default model trained in-process on generated data
//    over CreateLocalStore, without the cache and with it at S = 2 and S = 4: test AUC within
//    0.002 of the uncached run's. One worker over the in-process store is deterministic, so the
//    difference is the cache's, not run-to-run noise.
//  - WorkerRowCache (label integration): tessera-worker with --cache_rows on a real
//    tessera-server: hits in its Prometheus metrics while it trains and in its report, test AUC
//    near the uncached run's; refused with --consistency=bsp.
#include "worker/row_cache.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "tests/worker/worker_cluster_fixture.h"
#include "worker/backend.h"
#include "worker/data_source.h"
#include "worker/model.h"
#include "worker/param_store.h"
#include "worker/trainer.h"

namespace tessera {
namespace {

using testing::ChildProcess;
using testing::LocalCluster;
using namespace tessera::worker;

// The bar: a cached run's test AUC within this of the uncached one's, S <= 4.
constexpr double kAucBar = 0.002;

struct Trained {
  double auc = 0;
  RowCacheStats cache;
};

// The default job's model and data (tessera-worker's defaults, one worker), trained over a
// local store, through a cache of `cache_rows` rows at staleness `s` (0 rows: none).
Trained TrainInProcess(uint64_t train_samples, uint64_t cache_rows, int32_t s) {
  Trained r;
  DataSourceOptions d;
  d.train_samples = train_samples;
  d.test_samples = 100000;
  auto train = OpenTrainData(d);
  auto test = OpenTestData(d);
  EXPECT_TRUE(train.ok() && test.ok());
  if (!train.ok() || !test.ok()) return r;
  ModelConfig mc;
  mc.num_dense = (*train)->schema().num_dense;
  mc.num_fields = (*train)->schema().num_fields;
  mc.embedding_dim = 8;
  mc.bottom_mlp = {64};
  mc.top_mlp = {64};
  mc.embedding_optimizer.learning_rate = 0.05f;
  mc.dense_optimizer.learning_rate = 0.003f;
  mc.wide_optimizer.learning_rate = 0.05f;
  mc.wide_optimizer.l2 = 0.1f;
  auto layout = ModelLayout::Create(mc);
  EXPECT_TRUE(layout.ok()) << layout.status().ToString();
  if (!layout.ok()) return r;
  auto servers = CreateLocalStore();
  std::unique_ptr<CachingStore> cache;
  ParamStore* store = servers.get();
  if (cache_rows > 0) {
    RowCacheOptions co;
    co.rows = cache_rows;
    co.staleness = s;
    auto c = CreateCachingStore(servers.get(), co);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    if (!c.ok()) return r;
    cache = std::move(*c);
    store = cache.get();
  }
  auto backend = CreateCpuBackend(*layout, {1});
  EXPECT_TRUE(backend.ok());
  if (!backend.ok()) return r;
  TrainerOptions to;
  to.batch_size = 1024;
  to.progress_interval_s = 0;
  to.resume = false;
  auto trainer = Trainer::Create(to, *layout, store, backend->get(), train->get());
  EXPECT_TRUE(trainer.ok()) << trainer.status().ToString();
  if (!trainer.ok()) return r;
  EXPECT_TRUE((*trainer)->Init().ok());
  auto result = (*trainer)->Train();
  EXPECT_TRUE(result.ok()) << result.status().ToString();
  if (cache) {
    EXPECT_TRUE(cache->Flush().ok());
    r.cache = cache->stats();
  }
  // The test reads the servers' values, as the job's does.
  auto ev = Evaluate(*layout, servers.get(), backend->get(), test->get());
  EXPECT_TRUE(ev.ok()) << ev.status().ToString();
  if (ev.ok()) r.auc = ev->auc;
  return r;
}

TEST(RowCacheQuality, CachedRunsTestAucWithinBarOfUncached) {
  constexpr uint64_t kTrain = 1000000;
  const Trained plain = TrainInProcess(kTrain, 0, 0);
  std::printf("uncached: test auc %.4f\n", plain.auc);
  ASSERT_GT(plain.auc, 0.6);  // not a degenerate run
  for (int32_t s : {2, 4}) {
    const Trained cached = TrainInProcess(kTrain, 65536, s);
    const RowCacheStats& c = cached.cache;
    std::printf(
        "S=%d: test auc %.4f (delta %+.4f, bar %.3f), hit rate %.3f, %llu rows' "
        "gradients deferred, %llu keys pushed at once\n",
        s, cached.auc, cached.auc - plain.auc, kAucBar, c.hit_rate(),
        static_cast<unsigned long long>(c.flushed_rows),
        static_cast<unsigned long long>(c.passed_keys));
    EXPECT_LE(std::fabs(cached.auc - plain.auc), kAucBar) << "S=" << s;
    // The cache was used: a good part of the pulls were hits, most pushes deferred.
    EXPECT_GT(c.hit_rate(), 0.2) << "S=" << s;
    EXPECT_GT(c.flushed_rows, c.passed_keys) << "S=" << s;
  }
}

std::vector<std::string> WorkerArgs(const std::string& server, const std::string& job,
                                    const std::string& dir) {
  return {TESSERA_WORKER_BINARY,          "--servers=" + server,    "--job=" + job,
          "--out_dir=" + dir + "/" + job, "--train_samples=300000", "--validate_every=0"};
}

// One tessera-worker run; its exit code and output.
testing::ProgramRun RunWorker(const std::vector<std::string>& args, const std::string& log) {
  return testing::RunToEnd(args, log, 600);
}

// A cached run on a real server: its hits show in /metrics while it trains, its report gives
// the hit rate and no gradient still deferred when the test ran, and its test AUC is near the
// uncached run's (one worker and one server apply
// pushes in order, so both runs are repeatable; the bar is the in-process test's).
TEST(WorkerRowCache, RealServerRunCountsHitsAndMatchesUncached) {
  LocalCluster cluster(testing::Servers(1));
  ASSERT_TRUE(cluster.Start().ok());
  const std::string server = cluster.endpoints()[0];
  const testing::ProgramRun plain =
      RunWorker(WorkerArgs(server, "plain", cluster.dir()), cluster.dir() + "/plain.log");
  ASSERT_EQ(plain.rc, 0) << plain.out;

  const uint32_t port = testing::PickFreePort();
  std::vector<std::string> args = WorkerArgs(server, "cached", cluster.dir());
  for (const char* a : {"--cache_rows=65536", "--cache_staleness=2", "--progress_interval_s=0.2",
                        "--metrics_address=127.0.0.1"}) {
    args.push_back(a);
  }
  args.push_back("--metrics_port=" + std::to_string(port));
  ChildProcess worker;
  ASSERT_TRUE(worker.Start(args, cluster.dir() + "/cached.log"));
  uint64_t scraped_hits = 0;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(300);
  while (std::chrono::steady_clock::now() < until && worker.Running() && scraped_hits == 0) {
    const std::string body = testing::HttpGet(port, "/metrics");
    std::smatch m;
    if (std::regex_search(body, m, std::regex("\ntessera_worker_cache_hits_total ([0-9]+)\n"))) {
      scraped_hits = std::stoull(m[1]);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_GT(scraped_hits, 0u) << "no cache hits in /metrics while the worker trained";
  ASSERT_EQ(worker.Wait(600), 0) << worker.Output();
  const std::string out = worker.Output();
  EXPECT_NE(out.find("cache_hit_rate"), std::string::npos) << "no hit rate in the progress lines";
  const auto a = testing::ParseWorkerReport(plain.out);
  const auto b = testing::ParseWorkerReport(out);
  ASSERT_TRUE(a.count("test_auc") && b.count("test_auc") && b.count("cache_hit_rate")) << out;
  EXPECT_EQ(a.count("cache_hit_rate"), 0u);
  std::printf(
      "real server, 300k samples: test auc uncached %.4f cached (S=2) %.4f delta %+.4f, "
      "hit rate %.3f\n",
      a.at("test_auc"), b.at("test_auc"), b.at("test_auc") - a.at("test_auc"),
      b.at("cache_hit_rate"));
  EXPECT_GT(b.at("cache_hit_rate"), 0.2);
  EXPECT_GT(b.at("cache_flushed_rows"), 0);
  // The test read the servers after every deferred gradient was pushed.
  ASSERT_TRUE(b.count("cache_deferred_rows"));
  EXPECT_EQ(b.at("cache_deferred_rows"), 0);
  EXPECT_LE(std::fabs(b.at("test_auc") - a.at("test_auc")), kAucBar);
}

// Bulk-synchronous consistency promises every pull sees every earlier push: a usage error.
TEST(WorkerRowCache, RefusedUnderBulkSynchronousConsistency) {
  LocalCluster cluster(testing::Servers(1));
  ASSERT_TRUE(cluster.Start().ok());
  std::vector<std::string> args = WorkerArgs(cluster.endpoints()[0], "bsp", cluster.dir());
  args.push_back("--consistency=bsp");
  args.push_back("--cache_rows=1000");
  const testing::ProgramRun r = RunWorker(args, cluster.dir() + "/bsp.log");
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_NE(r.out.find("bulk-synchronous"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("trained"), std::string::npos) << r.out;
  args.back() = "--cache_rows=10";
  args.push_back("--consistency=async");
  args.push_back("--cache_staleness=0");
  const testing::ProgramRun s0 = RunWorker(args, cluster.dir() + "/s0.log");
  EXPECT_EQ(s0.rc, 2) << s0.out;
  EXPECT_NE(s0.out.find("staleness must be in [1, 64]"), std::string::npos) << s0.out;
}

}  // namespace
}  // namespace tessera
