// The training loop's pipelining (TrainerOptions::prefetch_depth, max_pushes_in_flight) on the
// in-process store behind a test-local recording wrapper: when each pull is issued (clock,
// acknowledged pushes), how many steps are pushed and unacknowledged, the order of position
// records, and that no pull is left in flight when Train returns (stop, errors, reducer).
#include "worker/trainer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <ostream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "ps/mutex.h"
#include "worker/backend.h"
#include "worker/local_ranks.h"
#include "worker/local_reducer.h"
#include "worker/model.h"
#include "worker/param_store.h"
#include "worker/synthetic_data.h"

namespace tessera::worker {
namespace {

constexpr uint32_t kBatch = 64;

// A ParamStore over another that records what the trainer does and makes pushes asynchronous:
// a push is applied to the inner store and acknowledged (its Pending completes) only when it is
// released, that is once `hold` more Clocks than its step have been called (hold < 0: never
// by clocks) or when no Clock was called for `quiet` (the end of a run). Pulls are served from
// the inner store when issued and written to their output when waited for, and counted:
// issued vs waited. Steps are numbered by Clocks: the pushes issued after n-1 Clocks belong to
// step n. Each pull of the embedding table records the clock and the last step whose pushes
// (and every earlier step's) were acknowledged when it was issued.
class RecordingStore final : public ParamStore {
 public:
  struct PullRecord {
    int64_t clock;
    int64_t acked_through;
  };

