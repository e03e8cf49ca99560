#include "worker/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <limits>
#include <sstream>
#include <thread>

#include "ps/mutex.h"
#include "worker/metrics.h"

namespace tessera::worker {

// Commits steps in the background, strictly in step order: for each submitted step, waits
// for its pushes (and Clock) and then records it as committed (its data position and clock)
// with PutMeta. Steps queue up without waiting; the trainer bounds how many with WaitBelow.
// After the first failure nothing more is committed. Destruction drops the steps not begun
// (their pushes copied their inputs: nothing of the trainer's is touched afterwards).
class Trainer::Committer {
 public:
  explicit Committer(ParamStore* store) : store_(store), thread_([this] { Run(); }) {}
  ~Committer() {
    {
      MutexLock lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  /// Waits until fewer than `n` steps are submitted and not yet committed (or a commit
  /// failed); returns the first error of any commit so far.
  Status WaitBelow(size_t n) {
    MutexLock lock(mu_);
    while (status_.ok() && queue_.size() >= n) cv_.wait(lock.native());
    return status_;
  }
  /// Waits until every submitted step is committed; the first error of any commit so far.
  Status WaitIdle() { return WaitBelow(1); }

  void Submit(std::vector<Pending> pending, std::string key, std::string value,
              std::function<void()> done) {
    MutexLock lock(mu_);
    if (!status_.ok()) return;  // an earlier step failed: later ones are never committed
    queue_.push_back(Item{std::move(pending), std::move(key), std::move(value), std::move(done)});
    cv_.notify_all();
  }

 private:
  struct Item {
    std::vector<Pending> pending;
    std::string key, value;
    std::function<void()> done;
  };

  void Run() ABSL_LOCKS_EXCLUDED(mu_) {
    MutexLock lock(mu_);
    while (true) {
      while (!stop_ && queue_.empty()) cv_.wait(lock.native());
      if (stop_) return;
      // The item stays at the front (counted as in flight) until it is committed.
      Item& item = queue_.front();
      std::vector<Pending> pending = std::move(item.pending);
      const std::string key = std::move(item.key), value = std::move(item.value);
      auto done = std::move(item.done);
      lock.Unlock();
      Status s;
      for (Pending& p : pending) {
        Status w = p.Wait();
        if (s.ok() && !w.ok()) s = w.WithContext("push");
      }
      if (s.ok()) s = store_->PutMeta(key, value).WithContext("commit");
      if (s.ok() && done) done();
      lock.Lock();
      queue_.pop_front();
      if (status_.ok() && !s.ok()) {
        status_ = s;
        queue_.clear();
      }
      cv_.notify_all();
    }
  }

  ParamStore* store_;
  Mutex mu_;
  std::condition_variable cv_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  Status status_ ABSL_GUARDED_BY(mu_);
  std::deque<Item> queue_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

struct Trainer::Step {
  ReadyBatch ready;  // the feed's batch; passed back to it so that its buffers are reused
  uint64_t global_size = 0;
  std::vector<uint64_t> keys;
  std::vector<uint32_t> rows;
  std::vector<uint64_t> positions;
  std::vector<float> emb, wide, params;
  std::vector<Pending> pulls;
  bool end = false;
};

namespace {

using SteadyClock = std::chrono::steady_clock;
double SecondsSince(SteadyClock::time_point t) {
  return std::chrono::duration<double>(SteadyClock::now() - t).count();
}

// The progress since the previous report (leader; other ranks, with no running metrics, get
// zeros in the figures they do not track). Each report starts the next report's window.
class ProgressWindow {
 public:
  explicit ProgressWindow(SteadyClock::time_point start) : start_(start), last_report_(start) {}

  // `result` holds the run's sums so far (samples, summed loss).
  TrainProgress Next(uint64_t step, const TrainResult& result, const RunningMetrics* running) {
    TrainProgress p;
    p.step = step;
    p.samples = result.samples;
    p.seconds = SecondsSince(start_);
    const double dt = SecondsSince(last_report_);
    p.samples_per_s = dt > 0 ? static_cast<double>(result.samples - last_samples_) / dt : 0;
    p.loss = result.samples > last_samples_
                 ? (result.train_loss - last_loss_) /
                       static_cast<double>(result.samples - last_samples_)
                 : 0;
    if (running != nullptr) {
      p.running_auc = running->Auc();
      p.running_logloss = running->LogLoss();
    }
    last_report_ = SteadyClock::now();
    last_samples_ = result.samples;
    last_loss_ = result.train_loss;
    return p;
  }
  double SecondsSinceReport() const { return SecondsSince(last_report_); }

 private:
  const SteadyClock::time_point start_;
  SteadyClock::time_point last_report_;
  uint64_t last_samples_ = 0;
  double last_loss_ = 0;
};

// The run's sums (samples, summed loss) into its figures, after `seconds` of training.
void FinishResult(double seconds, TrainResult* result) {
  result->seconds = seconds;
  result->samples_per_s = seconds > 0 ? static_cast<double>(result->samples) / seconds : 0;
  result->train_loss =
      result->samples > 0 ? result->train_loss / static_cast<double>(result->samples) : 0;
}

struct Position {
  uint64_t step = 0;
  int64_t clock = 0;
  std::vector<uint64_t> positions;
};

std::string FormatPosition(uint64_t step, int64_t clock, const std::vector<uint64_t>& pos) {
  std::string s = "step=" + std::to_string(step) + " clock=" + std::to_string(clock) + " pos=";
  for (size_t i = 0; i < pos.size(); ++i) {
    if (i > 0) s += ",";
    s += std::to_string(pos[i]);
  }
  return s;
}

Result<Position> ParsePosition(const std::string& s) {
  Position p;
  std::istringstream in(s);
  std::string tok;
  bool has_step = false, has_pos = false;
  while (in >> tok) {
    const size_t eq = tok.find('=');
    if (eq == std::string::npos) return Status::Corruption("bad position record '" + s + "'");
    const std::string k = tok.substr(0, eq), v = tok.substr(eq + 1);
    char* end = nullptr;
    if (k == "step") {
      p.step = std::strtoull(v.c_str(), &end, 10);
      has_step = end != v.c_str();
    } else if (k == "clock") {
      p.clock = std::strtoll(v.c_str(), &end, 10);
    } else if (k == "pos") {
      std::istringstream ps(v);
      std::string item;
      while (std::getline(ps, item, ','))
        p.positions.push_back(std::strtoull(item.c_str(), nullptr, 10));
      has_pos = !p.positions.empty();
    }
  }
  if (!has_step || !has_pos) return Status::Corruption("bad position record '" + s + "'");
  return p;
}

// A uint64 from the leader to every local rank.
Result<uint64_t> ShareFromLeader(LocalReducer* r, uint64_t v) {
  std::vector<uint64_t> all;
  TESSERA_RETURN_IF_ERROR(r->AllGather(r->leader() ? v : 0, &all));
  return all[0];
}

}  // namespace

Result<std::unique_ptr<Trainer>> Trainer::Create(const TrainerOptions& options,
                                                 const ModelLayout& layout, ParamStore* store,
                                                 Backend* backend, DataReader* reader,
                                                 LocalReducer* reducer) {
  const bool leader = reducer == nullptr || reducer->leader();
  if (leader && store == nullptr) return Status::InvalidArgument("the leader needs a store");
  if (backend == nullptr || reader == nullptr) {
    return Status::InvalidArgument("trainer needs a backend and a reader");
  }
  if (options.batch_size == 0) return Status::InvalidArgument("batch_size is 0");
  if (options.prefetch_depth == 0 || options.prefetch_depth > kMaxPrefetchDepth) {
    return Status::InvalidArgument("prefetch_depth is " + std::to_string(options.prefetch_depth) +
                                   ", not in [1, " + std::to_string(kMaxPrefetchDepth) + "]");
  }
  if (options.max_pushes_in_flight == 0 || options.max_pushes_in_flight > kMaxPrefetchDepth) {
    return Status::InvalidArgument(
        "max_pushes_in_flight is " + std::to_string(options.max_pushes_in_flight) +
        ", not in [1, " + std::to_string(kMaxPrefetchDepth) + "]");
  }
  const ModelConfig& c = layout.config();
  const Schema& s = reader->schema();
  if (s.num_fields != c.num_fields || (c.deep && s.num_dense != c.num_dense)) {
    return Status::InvalidArgument("data has " + std::to_string(s.num_dense) +
                                   " dense features and " + std::to_string(s.num_fields) +
                                   " fields; the model wants " + std::to_string(c.num_dense) +
                                   " and " + std::to_string(c.num_fields));
  }
  return std::unique_ptr<Trainer>(new Trainer(options, layout, store, backend, reader, reducer));
}

Trainer::Trainer(const TrainerOptions& options, const ModelLayout& layout, ParamStore* store,
                 Backend* backend, DataReader* reader, LocalReducer* reducer)
    : options_(options),
      layout_(layout),
      store_(store),
      backend_(backend),
      reader_(reader),
      reducer_(reducer),
      leader_(reducer == nullptr || reducer->leader()) {
  if (leader_) committer_ = std::make_unique<Committer>(store_);
}

Trainer::~Trainer() = default;

std::string Trainer::MetaKey() const {
  return options_.job + "/pos/" + std::to_string(options_.worker_id);
}

Status Trainer::Init() {
  const ModelConfig& c = layout_.config();
  Position pos;
  bool resumed = false;
  Status st;
  if (leader_) {
    dense_tables_.clear();
    for (const auto& t : layout_.dense_tables()) {
      TESSERA_ASSIGN_OR_RETURN(uint32_t id, store_->AddTable(t.spec));
      dense_tables_.push_back(id);
    }
    if (c.deep) {
      TESSERA_ASSIGN_OR_RETURN(emb_table_, store_->AddTable(layout_.embedding_table()));
    }
    if (c.wide) {
      TESSERA_ASSIGN_OR_RETURN(wide_table_, store_->AddTable(layout_.wide_table()));
    }
    if (options_.resume) {
      auto meta = store_->GetMeta(MetaKey());
      if (!meta.ok()) {
        st = meta.status().WithContext("reading position");
      } else if (meta->has_value()) {
        auto parsed = ParsePosition(**meta);
        if (!parsed.ok()) {
          st = parsed.status();
        } else {
          pos = *parsed;
          resumed = true;
          const uint32_t ranks = reducer_ ? reducer_->size() : 1;
          if (pos.positions.size() != ranks) {
            st = Status::FailedPrecondition("stored position has " +
                                            std::to_string(pos.positions.size()) +
                                            " local ranks, this node has " + std::to_string(ranks));
          }
        }
      }
    }
  }
  if (reducer_ != nullptr) {
    // Every rank learns whether the leader failed, the resumed step and its own position.
    TESSERA_ASSIGN_OR_RETURN(uint64_t ok, ShareFromLeader(reducer_, st.ok() ? 1 : 0));
    if (!ok) return st.ok() ? Status::Internal("leader failed to initialize") : st;
    TESSERA_ASSIGN_OR_RETURN(uint64_t r, ShareFromLeader(reducer_, resumed ? 1 : 0));
    resumed = r != 0;
    TESSERA_ASSIGN_OR_RETURN(pos.step, ShareFromLeader(reducer_, pos.step));
    std::vector<uint64_t> mine(reducer_->size());
    for (uint32_t i = 0; i < reducer_->size(); ++i) {
      TESSERA_ASSIGN_OR_RETURN(
          mine[i], ShareFromLeader(reducer_, i < pos.positions.size() ? pos.positions[i] : 0));
    }
    pos.positions = mine;
  } else {
    TESSERA_RETURN_IF_ERROR(st);
  }
  step_ = 0;
  if (!resumed && options_.start_clock > 0 && leader_) {
    TESSERA_RETURN_IF_ERROR(store_->SetClock(options_.start_clock));
  }
  if (resumed) {
    step_ = pos.step;
    const uint32_t me = reducer_ ? reducer_->rank() : 0;
    TESSERA_RETURN_IF_ERROR(reader_->Seek(pos.positions[me]).WithContext("resuming"));
    if (leader_) TESSERA_RETURN_IF_ERROR(store_->SetClock(pos.clock));
  }
  return Status::OK();
}

Status Trainer::Prepare(Step* s) {
  s->pulls.clear();
  if (feed_ == nullptr) {  // the first batch of Train: read on from where Init left the reader
    auto feed = BatchFeed::Start(
        reader_, {.batch_size = options_.batch_size, .threads = options_.data_threads});
    if (!feed.ok()) return feed.status().WithContext("data feed");
    feed_ = std::move(*feed);
  }
  // The feed has read, parsed and indexed the batch (IndexBatch) ahead on its threads.
  TESSERA_ASSIGN_OR_RETURN(const bool more, feed_->Next(&s->ready));
  const uint32_t n = more ? s->ready.batch.size : 0;
  if (reducer_ != nullptr) {
    std::vector<uint64_t> sizes;
    TESSERA_RETURN_IF_ERROR(reducer_->AllGather(n, &sizes));
    s->global_size = 0;
    for (uint64_t x : sizes) s->global_size += x;
    TESSERA_RETURN_IF_ERROR(reducer_->AllGather(s->ready.position, &s->positions));
  } else {
    s->global_size = n;
    s->positions.assign(1, s->ready.position);
  }
  s->end = s->global_size == 0;
  if (s->end) return Status::OK();
  IndexedBatch& ib = s->ready.index;
  if (reducer_ != nullptr) {
    TESSERA_RETURN_IF_ERROR(reducer_->UnionKeys(ib.unique_keys, &s->keys));
    TESSERA_RETURN_IF_ERROR(IndexBatchOnto(s->ready.batch, s->keys, &s->rows));
  } else {
    // Swapped, not moved: both buffers keep their capacity for the next batches.
    s->keys.swap(ib.unique_keys);
    s->rows.swap(ib.rows);
  }
  return Status::OK();
}

Status Trainer::IssuePull(Step* s) {
  if (s->end) return Status::OK();
  const ModelConfig& c = layout_.config();
  s->emb.resize(c.deep ? s->keys.size() * c.embedding_dim : 0);
  s->wide.resize(c.wide ? s->keys.size() : 0);
  s->params.resize(layout_.num_params());
  if (!leader_) return Status::OK();
  if (c.deep) s->pulls.push_back(store_->Pull(emb_table_, s->keys, s->emb.data()));
  if (c.wide) s->pulls.push_back(store_->Pull(wide_table_, s->keys, s->wide.data()));
  const auto& dense = layout_.dense_tables();
  for (size_t i = 0; i < dense.size(); ++i) {
    s->pulls.push_back(store_->DensePull(dense_tables_[i], 0, dense[i].spec.length,
                                         s->params.data() + dense[i].offset));
  }
  return Status::OK();
}

Status Trainer::FinishPull(Step* s) {
  Status st;
  for (Pending& p : s->pulls) {
    Status w = p.Wait();
    if (st.ok() && !w.ok()) st = w.WithContext("pull");
  }
  s->pulls.clear();
  if (reducer_ == nullptr) return st;
  std::vector<uint64_t> oks;
  TESSERA_RETURN_IF_ERROR(reducer_->AllGather(st.ok() ? 1 : 0, &oks));
  if (oks[0] == 0) return st.ok() ? Status::Unavailable("the leader's pull failed") : st;
  TESSERA_RETURN_IF_ERROR(reducer_->Broadcast(s->emb));
  TESSERA_RETURN_IF_ERROR(reducer_->Broadcast(s->wide));
  return reducer_->Broadcast(s->params);
}

float LrSchedule::Factor(uint64_t k) const {
  if (k == 0) k = 1;
  if (warmup_steps > 0 && k < warmup_steps) {
    return static_cast<float>(static_cast<double>(k) / static_cast<double>(warmup_steps));
  }
  if (decay == Decay::kNone || decay_steps == 0) return 1.0f;
  const uint64_t after = k - std::min(k, warmup_steps);
  const double p = std::min(1.0, static_cast<double>(after) / static_cast<double>(decay_steps));
  const double f = final_scale;
  if (decay == Decay::kLinear) return static_cast<float>(1.0 - (1.0 - f) * p);
  return static_cast<float>(f + (1.0 - f) * 0.5 * (1.0 + std::cos(M_PI * p)));
}

Result<LrSchedule::Decay> ParseLrDecay(std::string_view name) {
  if (name == "none") return LrSchedule::Decay::kNone;
  if (name == "linear") return LrSchedule::Decay::kLinear;
  if (name == "cosine") return LrSchedule::Decay::kCosine;
  return Status::InvalidArgument("learning-rate decay must be none, linear or cosine, not '" +
                                 std::string(name) + "'");
}

Status Trainer::ComputeAndPush(Step* s, TrainResult* result) {
  ModelGrads& grads = grads_;
  std::vector<float>& probs = probs_;
  const Batch& b = s->ready.batch;
  probs.resize(b.size);
  const ModelInput in = InputOf(s, true);
  const float scale = options_.mean_loss ? 1.0f / static_cast<float>(s->global_size) : 1.0f;
  if (reducer_ != nullptr) {
    // Sums over the local ranks (on the GPU with an NCCL reducer and a CUDA backend).
    TESSERA_RETURN_IF_ERROR(
        backend_->ForwardBackwardReduced(in, scale, probs.data(), &grads, reducer_));
  } else {
    TESSERA_RETURN_IF_ERROR(backend_->ForwardBackward(in, scale, probs.data(), &grads));
  }
  result->samples += s->global_size;
  result->train_loss += grads.loss_sum;
  ++step_;
  if (!leader_) return Status::OK();
  running_->Add(probs, b.labels);

  // At most max_pushes_in_flight steps pushed and uncommitted: a restarted worker redoes at
  // most those.
  TESSERA_RETURN_IF_ERROR(committer_->WaitBelow(options_.max_pushes_in_flight));
  const ModelConfig& c = layout_.config();
  if (options_.lr_schedule.active()) {
    TESSERA_RETURN_IF_ERROR(store_->SetLearningRateScale(options_.lr_schedule.Factor(step_)));
  }
  std::vector<Pending> pushes;
  if (c.deep) pushes.push_back(store_->Push(emb_table_, s->keys, grads.embeddings));
  if (c.wide) pushes.push_back(store_->Push(wide_table_, s->keys, grads.wide));
  const auto& dense = layout_.dense_tables();
  for (size_t i = 0; i < dense.size(); ++i) {
    pushes.push_back(store_->DensePush(
        dense_tables_[i], 0,
        std::span<const float>(grads.params.data() + dense[i].offset, dense[i].spec.length)));
  }
  if (options_.staleness == 0) {
    // Bulk-synchronous: the clock may only advance once this step's updates are applied.
    for (Pending& p : pushes) TESSERA_RETURN_IF_ERROR(p.Wait().WithContext("push"));
  }
  pushes.push_back(store_->Clock());
  const uint64_t step = step_;
  auto on_commit = options_.on_commit;
  committer_->Submit(std::move(pushes), MetaKey(),
                     FormatPosition(step, store_->clock(), s->positions),
                     on_commit ? std::function<void()>([on_commit, step] { on_commit(step); })
                               : std::function<void()>());
  return Status::OK();
}

Result<bool> Trainer::Pause(const TrainProgress& progress) {
  Status st;
  bool stop = false;
  if (leader_) {
    // What the pause looks at (the cluster's tables) must include this step.
    st = committer_->WaitIdle();
    if (st.ok()) {
      auto r = options_.on_pause(progress);
      if (r.ok()) {
        stop = *r;
      } else {
        st = r.status().WithContext("step " + std::to_string(step_));
      }
    }
  }
  if (reducer_ != nullptr) {
    // 0: go on, 1: stop, 2: the leader failed.
    TESSERA_ASSIGN_OR_RETURN(uint64_t v, ShareFromLeader(reducer_, st.ok() ? (stop ? 1 : 0) : 2));
    if (v == 2) return st.ok() ? Status::Internal("the leader's pause failed") : st;
    stop = v == 1;
  }
  TESSERA_RETURN_IF_ERROR(st);
  return stop;
}

uint32_t Trainer::DataAhead() const { return options_.prefetch ? options_.prefetch_depth : 0; }

uint32_t Trainer::PullAhead() const {
  if (!options_.prefetch || options_.staleness == 0) return 0;
  if (options_.staleness < 0) return options_.prefetch_depth;
  return std::min(options_.prefetch_depth, static_cast<uint32_t>(options_.staleness));
}

// The steps of a run in flight: step i of the run (0-based) lives in steps[i % steps.size()];
// steps [k, prepared) are prepared, steps [k, pulled) have their pulls issued, step k computes
// next. Pulls in flight write into the steps: destruction (every exit of Train) waits for them.
struct Trainer::Ring {
  explicit Ring(size_t size) : steps(size) {}
  ~Ring() {
    for (Step& s : steps) {
      for (Pending& p : s.pulls) (void)p.Wait();
      s.pulls.clear();
    }
  }
  Step* at(uint64_t i) { return &steps[i % steps.size()]; }

  std::vector<Step> steps;
  uint64_t k = 0, prepared = 0, pulled = 0;
  uint64_t budget = 0;    // steps this run may do (max_steps)
  bool data_end = false;  // a prepared step found the end of the data
};

// Prepares steps up to k + DataAhead() and issues pulls up to k + PullAhead(). The decisions
// depend only on what every local rank shares (the global batch sizes), so every rank runs the
// same collectives in the same order.
ModelInput Trainer::InputOf(Step* s, bool pulled) const {
  const Batch& b = s->ready.batch;
  ModelInput in;
  in.batch_size = b.size;
  in.dense = b.dense.data();
  in.labels = b.labels.data();
  in.offsets = b.offsets.data();
  in.rows = s->rows.data();
  in.weights = b.weights.empty() ? nullptr : b.weights.data();
  in.num_rows = static_cast<uint32_t>(s->keys.size());
  if (pulled) {
    in.embeddings = s->emb.data();
    in.wide = s->wide.data();
    in.params = s->params.data();
  }
  return in;
}

Status Trainer::StageNext(Ring* r) {
  if (r->k + 1 >= r->prepared) return Status::OK();
  Step* next = r->at(r->k + 1);
  if (next->end) return Status::OK();
  // Its pulls may still be in flight: the rows and parameters go with the computing call.
  return backend_->Stage(InputOf(next, false));
}

Status Trainer::Fill(Ring* r, uint32_t pull_ahead) {
  while (!r->data_end && r->prepared < r->budget && r->prepared <= r->k + DataAhead()) {
    Step* s = r->at(r->prepared);
    TESSERA_RETURN_IF_ERROR(Prepare(s));
    ++r->prepared;
    r->data_end = s->end;
  }
  while (r->pulled < r->prepared && r->pulled <= r->k + pull_ahead) {
    TESSERA_RETURN_IF_ERROR(IssuePull(r->at(r->pulled)));
    ++r->pulled;
  }
  return Status::OK();
}

Result<TrainResult> Trainer::Train() {
  TrainResult result;
  result.resumed_steps = step_;
  running_ = std::make_unique<RunningMetrics>(options_.running_window);
  const auto start = SteadyClock::now();
  ProgressWindow window(start);
  Ring ring(DataAhead() + 1);
  ring.budget = options_.max_steps == 0 ? std::numeric_limits<uint64_t>::max()
                                        : options_.max_steps - std::min(options_.max_steps, step_);
  auto fail = [&](Status s) -> Status {
    if (reducer_ != nullptr) {
      reducer_->Abort(s.WithContext("local rank " + std::to_string(reducer_->rank())));
    }
    return s;
  };
  auto report = [&] { return window.Next(step_, result, leader_ ? running_.get() : nullptr); };
  // The feed (started by the first Prepare) stops, its threads joined, when Train returns.
  struct FeedStop {
    std::unique_ptr<BatchFeed>& feed;
    ~FeedStop() { feed.reset(); }
  } feed_stop{feed_};

  // A batch staged for the backend and never computed is dropped before its memory goes.
  struct StageDrop {
    Backend* backend;
    ~StageDrop() { (void)backend->Stage(ModelInput{}); }
  } stage_drop{backend_};

  while (true) {
    Status s = Fill(&ring, 0);
    if (!s.ok()) return fail(s);
    if (ring.k == ring.prepared) break;  // max_steps
    Step* cur = ring.at(ring.k);
    if (cur->end) break;
    s = FinishPull(cur);
    // The steps ahead are pulled once this step's pull is in: a caching store (row_cache.h)
    // holds the rows a pull brought from when it is waited for, so the next pull finds them.
    if (s.ok()) s = Fill(&ring, PullAhead());
    if (s.ok()) s = StageNext(&ring);
    if (s.ok()) s = ComputeAndPush(cur, &result);
    if (!s.ok()) return fail(s);
    ++ring.k;
    if (options_.pause_at && options_.on_pause && options_.pause_at(step_)) {
      auto stop = Pause(report());
      if (!stop.ok()) return fail(stop.status());
      if (*stop) {
        result.stopped = true;
        break;  // the prefetched steps are dropped (~Ring waits for their pulls)
      }
    }
    if (leader_ && options_.progress_interval_s > 0 &&
        window.SecondsSinceReport() >= options_.progress_interval_s) {
      const TrainProgress p = report();
      if (options_.on_progress) options_.on_progress(p);
    }
  }
  if (leader_) {
    Status s = committer_->WaitIdle();
    if (!s.ok()) return fail(s);
  }
  result.steps = step_;
  FinishResult(SecondsSince(start), &result);
  result.running_auc = leader_ ? running_->Auc() : 0.5;
  return result;
}

Result<EvalResult> Evaluate(const ModelLayout& layout, ParamStore* store, Backend* backend,
                            DataReader* reader, uint32_t batch_size) {
  const ModelConfig& c = layout.config();
  std::vector<uint32_t> dense_ids;
  for (const auto& t : layout.dense_tables()) {
    TESSERA_ASSIGN_OR_RETURN(uint32_t id, store->AddTable(t.spec));
    dense_ids.push_back(id);
  }
  uint32_t emb = 0, wide = 0;
  if (c.deep) {
    TESSERA_ASSIGN_OR_RETURN(emb, store->AddTable(layout.embedding_table()));
  }
  if (c.wide) {
    TESSERA_ASSIGN_OR_RETURN(wide, store->AddTable(layout.wide_table()));
  }
  std::vector<float> params(layout.num_params());
  for (size_t i = 0; i < dense_ids.size(); ++i) {
    const auto& t = layout.dense_tables()[i];
    TESSERA_RETURN_IF_ERROR(
        store->DensePull(dense_ids[i], 0, t.spec.length, params.data() + t.offset).Wait());
  }
  std::vector<float> probs, labels, truth;
  // Batches read, parsed and indexed ahead (DefaultDataThreads()).
  TESSERA_ASSIGN_OR_RETURN(auto feed, BatchFeed::Start(reader, {.batch_size = batch_size}));
  ReadyBatch ready;
  const Batch& batch = ready.batch;
  const IndexedBatch& ib = ready.index;
  std::vector<float> emb_rows, wide_rows, p;
  while (true) {
    TESSERA_ASSIGN_OR_RETURN(const bool more, feed->Next(&ready));
    if (!more) break;
    emb_rows.resize(c.deep ? ib.unique_keys.size() * c.embedding_dim : 0);
    wide_rows.resize(c.wide ? ib.unique_keys.size() : 0);
    Pending pe, pw;
    if (c.deep) pe = store->Pull(emb, ib.unique_keys, emb_rows.data());
    if (c.wide) pw = store->Pull(wide, ib.unique_keys, wide_rows.data());
    TESSERA_RETURN_IF_ERROR(pe.Wait());
    TESSERA_RETURN_IF_ERROR(pw.Wait());
    ModelInput in;
    in.batch_size = batch.size;
    in.dense = batch.dense.data();
    in.offsets = batch.offsets.data();
    in.rows = ib.rows.data();
    in.weights = batch.weights.empty() ? nullptr : batch.weights.data();
    in.num_rows = static_cast<uint32_t>(ib.unique_keys.size());
    in.embeddings = emb_rows.data();
    in.wide = wide_rows.data();
    in.params = params.data();
    p.resize(batch.size);
    TESSERA_RETURN_IF_ERROR(backend->Forward(in, p.data()));
    probs.insert(probs.end(), p.begin(), p.end());
    labels.insert(labels.end(), batch.labels.begin(), batch.labels.end());
    truth.insert(truth.end(), batch.true_probs.begin(), batch.true_probs.end());
  }
  EvalResult r;
  r.samples = probs.size();
  r.auc = Auc(probs, labels);
  r.logloss = LogLoss(probs, labels);
  if (!truth.empty() && truth.size() == labels.size()) {
    r.oracle_auc = Auc(truth, labels);
    r.oracle_logloss = LogLoss(truth, labels);
  }
  return r;
}

}  // namespace tessera::worker
