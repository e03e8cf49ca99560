// tessera-worker: trains the click model on a Tessera cluster and reports its test quality.
#include <gflags/gflags.h>
#include <glog/logging.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <sstream>
#include <vector>

#include "ps/cli.h"
#include "ps/client/client.h"
#include "ps/coord/coordinator_url.h"
#include "ps/coord/etcd_map_source.h"
#include "ps/curve.h"
#include "ps/metrics/http_endpoint.h"
#include "ps/routing.h"
#include "worker/backend.h"
#include "worker/data_source.h"
#include "worker/local_ranks.h"
#include "worker/local_reducer.h"
#include "worker/param_store.h"
#include "worker/report.h"
#include "worker/trainer.h"
#include "worker/validation.h"

DEFINE_string(servers, "", "Server endpoints in rank order: comma-separated, or @FILE");
DEFINE_string(coordinator, "",
              "Instead of --servers: etcd://HOST:PORT/PREFIX, the etcd whose PREFIX/slotmap "
              "(tessera-ctl map init) names the servers and routes keys; the worker follows the "
              "map's newer versions (docs/elasticity.md)");
DEFINE_string(curve_server_key_file, "",
              "File holding the servers' CurveZMQ public key (clusters started with "
              "--curve_secret_key_file)");
DEFINE_uint32(worker_id, 0, "This worker's rank among the job's workers");
DEFINE_uint32(num_workers, 1, "Workers (nodes) in the job");
DEFINE_uint32(local_ranks, 1,
              "Local ranks reduced inside this node before one push: CPU threads, or with "
              "--backend=cuda one GPU each (rank r on GPU r mod the GPU count; NCCL)");
DEFINE_string(data, "synthetic",
              "synthetic | criteo:PATH | libsvm:PATH | csv:PATH (with --schema) | movielens:DIR");
DEFINE_string(schema, "",
              "--data=csv: the columns, e.g. 'label=click;numeric=price:log;"
              "categorical=site_id,app_id;delimiter=,;header=true' (docs/worker.md, CSV input)");
DEFINE_bool(skip_bad_lines, false,
            "--data=csv: skip malformed lines (counted: skipped_lines in the report) instead of "
            "failing");
DEFINE_uint64(train_samples, 2500000, "Synthetic: training samples (all workers together)");
DEFINE_uint64(test_samples, 100000, "Synthetic: test samples");
DEFINE_uint64(seed, 1, "Synthetic: seed of the planted model");
DEFINE_uint64(synthetic_max_cardinality, 20000, "Synthetic: cap of the Criteo cardinalities");
DEFINE_double(zipf, 1.2, "Synthetic: Zipf exponent of ids");
DEFINE_double(interaction_std, tessera::worker::SyntheticOptions{}.interaction_std,
              "Synthetic: standard deviation of the planted pairwise interactions' logit part");
DEFINE_double(bias_std, tessera::worker::SyntheticOptions{}.bias_std,
              "Synthetic: standard deviation of the planted per-id biases' logit part");
DEFINE_uint32(planted_dim, tessera::worker::SyntheticOptions{}.planted_dim,
              "Synthetic: width of the planted field vectors (1..8)");
DEFINE_uint32(epochs, 1,
              "Passes over the training data (0: repeat the data until --max_steps, which must "
              "then be set)");
DEFINE_uint32(shuffle_buffer, 0, "Shuffle buffer in samples (0: file order)");
DEFINE_uint32(holdout_mod, 10, "Criteo/libSVM/CSV: every N-th line is a test line");
DEFINE_uint32(batch_size, 0,
              "Samples per step per local rank; 0: chosen from the data, 1024 or less so that an "
              "epoch has at least 100 steps (at least 32)");
DEFINE_uint64(max_steps, 0, "Stop after this many steps (0: when the data ends)");
DEFINE_bool(prefetch, true, "Pull the next batch while this one computes");
DEFINE_string(consistency, "async", "async | bsp | ssp");
DEFINE_int32(staleness, 2, "Bound of --consistency=ssp, in clocks");
DEFINE_int32(threads, 1, "CPU backend threads per local rank");
DEFINE_string(backend, "cpu", "cpu | cuda");
DEFINE_uint32(embedding_dim, 8, "Embedding width");
DEFINE_string(bottom_mlp, "64", "Bottom MLP hidden widths, comma-separated (may be empty)");
DEFINE_string(top_mlp, "64", "Top MLP hidden widths, comma-separated (may be empty)");
DEFINE_string(pooling, "sum", "Embedding bag pooling: sum | mean");
DEFINE_string(model, "dlrm", "dlrm | deepfm | dcn");
DEFINE_uint32(cross_layers, 3, "--model=dcn: DCN-v2 full-rank cross layers before the top MLP");
DEFINE_bool(deep, true, "Train the deep (DLRM) part");
DEFINE_bool(wide, true, "Train the wide part (FTRL)");
DEFINE_double(emb_lr, 0.05, "Embedding Adagrad learning rate");
DEFINE_double(dense_lr, 0.003, "MLP Adam learning rate");
DEFINE_double(wide_lr, 0.05, "Wide FTRL alpha");
DEFINE_double(emb_l2, 0, "L2 regularization of the embeddings (applied by the servers to the rows "
              "a push updates)");