  RecordingStore(ParamStore* inner, std::string emb_name, int64_t hold,
                 std::chrono::milliseconds quiet)
      : inner_(inner), emb_name_(std::move(emb_name)), hold_(hold), quiet_(quiet),
        thread_([this] { Run(); }) {}
  ~RecordingStore() override {
    {
      MutexLock lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  Result<uint32_t> AddTable(const TableSpec& spec) override {
    TESSERA_ASSIGN_OR_RETURN(uint32_t id, inner_->AddTable(spec));
    MutexLock lock(mu_);
    if (spec.name == emb_name_) emb_table_ = id;
    dims_[id] = spec.dim;
    return id;
  }
  Pending Pull(uint32_t table, std::span<const uint64_t> keys, float* out) override {
    uint32_t dim = 0;
    {
      MutexLock lock(mu_);
      dim = dims_[table];
    }
    auto buf = std::make_shared<std::vector<float>>(keys.size() * dim);
    Status st = inner_->Pull(table, keys, buf->data()).Wait();
    MutexLock lock(mu_);
    if (table == emb_table_) {
      keys_.insert(keys.begin(), keys.end());
      pulls_.push_back({clocks_, AckedThroughLocked()});
      if (fail_pull_ == pulls_.size()) st = Status::Unavailable("test: pull failed");
    }
    return Deferred(st, buf, out);
  }
  Pending DensePull(uint32_t table, uint64_t offset, uint64_t length, float* out) override {
    auto buf = std::make_shared<std::vector<float>>(length);
    Status st = inner_->DensePull(table, offset, length, buf->data()).Wait();
    MutexLock lock(mu_);
    return Deferred(st, buf, out);
  }
  Pending Push(uint32_t table, std::span<const uint64_t> keys,
               std::span<const float> grads) override {
    std::vector<uint64_t> k(keys.begin(), keys.end());
    std::vector<float> g(grads.begin(), grads.end());
    return Enqueue([this, table, k = std::move(k), g = std::move(g)] {
      return inner_->Push(table, k, g).Wait();
    });
  }
  Pending DensePush(uint32_t table, uint64_t offset, std::span<const float> grads) override {
    std::vector<float> g(grads.begin(), grads.end());
    return Enqueue([this, table, offset, g = std::move(g)] {
      return inner_->DensePush(table, offset, g).Wait();
    });
  }
  Pending Clock() override {
    {
      MutexLock lock(mu_);
      ++clocks_;
      last_clock_ = std::chrono::steady_clock::now();
    }
    cv_.notify_all();
    return inner_->Clock();
  }
  int64_t clock() const override {
    MutexLock lock(mu_);
    return clocks_;
  }
  Status SetClock(int64_t clock) override {
    MutexLock lock(mu_);
    clocks_ = clock;
    return Status::OK();
  }
  Status Barrier(const std::string& name) override { return inner_->Barrier(name); }
  Status PutMeta(const std::string& name, std::string_view value) override {
    {
      MutexLock lock(mu_);
      const std::string v(value);
      const int64_t step = std::stoll(v.substr(v.find("step=") + 5));
      commits_.push_back({step, AckedThroughLocked()});
    }
    return inner_->PutMeta(name, value);
  }
  Result<std::optional<std::string>> GetMeta(const std::string& name) override {
    return inner_->GetMeta(name);
  }
  Status SetLearningRateScale(float scale) override { return inner_->SetLearningRateScale(scale); }

  // The n-th pull of the embedding table (1-based) fails.
  void FailPull(size_t n) {
    MutexLock lock(mu_);
    fail_pull_ = n;
  }
  // The pushes of step n fail.
  void FailPushesOfStep(int64_t n) {
    MutexLock lock(mu_);
    fail_step_ = n;
  }

  // Every key pulled from the embedding table.
  std::vector<uint64_t> keys() const {
    MutexLock lock(mu_);
    return std::vector<uint64_t>(keys_.begin(), keys_.end());
  }
  std::vector<PullRecord> pulls() const {
    MutexLock lock(mu_);
    return pulls_;
  }
  // (step of the record, last fully acknowledged step when it was written), in write order.
  std::vector<std::pair<int64_t, int64_t>> commits() const {
    MutexLock lock(mu_);
    return commits_;
  }
  // The most steps before a step that had pushes unacknowledged when its first push came.
  int64_t max_unacked_before_push() const {
    MutexLock lock(mu_);
    return max_unacked_;
  }
  size_t pulls_issued() const {
    MutexLock lock(mu_);
    return issued_;
  }
  size_t pulls_waited() const {
    MutexLock lock(mu_);
    return waited_;
  }

 private:
  struct PushItem {
    int64_t step;
    std::function<Status()> apply;
    bool done = false;
    Status result;
  };

  Pending Deferred(Status st, std::shared_ptr<std::vector<float>> buf, float* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    ++issued_;
    return Pending([this, st, buf, out] {
      if (st.ok()) std::copy(buf->begin(), buf->end(), out);
      MutexLock lock(mu_);
      ++waited_;
      return st;
    });
  }

  Pending Enqueue(std::function<Status()> apply) {
    auto item = std::make_shared<PushItem>();
    item->apply = std::move(apply);
    {
      MutexLock lock(mu_);
      item->step = clocks_ + 1;
      if (item->step != last_push_step_) {
        last_push_step_ = item->step;
        std::map<int64_t, bool> open;
        for (const auto& p : items_) {
          if (!p->done && p->step < item->step) open[p->step] = true;
        }
        max_unacked_ = std::max<int64_t>(max_unacked_, static_cast<int64_t>(open.size()));
      }
      items_.push_back(item);
    }
    cv_.notify_all();
    return Pending([this, item] {
      MutexLock lock(mu_);
      while (!item->done) cv_.wait(lock.native());
      return item->result;
    });
  }

  int64_t AckedThroughLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    int64_t first_open = clocks_ + 1;
    for (const auto& p : items_) {
      if (!p->done) first_open = std::min(first_open, p->step);
    }
    return first_open - 1;
  }

  void Run() ABSL_LOCKS_EXCLUDED(mu_) {
    MutexLock lock(mu_);
    while (!stop_) {
      const bool quiet = std::chrono::steady_clock::now() - last_clock_ >= quiet_;
      bool any = false;
      // By index: Enqueue may append while the lock is released below.
      for (size_t i = 0; i < items_.size(); ++i) {
        std::shared_ptr<PushItem> p = items_[i];
        if (p->done) continue;
        if (!quiet && (hold_ < 0 || clocks_ < p->step + hold_)) continue;
        Status s = p->step == fail_step_ ? Status::Unavailable("test: push failed") : Status();
        auto apply = std::move(p->apply);
        lock.Unlock();
        if (s.ok()) s = apply();
        lock.Lock();
        p->result = s;
        p->done = true;
        any = true;
      }
      if (any) {
        cv_.notify_all();
        continue;
      }
      cv_.wait_for(lock.native(), std::chrono::milliseconds(2));
    }
    for (auto& p : items_) {
      p->done = true;
      p->result = Status::Cancelled("test store closed");
    }
    cv_.notify_all();
  }

  ParamStore* inner_;
  const std::string emb_name_;
  const int64_t hold_;
  const std::chrono::milliseconds quiet_;
  mutable Mutex mu_;
  std::condition_variable cv_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  uint32_t emb_table_ ABSL_GUARDED_BY(mu_) = ~0u;
  std::map<uint32_t, uint32_t> dims_ ABSL_GUARDED_BY(mu_);
  std::set<uint64_t> keys_ ABSL_GUARDED_BY(mu_);
  int64_t clocks_ ABSL_GUARDED_BY(mu_) = 0;
  std::chrono::steady_clock::time_point last_clock_ ABSL_GUARDED_BY(mu_) =
      std::chrono::steady_clock::now();
  std::vector<std::shared_ptr<PushItem>> items_ ABSL_GUARDED_BY(mu_);
  int64_t last_push_step_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t max_unacked_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<PullRecord> pulls_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<int64_t, int64_t>> commits_ ABSL_GUARDED_BY(mu_);
  size_t issued_ ABSL_GUARDED_BY(mu_) = 0, waited_ ABSL_GUARDED_BY(mu_) = 0;
  size_t fail_pull_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t fail_step_ ABSL_GUARDED_BY(mu_) = -1;
  std::thread thread_;
};

ModelConfig Model() {
  ModelConfig c;
  c.embedding_dim = 4;
  c.bottom_mlp = {8};
  c.top_mlp = {8};
  c.table_prefix = "t";
  return c;
}

SyntheticOptions Data(uint32_t rank = 0, uint32_t world = 1) {
  SyntheticOptions s;
  s.seed = 5;
  s.rank = rank;
  s.world = world;
  s.cardinalities = CriteoLikeCardinalities(1000);
  return s;
}

TrainerOptions Options(int32_t staleness, uint32_t depth, uint64_t steps) {
  TrainerOptions o;
  o.batch_size = kBatch;
  o.max_steps = steps;
  o.staleness = staleness;
  o.prefetch_depth = depth;
  o.resume = false;
  o.progress_interval_s = 0;
  return o;
}

// Trains one trainer (no reducer) on `store`.
Result<TrainResult> TrainOn(ParamStore* store, const ModelLayout& layout,
                            const TrainerOptions& o) {
  TESSERA_ASSIGN_OR_RETURN(auto reader, SyntheticReader::Create(Data()));
  TESSERA_ASSIGN_OR_RETURN(auto backend, CreateCpuBackend(layout, {1}));
  TESSERA_ASSIGN_OR_RETURN(auto trainer,
                           Trainer::Create(o, layout, store, backend.get(), reader.get()));
  TESSERA_RETURN_IF_ERROR(trainer->Init());
  return trainer->Train();
}

// Every dense parameter and the embedding rows of `keys`.
std::vector<float> Params(ParamStore* store, const ModelLayout& layout,
                          const std::vector<uint64_t>& keys) {
  std::vector<float> out(layout.num_params());
  for (const auto& t : layout.dense_tables()) {
    auto id = store->AddTable(t.spec);
    EXPECT_TRUE(id.ok());
    EXPECT_TRUE(store->DensePull(*id, 0, t.spec.length, out.data() + t.offset).Wait().ok());
  }
  EXPECT_FALSE(keys.empty());
  auto emb = store->AddTable(layout.embedding_table());
  EXPECT_TRUE(emb.ok());
  std::vector<float> rows(keys.size() * layout.config().embedding_dim);
  EXPECT_TRUE(store->Pull(*emb, keys, rows.data()).Wait().ok());
  out.insert(out.end(), rows.begin(), rows.end());
  return out;
}

struct PullCase {
  int32_t staleness;
  uint32_t depth;
  bool prefetch;
  int64_t pull_ahead;  // the documented rule's j
};

void PrintTo(const PullCase& c, std::ostream* os) {
  *os << "staleness " << c.staleness << " depth " << c.depth << " prefetch " << c.prefetch
      << " pull-ahead " << c.pull_ahead;
}

class TrainerPullAheadTest : public ::testing::TestWithParam<PullCase> {};

// Step m's pull is issued at clock max(0, m - 1 - j), j by the rule of prefetch_depth; under BSP
// (j = 0) every pull also comes after the previous step's pushes were acknowledged, although
// the store acknowledges them late (only when no Clock came for 20 ms).
TEST_P(TrainerPullAheadTest, PullsAreIssuedAtTheDocumentedClock) {
  const PullCase c = GetParam();
  auto layout = ModelLayout::Create(Model());
  ASSERT_TRUE(layout.ok());
  auto inner = CreateLocalStore();
  RecordingStore store(inner.get(), layout->embedding_table().name, -1,
                       std::chrono::milliseconds(20));
  TrainerOptions o = Options(c.staleness, c.depth, 12);
  o.prefetch = c.prefetch;
  auto r = TrainOn(&store, *layout, o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->steps, 12u);
  const auto pulls = store.pulls();
  ASSERT_EQ(pulls.size(), 12u);  // none for steps past max_steps
  for (size_t i = 0; i < pulls.size(); ++i) {
    const int64_t m = static_cast<int64_t>(i) + 1;
    EXPECT_EQ(pulls[i].clock, std::max<int64_t>(0, m - 1 - c.pull_ahead)) << "step " << m;
    if (c.staleness > 0) {
      EXPECT_GE(pulls[i].clock, m - 1 - c.staleness) << "step " << m;
    }
    if (c.staleness == 0) {
      EXPECT_GE(pulls[i].acked_through, m - 1) << "step " << m;
    }
  }
  EXPECT_EQ(store.pulls_issued(), store.pulls_waited());
}

INSTANTIATE_TEST_SUITE_P(Rules, TrainerPullAheadTest,
                         ::testing::Values(PullCase{0, 4, true, 0}, PullCase{1, 4, true, 1},
                                           PullCase{2, 4, true, 2}, PullCase{6, 4, true, 4},
                                           PullCase{-1, 4, true, 4}, PullCase{-1, 1, true, 1},
                                           PullCase{2, 1, true, 1}, PullCase{-1, 4, false, 0}),
                         [](const auto& info) {
                           const PullCase& c = info.param;
                           return std::string(c.staleness < 0 ? "async" : "s") +
                                  (c.staleness < 0 ? "" : std::to_string(c.staleness)) + "_d" +
                                  std::to_string(c.depth) + (c.prefetch ? "" : "_off");
                         });

// Under BSP a deep prefetch trains exactly the parameters of depth 1 and of no prefetch.
TEST(TrainerPrefetch, BspDeepPrefetchGivesExactlyTheSameParameters) {
  auto layout = ModelLayout::Create(Model());
  ASSERT_TRUE(layout.ok());
  std::vector<std::vector<float>> params;
  std::vector<double> losses;
  for (uint32_t depth : {1u, 4u, 0u}) {
    auto inner = CreateLocalStore();
    RecordingStore store(inner.get(), layout->embedding_table().name, 1,
                         std::chrono::milliseconds(20));
    TrainerOptions o = Options(0, depth == 0 ? 1 : depth, 10);
    o.prefetch = depth != 0;
    auto r = TrainOn(&store, *layout, o);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    params.push_back(Params(inner.get(), *layout, store.keys()));
    losses.push_back(r->train_loss);
  }
  EXPECT_EQ(params[1], params[0]);
  EXPECT_EQ(params[2], params[0]);
  EXPECT_EQ(losses[1], losses[0]);
}

// With max_pushes_in_flight M and a store that acknowledges step n's pushes only once step
// n + M - 1 called Clock, exactly M - 1 earlier steps are unacknowledged whenever a step
// pushes (never more), and position records come in step order, each after its step's pushes
// and all earlier ones are acknowledged.
TEST(TrainerPrefetch, PushesInFlightAreBoundedAndCommitsInOrder) {
  auto layout = ModelLayout::Create(Model());
  ASSERT_TRUE(layout.ok());
  for (uint32_t m : {1u, 2u, 3u}) {
    SCOPED_TRACE("max_pushes_in_flight " + std::to_string(m));
    auto inner = CreateLocalStore();
    RecordingStore store(inner.get(), layout->embedding_table().name, m - 1,
                         std::chrono::milliseconds(200));
    TrainerOptions o = Options(-1, 4, 16);
    o.max_pushes_in_flight = m;
    std::vector<uint64_t> committed;
    o.on_commit = [&](uint64_t step) { committed.push_back(step); };
    auto r = TrainOn(&store, *layout, o);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(store.max_unacked_before_push(), static_cast<int64_t>(m) - 1);
    const auto commits = store.commits();
    ASSERT_EQ(commits.size(), 16u);
    for (size_t i = 0; i < commits.size(); ++i) {
      EXPECT_EQ(commits[i].first, static_cast<int64_t>(i) + 1);
      EXPECT_GE(commits[i].second, commits[i].first) << "record of step " << commits[i].first
                                                     << " before its pushes were acknowledged";
    }
    ASSERT_EQ(committed.size(), 16u);
    for (size_t i = 0; i < committed.size(); ++i) EXPECT_EQ(committed[i], i + 1);
    EXPECT_EQ(inner->GetMeta("ctr/pos/0").value().value().rfind("step=16 ", 0), 0u);
  }
}

// A stop at a pause with deep prefetch: the prefetched steps' pulls (issued, not computed) are
// all waited for before Train returns, so none writes into the dropped buffers.
TEST(TrainerPrefetch, StopAtPauseWaitsForThePrefetchedPulls) {
  auto layout = ModelLayout::Create(Model());
  ASSERT_TRUE(layout.ok());
  auto inner = CreateLocalStore();
  RecordingStore store(inner.get(), layout->embedding_table().name, 0,
                       std::chrono::milliseconds(20));
  TrainerOptions o = Options(-1, 4, 0);
  o.pause_at = [](uint64_t step) { return step == 3; };
  o.on_pause = [](const TrainProgress&) -> Result<bool> { return true; };
  auto r = TrainOn(&store, *layout, o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->stopped);
  EXPECT_EQ(r->steps, 3u);
  EXPECT_EQ(store.pulls().size(), 7u);  // steps 4..7 were pulled ahead
  EXPECT_EQ(store.pulls_issued(), store.pulls_waited());
  EXPECT_EQ(inner->GetMeta("ctr/pos/0").value().value().rfind("step=3 ", 0), 0u);
}

// Errors with deep prefetch (a failed pull while later ones are in flight, failed pushes):
// Train fails with the error and no pull is left in flight; nothing after the failed step is
// committed.
TEST(TrainerPrefetch, ErrorsLeaveNoPullInFlight) {
  auto layout = ModelLayout::Create(Model());
  ASSERT_TRUE(layout.ok());
  {
    auto inner = CreateLocalStore();
    RecordingStore store(inner.get(), layout->embedding_table().name, 0,
                         std::chrono::milliseconds(20));
    store.FailPull(5);
    auto r = TrainOn(&store, *layout, Options(-1, 4, 20));
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().ToString().find("test: pull failed"), std::string::npos)
        << r.status().ToString();
    EXPECT_GT(store.pulls().size(), 5u);
    EXPECT_EQ(store.pulls_issued(), store.pulls_waited());
  }
  {
    auto inner = CreateLocalStore();
    RecordingStore store(inner.get(), layout->embedding_table().name, 0,
                         std::chrono::milliseconds(20));
    store.FailPushesOfStep(4);
    auto r = TrainOn(&store, *layout, Options(-1, 4, 20));
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().ToString().find("test: push failed"), std::string::npos)
        << r.status().ToString();
    EXPECT_EQ(store.pulls_issued(), store.pulls_waited());
    for (const auto& c : store.commits()) EXPECT_LT(c.first, 4);
  }
}

// Two local ranks (CPU threads), the leader's store recording: BSP with depth 4 equals depth 1
// exactly, and a stop at a pause leaves no pull in flight on the leader.
TEST(TrainerPrefetch, ReducedRanksWithDeepPrefetch) {
  auto layout = ModelLayout::Create(Model());
  ASSERT_TRUE(layout.ok());
  auto run = [&](const TrainerOptions& o, ParamStore* store) -> Status {
    TESSERA_ASSIGN_OR_RETURN(auto group, CpuReduceGroup::Create(2));
    return RunLocalRanks(2, group.get(), [&](uint32_t r) -> Status {
      TESSERA_ASSIGN_OR_RETURN(auto member, group->Join(r));
      TESSERA_ASSIGN_OR_RETURN(auto reader, SyntheticReader::Create(Data(r, 2)));
      TESSERA_ASSIGN_OR_RETURN(auto backend, CreateCpuBackend(*layout, {1}));
      TESSERA_ASSIGN_OR_RETURN(auto trainer,
                               Trainer::Create(o, *layout, r == 0 ? store : nullptr,
                                               backend.get(), reader.get(), member.get()));
      TESSERA_RETURN_IF_ERROR(trainer->Init());
      TESSERA_ASSIGN_OR_RETURN(TrainResult tr, trainer->Train());
      if (tr.steps != (o.pause_at ? 2u : 8u)) {
        return Status::Internal("steps " + std::to_string(tr.steps));
      }
      return Status::OK();
    });
  };
  std::vector<std::vector<float>> params;
  for (uint32_t depth : {1u, 4u}) {
    auto inner = CreateLocalStore();
    RecordingStore store(inner.get(), layout->embedding_table().name, 1,
                         std::chrono::milliseconds(20));
    Status s = run(Options(0, depth, 8), &store);
    ASSERT_TRUE(s.ok()) << s.ToString();
    params.push_back(Params(inner.get(), *layout, store.keys()));
  }
  EXPECT_EQ(params[1], params[0]);

  auto inner = CreateLocalStore();
  RecordingStore store(inner.get(), layout->embedding_table().name, 0,
                       std::chrono::milliseconds(20));
  TrainerOptions o = Options(-1, 4, 0);
  o.pause_at = [](uint64_t step) { return step == 2; };
  o.on_pause = [](const TrainProgress&) -> Result<bool> { return true; };
  Status s = run(o, &store);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(store.pulls().size(), 6u);
  EXPECT_EQ(store.pulls_issued(), store.pulls_waited());
}

TEST(TrainerPrefetch, DepthOutOfRangeIsRefused) {
  auto layout = ModelLayout::Create(Model());
  ASSERT_TRUE(layout.ok());
  auto store = CreateLocalStore();
  auto reader = SyntheticReader::Create(Data());
  ASSERT_TRUE(reader.ok());
  auto backend = CreateCpuBackend(*layout, {1});
  ASSERT_TRUE(backend.ok());
  for (uint32_t d : {0u, kMaxPrefetchDepth + 1}) {
    TrainerOptions o = Options(-1, d, 1);
    auto t = Trainer::Create(o, *layout, store.get(), backend->get(), reader->get());
    ASSERT_FALSE(t.ok());
    EXPECT_NE(t.status().ToString().find("prefetch_depth is " + std::to_string(d)),
              std::string::npos)
        << t.status().ToString();
    o = Options(-1, 2, 1);
    o.max_pushes_in_flight = d;
    EXPECT_FALSE(Trainer::Create(o, *layout, store.get(), backend->get(), reader->get()).ok());
  }
}

// A CPU backend that records the calls the trainer makes: what each Stage was handed (the batch
// pointers, whether parameters came with it) and the batch each computing call computed.
class StageRecordingBackend final : public Backend {
 public:
  struct Call {
    bool stage;
    uint32_t batch_size;
    const uint32_t* offsets;
    const uint32_t* rows;
    bool with_params;
  };
  explicit StageRecordingBackend(std::unique_ptr<Backend> inner) : inner_(std::move(inner)) {}
  std::string_view name() const override { return inner_->name(); }
  Status Forward(const ModelInput& in, float* probs) override {
    Record(false, in);
    return inner_->Forward(in, probs);
  }
  Status ForwardBackward(const ModelInput& in, float loss_scale, float* probs,
                         ModelGrads* grads) override {
    Record(false, in);
    return inner_->ForwardBackward(in, loss_scale, probs, grads);
  }
  Status Stage(const ModelInput& in) override {
    Record(true, in);
    return inner_->Stage(in);
  }
  const std::vector<Call>& calls() const { return calls_; }

