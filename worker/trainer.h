// The training loop: pipelined pulls, compute, intra-node reduction, pushes, resumable position.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ps/status.h"
#include "worker/backend.h"
#include "worker/data_reader.h"
#include "worker/feed.h"
#include "worker/local_reducer.h"
#include "worker/metrics.h"
#include "worker/model.h"
#include "worker/param_store.h"

namespace tessera::worker {

/// Progress of a training run, reported every TrainerOptions::progress_interval_s.
struct TrainProgress {
  uint64_t step = 0;         ///< Steps done by this node (resumed steps included).
  uint64_t samples = 0;      ///< Samples trained by this node in this run.
  double seconds = 0;        ///< Wall time of this run.
  double samples_per_s = 0;  ///< Since the last report.
  double loss = 0;           ///< Mean training loss since the last report.
  double running_auc = 0.5;  ///< AUC of the leader's last predictions (before their update).
  double running_logloss = 0;
};

/// A learning-rate schedule: the factor every table's learning rate is multiplied by for the
/// pushes of step k (k = 1, 2, ...; resumed steps count), sent with the pushes
/// (Client::SetLearningRateScale; FTRL tables ignore it). Linear warm-up from 1/warmup_steps to
/// 1 over the first warmup_steps steps, then a decay from 1 to final_scale over decay_steps
/// steps (none: 1 throughout; linear; cosine: final + (1 - final) (1 + cos(pi p)) / 2), then
/// final_scale.
struct LrSchedule {
  enum class Decay : uint8_t { kNone, kLinear, kCosine };
  uint64_t warmup_steps = 0;
  Decay decay = Decay::kNone;
  uint64_t decay_steps = 0;
  float final_scale = 0.1f;
  /// Whether the factor is ever other than 1.
  bool active() const { return warmup_steps > 0 || (decay != Decay::kNone && decay_steps > 0); }
  /// The factor of step `k` (>= 1).
  float Factor(uint64_t k) const;
};

/// "none" | "linear" | "cosine"; InvalidArgument otherwise.
Result<LrSchedule::Decay> ParseLrDecay(std::string_view name);

/// The largest TrainerOptions::prefetch_depth and max_pushes_in_flight (each prefetched step
/// holds a batch and its pulled rows in memory).
inline constexpr uint32_t kMaxPrefetchDepth = 64;

/// Options of a Trainer.
struct TrainerOptions {
  /// Samples per step per local rank. Default: 1024.
  uint32_t batch_size = 1024;
  /// Stop after this many steps of this node (resumed steps count); 0: when the data ends.
  /// Default: 0.
  uint64_t max_steps = 0;
  /// Read the next batches and pull their parameters while the current batch computes
  /// (prefetch_depth says how far). false: nothing runs ahead (each step reads, pulls, computes
  /// and pushes in turn). Default: true.
  bool prefetch = true;
  /// Threads that read, parse and index batches ahead of training (a BatchFeed, worker/feed.h);
  /// the batches are the same whatever their number. 0: DefaultDataThreads(). Default: 0.
  uint32_t data_threads = 0;
  /// How many steps ahead of the one computing are prepared (read, keys deduplicated and, with
  /// a reducer, unioned); each has its own buffers (a ring of prefetch_depth + 1 steps). Their
  /// pulls run ahead by the pull-ahead j (step k's pull is issued before step k - j computes,
  /// on the client's clock of that moment):
  ///  - BSP (staleness 0): j = 0. Step k's pull is issued only after step k - 1's pushes are
  ///    acknowledged and its Clock sent, so it sees every worker's pushes of steps < k, exactly
  ///    as without prefetch; only data preparation runs ahead.
  ///  - SSP (staleness s > 0): j = min(prefetch_depth, s). Step k's pull is issued at clock
  ///    k - 1 - j or later (never more than s clocks early); the servers serve a pull issued at
  ///    clock c once every worker's clock reached c - s, so step k's values may lag each
  ///    worker by up to s + j <= 2s steps instead of s (s + 1 with depth 1, the behaviour
  ///    before prefetch_depth existed).
  ///  - asynchronous (staleness < 0): j = prefetch_depth. Step k computes on values that may
  ///    miss this worker's own last j steps of pushes (and whatever of the other workers'
  ///    pushes had not arrived when the pull was served).
  /// 1 .. kMaxPrefetchDepth; InvalidArgument otherwise (also with prefetch false). Default: 1
  /// (the async quality test's DeepFM gap to the oracle grew from 0.0076-0.0084 at depth 1 to
  /// 0.0091-0.0104 at depth 2, over its bar of 0.010 once in four runs).
  uint32_t prefetch_depth = 1;
  /// Steps whose pushes may be submitted and not yet acknowledged and committed (the leader
  /// waits before pushing another). Position records are written strictly in step order, each
  /// after that step's pushes and all earlier ones are acknowledged, so a worker that dies
  /// and restarts redoes at most this many steps (their pushes may have been applied: they are
  /// applied again). 1: one step at a time. Under BSP every step's pushes are acknowledged
  /// before its Clock anyway. 1 .. kMaxPrefetchDepth. Default: 2.
  uint32_t max_pushes_in_flight = 2;
  /// The job's staleness, as in ConsistencyOptions: -1 asynchronous, 0 bulk-synchronous (the
  /// next pull waits for this step's pushes), > 0 bounded. Default: -1.
  int32_t staleness = -1;
  /// This node's worker id (its rank among the job's nodes); names its position record.
  /// Default: 0.
  uint32_t worker_id = 0;
  /// The job name; position records are "<job>/pos/<worker_id>". Default: "ctr".
  std::string job = "ctr";
  /// Resume from the stored position and clock when there is one. Default: true.
  bool resume = true;
  /// A run that does not resume sets this worker's clock here first (0: leaves it at 0): a job
  /// that follows another one of the same worker id on the same servers goes on from that one's
  /// clock, so that its checkpoint cuts do not wait for a clock the earlier job reached.
  /// Default: 0.
  int64_t start_clock = 0;
  /// Seconds between progress reports (0: none). Default: 5.
  double progress_interval_s = 5;
  /// Called with each progress report (on the leader). Default: none.
  std::function<void(const TrainProgress&)> on_progress;
  /// Predictions the running AUC covers. Default: 100000.
  size_t running_window = 100000;
  /// Gradients are those of the global batch's summed loss (per-sample gradients summed, the
  /// scale FTRL's and SGD's hyper-parameters are usually given for); when true, of its mean.
  /// Adagrad and Adam are insensitive to the choice. Default: false.
  bool mean_loss = false;
  /// Called after each committed step with the step number (tests use it). Default: none.
  std::function<void(uint64_t)> on_commit;
  /// Pauses for validation: after step S with pause_at(S) true (every local rank asks), the
  /// leader waits until step S's pushes are applied and the step is committed, then calls
  /// on_pause with a progress report of the steps since the previous report (on_progress is
  /// not called for those); the other local ranks wait for its answer. true: training ends
  /// after step S (the batches prefetched for later steps are dropped once their pulls have
  /// finished); an error fails Train.
  /// Both or neither. Default: none.
  std::function<bool(uint64_t)> pause_at;
  /// The learning-rate schedule (pushes of the leader). Default: none (factor 1).
  LrSchedule lr_schedule;
  std::function<Result<bool>(const TrainProgress&)> on_pause;
};

/// The result of Train().
struct TrainResult {
  uint64_t steps = 0;          ///< Steps done by this node in total (resumed ones included).
  uint64_t resumed_steps = 0;  ///< Steps that were already done when this run started.
  uint64_t samples = 0;        ///< Samples this node trained in this run.
  double seconds = 0;
  double samples_per_s = 0;
  double train_loss = 0;  ///< Mean loss over this run's samples.
  double running_auc = 0.5;
  bool stopped = false;  ///< on_pause ended training before the data or max_steps did.
};

/// One local rank's training loop. With a LocalReducer, every local rank of the node runs its
/// own Trainer (same options, its own reader shard, backend and thread); only the leader
/// (local rank 0) talks to the servers, through `store`, which other ranks may pass as null.
/// Without one, the trainer is alone on its node. Not thread-safe: one thread calls it.
class Trainer {
 public:
  /// Borrows everything; all must outlive the trainer. `reducer` may be null.
  static Result<std::unique_ptr<Trainer>> Create(const TrainerOptions& options,
                                                 const ModelLayout& layout, ParamStore* store,
                                                 Backend* backend, DataReader* reader,
                                                 LocalReducer* reducer = nullptr);
  ~Trainer();

