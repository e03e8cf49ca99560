#include "worker/job.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <utility>

#include "ps/client/client.h"
#include "ps/curve.h"
#include "worker/auto_config.h"
#include "worker/backend.h"
#include "worker/csv_reader.h"
#include "worker/data_source.h"
#include "worker/feed.h"
#include "worker/local_ranks.h"
#include "worker/local_reducer.h"
#include "worker/metrics.h"
#include "worker/param_store.h"
#include "worker/report.h"

namespace tessera::worker {
namespace {

double UnixSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// What one worker trained in this run: its record "<job>/trained/<worker>" for the job's totals.
struct Trained {
  uint64_t samples = 0;
  double loss_sum = 0;
  double start_s = 0, end_s = 0;  // Unix seconds
};

std::string FormatTrained(const Trained& t) {
  char buf[160];
  std::snprintf(buf, sizeof(buf), "samples=%llu loss_sum=%.17g start=%.6f end=%.6f",
                static_cast<unsigned long long>(t.samples), t.loss_sum, t.start_s, t.end_s);
  return buf;
}

// The job's totals from every worker's record (called after the barrier that follows them).
Result<Trained> JobTotals(ParamStore* store, const std::string& job, uint32_t num_workers) {
  Trained total;
  total.start_s = 1e300;
  for (uint32_t w = 0; w < num_workers; ++w) {
    const std::string key = job + "/trained/" + std::to_string(w);
    TESSERA_ASSIGN_OR_RETURN(auto v, store->GetMeta(key));
    unsigned long long samples = 0;
    double loss = 0, start = 0, end = 0;
    if (!v || std::sscanf(v->c_str(), "samples=%llu loss_sum=%lf start=%lf end=%lf", &samples,
                          &loss, &start, &end) != 4) {
      return Status::Corruption("no valid training record " + key);
    }
    total.samples += samples;
    total.loss_sum += loss;
    total.start_s = std::min(total.start_s, start);
    total.end_s = std::max(total.end_s, end);
  }
  return total;
}

RowCacheOptions CacheOptions(const JobOptions& o) {
  RowCacheOptions c;
  c.rows = o.cache_rows;
  c.staleness = o.cache_staleness;
  c.consistency_staleness = o.staleness;
  return c;
}

CurveRow TrainingRow(const TrainProgress& p, uint64_t global_batch) {
  CurveRow row;
  row.step = p.step;
  row.samples = p.step * global_batch;
  row.train_loss = p.loss;
  row.samples_per_s = p.samples_per_s;
  return row;
}

// One node's job, step by step in the order RunJob calls them; each step's state stays here for
// the next. The steps print what tessera-worker always printed, in the same order.
class Job {
 public:
  explicit Job(const JobOptions& o)
      : o_(o), out_(o.out), nl_(std::max<uint32_t>(o.local_ranks, 1)), batch_size_(o.batch_size) {}

  Status SetUpLocalRanks();
  Status Connect();
  Status SetUpCache();
  Status SetUpData();
  Status ResolveDefaults();
  Status CreateModel();
  void SetUpTrainer();
  Status SetUpValidation();
  // Sets *options_error when the schedule cannot be resolved from the options and the data.
  Status SetUpLrSchedule(bool* options_error);
  Status OpenCurve();
  Status Train();
  Result<JobReport> Test();

 private:
  Result<bool> ValidationPause(const TrainProgress& p);
  Status ReadValidationSamples(Batch* samples);
  Status RunRank(uint32_t local);
  Status RestoreBest(JobReport* report);
  void WriteHtml(JobReport* report);
  Result<uint64_t> CountTrainingShard() const;
  Status FlushCache();