 private:
  void Record(bool stage, const ModelInput& in) {
    calls_.push_back({stage, in.batch_size, in.offsets, in.rows,
                      in.params != nullptr || in.embeddings != nullptr || in.wide != nullptr});
  }
  std::unique_ptr<Backend> inner_;
  std::vector<Call> calls_;
};

// With prefetch, the trainer stages step k + 1's batch (its pulled rows and parameters left to
// the computing call: they may still be in flight) before step k computes, the staged batch is
// the very memory step k + 1 then computes, and the last call, once Train is done, drops what
// is staged (an empty batch): Backend::Stage's contract, which the CUDA backend relies on.
TEST(TrainerPrefetch, NextBatchIsStagedBeforeThisOneComputesAndDroppedAtTheEnd) {
  auto layout = ModelLayout::Create(Model());
  ASSERT_TRUE(layout.ok());
  constexpr uint64_t kSteps = 6;
  for (int32_t staleness : {-1, 0}) {
    SCOPED_TRACE("staleness " + std::to_string(staleness));
    auto store = CreateLocalStore();
    auto reader = SyntheticReader::Create(Data());
    ASSERT_TRUE(reader.ok());
    auto cpu = CreateCpuBackend(*layout, {1});
    ASSERT_TRUE(cpu.ok());
    StageRecordingBackend backend(std::move(*cpu));
    auto trainer = Trainer::Create(Options(staleness, 2, kSteps), *layout, store.get(), &backend,
                                   reader->get());
    ASSERT_TRUE(trainer.ok()) << trainer.status().ToString();
    ASSERT_TRUE((*trainer)->Init().ok());
    auto r = (*trainer)->Train();
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_EQ(r->steps, kSteps);

    const auto& calls = backend.calls();
    std::vector<const StageRecordingBackend::Call*> computes;
    for (const auto& c : calls) {
      if (!c.stage) computes.push_back(&c);
    }
    ASSERT_EQ(computes.size(), kSteps);
    // Steps 2..kSteps are each staged once, right before the step before them computes.
    uint64_t k = 0;  // computes seen
    for (size_t i = 0; i + 1 < calls.size(); ++i) {
      if (!calls[i].stage) {
        ++k;
        continue;
      }
      ASSERT_LT(k + 1, kSteps) << "call " << i << ": a batch staged after the last step";
      ASSERT_FALSE(calls[i + 1].stage) << "call " << i << ": two stages in a row";
      EXPECT_EQ(calls[i].batch_size, kBatch);
      EXPECT_FALSE(calls[i].with_params) << "call " << i;
      EXPECT_EQ(calls[i].offsets, computes[k + 1]->offsets) << "call " << i;
      EXPECT_EQ(calls[i].rows, computes[k + 1]->rows) << "call " << i;
    }
    size_t stages = 0;
    for (const auto& c : calls) stages += c.stage && c.batch_size > 0;
    EXPECT_EQ(stages, kSteps - 1);
    ASSERT_FALSE(calls.empty());
    EXPECT_TRUE(calls.back().stage);
    EXPECT_EQ(calls.back().batch_size, 0u) << "what was staged is not dropped at the end";
  }
}

}  // namespace
}  // namespace tessera::worker