DEFINE_double(dense_l2, 0, "L2 regularization of the MLP weights and biases (applied by the servers)");
DEFINE_double(wide_l2, 0.1, "Wide FTRL L2 strength");
DEFINE_uint64(lr_warmup_steps, 0,
              "Learning-rate warm-up: the rate rises linearly to its value over this many steps");
DEFINE_string(lr_decay, "none", "Learning-rate decay after the warm-up: none | linear | cosine");
DEFINE_uint64(lr_decay_steps, 0,
              "Steps the decay lasts (0: until the planned last step, when there is one)");
DEFINE_double(lr_final_scale, 0.1, "Learning-rate factor at the end of the decay");
DEFINE_double(emb_init_acc,
              tessera::worker::ModelConfig::DefaultEmbeddingOptimizer().initial_accumulator,
              "Embedding Adagrad initial accumulator");
DEFINE_string(job, "ctr", "Job name: table prefix and position records");
DEFINE_bool(resume, true, "Resume from the stored position of this worker");
DEFINE_bool(evaluate, true, "After training (and a barrier of all workers), worker 0 evaluates");
DEFINE_double(progress_interval_s, 5, "Seconds between progress lines");
DEFINE_int64(request_timeout_ms, 60000, "Client request timeout");
DEFINE_int64(retry_for_ms, 120000,
             "How long calls to a server that is down are retried (pushes apply exactly once) "
             "before the worker fails; 0: no retries");
DEFINE_uint32(metrics_port, 0,
              "Serve Prometheus metrics (/metrics), /healthz and /readyz over HTTP on this port "
              "(0: off); /readyz answers 200 while the worker trains");
DEFINE_string(validate_every, "epoch",
              "Validation rounds: after every N steps, or 'epoch' (after each pass over the "
              "training data), and after the last step; 0: no validation (and no validation part)");
DEFINE_uint32(validation_mod, 10,
              "Files: every N-th sample of the training part is held out for validation; "
              "synthetic: validation is a stream of its own (--validation_samples)");
DEFINE_uint64(validation_samples, 20000, "Validation samples scored per round (at most)");
DEFINE_string(early_stopping_metric, "logloss",
              "Validation figure that picks the best round and stops early: auc (higher is better) "
              "| logloss (lower is better)");
DEFINE_uint32(early_stopping_patience, 3,
              "Stop when the validation AUC has not improved for this many rounds (0: never)");
DEFINE_string(admin_root, "",
              "The servers' --admin_root as this worker sees it: worker 0 keeps the best "
              "validated state there as a checkpoint and restores it before the test (empty: the "
              "final state is tested)");
DEFINE_string(out_dir, ".", "Worker 0 writes metrics.csv (the training curve) here");
DEFINE_string(metrics_address, "0.0.0.0", "Address the metrics port listens on");

namespace tw = tessera::worker;

namespace {

constexpr tessera::cli::ToolInfo kTool{
    .name = "tessera-worker",
    .usage = "usage: tessera-worker --servers=EPS|--coordinator=etcd://HOST:PORT/PREFIX\n"
             "                      [--worker_id=I --num_workers=N] [--data=SPEC]\n"
             "Trains a click model on a Tessera cluster and reports its test quality.",
    .flags_file = __FILE__};

// The worker's training figures as metrics (tessera_worker_*), set from each progress report.
class WorkerMetrics {
 public:
  explicit WorkerMetrics(tessera::metrics::Registry& r)
      : step_(r.AddGauge("tessera_worker_step", "Steps done by this node (resumed included).")),
        samples_(r.AddCounter("tessera_worker_samples_total",
                              "Samples this node trained in this run (all its local ranks).")),
        rate_(r.AddGauge("tessera_worker_samples_per_second",
                         "This node's training rate since the previous progress report.")),
        loss_(r.AddGauge("tessera_worker_train_loss",
                         "Mean training loss since the previous progress report.")),
        auc_(r.AddGauge("tessera_worker_running_auc",
                        "AUC of the node's recent predictions, before their update.")),
        logloss_(r.AddGauge("tessera_worker_running_logloss",
                            "Log loss of the node's recent predictions, before their update.")),
        test_auc_(r.AddGauge("tessera_worker_test_auc", "Test AUC (worker 0, after training).")),
        test_logloss_(r.AddGauge("tessera_worker_test_logloss",
                                 "Test log loss (worker 0, after training).")) {
    r.AddGauge("tessera_worker_info", "Constant 1, labelled with the worker's place and build.",
               {{"worker_id", std::to_string(FLAGS_worker_id)},
                {"num_workers", std::to_string(FLAGS_num_workers)},
                {"backend", FLAGS_backend},
                {"version", std::string(tessera::cli::Version())}})
        .Set(1);
  }
  void Progress(const tw::TrainProgress& p) {
    step_.Set(static_cast<double>(p.step));
    if (p.samples > samples_seen_) samples_.Inc(p.samples - samples_seen_);
    samples_seen_ = std::max(samples_seen_, p.samples);
    rate_.Set(p.samples_per_s);
    loss_.Set(p.loss);
    auc_.Set(p.running_auc);
    logloss_.Set(p.running_logloss);
  }
  void Test(double auc, double logloss) {
    test_auc_.Set(auc);
    test_logloss_.Set(logloss);
  }