  JobOptions o_;  // the caller's, with the defaults from the data resolved (ResolveDefaults)
  std::FILE* out_;
  const uint32_t nl_;    // local ranks
  uint32_t batch_size_;  // the option's, or chosen from the data
  int gpus_ = 0;
  std::shared_ptr<ReduceGroup> group_;
  std::unique_ptr<Client> client_;
  std::unique_ptr<ParamStore> store_;
  std::unique_ptr<CachingStore> cache_;  // over store_, for training only; null: none
  SkippedLines skipped_lines_;  // outlives every reader opened from dopt_
  DataSourceOptions dopt_;
  std::optional<ModelLayout> layout_;
  TrainerOptions topt_;
  ValidationSchedule schedule_;
  std::unique_ptr<Backend> validation_backend_;
  std::unique_ptr<Validator> validator_;
  std::unique_ptr<CurveFile> curve_;
  uint64_t global_batch_ = 0;
  TrainResult trained_;
  double train_start_s_ = 0, train_end_s_ = 0;
};

// The compute set-up is checked before anything connects: a node without the GPUs it was asked
// for is refused at once.
Status Job::SetUpLocalRanks() {
  if (o_.backend == "cuda") {
    auto n = CudaDeviceCount();
    if (!n.ok()) return n.status().WithContext("--backend=cuda");
    gpus_ = *n;
  }
  const ReducerKind reducer_kind = ChooseReducer(o_.backend, nl_);
  auto group = CreateReduceGroup(reducer_kind, nl_);
  if (!group.ok()) {
    return group.status().WithContext("--backend=" + o_.backend +
                                      " --local_ranks=" + std::to_string(nl_));
  }
  group_ = *group;
  std::fprintf(out_, "worker %u %s\n", o_.worker_id, DescribeReducer(reducer_kind, nl_).c_str());
  std::fflush(out_);
  return Status::OK();
}

Status Job::Connect() {
  TESSERA_ASSIGN_OR_RETURN(client_, ConnectClient(o_));
  store_ = CreateClusterStore(client_.get());
  return Status::OK();
}

// The hot-row cache wraps the store the training loop uses; validation and the test read the
// servers through store_ (RunJob checked the options).
Status Job::SetUpCache() {
  if (o_.cache_rows == 0) return Status::OK();
  TESSERA_ASSIGN_OR_RETURN(cache_, CreateCachingStore(store_.get(), CacheOptions(o_)));
  std::fprintf(out_, "worker %u hot-row cache: %llu rows per sparse table, staleness %d steps\n",
               o_.worker_id, static_cast<unsigned long long>(o_.cache_rows), o_.cache_staleness);
  std::fflush(out_);
  return Status::OK();
}

// Pushes the cache's deferred gradients and waits for them: what is read from the servers
// next (a validation round, the test) includes every step trained.
Status Job::FlushCache() {
  if (!cache_) return Status::OK();
  TESSERA_RETURN_IF_ERROR(cache_->Flush().WithContext("hot-row cache"));
  if (o_.observer) o_.observer->OnRowCache(cache_->stats());
  return Status::OK();
}

Result<uint64_t> Job::CountTrainingShard() const {
  auto shard = SmallestTrainShard(dopt_);
  if (!shard.ok()) return shard.status().WithContext("counting the training part");
  return *shard;
}

Status Job::SetUpData() {
  dopt_ = DataOptionsOf(o_);
  dopt_.skipped_lines = &skipped_lines_;
  if (batch_size_ == 0) {
    // Small data sets need small batches: 100 steps an epoch at least (docs/worker.md).
    TESSERA_ASSIGN_OR_RETURN(const uint64_t shard, CountTrainingShard());
    batch_size_ = DefaultBatchSize(shard);
    std::fprintf(out_, "worker %u batch size %u (chosen: %llu training samples a rank)\n",
                 o_.worker_id, batch_size_, static_cast<unsigned long long>(shard));
  }
  global_batch_ = static_cast<uint64_t>(batch_size_) * nl_ * o_.num_workers;
  return Status::OK();
}

// The embedding width and MLP sizes the user left to the data, from a profile of the start of
// shard 0's training part: every worker reads the same samples and picks the same model.
Status Job::ResolveDefaults() {
  const bool mlp_auto = o_.bottom_mlp == kAutoMlp || o_.top_mlp == kAutoMlp;
  if (o_.embedding_dim == 0) {
    DataSourceOptions first = dopt_;
    first.rank = 0;
    first.epochs = 1;
    first.shuffle_buffer = 0;
    TESSERA_ASSIGN_OR_RETURN(auto reader, OpenTrainData(first));
    auto profile = ProfileData(reader.get());
    if (!profile.ok()) return profile.status().WithContext("profiling the training data");
    o_.embedding_dim = DefaultEmbeddingDim(*profile);
    std::fprintf(out_,
                 "worker %u embedding width %u (chosen: %zu fields, %.0f distinct keys a field "
                 "in the first %llu training samples)\n",
                 o_.worker_id, o_.embedding_dim, profile->distinct_keys.size(),
                 profile->MeanDistinctKeys(), static_cast<unsigned long long>(profile->samples));
  }
  if (o_.bottom_mlp == kAutoMlp) o_.bottom_mlp = DefaultMlp(o_.embedding_dim);
  if (o_.top_mlp == kAutoMlp) o_.top_mlp = DefaultMlp(o_.embedding_dim);
  if (mlp_auto) {
    std::fprintf(out_, "worker %u MLPs: bottom %s, top %s (chosen from the width %u)\n",
                 o_.worker_id, o_.bottom_mlp.c_str(), o_.top_mlp.c_str(), o_.embedding_dim);
  }
  std::fflush(out_);
  return Status::OK();
}

// The model's shape follows the data's.
Status Job::CreateModel() {
  TESSERA_ASSIGN_OR_RETURN(auto probe, OpenTestData(dopt_));
  TESSERA_ASSIGN_OR_RETURN(const ModelConfig mc, ModelConfigOf(o_, probe->schema()));
  TESSERA_ASSIGN_OR_RETURN(auto layout, ModelLayout::Create(mc));
  layout_.emplace(std::move(layout));
  return Status::OK();
}

void Job::SetUpTrainer() {
  topt_.batch_size = batch_size_;
  topt_.max_steps = o_.max_steps;
  topt_.prefetch = o_.prefetch;
  topt_.data_threads = o_.data_threads != 0 ? o_.data_threads : DefaultDataThreads(nl_);
  topt_.prefetch_depth = o_.prefetch_depth;
  topt_.max_pushes_in_flight = o_.max_pushes_in_flight;
  topt_.staleness = o_.staleness;
  topt_.worker_id = o_.worker_id;
  topt_.job = o_.job;
  topt_.resume = o_.resume;
  topt_.start_clock = o_.start_clock;
  topt_.progress_interval_s = o_.progress_interval_s;
  topt_.on_progress = [this](const TrainProgress& p) {
    if (o_.observer) o_.observer->OnProgress(p);
    std::fprintf(
        out_, "worker %u step %llu samples %llu %.0f samples/s loss %.4f running_auc %.4f",
        o_.worker_id, static_cast<unsigned long long>(p.step),
        static_cast<unsigned long long>(p.samples), p.samples_per_s, p.loss, p.running_auc);
    if (cache_) {
      const RowCacheStats c = cache_->stats();
      if (o_.observer) o_.observer->OnRowCache(c);
      std::fprintf(out_, " cache_hit_rate %.3f", c.hit_rate());
    }
    std::fprintf(out_, "\n");
    std::fflush(out_);
  };
}

// Worker 0 scores up to validation_samples samples of the validation part each round.
Status Job::ReadValidationSamples(Batch* samples) {
  TESSERA_ASSIGN_OR_RETURN(auto reader, OpenValidationData(dopt_));
  samples->Clear(reader->schema());
  while (samples->size < o_.validation_samples) {
    auto n = reader->Read(
        static_cast<uint32_t>(std::min<uint64_t>(o_.validation_samples - samples->size, 1u << 16)),
        samples);
    if (!n.ok()) return n.status().WithContext("reading the validation part");
    if (*n == 0) break;
  }
  return Status::OK();
}

// Validation: every node trains the same number of steps (the last step that every rank still
// has data for), so that every node takes part in every round.
Status Job::SetUpValidation() {
  if (!o_.validate) return Status::OK();
  TESSERA_ASSIGN_OR_RETURN(const uint64_t shard, CountTrainingShard());
  const uint64_t planned = PlannedSteps(shard, o_.epochs, batch_size_);
  if (planned != 0 && (topt_.max_steps == 0 || planned < topt_.max_steps)) {
    topt_.max_steps = planned;
  }
  schedule_.every_steps = o_.validate_every_steps;
  schedule_.epoch_samples = shard;
  schedule_.batch_size = batch_size_;
  schedule_.last_step = topt_.max_steps;
  ValidationOptions vopt;
  vopt.job = o_.job;
  vopt.worker_id = o_.worker_id;
  vopt.num_workers = o_.num_workers;
  vopt.patience = o_.early_stopping_patience;
  vopt.by_auc = o_.early_stopping != EarlyStopping::kLogloss;
  vopt.patience_on_both = o_.early_stopping == EarlyStopping::kBoth;
  vopt.last_step = topt_.max_steps;
  if (!o_.admin_root.empty()) vopt.best_dir = o_.job + "-best";
  Batch samples;
  if (o_.worker_id == 0) {
    TESSERA_RETURN_IF_ERROR(ReadValidationSamples(&samples));
    TESSERA_ASSIGN_OR_RETURN(validation_backend_,
                             CreateCpuBackend(*layout_, {std::max(o_.threads, 2)}));
    if (o_.admin_root.empty()) {
      std::fprintf(out_,
                   "worker 0: no --admin_root: the best validated state is not kept; the "
                   "test scores the final state\n");
    }
  }
  TESSERA_ASSIGN_OR_RETURN(validator_,
                           Validator::Create(vopt, *layout_, store_.get(), client_.get(),
                                             validation_backend_.get(), std::move(samples)));
  topt_.pause_at = [this](uint64_t step) { return schedule_.Due(step); };
  topt_.on_pause = [this](const TrainProgress& p) { return ValidationPause(p); };
  return Status::OK();
}

// A validation round after step p.step; worker 0 prints it and adds it to the curve.
Result<bool> Job::ValidationPause(const TrainProgress& p) {
  TESSERA_RETURN_IF_ERROR(FlushCache());
  TESSERA_ASSIGN_OR_RETURN(bool stop, validator_->Round(p.step));
  if (o_.worker_id != 0) return stop;
  const ValidationPoint& v = validator_->history().back();
  std::fprintf(out_, "worker 0 validate step %llu samples %llu auc %.4f logloss %.4f%s\n",
               static_cast<unsigned long long>(v.step), static_cast<unsigned long long>(v.samples),
               v.auc, v.logloss, validator_->best()->step == v.step ? " (best)" : "");
  if (stop) {
    std::fprintf(out_,
                 "worker 0 early stop after step %llu: no better validation %s for %u "
                 "rounds (best: step %llu auc %.4f logloss %.4f)\n",
                 static_cast<unsigned long long>(p.step),
                 o_.early_stopping == EarlyStopping::kBoth ? "auc or logloss"
                 : o_.early_stopping == EarlyStopping::kAuc ? "auc" : "logloss",
                 o_.early_stopping_patience,
                 static_cast<unsigned long long>(validator_->best()->step), validator_->best()->auc,
                 validator_->best()->logloss);
  }
  std::fflush(out_);
  if (curve_) {
    CurveRow row = TrainingRow(p, global_batch_);
    row.validation_auc = v.auc;
    row.validation_logloss = v.logloss;
    TESSERA_RETURN_IF_ERROR(curve_->Append(row));
  }
  return stop;
}

// The learning-rate schedule; a decay without decay_steps lasts until the planned end. Several
// epochs without a decay given get a cosine one (lr_decay_by_epochs).
Status Job::SetUpLrSchedule(bool* options_error) {
  if (o_.lr_decay_by_epochs && o_.lr_schedule.decay == LrSchedule::Decay::kNone &&
      o_.epochs > 1) {
    o_.lr_schedule.decay = LrSchedule::Decay::kCosine;
    std::fprintf(out_, "worker %u learning rates: cosine decay to %g by the planned last step "
                       "(chosen: %u epochs)\n",
                 o_.worker_id, o_.lr_schedule.final_scale, o_.epochs);
    std::fflush(out_);
  }
  topt_.lr_schedule = o_.lr_schedule;
  if (o_.lr_schedule.decay == LrSchedule::Decay::kNone || o_.lr_schedule.decay_steps != 0) {
    return Status::OK();
  }
  uint64_t end = topt_.max_steps;
  if (end == 0) {
    TESSERA_ASSIGN_OR_RETURN(const uint64_t shard, CountTrainingShard());
    end = PlannedSteps(shard, o_.epochs, batch_size_);
  }
  if (end <= o_.lr_schedule.warmup_steps) {
    if (options_error) *options_error = true;
    return Status::InvalidArgument(
        "--lr_decay needs --lr_decay_steps: no planned last step after the warm-up");
  }
  topt_.lr_schedule.decay_steps = end - o_.lr_schedule.warmup_steps;
  return Status::OK();
}

// Worker 0 writes the training curve: a row per progress report and per validation round.
Status Job::OpenCurve() {
  if (o_.worker_id != 0) return Status::OK();
  std::error_code ec;
  std::filesystem::create_directories(o_.out_dir, ec);
  auto c = CurveFile::Create((std::filesystem::path(o_.out_dir) / "metrics.csv").string());
  if (!c.ok()) return c.status().WithContext("--out_dir");
  curve_ = std::move(*c);
  auto on_progress = topt_.on_progress;
  topt_.on_progress = [this, on_progress](const TrainProgress& p) {
    on_progress(p);
    Status s = curve_->Append(TrainingRow(p, global_batch_));
    if (!s.ok()) std::fprintf(stderr, "tessera-worker 0: %s\n", s.ToString().c_str());
  };
  return Status::OK();
}

// One local rank's set-up and training; local rank 0 talks to the servers and reports.
Status Job::RunRank(uint32_t local) {
  std::unique_ptr<LocalReducer> reducer;
  if (group_) {
    TESSERA_ASSIGN_OR_RETURN(reducer, group_->Join(local));
  }
  DataSourceOptions mine = dopt_;
  mine.rank = o_.worker_id * nl_ + local;
  TESSERA_ASSIGN_OR_RETURN(auto reader, OpenTrainData(mine));
  std::unique_ptr<Backend> backend;
  if (o_.backend == "cuda") {
    TESSERA_ASSIGN_OR_RETURN(backend, CreateCudaBackend(*layout_, DeviceOfLocalRank(local, gpus_)));
  } else if (o_.backend == "null") {
    TESSERA_ASSIGN_OR_RETURN(backend, CreateNullBackend(*layout_));
  } else {
    TESSERA_ASSIGN_OR_RETURN(backend, CreateCpuBackend(*layout_, {o_.threads}));
  }
  ParamStore* store = nullptr;  // local rank 0's: the servers, through the cache where on
  if (local == 0) store = cache_ ? static_cast<ParamStore*>(cache_.get()) : store_.get();
  TESSERA_ASSIGN_OR_RETURN(auto trainer,
                           Trainer::Create(topt_, *layout_, store,
                                           backend.get(), reader.get(), reducer.get()));
  TESSERA_RETURN_IF_ERROR(trainer->Init());
  if (o_.observer && local == 0) o_.observer->OnReady(true, "");
  TESSERA_ASSIGN_OR_RETURN(TrainResult r, trainer->Train());
  if (local == 0) trained_ = r;
  return Status::OK();
}

// Every rank's set-up and training; a rank that fails aborts the group (RunLocalRanks), so that
// no other rank waits for it forever.
Status Job::Train() {
  train_start_s_ = UnixSeconds();
  TESSERA_RETURN_IF_ERROR(
      RunLocalRanks(nl_, group_.get(), [this](uint32_t local) { return RunRank(local); }));
  TESSERA_RETURN_IF_ERROR(FlushCache());
  train_end_s_ = UnixSeconds();
  if (o_.observer) o_.observer->OnReady(false, "training finished");
  const TrainResult& tr = trained_;
  std::fprintf(out_,
               "worker %u trained %llu samples in %.1f s (%.0f samples/s), %llu steps "
               "(%llu resumed), train loss %.4f\n",
               o_.worker_id, static_cast<unsigned long long>(tr.samples), tr.seconds,
               tr.samples_per_s, static_cast<unsigned long long>(tr.steps),
               static_cast<unsigned long long>(tr.resumed_steps), tr.train_loss);
  if (cache_) {
    const RowCacheStats c = cache_->stats();
    std::fprintf(out_,
                 "worker %u hot-row cache: hit rate %.3f (%llu hits, %llu misses), %llu rows, "
                 "%llu keys pushed at once, %llu rows' gradients deferred and pushed in %llu "
                 "pushes, %llu evictions, %llu refetches waited for a flush, %llu keys joined a "
                 "fetch in flight\n",
                 o_.worker_id, c.hit_rate(), static_cast<unsigned long long>(c.hits),
                 static_cast<unsigned long long>(c.misses),
                 static_cast<unsigned long long>(c.rows),
                 static_cast<unsigned long long>(c.passed_keys),
                 static_cast<unsigned long long>(c.flushed_rows),
                 static_cast<unsigned long long>(c.flushes),
                 static_cast<unsigned long long>(c.evictions),
                 static_cast<unsigned long long>(c.flush_waits),
                 static_cast<unsigned long long>(c.joined));
    std::fflush(out_);
  }
  return Status::OK();
}

// Worker 0 restores the best validated state, where one was kept, for the test.
Status Job::RestoreBest(JobReport* report) {
  report->tested_step = trained_.steps;
  if (!validator_) return Status::OK();
  TESSERA_ASSIGN_OR_RETURN(std::optional<uint64_t> restored,
                           validator_->RestoreBest(trained_.steps));
  if (!restored) return Status::OK();
  // The state the test scores: scored on the validation part again, it must give the best
  // round's figures.
  TESSERA_ASSIGN_OR_RETURN(ValidationPoint again, validator_->Score());
  report->restored = true;
  report->tested_step = *restored;
  report->restored_validation_auc = again.auc;
  std::fprintf(out_,
               "worker 0 restored the best validated state (step %llu, checkpoint %s) for "
               "the test\n",
               static_cast<unsigned long long>(*restored), validator_->best_checkpoint().c_str());
  return Status::OK();
}

// report.html beside metrics.csv; a failure is printed and does not fail the job.
void Job::WriteHtml(JobReport* report) {
  ReportSummary summary;
  summary.data = o_.data;
  summary.steps = trained_.steps;
  summary.test_samples = report->test.samples;
  summary.test_auc = report->test.auc;
  summary.test_logloss = report->test.logloss;
  summary.oracle_auc = report->test.oracle_auc;
  summary.oracle_logloss = report->test.oracle_logloss;
  summary.train_seconds = trained_.seconds;
  summary.train_loss = trained_.train_loss;
  summary.early_stopped = trained_.stopped;
  if (report->best_validation) {
    summary.best_validation_step = report->best_validation->step;
    summary.best_validation_auc = report->best_validation->auc;
    summary.best_validation_logloss = report->best_validation->logloss;
    summary.tested_step = report->tested_step;
  }
  const std::string html =
      (std::filesystem::path(curve_->path()).parent_path() / "report.html").string();
  report->summary = summary;
  Status written = WriteReport(curve_->path(), summary, html);
  if (written.ok()) {
    report->report_html = html;
  } else {
    std::fprintf(stderr, "tessera-worker 0: report.html: %s\n", written.ToString().c_str());
  }
}

// Each worker records what it trained; worker 0 tests the model and reports the job's totals
// from the records.
Result<JobReport> Job::Test() {
  JobReport report;
  report.train = trained_;
  report.skipped_lines = skipped_lines_.count();
  report.embedding_dim = o_.embedding_dim;
  report.bottom_mlp = o_.bottom_mlp;
  report.top_mlp = o_.top_mlp;
  report.lr_schedule = topt_.lr_schedule;
  for (const auto& t : layout_->dense_tables()) report.tables.push_back(t.spec.name);
  if (!layout_->embedding_table().name.empty()) {
    report.tables.push_back(layout_->embedding_table().name);
  }
  if (!layout_->wide_table().name.empty()) report.tables.push_back(layout_->wide_table().name);
  if (cache_) report.row_cache = cache_->stats();
  if (validator_) report.best_validation = validator_->best();
  if (!o_.evaluate) return report;
  const TrainResult& tr = trained_;
  TESSERA_RETURN_IF_ERROR(
      store_->PutMeta(o_.job + "/trained/" + std::to_string(o_.worker_id),
                      FormatTrained({tr.samples, tr.train_loss * static_cast<double>(tr.samples),
                                     train_start_s_, train_end_s_})));
  TESSERA_RETURN_IF_ERROR(store_->Barrier(o_.job + "/train_done"));
  if (o_.worker_id != 0) return report;
  TESSERA_ASSIGN_OR_RETURN(const Trained job, JobTotals(store_.get(), o_.job, o_.num_workers));
  report.job_samples = job.samples;
  report.job_loss_sum = job.loss_sum;
  report.job_start_s = job.start_s;
  report.job_end_s = job.end_s;
  TESSERA_RETURN_IF_ERROR(RestoreBest(&report));
  TESSERA_ASSIGN_OR_RETURN(auto test, OpenTestData(dopt_));
  TESSERA_ASSIGN_OR_RETURN(auto backend, CreateCpuBackend(*layout_, {std::max(o_.threads, 2)}));
  TESSERA_ASSIGN_OR_RETURN(report.test,
                           Evaluate(*layout_, store_.get(), backend.get(), test.get()));
  if (validator_) report.best_validation = validator_->best();
  const EvalResult& ev = report.test;
  if (o_.observer) o_.observer->OnTest(ev.auc, ev.logloss);
  std::fprintf(out_, "test samples %llu auc %.4f logloss %.4f",
               static_cast<unsigned long long>(ev.samples), ev.auc, ev.logloss);
  if (std::isfinite(ev.oracle_auc)) {
    std::fprintf(out_, " oracle_auc %.4f oracle_logloss %.4f (gap %.4f)", ev.oracle_auc,
                 ev.oracle_logloss, ev.oracle_auc - ev.auc);
  }
  std::fprintf(out_, "\n");
  report.tested = true;
  report.metrics_csv = curve_->path();
  WriteHtml(&report);
  report.skipped_lines = skipped_lines_.count();
  return report;
}

}  // namespace

Result<std::unique_ptr<Client>> ConnectClient(const JobOptions& o) {
  ClientOptions copt;
  copt.servers = o.servers;
  copt.worker_id = o.worker_id;
  copt.consistency.num_workers = o.num_workers;
  copt.consistency.staleness = o.staleness;
  copt.request_timeout_ms = o.request_timeout_ms;
  copt.retry_for_ms = o.retry_for_ms;
  copt.admin_root = o.admin_root;
  if (!o.curve_server_key_file.empty()) {
    TESSERA_ASSIGN_OR_RETURN(copt.curve_server_key, ReadCurveKeyFile(o.curve_server_key_file));
  }
  if (!o.curve_client_key_file.empty()) {
    TESSERA_ASSIGN_OR_RETURN(copt.curve_client_secret_key,
                             ReadCurveKeyFile(o.curve_client_key_file));
  }
  if (o.cluster_map) {
    auto source = o.cluster_map();
    if (!source.ok()) return source.status().WithContext("--coordinator");
    return Client::Create(copt, std::move(*source));
  }
  return Client::Create(copt);
}

DataSourceOptions DataOptionsOf(const JobOptions& o) {
  DataSourceOptions d;
  d.spec = o.data;
  d.schema = o.schema;
  d.skip_bad_lines = o.skip_bad_lines;
  d.world = o.num_workers * o.local_ranks;
  d.epochs = o.epochs;
  d.shuffle_buffer = o.shuffle_buffer;
  d.holdout_mod = o.holdout_mod;
  d.train_samples = o.train_samples;
  d.test_samples = o.test_samples;
  d.synthetic.seed = o.seed;
  d.synthetic.zipf_exponent = o.zipf;
  d.synthetic.interaction_std = o.interaction_std;
  d.synthetic.bias_std = o.bias_std;
  d.synthetic.planted_dim = o.planted_dim;
  d.synthetic.cardinalities = CriteoLikeCardinalities(o.synthetic_max_cardinality);
  d.validation_mod = o.validate ? o.validation_mod : 0;
  d.validation_samples = o.validation_samples;
  return d;
}

Result<ModelConfig> ModelConfigOf(const JobOptions& o, const Schema& schema) {
  if (o.embedding_dim == 0 || o.bottom_mlp == kAutoMlp || o.top_mlp == kAutoMlp) {
    return Status::InvalidArgument(
        "ModelConfigOf: the embedding width or an MLP is still to be chosen from the data");
  }
  ModelConfig mc;
  mc.num_dense = schema.num_dense;
  mc.num_fields = schema.num_fields;
  mc.embedding_dim = o.embedding_dim;
  TESSERA_ASSIGN_OR_RETURN(mc.bottom_mlp, ParseLayerWidths(o.bottom_mlp));
  TESSERA_ASSIGN_OR_RETURN(mc.top_mlp, ParseLayerWidths(o.top_mlp));
  mc.pooling = o.pooling;
  mc.kind = o.model;
  mc.num_cross_layers = o.cross_layers;
  mc.deep = o.deep;
  mc.wide = o.wide;
  mc.table_prefix = o.job;
  mc.embedding_optimizer.learning_rate = static_cast<float>(o.emb_lr);
  mc.embedding_optimizer.initial_accumulator = static_cast<float>(o.emb_init_acc);
  mc.embedding_init_scale = static_cast<float>(o.emb_init_scale);
  mc.dense_optimizer.learning_rate = static_cast<float>(o.dense_lr);
  mc.wide_optimizer.learning_rate = static_cast<float>(o.wide_lr);
  mc.embedding_optimizer.l2 = static_cast<float>(o.emb_l2);
  mc.dense_optimizer.l2 = static_cast<float>(o.dense_l2);
  mc.wide_optimizer.l2 = static_cast<float>(o.wide_l2);
  return mc;
}

Result<JobReport> RunJob(const JobOptions& options, bool* options_error) {
  if (options_error) *options_error = false;
  if (options.local_ranks > kMaxLocalRanks) {
    if (options_error) *options_error = true;
    return Status::InvalidArgument("--local_ranks=" + std::to_string(options.local_ranks) +
                                   " is over the bound " + std::to_string(kMaxLocalRanks) +
                                   " (each local rank is a thread with its own model copy)");
  }
  if (options.prefetch_depth == 0 || options.prefetch_depth > kMaxPrefetchDepth) {
    if (options_error) *options_error = true;
    return Status::InvalidArgument("--prefetch_depth=" + std::to_string(options.prefetch_depth) +
                                   " is not in [1, " + std::to_string(kMaxPrefetchDepth) +
                                   "] (each prefetched step holds a batch and its rows)");
  }
  if (options.max_pushes_in_flight == 0 || options.max_pushes_in_flight > kMaxPrefetchDepth) {
    if (options_error) *options_error = true;
    return Status::InvalidArgument("--max_pushes_in_flight=" +
                                   std::to_string(options.max_pushes_in_flight) +
                                   " is not in [1, " + std::to_string(kMaxPrefetchDepth) + "]");
  }
  if (options.backend != "cpu" && options.backend != "cuda" && options.backend != "null") {
    if (options_error) *options_error = true;
    return Status::InvalidArgument("--backend must be cpu, cuda or null, not '" +
                                   options.backend + "'");
  }
  if (options.data_threads > kMaxDataThreads) {
    if (options_error) *options_error = true;
    return Status::InvalidArgument("--data_threads=" + std::to_string(options.data_threads) +
                                   " is over the bound " + std::to_string(kMaxDataThreads));
  }
  if (options.cache_rows > 0) {
    Status cache = ValidateRowCacheOptions(CacheOptions(options));
    if (!cache.ok()) {
      if (options_error) *options_error = true;
      return Status::InvalidArgument("--cache_rows/--cache_staleness: " + cache.message());
    }
  }
  Job job(options);
  TESSERA_RETURN_IF_ERROR(job.SetUpLocalRanks());
  TESSERA_RETURN_IF_ERROR(job.Connect());
  TESSERA_RETURN_IF_ERROR(job.SetUpCache());
  TESSERA_RETURN_IF_ERROR(job.SetUpData());
  TESSERA_RETURN_IF_ERROR(job.ResolveDefaults());
  TESSERA_RETURN_IF_ERROR(job.CreateModel());
  job.SetUpTrainer();
  TESSERA_RETURN_IF_ERROR(job.SetUpValidation());
  TESSERA_RETURN_IF_ERROR(job.SetUpLrSchedule(options_error));
  TESSERA_RETURN_IF_ERROR(job.OpenCurve());
  TESSERA_RETURN_IF_ERROR(job.Train());
  return job.Test();
}

}  // namespace tessera::worker
