// Deep prefetch (TrainerOptions::prefetch_depth) against real tessera-server processes: under
// BSP two workers' pulls of step k see every push of both workers' steps < k, and one worker
// trains exactly the same parameters with depth 4 as with depth 1; under SSP no pull is issued
// more than `staleness` clocks before its step.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ps/client/client.h"
#include "ps/mutex.h"
#include "tests/cluster_fixture.h"
#include "worker/backend.h"
#include "worker/model.h"
#include "worker/param_store.h"
#include "worker/synthetic_data.h"
#include "worker/trainer.h"

namespace tessera::worker {
namespace {

using tessera::testing::LocalCluster;

constexpr uint32_t kServers = 2;
constexpr uint64_t kSteps = 12;

// A ParamStore over a cluster store that counts steps in a table of its own: with every push
// of the embedding table it adds 1 to the dense counter table "<job>/count" (SGD, learning rate
// 1, gradient -1) and its Pending completes when both are acknowledged; with every pull of the
// embedding table it also pulls the counter, at the same clock and through the same staleness
// gate, and records the value it saw and the clock the pull was issued at.
class CountingStore final : public ForwardingStore {
 public:
  struct PullRecord {
    int64_t clock;
    float count;
  };

  CountingStore(ParamStore* inner, std::string emb_name, std::string count_name)
      : ForwardingStore(inner), emb_name_(std::move(emb_name)), count_name_(std::move(count_name)) {}

  Result<uint32_t> AddTable(const TableSpec& spec) override {
    TESSERA_ASSIGN_OR_RETURN(uint32_t id, inner_->AddTable(spec));
    if (spec.name == emb_name_) {
      OptimizerSpec sgd;
      sgd.kind = OptimizerKind::kSgd;
      sgd.learning_rate = 1.0f;
      TESSERA_ASSIGN_OR_RETURN(uint32_t count,
                               inner_->AddTable(TableSpec::Dense(count_name_, 1, sgd)));
      MutexLock lock(mu_);
      emb_ = id;
      count_ = count;
    }
    return id;
  }
  Pending Pull(uint32_t table, std::span<const uint64_t> keys, float* out) override {
    const int64_t clock = inner_->clock();
    Pending p = inner_->Pull(table, keys, out);
    uint32_t count = 0;
    {
      MutexLock lock(mu_);
      if (table != emb_) return p;
      count = count_;
    }
    auto value = std::make_shared<float>(0.0f);
    Pending c = inner_->DensePull(count, 0, 1, value.get());
    return Pending([this, p, c, value, clock]() mutable {
      Status s = p.Wait();
      Status t = c.Wait();
      if (!t.ok()) return t;
      MutexLock lock(mu_);
      pulls_.push_back({clock, *value});
      return s;
    });
  }
  Pending Push(uint32_t table, std::span<const uint64_t> keys,
               std::span<const float> grads) override {
    Pending p = inner_->Push(table, keys, grads);
    uint32_t count = 0;
    {
      MutexLock lock(mu_);
      if (table != emb_) return p;
      count = count_;
    }
    Pending c = inner_->DensePush(count, 0, std::vector<float>{-1.0f});
    return Pending([p, c]() mutable {
      Status s = p.Wait();
      Status t = c.Wait();
      return s.ok() ? t : s;
    });
  }

  // In the order the trainer waited for them: step 1, 2, ...
  std::vector<PullRecord> pulls() const {
    MutexLock lock(mu_);
    return pulls_;
  }

