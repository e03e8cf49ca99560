#include "worker/validation.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <thread>

#include "ps/admin_path.h"
#include "worker/trainer.h"

namespace tessera::worker {

bool ValidationSchedule::Due(uint64_t step) const {
  if (step == 0) return false;
  if (last_step != 0 && step == last_step) return true;
  if (every_steps > 0) return step % every_steps == 0;
  if (epoch_samples == 0) return false;
  // An epoch ends in this step iff a multiple of epoch_samples lies in ((step-1)*b, step*b].
  const uint64_t b = std::max<uint32_t>(batch_size, 1);
  return step * b / epoch_samples > (step - 1) * b / epoch_samples;
}

uint64_t PlannedSteps(uint64_t shard_samples, uint32_t epochs, uint32_t batch_size) {
  const uint64_t b = std::max<uint32_t>(batch_size, 1);
  return (shard_samples * epochs + b - 1) / b;
}

Result<std::unique_ptr<Validator>> Validator::Create(const ValidationOptions& options,
                                                     const ModelLayout& layout, ParamStore* store,
                                                     Client* client, Backend* backend,
                                                     Batch samples) {
  if (store == nullptr) return Status::InvalidArgument("validation needs a store");
  std::unique_ptr<DataReader> reader;
  if (options.worker_id == 0) {
    if (backend == nullptr) return Status::InvalidArgument("worker 0 validates: needs a backend");
    if (samples.size == 0) return Status::InvalidArgument("the validation part is empty");
    if (!options.best_dir.empty()) {
      if (client == nullptr) return Status::InvalidArgument("keeping the best needs a client");
      TESSERA_RETURN_IF_ERROR(ValidateAdminName(options.best_dir).WithContext("best_dir"));
    }
    reader = InMemoryReader(std::move(samples));
  }
  return std::unique_ptr<Validator>(
      new Validator(options, layout, store, client, backend, std::move(reader)));
}

Validator::Validator(const ValidationOptions& options, const ModelLayout& layout,
                     ParamStore* store, Client* client, Backend* backend,
                     std::unique_ptr<DataReader> samples)
    : options_(options),
      layout_(layout),
      store_(store),
      client_(client),
      backend_(backend),
      samples_(std::move(samples)),
      stopper_(options.by_auc, options.patience_on_both, options.patience) {}

Validator::~Validator() = default;

Status Validator::WaitForMeta(const std::string& name, std::string* value) {
  // Rounds are rare and short next to training: poll, backing off to 50 ms.
  auto wait = std::chrono::milliseconds(1);
  while (true) {
    TESSERA_ASSIGN_OR_RETURN(auto v, store_->GetMeta(name));
    if (v.has_value()) {
      *value = std::move(*v);
      return Status::OK();
    }
    std::this_thread::sleep_for(wait);
    wait = std::min(wait * 2, std::chrono::milliseconds(50));
  }
}

Result<EarlyStopping> ParseEarlyStopping(std::string_view name) {
  if (name == "logloss") return EarlyStopping::kLogloss;
  if (name == "auc") return EarlyStopping::kAuc;
  if (name == "both") return EarlyStopping::kBoth;
  return Status::InvalidArgument("unknown early stopping metric '" + std::string(name) +
                                 "' (auc, logloss or both)");
}

uint32_t DefaultBatchSize(uint64_t shard_samples) {
  return static_cast<uint32_t>(std::clamp<uint64_t>(shard_samples / kMinStepsPerEpoch, 32, 1024));
}

bool EarlyStopper::Add(const ValidationPoint& point) {
  const bool better = !best_ || (by_auc_ ? point.auc > best_->auc : point.logloss < best_->logloss);
  const double other = by_auc_ ? point.logloss : point.auc;
  const bool other_better = !any_ || (by_auc_ ? other < best_other_ : other > best_other_);
  any_ = true;
  if (other_better) best_other_ = other;
  if (better) {
    best_ = point;
    bad_ = 0;
  } else if (both_ && other_better) {
    bad_ = 0;
  } else {
    ++bad_;
  }
  return better;
}

Result<bool> Validator::Round(uint64_t step) {
  const std::string round = options_.job + "/val/" + std::to_string(step);
  std::string value;
  if (options_.worker_id != 0) {
    TESSERA_RETURN_IF_ERROR(
        store_->PutMeta(round + "/ready/" + std::to_string(options_.worker_id), "1"));
    TESSERA_RETURN_IF_ERROR(WaitForMeta(round, &value));
    return value == "stop";
  }
  for (uint32_t w = 1; w < options_.num_workers; ++w) {
    TESSERA_RETURN_IF_ERROR(WaitForMeta(round + "/ready/" + std::to_string(w), &value));
  }
  TESSERA_ASSIGN_OR_RETURN(ValidationPoint point, Score());
  point.step = step;
  history_.push_back(point);
  if (stopper_.Add(point)) TESSERA_RETURN_IF_ERROR(KeepBest(step));
  const bool stop = stopper_.stop();
  TESSERA_RETURN_IF_ERROR(store_->PutMeta(round, stop ? "stop" : "go"));
  return stop;
}

Result<ValidationPoint> Validator::Score() {
  if (options_.worker_id != 0) return Status::FailedPrecondition("only worker 0 scores");
  TESSERA_RETURN_IF_ERROR(samples_->Rewind());
  TESSERA_ASSIGN_OR_RETURN(
      EvalResult ev, Evaluate(layout_, store_, backend_, samples_.get(), options_.eval_batch));
  return ValidationPoint{0, ev.samples, ev.auc, ev.logloss};
}

Status Validator::KeepBest(uint64_t step) {
  if (options_.best_dir.empty() || step == options_.last_step) {
    // Nothing kept, or nothing follows this step: the final state is the best.
    best_ckpt_.clear();
    return Status::OK();
  }
  TESSERA_ASSIGN_OR_RETURN(const std::string root,
                           CanonicalAdminRoot(client_->options().admin_root));
  const std::string name = options_.best_dir + "/step-" + std::to_string(step);
  auto remove = [&](const std::string& n) -> Status {
    TESSERA_ASSIGN_OR_RETURN(const std::string path, ResolveAdminPath(root, n));
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
    if (ec) return Status::IOError("cannot remove '" + path + "': " + ec.message());
    return Status::OK();
  };
  // A directory of the same name from an earlier run of the job would refuse the checkpoint.
  TESSERA_RETURN_IF_ERROR(remove(name));
  TESSERA_RETURN_IF_ERROR(client_->Checkpoint(name).status().WithContext("keeping the best"));
  if (!best_ckpt_.empty()) TESSERA_RETURN_IF_ERROR(remove(best_ckpt_));
  best_ckpt_ = name;
  return Status::OK();
}

Result<std::optional<uint64_t>> Validator::RestoreBest(uint64_t last_step) {
  const std::optional<ValidationPoint>& best = stopper_.best();
  if (options_.worker_id != 0 || !best || best->step == last_step || best_ckpt_.empty()) {
    return std::optional<uint64_t>();
  }
  // The checkpoint holds the position records of the best step; the job has gone past it.
  std::vector<std::pair<std::string, std::string>> positions;
  for (uint32_t w = 0; w < options_.num_workers; ++w) {
    const std::string key = options_.job + "/pos/" + std::to_string(w);
    TESSERA_ASSIGN_OR_RETURN(auto v, store_->GetMeta(key));
    if (v.has_value()) positions.emplace_back(key, std::move(*v));
  }
  TESSERA_RETURN_IF_ERROR(client_->Restore(best_ckpt_).WithContext("restoring the best state"));
  for (const auto& [key, value] : positions) TESSERA_RETURN_IF_ERROR(store_->PutMeta(key, value));
  return std::optional<uint64_t>(best->step);
}

}  // namespace tessera::worker
