// Validation during training: when rounds happen, the job-wide stop decision, the best state.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ps/client/client.h"
#include "ps/status.h"
#include "worker/backend.h"
#include "worker/batch.h"
#include "worker/data_reader.h"
#include "worker/model.h"
#include "worker/param_store.h"

namespace tessera::worker {

/// When validation rounds happen: after every `every_steps`-th step, or (every_steps 0) after
/// the step in which each epoch of `epoch_samples` samples ends (a step reads `batch_size`
/// samples); and after `last_step`, the planned end (0: none). Every worker computes the same.
struct ValidationSchedule {
  uint64_t every_steps = 0;
  uint64_t epoch_samples = 0;
  uint32_t batch_size = 1;
  uint64_t last_step = 0;
  /// Whether a round follows step `step` (>= 1).
  bool Due(uint64_t step) const;
};

/// Steps of one node that read `epochs` passes over `shard_samples` samples per local rank,
/// `batch_size` a step, ending with the last step every rank still has a sample for: every
/// node of a job whose smallest shard has `shard_samples` can do this many (0 epochs: 0, no
/// end).
uint64_t PlannedSteps(uint64_t shard_samples, uint32_t epochs, uint32_t batch_size);

/// tessera-worker's --batch_size=0 picks the batch (at most 1024, at least 32) that gives an
/// epoch at least this many steps a rank.
inline constexpr uint64_t kMinStepsPerEpoch = 100;

/// That batch for a smallest training shard of `shard_samples` samples a rank:
/// clamp(shard / kMinStepsPerEpoch, 32, 1024).
uint32_t DefaultBatchSize(uint64_t shard_samples);

/// What picks the best validation round and stops early.
enum class EarlyStopping : uint8_t {
  kLogloss,  ///< the lowest logloss; stop when it has not improved for the patience
  kAuc,      ///< the highest AUC; stop when it has not improved for the patience
  kBoth,     ///< the highest AUC; stop when neither AUC nor logloss has improved for it
};
/// "logloss" | "auc" | "both"; InvalidArgument otherwise.
Result<EarlyStopping> ParseEarlyStopping(std::string_view name);

/// Options of a Validator.
struct ValidationOptions {
  /// Job name: the round records are "<job>/val/<step>" (the decision, written by worker 0)
  /// and "<job>/val/<step>/ready/<worker>" (the others). Default: "ctr".
  std::string job = "ctr";
  /// This worker's id; worker 0 evaluates and decides. Default: 0.
  uint32_t worker_id = 0;
  /// Workers in the job (all take part in every round). Default: 1.
  uint32_t num_workers = 1;
  /// Stop once the validation AUC has not improved on the best for this many rounds in a row;
  /// 0: never stop early. Default: 3.
  uint32_t patience = 3;
  /// The planned last step (0: none): a best found there is not checkpointed (nothing follows
  /// it). Default: 0.
  uint64_t last_step = 0;
  /// Worker 0 keeps the best state as a cluster checkpoint "<best_dir>/step-<S>" (a name
  /// relative to the servers' --admin_root; the client needs ClientOptions::admin_root), the
  /// previous best's directory removed. Empty: the best state is not kept. Default: empty.
  std::string best_dir;
  /// Samples per evaluation batch. Default: 8192.
  uint32_t eval_batch = 8192;
  /// What "better" means for the best round and early stopping: a higher AUC, or (false) a
  /// lower logloss. Default: logloss (docs/worker.md: on MovieLens the AUC of 9k validation
  /// samples stays flat over the epochs where the test AUC falls).
  bool by_auc = false;
  /// A round that improves either figure (AUC or logloss) resets the count of rounds without
  /// improvement, so the job stops only once neither has improved for `patience` rounds; the
  /// best round is still the one by_auc picks. Default: false (only that figure counts).
  bool patience_on_both = false;
};

/// The validation figures after one step.
struct ValidationPoint {
  uint64_t step = 0;
  uint64_t samples = 0;  ///< Validation samples scored.
  double auc = 0.5;
  double logloss = 0;
};

/// The early-stopping decision over a sequence of validation rounds, without I/O: which round
/// is the best (by AUC or logloss) and how many rounds in a row did not improve (the picking
/// figure, or with patience_on_both either figure). Not thread-safe.
class EarlyStopper {
 public:
  EarlyStopper(bool by_auc, bool patience_on_both, uint32_t patience)
      : by_auc_(by_auc), both_(patience_on_both), patience_(patience) {}
  /// Takes the next round; returns whether it is the new best.
  bool Add(const ValidationPoint& point);
  /// Whether the job stops after the last round added (patience 0: never).
  bool stop() const { return patience_ > 0 && bad_ >= patience_; }
  /// Rounds in a row without improvement.
  uint32_t rounds_without_improvement() const { return bad_; }
  const std::optional<ValidationPoint>& best() const { return best_; }