 private:
  const std::string emb_name_, count_name_;
  mutable Mutex mu_;
  uint32_t emb_ ABSL_GUARDED_BY(mu_) = ~0u;
  uint32_t count_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<PullRecord> pulls_ ABSL_GUARDED_BY(mu_);
};

std::unique_ptr<Client> Connect(const LocalCluster& c, uint32_t workers, int32_t staleness,
                                uint32_t worker_id = 0) {
  ClientOptions o;
  o.servers = c.endpoints();
  o.worker_id = worker_id;
  o.consistency.num_workers = workers;
  o.consistency.staleness = staleness;
  auto r = Client::Create(o);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? std::move(r).value() : nullptr;
}

ModelConfig Model(const std::string& prefix) {
  ModelConfig c;
  c.embedding_dim = 4;
  c.bottom_mlp = {8};
  c.top_mlp = {8};
  c.table_prefix = prefix;
  return c;
}

struct TrainRun {
  int32_t staleness = 0;
  uint32_t depth = 1;
  uint32_t workers = 1;
  std::string job;
};

// Trains `run.workers` workers (threads, a client each) on the cluster; returns each worker's
// recorded pulls.
Result<std::vector<std::vector<CountingStore::PullRecord>>> Train(const LocalCluster& cluster,
                                                                   const TrainRun& run) {
  auto layout = ModelLayout::Create(Model(run.job));
  if (!layout.ok()) return layout.status();
  std::vector<std::vector<CountingStore::PullRecord>> pulls(run.workers);
  std::vector<Status> status(run.workers);
  std::vector<std::thread> threads;
  for (uint32_t w = 0; w < run.workers; ++w) {
    threads.emplace_back([&, w] {
      status[w] = [&]() -> Status {
        auto client = Connect(cluster, run.workers, run.staleness, w);
        if (client == nullptr) return Status::Unavailable("no client");
        auto cluster_store = CreateClusterStore(client.get());
        CountingStore store(cluster_store.get(), layout->embedding_table().name,
                            run.job + "/count");
        SyntheticOptions d;
        d.seed = 9;
        d.rank = w;
        d.world = run.workers;
        d.cardinalities = CriteoLikeCardinalities(1000);
        TESSERA_ASSIGN_OR_RETURN(auto reader, SyntheticReader::Create(d));
        TESSERA_ASSIGN_OR_RETURN(auto backend, CreateCpuBackend(*layout, {1}));
        TrainerOptions o;
        o.batch_size = 128;
        o.max_steps = kSteps;
        o.staleness = run.staleness;
        o.prefetch = run.depth > 0;  // 0: no prefetch
        o.prefetch_depth = std::max(run.depth, 1u);
        o.worker_id = w;
        o.job = run.job;
        o.resume = false;
        o.progress_interval_s = 0;
        TESSERA_ASSIGN_OR_RETURN(auto trainer, Trainer::Create(o, *layout, &store, backend.get(),
                                                               reader.get()));
        TESSERA_RETURN_IF_ERROR(trainer->Init());
        TESSERA_ASSIGN_OR_RETURN(TrainResult r, trainer->Train());
        if (r.steps != kSteps) return Status::Internal("steps " + std::to_string(r.steps));
        pulls[w] = store.pulls();
        return Status::OK();
      }();
    });
  }
  for (auto& t : threads) t.join();
  for (const Status& s : status) TESSERA_RETURN_IF_ERROR(s);
  return pulls;
}

// Every dense table of the job's model (their values depend on every step's embeddings too).
std::vector<float> Params(Client* admin, const std::string& job) {
  auto layout = ModelLayout::Create(Model(job));
  EXPECT_TRUE(layout.ok());
  std::vector<float> out;
  for (const auto& d : layout->dense_tables()) {
    auto t = admin->GetTable(d.spec.name);
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    if (!t.ok()) return {};
    std::vector<float> v(d.spec.length);
    EXPECT_TRUE(admin->Wait(admin->DensePull(*t, 0, v.size(), v.data())).ok());
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

TEST(WorkerPrefetchTest, BspPullsOfStepKSeeEveryWorkersPushesOfEarlierSteps) {
  LocalCluster cluster(tessera::testing::Servers(kServers));
  ASSERT_TRUE(cluster.Start().ok());
  auto pulls = Train(cluster, TrainRun{.staleness = 0, .depth = 4, .workers = 2, .job = "bsp2"});
  ASSERT_TRUE(pulls.ok()) << pulls.status().ToString();
  for (uint32_t w = 0; w < 2; ++w) {
    ASSERT_EQ((*pulls)[w].size(), kSteps) << "worker " << w;
    for (size_t i = 0; i < kSteps; ++i) {
      const int64_t k = static_cast<int64_t>(i) + 1;
      EXPECT_EQ((*pulls)[w][i].clock, k - 1) << "worker " << w << " step " << k;
      // Both workers' steps 1..k-1 pushed one count each before step k's pull was served.
      EXPECT_GE((*pulls)[w][i].count, 2.0f * static_cast<float>(k - 1))
          << "worker " << w << " step " << k;
    }
  }
}

// Without prefetch, with depth 1 and with depth 4: the same parameters, bit for bit.
TEST(WorkerPrefetchTest, BspOneWorkerDepthFourEqualsNoPrefetch) {
  LocalCluster cluster(tessera::testing::Servers(kServers));
  ASSERT_TRUE(cluster.Start().ok());
  for (uint32_t depth : {0u, 1u, 4u}) {
    auto r = Train(cluster, TrainRun{.staleness = 0, .depth = depth, .workers = 1,
                                .job = "one" + std::to_string(depth)});
    ASSERT_TRUE(r.ok()) << r.status().ToString();
  }
  auto admin = Connect(cluster, 0, -1);
  ASSERT_NE(admin, nullptr);
  const auto off = Params(admin.get(), "one0");
  ASSERT_FALSE(off.empty());
  EXPECT_EQ(Params(admin.get(), "one1"), off);
  EXPECT_EQ(Params(admin.get(), "one4"), off);
}

TEST(WorkerPrefetchTest, SspPullsAreNeverMoreThanStalenessClocksEarly) {
  LocalCluster cluster(tessera::testing::Servers(kServers));
  ASSERT_TRUE(cluster.Start().ok());
  constexpr int32_t kStaleness = 1;
  auto pulls =
      Train(cluster, TrainRun{.staleness = kStaleness, .depth = 4, .workers = 2, .job = "ssp"});
  ASSERT_TRUE(pulls.ok()) << pulls.status().ToString();
  for (uint32_t w = 0; w < 2; ++w) {
    ASSERT_EQ((*pulls)[w].size(), kSteps);
    for (size_t i = 0; i < kSteps; ++i) {
      const int64_t k = static_cast<int64_t>(i) + 1;
      EXPECT_EQ((*pulls)[w][i].clock, std::max<int64_t>(0, k - 1 - kStaleness))
          << "worker " << w << " step " << k;
    }
  }
}

}  // namespace
}  // namespace tessera::worker