  /// Creates the tables (leader) and moves the reader to the stored position (resume).
  Status Init();
  /// Trains until the data ends or max_steps. The reader is read ahead (data_threads), so
  /// afterwards its position is past the batches trained.
  Result<TrainResult> Train();

 private:
  struct Step;
  struct Ring;
  class Committer;
  Trainer(const TrainerOptions& options, const ModelLayout& layout, ParamStore* store,
          Backend* backend, DataReader* reader, LocalReducer* reducer);
  Status Prepare(Step* step);
  Status IssuePull(Step* step);
  Status FinishPull(Step* step);
  Status ComputeAndPush(Step* step, TrainResult* result);
  // Steps prepared ahead of the one computing, and those of them whose pulls are issued
  // (TrainerOptions::prefetch_depth).
  uint32_t DataAhead() const;
  uint32_t PullAhead() const;
  // Prepares the steps ahead and issues the pulls of those up to `pull_ahead` past the current.
  Status Fill(Ring* ring, uint32_t pull_ahead);
  // The backend's input of a prepared step; its pulled rows and parameters only with `pulled`.
  ModelInput InputOf(Step* step, bool pulled) const;
  // Hands the next step's batch to the backend early (Backend::Stage: the CUDA backend uploads
  // it while this step computes).
  Status StageNext(Ring* ring);
  Result<bool> Pause(const TrainProgress& progress);
  std::string MetaKey() const;

  TrainerOptions options_;
  const ModelLayout& layout_;
  ParamStore* store_;
  Backend* backend_;
  DataReader* reader_;
  std::unique_ptr<BatchFeed> feed_;  // reads reader_ during Train
  LocalReducer* reducer_;
  bool leader_;
  uint32_t emb_table_ = 0, wide_table_ = 0;
  std::vector<uint32_t> dense_tables_;
  uint64_t step_ = 0;
  std::unique_ptr<Committer> committer_;
  std::unique_ptr<RunningMetrics> running_;
  ModelGrads grads_;
  std::vector<float> probs_;
};

/// Test-set quality.
struct EvalResult {
  uint64_t samples = 0;
  double auc = 0.5;
  double logloss = 0;
  /// AUC of the true probabilities (generated data); NaN when unknown.
  double oracle_auc = std::numeric_limits<double>::quiet_NaN();
  double oracle_logloss = std::numeric_limits<double>::quiet_NaN();
};

/// Predicts every sample of `reader` with the parameters in `store` (tables created by a
/// Trainer of the same layout) and scores the predictions.
Result<EvalResult> Evaluate(const ModelLayout& layout, ParamStore* store, Backend* backend,
                            DataReader* reader, uint32_t batch_size = 8192);

}  // namespace tessera::worker
