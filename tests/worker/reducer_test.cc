// LocalReducer on CPU threads against real tessera-server processes: a node of 1, 2 or 4 local
// ranks sends exactly one push per table per server per step (counted by the servers), and its
// trained parameters equal those of one trainer that reads the same samples without reduction.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "ps/client/client.h"
#include "ps/routing.h"
#include "tests/cluster_fixture.h"
#include "worker/backend.h"
#include "worker/batch.h"
#include "worker/local_ranks.h"
#include "worker/local_reducer.h"
#include "worker/model.h"
#include "worker/param_store.h"
#include "worker/synthetic_data.h"
#include "worker/trainer.h"

namespace tessera::worker {
namespace {

using tessera::testing::LocalCluster;

constexpr uint32_t kServers = 2;
constexpr uint32_t kBatch = 256;  // per local rank
constexpr uint64_t kSteps = 8;

// No clock-based waiting: the trainers run bulk-synchronously on their own (staleness 0 in
// TrainerOptions waits for each step's pushes before the next pull), which makes the result
// deterministic up to float summation order.
std::unique_ptr<Client> Connect(const LocalCluster& c) { return testing::ConnectClient(c); }

SyntheticOptions Data(uint32_t rank, uint32_t world) {
  SyntheticOptions s;
  s.seed = 11;
  s.rank = rank;
  s.world = world;
  s.cardinalities = CriteoLikeCardinalities(2000);
  return s;
}

ModelConfig Model(const std::string& prefix) {
  ModelConfig c;
  c.embedding_dim = 8;
  c.bottom_mlp = {16};
  c.top_mlp = {16};
  c.table_prefix = prefix;
  return c;
}

TrainerOptions Options(const std::string& job) {
  TrainerOptions o;
  o.batch_size = kBatch;
  o.max_steps = kSteps;
  o.staleness = 0;
  o.job = job;
  o.resume = false;
  o.progress_interval_s = 0;
  return o;
}

// "pushes N" of a server's statistics.
uint64_t Pushes(Client* admin, uint32_t server) {
  auto stats = admin->ServerStats(server);
  EXPECT_TRUE(stats.ok()) << stats.status().ToString();
  if (!stats.ok()) return 0;
  std::istringstream in(*stats);
  std::string name;
  uint64_t value = 0;
  while (in >> name >> value) {
    if (name == "pushes") return value;
  }
  ADD_FAILURE() << "no pushes line in\n" << *stats;
  return 0;
}

// Trains `ranks` local ranks (threads) with a CpuReduceGroup; only rank 0 has a store.
Status TrainReduced(Client* client, const ModelLayout& layout, uint32_t ranks,
                    const std::string& job) {
  auto group = CpuReduceGroup::Create(ranks);
  if (!group.ok()) return group.status();
  auto store = CreateClusterStore(client);
  return RunLocalRanks(ranks, group->get(), [&](uint32_t r) -> Status {
    TESSERA_ASSIGN_OR_RETURN(auto member, (*group)->Join(r));
    TESSERA_ASSIGN_OR_RETURN(auto reader, SyntheticReader::Create(Data(r, ranks)));
    TESSERA_ASSIGN_OR_RETURN(auto backend, CreateCpuBackend(layout, {1}));
    TESSERA_ASSIGN_OR_RETURN(auto trainer,
                             Trainer::Create(Options(job), layout, r == 0 ? store.get() : nullptr,
                                             backend.get(), reader.get(), member.get()));
    TESSERA_RETURN_IF_ERROR(trainer->Init());
    TESSERA_ASSIGN_OR_RETURN(TrainResult tr, trainer->Train());
    if (tr.steps != kSteps) return Status::Internal("steps " + std::to_string(tr.steps));
    return Status::OK();
  });
}

// One trainer, no reducer, global batches of ranks * kBatch: the same samples per step.
Status TrainPlain(Client* client, const ModelLayout& layout, uint32_t ranks,
                  const std::string& job) {
  auto store = CreateClusterStore(client);
  TESSERA_ASSIGN_OR_RETURN(auto reader, SyntheticReader::Create(Data(0, 1)));
  TESSERA_ASSIGN_OR_RETURN(auto backend, CreateCpuBackend(layout, {1}));
  TrainerOptions o = Options(job);
  o.batch_size = kBatch * ranks;
  TESSERA_ASSIGN_OR_RETURN(auto trainer,
                           Trainer::Create(o, layout, store.get(), backend.get(), reader.get()));
  TESSERA_RETURN_IF_ERROR(trainer->Init());
  TESSERA_ASSIGN_OR_RETURN(TrainResult tr, trainer->Train());
  if (tr.steps != kSteps) return Status::Internal("steps " + std::to_string(tr.steps));
  return Status::OK();
}

// The unique keys of every step's global batch, in step order.
std::vector<std::vector<uint64_t>> StepKeys(uint32_t ranks) {
  auto reader = SyntheticReader::Create(Data(0, 1));
  EXPECT_TRUE(reader.ok());
  std::vector<std::vector<uint64_t>> out;
  for (uint64_t t = 0; t < kSteps; ++t) {
    Batch b;
    b.Clear((*reader)->schema());
    EXPECT_TRUE((*reader)->Read(kBatch * ranks, &b).ok());
    IndexedBatch ib;
    IndexBatch(b, &ib);
    out.push_back(ib.unique_keys);
  }
  return out;
}

std::vector<float> PullSparse(Client* admin, const std::string& name,
                              const std::vector<uint64_t>& keys) {
  auto t = admin->GetTable(name);
  EXPECT_TRUE(t.ok()) << name << ": " << t.status().ToString();
  if (!t.ok()) return {};
  std::vector<float> v(keys.size() * t->spec.dim);
  Status s = admin->Wait(admin->Pull(*t, keys, v.data()));
  EXPECT_TRUE(s.ok()) << s.ToString();
  return v;
}

std::vector<float> PullDense(Client* admin, const std::string& name) {
  auto t = admin->GetTable(name);
  EXPECT_TRUE(t.ok()) << name << ": " << t.status().ToString();
  if (!t.ok()) return {};
  std::vector<float> v(t->spec.length);
  Status s = admin->Wait(admin->DensePull(*t, 0, t->spec.length, v.data()));
  EXPECT_TRUE(s.ok()) << s.ToString();
  return v;
}

// Largest |a - b| / (1e-3 + |b|) over the elements.
double MaxRelDiff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    m = std::max(m, std::abs(double{a[i]} - b[i]) / (1e-3 + std::abs(double{b[i]})));
  }
  return m;
}