 private:
  bool by_auc_, both_;
  uint32_t patience_;
  std::optional<ValidationPoint> best_;
  double best_other_ = 0;  // the best so far of the figure that does not pick
  bool any_ = false;
  uint32_t bad_ = 0;
};

/// Runs the validation rounds of one worker (its leader rank). In a round after step S every
/// worker has its step S committed (pushes applied); the others record that they are there and
/// wait for worker 0's decision; worker 0 waits for them, scores the validation samples with
/// the cluster's parameters (Evaluate), checkpoints a new best, and records the decision. So
/// every worker stops after the same step, and worker 0 scores exactly the state after step S
/// of every worker. Not thread-safe: the leader's training thread calls it.
class Validator {
 public:
  /// Borrows `store`, `client` and `backend` (must outlive the validator). Worker 0 needs
  /// `backend` (CPU is enough) and `samples` (the validation set); `client` (Checkpoint,
  /// Restore) only with a best_dir. Other workers pass only `store`.
  static Result<std::unique_ptr<Validator>> Create(const ValidationOptions& options,
                                                   const ModelLayout& layout, ParamStore* store,
                                                   Client* client, Backend* backend,
                                                   Batch samples);
  ~Validator();

  /// The round after step `step` (every worker calls it after the same steps). Returns
  /// whether the job stops here. Blocks until worker 0 has decided (others) or every worker
  /// has arrived (worker 0); no time limit, as Barrier.
  Result<bool> Round(uint64_t step);
  /// Worker 0, once no worker trains any more: loads the best state's checkpoint into the
  /// cluster unless the state after `last_step` is the best (or none was kept); the position
  /// records "<job>/pos/<w>", which the checkpoint holds too, are put back to their final
  /// values. Returns the step restored, or nullopt when nothing was.
  Result<std::optional<uint64_t>> RestoreBest(uint64_t last_step);
  /// Worker 0: scores the validation samples with the cluster's parameters as they are now
  /// (step is 0 in the result). After RestoreBest, equal to best() (the check that the restore
  /// brought back that state).
  Result<ValidationPoint> Score();

  /// Worker 0: the best round so far (highest AUC or lowest logloss, the earliest of equals).
  std::optional<ValidationPoint> best() const { return stopper_.best(); }
  /// Worker 0: every round's figures.
  const std::vector<ValidationPoint>& history() const { return history_; }
  /// Worker 0: rounds in a row without improvement (of the picking figure; with
  /// patience_on_both, of either).
  uint32_t rounds_without_improvement() const { return stopper_.rounds_without_improvement(); }
  /// Worker 0: the checkpoint name holding the best state; empty when none.
  const std::string& best_checkpoint() const { return best_ckpt_; }

 private:
  Validator(const ValidationOptions& options, const ModelLayout& layout, ParamStore* store,
            Client* client, Backend* backend, std::unique_ptr<DataReader> samples);
  Status WaitForMeta(const std::string& name, std::string* value);
  Status KeepBest(uint64_t step);

  ValidationOptions options_;
  const ModelLayout& layout_;
  ParamStore* store_;
  Client* client_;
  Backend* backend_;
  std::unique_ptr<DataReader> samples_;
  EarlyStopper stopper_;
  std::vector<ValidationPoint> history_;
  std::string best_ckpt_;
};

}  // namespace tessera::worker