 private:
  tessera::metrics::Gauge& step_;
  tessera::metrics::Counter& samples_;
  tessera::metrics::Gauge &rate_, &loss_, &auc_, &logloss_, &test_auc_, &test_logloss_;
  uint64_t samples_seen_ = 0;  // progress reports come from one thread
};

double UnixSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
      .count();
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
tessera::Result<Trained> JobTotals(tw::ParamStore* store) {
  Trained total;
  total.start_s = 1e300;
  for (uint32_t w = 0; w < FLAGS_num_workers; ++w) {
    const std::string key = FLAGS_job + "/trained/" + std::to_string(w);
    TESSERA_ASSIGN_OR_RETURN(auto v, store->GetMeta(key));
    unsigned long long samples = 0;
    double loss = 0, start = 0, end = 0;
    if (!v || std::sscanf(v->c_str(), "samples=%llu loss_sum=%lf start=%lf end=%lf", &samples,
                          &loss, &start, &end) != 4) {
      return tessera::Status::Corruption("no valid training record " + key);
    }
    total.samples += samples;
    total.loss_sum += loss;
    total.start_s = std::min(total.start_s, start);
    total.end_s = std::max(total.end_s, end);
  }
  return total;
}

int Fail(const tessera::Status& s) {
  std::fprintf(stderr, "tessera-worker %u: %s\n", FLAGS_worker_id, s.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  tessera::cli::ParseCommandLine(kTool, &argc, &argv);
  if (!tessera::cli::CheckOneOf(kTool, "backend", FLAGS_backend, {"cpu", "cuda"}) ||
      !tessera::cli::CheckOneOf(kTool, "pooling", FLAGS_pooling, {"sum", "mean"}) ||
      !tessera::cli::CheckOneOf(kTool, "consistency", FLAGS_consistency,
                                {"async", "bsp", "ssp"})) {
    return 2;
  }
  const auto model_kind = tw::ParseModelKind(FLAGS_model);
  if (!model_kind.ok()) {
    return tessera::cli::UsageError(kTool, "--model: " + model_kind.status().message());
  }
  std::vector<std::string> server_list;
  std::optional<tessera::CoordinatorUrl> coordinator;
  if (!FLAGS_coordinator.empty()) {
    if (!FLAGS_servers.empty()) {
      return tessera::cli::UsageError(kTool, "give --servers or --coordinator, not both (with "
                                             "--coordinator the cluster map names the servers)");
    }
    auto url = tessera::CoordinatorUrl::Parse(FLAGS_coordinator);
    if (!url.ok()) return tessera::cli::UsageError(kTool, "--coordinator: " + url.status().ToString());
    coordinator = *url;
  } else {
    auto servers = tessera::ParseClusterList(FLAGS_servers);
    if (!servers.ok()) {
      return tessera::cli::UsageError(kTool, "--servers: " + servers.status().ToString());
    }
    server_list = *servers;
  }
  google::InitGoogleLogging(argv[0]);
  FLAGS_logtostderr = true;
  tessera::metrics::Registry registry;
  WorkerMetrics worker_metrics(registry);
  std::unique_ptr<tessera::metrics::HttpEndpoint> http;
  if (FLAGS_metrics_port != 0) {
    auto e = tessera::metrics::HttpEndpoint::Start(
        {.address = FLAGS_metrics_address, .port = FLAGS_metrics_port}, &registry);
    if (!e.ok()) return tessera::cli::UsageError(kTool, "--metrics_port: " + e.status().ToString());
    http = std::move(*e);
    http->SetReady(false, "connecting to the servers");
  }

  // The compute set-up is checked before anything connects: a node without the GPUs it was
  // asked for is refused at once.
  const uint32_t nl = std::max<uint32_t>(FLAGS_local_ranks, 1);
  int gpus = 0;
  if (FLAGS_backend == "cuda") {
    auto n = tw::CudaDeviceCount();
    if (!n.ok()) return Fail(n.status().WithContext("--backend=cuda"));
    gpus = *n;
  }
  const tw::ReducerKind reducer_kind = tw::ChooseReducer(FLAGS_backend, nl);
  auto group_or = tw::CreateReduceGroup(reducer_kind, nl);
  if (!group_or.ok()) {
    return Fail(group_or.status().WithContext("--backend=" + FLAGS_backend +
                                              " --local_ranks=" + std::to_string(nl)));
  }
  std::shared_ptr<tw::ReduceGroup> group = *group_or;
  std::printf("worker %u %s\n", FLAGS_worker_id, tw::DescribeReducer(reducer_kind, nl).c_str());
  std::fflush(stdout);

  int32_t staleness = -1;  // async
  if (FLAGS_consistency == "bsp") {
    staleness = 0;
  } else if (FLAGS_consistency == "ssp") {
    staleness = std::max(FLAGS_staleness, 1);
  }

  tessera::ClientOptions copt;
  copt.servers = server_list;
  copt.worker_id = FLAGS_worker_id;
  copt.consistency.num_workers = FLAGS_num_workers;
  copt.consistency.staleness = staleness;
  copt.request_timeout_ms = FLAGS_request_timeout_ms;
  copt.retry_for_ms = FLAGS_retry_for_ms;
  copt.admin_root = FLAGS_admin_root;
  if (!FLAGS_curve_server_key_file.empty()) {
    auto key = tessera::ReadCurveKeyFile(FLAGS_curve_server_key_file);
    if (!key.ok()) return Fail(key.status());
    copt.curve_server_key = *key;
  }
  uint64_t validate_every = 0;
  const bool validate = FLAGS_validate_every != "0";
  if (validate && FLAGS_validate_every != "epoch") {
    char* end = nullptr;
    validate_every = std::strtoull(FLAGS_validate_every.c_str(), &end, 10);
    if (end == FLAGS_validate_every.c_str() || *end != '\0' || FLAGS_validate_every[0] == '-') {
      return tessera::cli::UsageError(kTool, "--validate_every must be a number of steps, "
                                             "'epoch' or 0, not '" + FLAGS_validate_every + "'");
    }
  }
  if (FLAGS_early_stopping_metric != "auc" && FLAGS_early_stopping_metric != "logloss") {
    return tessera::cli::UsageError(kTool, "--early_stopping_metric must be auc or logloss, "
                                           "not '" + FLAGS_early_stopping_metric + "'");
  }
  if (validate && FLAGS_validation_mod < 2) {
    return tessera::cli::UsageError(kTool, "--validation_mod must be at least 2");
  }
  auto client = [&]() -> tessera::Result<std::unique_ptr<tessera::Client>> {
    if (!coordinator) return tessera::Client::Create(copt);
    auto source = tessera::EtcdClusterMapSource::Create(*coordinator);
    if (!source.ok()) return source.status().WithContext("--coordinator");
    return tessera::Client::Create(copt, std::move(*source));
  }();
  if (!client.ok()) return Fail(client.status());
  auto store = tw::CreateClusterStore(client->get());

  tw::SkippedLines skipped_lines;  // outlives every reader opened from dopt
  tw::DataSourceOptions dopt;
  dopt.spec = FLAGS_data;
  dopt.schema = FLAGS_schema;
  dopt.skip_bad_lines = FLAGS_skip_bad_lines;
  dopt.skipped_lines = &skipped_lines;
  dopt.world = FLAGS_num_workers * FLAGS_local_ranks;
  dopt.epochs = FLAGS_epochs;
  dopt.shuffle_buffer = FLAGS_shuffle_buffer;
  dopt.holdout_mod = FLAGS_holdout_mod;
  dopt.train_samples = FLAGS_train_samples;
  dopt.test_samples = FLAGS_test_samples;
  dopt.synthetic.seed = FLAGS_seed;
  dopt.synthetic.zipf_exponent = FLAGS_zipf;
  dopt.synthetic.interaction_std = FLAGS_interaction_std;
  dopt.synthetic.bias_std = FLAGS_bias_std;
  dopt.synthetic.planted_dim = FLAGS_planted_dim;
  dopt.synthetic.cardinalities = tw::CriteoLikeCardinalities(FLAGS_synthetic_max_cardinality);
  dopt.validation_mod = validate ? FLAGS_validation_mod : 0;
  dopt.validation_samples = FLAGS_validation_samples;
  if (FLAGS_epochs == 0 && FLAGS_max_steps == 0) {
    return tessera::cli::UsageError(kTool, "--epochs=0 repeats the data without end: give "
                                           "--max_steps too");
  }
  if (FLAGS_batch_size == 0) {
    // Small data sets need small batches: 100 steps an epoch at least (docs/worker.md).
    auto shard = tw::SmallestTrainShard(dopt);
    if (!shard.ok()) return Fail(shard.status().WithContext("counting the training part"));
    FLAGS_batch_size = static_cast<uint32_t>(
        std::clamp<uint64_t>(*shard / tw::kMinStepsPerEpoch, 32, 1024));
    std::printf("worker %u batch size %u (chosen: %llu training samples a rank)\n",
                FLAGS_worker_id, FLAGS_batch_size, static_cast<unsigned long long>(*shard));
  }

  // The model's shape follows the data's.
  auto probe = tw::OpenTestData(dopt);
  if (!probe.ok()) return Fail(probe.status());
  tw::ModelConfig mc;
  mc.num_dense = (*probe)->schema().num_dense;
  mc.num_fields = (*probe)->schema().num_fields;
  mc.embedding_dim = FLAGS_embedding_dim;
  auto bottom = tw::ParseLayerWidths(FLAGS_bottom_mlp);
  if (!bottom.ok()) return Fail(bottom.status());
  auto top = tw::ParseLayerWidths(FLAGS_top_mlp);
  if (!top.ok()) return Fail(top.status());
  mc.bottom_mlp = *bottom;
  mc.top_mlp = *top;
  mc.pooling = FLAGS_pooling == "mean" ? tw::Pooling::kMean : tw::Pooling::kSum;
  mc.kind = *model_kind;
  mc.num_cross_layers = FLAGS_cross_layers;
  mc.deep = FLAGS_deep;
  mc.wide = FLAGS_wide;
  mc.table_prefix = FLAGS_job;
  mc.embedding_optimizer.learning_rate = static_cast<float>(FLAGS_emb_lr);
  mc.embedding_optimizer.initial_accumulator = static_cast<float>(FLAGS_emb_init_acc);
  mc.dense_optimizer.learning_rate = static_cast<float>(FLAGS_dense_lr);
  mc.wide_optimizer.learning_rate = static_cast<float>(FLAGS_wide_lr);
  mc.embedding_optimizer.l2 = static_cast<float>(FLAGS_emb_l2);
  mc.dense_optimizer.l2 = static_cast<float>(FLAGS_dense_l2);
  mc.wide_optimizer.l2 = static_cast<float>(FLAGS_wide_l2);
  auto layout = tw::ModelLayout::Create(mc);
  if (!layout.ok()) return Fail(layout.status());

  tw::TrainerOptions topt;
  topt.batch_size = FLAGS_batch_size;
  topt.max_steps = FLAGS_max_steps;
  topt.prefetch = FLAGS_prefetch;
  topt.staleness = staleness;
  topt.worker_id = FLAGS_worker_id;
  topt.job = FLAGS_job;
  topt.resume = FLAGS_resume;
  topt.progress_interval_s = FLAGS_progress_interval_s;
  topt.on_progress = [&worker_metrics](const tw::TrainProgress& p) {
    worker_metrics.Progress(p);
    std::printf("worker %u step %llu samples %llu %.0f samples/s loss %.4f running_auc %.4f\n",
                FLAGS_worker_id, static_cast<unsigned long long>(p.step),
                static_cast<unsigned long long>(p.samples), p.samples_per_s, p.loss, p.running_auc);
    std::fflush(stdout);
  };

  // Validation: every node trains the same number of steps (the last step that every rank
  // still has data for), so that every node takes part in every round.
  tw::ValidationSchedule schedule;
  std::unique_ptr<tw::Validator> validator;
  std::unique_ptr<tw::Backend> validation_backend;
  std::unique_ptr<tw::CurveFile> curve;
  const uint64_t global_batch =
      static_cast<uint64_t>(FLAGS_batch_size) * nl * FLAGS_num_workers;
  if (validate) {
    auto shard = tw::SmallestTrainShard(dopt);
    if (!shard.ok()) return Fail(shard.status().WithContext("counting the training part"));
    const uint64_t planned = tw::PlannedSteps(*shard, FLAGS_epochs, FLAGS_batch_size);
    if (planned != 0 && (topt.max_steps == 0 || planned < topt.max_steps)) {
      topt.max_steps = planned;
    }
    schedule.every_steps = validate_every;
    schedule.epoch_samples = *shard;
    schedule.batch_size = FLAGS_batch_size;
    schedule.last_step = topt.max_steps;
    tw::ValidationOptions vopt;
    vopt.job = FLAGS_job;
    vopt.worker_id = FLAGS_worker_id;
    vopt.num_workers = FLAGS_num_workers;
    vopt.patience = FLAGS_early_stopping_patience;
    vopt.by_auc = FLAGS_early_stopping_metric == "auc";
    vopt.last_step = topt.max_steps;
    if (!FLAGS_admin_root.empty()) vopt.best_dir = FLAGS_job + "-best";
    tw::Batch samples;
    if (FLAGS_worker_id == 0) {
      auto vr = tw::OpenValidationData(dopt);
      if (!vr.ok()) return Fail(vr.status());
      samples.Clear((*vr)->schema());
      while (samples.size < FLAGS_validation_samples) {
        auto n = (*vr)->Read(static_cast<uint32_t>(std::min<uint64_t>(
                                 FLAGS_validation_samples - samples.size, 1u << 16)),
                             &samples);
        if (!n.ok()) return Fail(n.status().WithContext("reading the validation part"));
        if (*n == 0) break;
      }
      auto b = tw::CreateCpuBackend(*layout, {std::max(FLAGS_threads, 2)});
      if (!b.ok()) return Fail(b.status());
      validation_backend = std::move(*b);
      if (FLAGS_admin_root.empty()) {
        std::printf("worker 0: no --admin_root: the best validated state is not kept; the test "
                    "scores the final state\n");
      }
    }
    auto v = tw::Validator::Create(vopt, *layout, store.get(), client->get(),
                                   validation_backend.get(), std::move(samples));
    if (!v.ok()) return Fail(v.status());
    validator = std::move(*v);
    topt.pause_at = [&schedule](uint64_t step) { return schedule.Due(step); };
    topt.on_pause = [&](const tw::TrainProgress& p) -> tessera::Result<bool> {
      TESSERA_ASSIGN_OR_RETURN(bool stop, validator->Round(p.step));
      if (FLAGS_worker_id != 0) return stop;
      const tw::ValidationPoint& v = validator->history().back();
      std::printf("worker 0 validate step %llu samples %llu auc %.4f logloss %.4f%s\n",
                  static_cast<unsigned long long>(v.step),
                  static_cast<unsigned long long>(v.samples), v.auc, v.logloss,
                  validator->rounds_without_improvement() == 0 ? " (best)" : "");
      if (stop) {
        std::printf("worker 0 early stop after step %llu: no better validation %s for %u "
                    "rounds (best: step %llu auc %.4f logloss %.4f)\n",
                    static_cast<unsigned long long>(p.step), FLAGS_early_stopping_metric.c_str(),
                    FLAGS_early_stopping_patience,
                    static_cast<unsigned long long>(validator->best()->step),
                    validator->best()->auc, validator->best()->logloss);
      }
      std::fflush(stdout);
      if (curve) {
        tw::CurveRow row;
        row.step = p.step;
        row.samples = p.step * global_batch;
        row.train_loss = p.loss;
        row.samples_per_s = p.samples_per_s;
        row.validation_auc = v.auc;
        row.validation_logloss = v.logloss;
        TESSERA_RETURN_IF_ERROR(curve->Append(row));
      }
      return stop;
    };
  }
  // The learning-rate schedule; a decay without --lr_decay_steps lasts until the planned end.
  {
    auto decay = tw::ParseLrDecay(FLAGS_lr_decay);
    if (!decay.ok()) return tessera::cli::UsageError(kTool, "--lr_decay: " + decay.status().message());
    if (!(FLAGS_lr_final_scale >= 0 && FLAGS_lr_final_scale <= 1)) {
      return tessera::cli::UsageError(kTool, "--lr_final_scale must be in [0, 1]");
    }
    topt.lr_schedule.warmup_steps = FLAGS_lr_warmup_steps;
    topt.lr_schedule.decay = *decay;
    topt.lr_schedule.final_scale = static_cast<float>(FLAGS_lr_final_scale);
    topt.lr_schedule.decay_steps = FLAGS_lr_decay_steps;
    if (*decay != tw::LrSchedule::Decay::kNone && FLAGS_lr_decay_steps == 0) {
      uint64_t end = topt.max_steps;
      if (end == 0) {
        auto shard = tw::SmallestTrainShard(dopt);
        if (!shard.ok()) return Fail(shard.status().WithContext("counting the training part"));
        end = tw::PlannedSteps(*shard, FLAGS_epochs, FLAGS_batch_size);
      }
      if (end <= FLAGS_lr_warmup_steps) {
        return tessera::cli::UsageError(
            kTool, "--lr_decay needs --lr_decay_steps: no planned last step after the warm-up");
      }
      topt.lr_schedule.decay_steps = end - FLAGS_lr_warmup_steps;
    }
  }
  if (FLAGS_worker_id == 0) {
    std::error_code ec;
    std::filesystem::create_directories(FLAGS_out_dir, ec);
    auto c = tw::CurveFile::Create((std::filesystem::path(FLAGS_out_dir) / "metrics.csv").string());
    if (!c.ok()) return Fail(c.status().WithContext("--out_dir"));
    curve = std::move(*c);
    auto on_progress = topt.on_progress;
    topt.on_progress = [on_progress, &curve, global_batch](const tw::TrainProgress& p) {
      on_progress(p);
      tw::CurveRow row;
      row.step = p.step;
      row.samples = p.step * global_batch;
      row.train_loss = p.loss;
      row.samples_per_s = p.samples_per_s;
      tessera::Status s = curve->Append(row);
      if (!s.ok()) std::fprintf(stderr, "tessera-worker 0: %s\n", s.ToString().c_str());
    };
  }

  // Every rank's set-up and training; a rank that fails aborts the group (RunLocalRanks), so
  // that no other rank waits for it forever.
  tw::TrainResult tr;
  auto run_rank = [&](uint32_t local) -> tessera::Status {
    std::unique_ptr<tw::LocalReducer> reducer;
    if (group) {
      TESSERA_ASSIGN_OR_RETURN(reducer, group->Join(local));
    }
    tw::DataSourceOptions mine = dopt;
    mine.rank = FLAGS_worker_id * nl + local;
    TESSERA_ASSIGN_OR_RETURN(auto reader, tw::OpenTrainData(mine));
    std::unique_ptr<tw::Backend> backend;
    if (FLAGS_backend == "cuda") {
      TESSERA_ASSIGN_OR_RETURN(backend,
                               tw::CreateCudaBackend(*layout, tw::DeviceOfLocalRank(local, gpus)));
    } else {
      TESSERA_ASSIGN_OR_RETURN(backend, tw::CreateCpuBackend(*layout, {FLAGS_threads}));
    }
    TESSERA_ASSIGN_OR_RETURN(auto trainer,
                             tw::Trainer::Create(topt, *layout, local == 0 ? store.get() : nullptr,
                                                 backend.get(), reader.get(), reducer.get()));
    TESSERA_RETURN_IF_ERROR(trainer->Init());
    if (http && local == 0) http->SetReady(true);
    TESSERA_ASSIGN_OR_RETURN(tw::TrainResult r, trainer->Train());
    if (local == 0) tr = r;
    return tessera::Status::OK();
  };
  const double train_start_s = UnixSeconds();
  tessera::Status trained = tw::RunLocalRanks(nl, group.get(), run_rank);
  if (!trained.ok()) return Fail(trained);
  const double train_end_s = UnixSeconds();
  if (http) http->SetReady(false, "training finished");
  std::printf(
      "worker %u trained %llu samples in %.1f s (%.0f samples/s), %llu steps "
      "(%llu resumed), train loss %.4f\n",
      FLAGS_worker_id, static_cast<unsigned long long>(tr.samples), tr.seconds, tr.samples_per_s,
      static_cast<unsigned long long>(tr.steps), static_cast<unsigned long long>(tr.resumed_steps),
      tr.train_loss);
  std::fflush(stdout);
  if (!FLAGS_evaluate) return 0;

  // Each worker records what it trained; worker 0 reports the job's totals from the records.
  tessera::Status s = store->PutMeta(
      FLAGS_job + "/trained/" + std::to_string(FLAGS_worker_id),
      FormatTrained({tr.samples, tr.train_loss * static_cast<double>(tr.samples), train_start_s,
                     train_end_s}));
  if (!s.ok()) return Fail(s);
  s = store->Barrier(FLAGS_job + "/train_done");
  if (!s.ok()) return Fail(s);
  if (FLAGS_worker_id != 0) return 0;
  auto job = JobTotals(store.get());
  if (!job.ok()) return Fail(job.status());
  std::optional<uint64_t> restored;
  double restored_validation_auc = std::nan("");
  if (validator) {
    auto r = validator->RestoreBest(tr.steps);
    if (!r.ok()) return Fail(r.status());
    restored = *r;
    if (restored) {
      // The state the test scores: scored on the validation part again, it must give the best
      // round's figures.
      auto again = validator->Score();
      if (!again.ok()) return Fail(again.status());
      restored_validation_auc = again->auc;
      std::printf("worker 0 restored the best validated state (step %llu, checkpoint %s) for "
                  "the test\n",
                  static_cast<unsigned long long>(*restored),
                  validator->best_checkpoint().c_str());
    }
  }
  auto test = tw::OpenTestData(dopt);
  if (!test.ok()) return Fail(test.status());
  auto backend = tw::CreateCpuBackend(*layout, {std::max(FLAGS_threads, 2)});
  if (!backend.ok()) return Fail(backend.status());
  auto ev = tw::Evaluate(*layout, store.get(), backend->get(), test->get());
  if (!ev.ok()) return Fail(ev.status());
  worker_metrics.Test(ev->auc, ev->logloss);
  std::printf("test samples %llu auc %.4f logloss %.4f",
              static_cast<unsigned long long>(ev->samples), ev->auc, ev->logloss);
  if (std::isfinite(ev->oracle_auc)) {
    std::printf(" oracle_auc %.4f oracle_logloss %.4f (gap %.4f)", ev->oracle_auc,
                ev->oracle_logloss, ev->oracle_auc - ev->auc);
  }
  std::printf("\n");
  // The report line (examples/ctr/README.md lists its keys). The training figures are worker
  // 0's own (its node's local ranks together, this run only): this process does not see the
  // other workers' counts. "data" stays the first key (scripts find the line by it); NaN
  // (no oracle) is written as null.
  nlohmann::ordered_json report;
  report["data"] = FLAGS_data;
  report["workers"] = FLAGS_num_workers;
  report["local_ranks"] = nl;
  report["consistency"] = FLAGS_consistency;
  report["prefetch"] = FLAGS_prefetch;
  report["model"] = FLAGS_deep ? FLAGS_model + (FLAGS_wide ? "+wide" : "") : "wide";
  report["train_samples_worker0"] = tr.samples;
  report["train_seconds"] = tr.seconds;
  report["samples_per_s_worker0"] = tr.samples_per_s;
  report["train_loss"] = job->samples > 0 ? job->loss_sum / static_cast<double>(job->samples) : 0;
  report["train_loss_worker0"] = tr.train_loss;
  // Every worker's samples of this run, over the wall time from the first worker's start of
  // training to the last one's end (the workers' clocks: one machine, or synchronized).
  report["train_samples"] = job->samples;
  report["train_seconds_cluster"] = job->end_s - job->start_s;
  report["samples_per_s_cluster"] =
      job->end_s > job->start_s ? static_cast<double>(job->samples) / (job->end_s - job->start_s)
                                : 0;
  report["test_samples"] = ev->samples;
  report["test_auc"] = ev->auc;
  report["test_logloss"] = ev->logloss;
  report["oracle_auc"] = ev->oracle_auc;
  report["oracle_logloss"] = ev->oracle_logloss;
  report["steps"] = tr.steps;
  report["early_stopped"] = tr.stopped;
  if (validator && validator->best()) {
    report["best_validation_step"] = validator->best()->step;
    report["best_validation_auc"] = validator->best()->auc;
    report["best_validation_logloss"] = validator->best()->logloss;
    report["early_stopping_metric"] = FLAGS_early_stopping_metric;
    report["tested_step"] = restored ? *restored : tr.steps;
    if (restored) report["restored_validation_auc"] = restored_validation_auc;
  }
  if (curve) {
    report["metrics_csv"] = curve->path();
    tw::ReportSummary summary;
    summary.data = FLAGS_data;
    summary.steps = tr.steps;
    summary.test_samples = ev->samples;
    summary.test_auc = ev->auc;
    summary.test_logloss = ev->logloss;
    summary.oracle_auc = ev->oracle_auc;
    summary.oracle_logloss = ev->oracle_logloss;
    summary.train_seconds = tr.seconds;
    summary.train_loss = tr.train_loss;
    summary.early_stopped = tr.stopped;
    if (validator && validator->best()) {
      summary.best_validation_step = validator->best()->step;
      summary.best_validation_auc = validator->best()->auc;
      summary.best_validation_logloss = validator->best()->logloss;
      summary.tested_step = restored ? *restored : tr.steps;
    }
    const std::string html =
        (std::filesystem::path(curve->path()).parent_path() / "report.html").string();
    tessera::Status written = tw::WriteReport(curve->path(), summary, html);
    if (written.ok()) {
      report["report_html"] = html;
    } else {
      std::fprintf(stderr, "tessera-worker 0: report.html: %s\n", written.ToString().c_str());
    }
  }
  if (FLAGS_skip_bad_lines) report["skipped_lines"] = skipped_lines.count();
  // A --data path need not be UTF-8; replace what is not rather than throw.
  std::printf("%s\n", report.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  return 0;
}