class WorkerReducerTest : public ::testing::TestWithParam<uint32_t> {};

TEST_P(WorkerReducerTest, OnePushPerNodePerStepAndSameValuesAsUnreduced) {
  const uint32_t ranks = GetParam();
  LocalCluster cluster(tessera::testing::Servers(kServers));
  ASSERT_TRUE(cluster.Start().ok());
  auto admin = Connect(cluster);
  ASSERT_NE(admin, nullptr);
  const std::string red = "red" + std::to_string(ranks), plain = "plain" + std::to_string(ranks);
  auto red_layout = ModelLayout::Create(Model(red));
  auto plain_layout = ModelLayout::Create(Model(plain));
  ASSERT_TRUE(red_layout.ok() && plain_layout.ok());

  std::vector<uint64_t> before(kServers), after(kServers);
  for (uint32_t s = 0; s < kServers; ++s) before[s] = Pushes(admin.get(), s);
  {
    auto client = Connect(cluster);
    ASSERT_NE(client, nullptr);
    Status st = TrainReduced(client.get(), *red_layout, ranks, red);
    ASSERT_TRUE(st.ok()) << st.ToString();
  }
  for (uint32_t s = 0; s < kServers; ++s) after[s] = Pushes(admin.get(), s);

  // Expected push requests per server: per step, one per sparse table whose keys include one
  // the server owns, and one per dense table with a part on the server.
  const auto keys = StepKeys(ranks);
  const SlotMap slots = SlotMap::Uniform(kServers);
  std::vector<uint64_t> expected(kServers, 0);
  for (const auto& step_keys : keys) {
    std::set<uint32_t> hit;
    for (uint64_t k : step_keys) hit.insert(slots.ServerOfKey(k));
    for (uint32_t s : hit) expected[s] += 2;  // the embedding and the wide table
  }
  for (const auto& d : red_layout->dense_tables()) {
    auto t = admin->GetTable(d.spec.name);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    for (uint32_t s = 0; s < kServers; ++s) {
      const DenseRange r = DenseRangeOfServer(t->id, d.spec.length, s, kServers);
      if (r.end > r.begin) expected[s] += kSteps;
    }
  }
  uint64_t total = 0;
  for (uint32_t s = 0; s < kServers; ++s) {
    EXPECT_EQ(after[s] - before[s], expected[s]) << "server " << s << ", " << ranks << " ranks";
    total += expected[s];
  }
  // Sanity of the expectation itself: at least one push per table per step.
  EXPECT_GE(total, kSteps * (2 + red_layout->dense_tables().size()));

  {
    auto client = Connect(cluster);
    ASSERT_NE(client, nullptr);
    Status st = TrainPlain(client.get(), *plain_layout, ranks, plain);
    ASSERT_TRUE(st.ok()) << st.ToString();
  }

  std::set<uint64_t> all_keys;
  for (const auto& k : keys) all_keys.insert(k.begin(), k.end());
  const std::vector<uint64_t> key_list(all_keys.begin(), all_keys.end());
  for (const std::string table : {"/emb", "/wide"}) {
    const auto a = PullSparse(admin.get(), red + table, key_list);
    const auto b = PullSparse(admin.get(), plain + table, key_list);
    ASSERT_FALSE(a.empty());
    EXPECT_LT(MaxRelDiff(a, b), 1e-3) << table;
    if (table == "/wide") {  // starts at zero: training moved it
      EXPECT_GT(*std::max_element(a.begin(), a.end()), 1e-3f);
    }
  }
  for (size_t i = 0; i < red_layout->dense_tables().size(); ++i) {
    const std::string suffix =
        red_layout->dense_tables()[i].spec.name.substr(red.size());  // "/bias", "/top0", ...
    const auto a = PullDense(admin.get(), red + suffix);
    const auto b = PullDense(admin.get(), plain + suffix);
    ASSERT_FALSE(a.empty());
    EXPECT_LT(MaxRelDiff(a, b), 1e-3) << suffix;
  }
}

INSTANTIATE_TEST_SUITE_P(LocalRanks, WorkerReducerTest, ::testing::Values(1u, 2u, 4u),
                         [](const ::testing::TestParamInfo<uint32_t>& i) {
                           return std::to_string(i.param) + "ranks";
                         });

}  // namespace
}  // namespace tessera::worker
