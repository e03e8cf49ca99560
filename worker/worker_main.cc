// tessera-worker: trains the click model on a Tessera cluster and reports its test quality.
// This file reads the flags into worker::JobOptions (worker/job.h), serves the worker's metrics
// and prints the JSON report line; worker::RunJob does the job.
#include <gflags/gflags.h>
#include <glog/logging.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ps/cli.h"
#include "ps/coord/coordinator_url.h"
#include "ps/coord/etcd_map_source.h"
#include "ps/metrics/http_endpoint.h"
#include "ps/metrics/metrics.h"
#include "ps/routing.h"
#include "worker/job.h"
#include "worker/search.h"

DEFINE_string(servers, "", "Server endpoints in rank order: comma-separated, or @FILE");
DEFINE_string(coordinator, "",
              "Instead of --servers: etcd://HOST:PORT/PREFIX, the etcd whose PREFIX/slotmap "
              "(tessera-ctl map init) names the servers and routes keys; the worker follows the "
              "map's newer versions (docs/elasticity.md); etcd://USER@HOST:PORT/PREFIX: as etcd "
              "user USER, password read from the file $TESSERA_ETCD_PASSWORD_FILE names");
DEFINE_string(curve_server_key_file, "",
              "File holding the servers' CurveZMQ public key (clusters started with "
              "--curve_secret_key_file)");
DEFINE_string(curve_client_key_file, "",
              "File holding this worker's own CurveZMQ secret key, for servers started with "
              "--authorized_clients (a key listed there) or --admin_clients (a worker that "
              "checkpoints its best model needs an admin key); empty: a fresh key");
DEFINE_uint32(worker_id, 0, "This worker's rank among the job's workers");
DEFINE_uint32(num_workers, 1, "Workers (nodes) in the job");
DEFINE_uint32(local_ranks, 1,
              "Local ranks reduced inside this node before one push: CPU threads, or with "
              "--backend=cuda one GPU each (rank r on GPU r mod the GPU count; NCCL); at most 256");
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
DEFINE_uint32(data_threads, 0,
              "Threads per local rank that read, parse and index batches ahead of training "
              "(the batches are the same whatever their number); 0: the cores divided among "
              "the local ranks, less one, 1 to 8");
DEFINE_uint32(prefetch_depth, 1,
              "Steps prepared ahead of the one computing (1..64); their pulls run ahead too: "
              "none under bsp, min(depth, staleness) under ssp, depth under async");
DEFINE_uint32(max_pushes_in_flight, 2,
              "Steps pushed and not yet acknowledged (1..64); a restarted worker redoes at most "
              "this many");
DEFINE_string(consistency, "async", "async | bsp | ssp");
DEFINE_int32(staleness, 2, "Bound of --consistency=ssp, in clocks");
DEFINE_uint64(cache_rows, 0,
              "Hot-row cache: rows of the most frequently pulled keys held by this worker per "
              "sparse table, their gradients pushed at most --cache_staleness steps late "
              "(docs/worker.md, Hot-row cache); 0: off; not with --consistency=bsp");
DEFINE_int32(cache_staleness, 2,
             "Hot-row cache: steps a held value is used after its pull, and a held row's "
             "gradients may wait before their push (1..64)");
DEFINE_int32(threads, 1, "CPU backend threads per local rank");
DEFINE_string(backend, "cpu",
              "cpu | cuda | null (null: no model, zero gradients; measures the feed: data, "
              "keys, pulls and pushes without a model)");
DEFINE_uint32(embedding_dim, 0,
              "Embedding width; 0: from the data, k^0.25 rounded to a multiple of 4 in "
              "[4, 32], k the mean distinct keys a field in the first 50,000 training samples");
DEFINE_string(bottom_mlp, "auto",
              "Bottom MLP hidden widths, comma-separated (may be empty); auto: one layer of 8 * "
              "the embedding width, in [64, 256]");
DEFINE_string(top_mlp, "auto", "Top MLP hidden widths, comma-separated (may be empty); auto: "
              "as --bottom_mlp");
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
DEFINE_string(lr_decay, "auto",
              "Learning-rate decay after the warm-up: none | linear | cosine | auto (cosine "
              "when --epochs > 1, else none)");
DEFINE_uint64(lr_decay_steps, 0,
              "Steps the decay lasts (0: until the planned last step, when there is one)");
DEFINE_double(lr_final_scale, 0.1, "Learning-rate factor at the end of the decay");
DEFINE_double(emb_init_scale, tessera::worker::ModelConfig{}.embedding_init_scale,
              "Embedding rows start uniform in [-s, s]");
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
DEFINE_string(early_stopping_metric, "both",
              "Validation figure that picks the best round and stops early: auc (higher is "
              "better) | logloss (lower is better) | both (the best round by AUC; no stop while "
              "either AUC or logloss improves)");
DEFINE_uint32(early_stopping_patience, 3,
              "Stop when the validation figure has not improved for this many rounds (0: never)");
DEFINE_string(admin_root, "",
              "The servers' --admin_root as this worker sees it: worker 0 keeps the best "
              "validated state there as a checkpoint and restores it before the test (empty: the "
              "final state is tested)");
DEFINE_uint32(search, 0,
              "Train this many configs (the defaults first, then models, widths, MLPs, "
              "learning rates and L2 around them) by successive halving against the same servers, "
              "each under its own table prefix; pick the best on the validation split, test only "
              "it (docs/worker.md, Search); 0: no search");
DEFINE_uint32(search_eta, 3, "--search: the halving factor (each rung keeps 1/eta of its trials)");
DEFINE_string(search_id, "",
              "--search: names the trials' table prefixes <job>-<id>-r<rung>t<trial> (1 to 32 "
              "letters, digits, '-', '_'); every worker of the job must be given the same one "
              "(required with --num_workers > 1); empty: from the clock");
DEFINE_string(out_dir, ".", "Worker 0 writes metrics.csv (the training curve) here");
DEFINE_string(metrics_address, "127.0.0.1",
              "Address the metrics port listens on: 127.0.0.1 (this machine only) by default; "
              "0.0.0.0 or the pod's IP where probes and scrapers come from outside");

namespace tw = tessera::worker;

namespace {

constexpr tessera::cli::ToolInfo kTool{
    .name = "tessera-worker",
    .usage = "usage: tessera-worker --servers=EPS|--coordinator=etcd://HOST:PORT/PREFIX\n"
             "                      [--worker_id=I --num_workers=N] [--data=SPEC]\n"
             "Trains a click model on a Tessera cluster and reports its test quality.",
    .flags_file = __FILE__};

// The worker's training figures as metrics (tessera_worker_*), set from each progress report,
// and its readiness on the HTTP endpoint (where there is one).
class WorkerMetrics final : public tw::JobObserver {
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
                                 "Test log loss (worker 0, after training).")),
        cache_hits_(r.AddCounter("tessera_worker_cache_hits_total",
                                 "Keys of pulls served by the hot-row cache (--cache_rows).")),
        cache_misses_(r.AddCounter("tessera_worker_cache_misses_total",
                                   "Keys of pulls the hot-row cache sent to the servers.")),
        cache_flushed_(r.AddCounter("tessera_worker_cache_flushed_rows_total",
                                    "Rows' deferred gradient sums the hot-row cache pushed.")),
        cache_rows_(r.AddGauge("tessera_worker_cache_rows", "Rows the hot-row cache holds.")),
        cache_deferred_(r.AddGauge("tessera_worker_cache_deferred_rows",
                                   "Held rows whose gradients are not pushed yet.")) {
    r.AddGauge("tessera_worker_info", "Constant 1, labelled with the worker's place and build.",
               {{"worker_id", std::to_string(FLAGS_worker_id)},
                {"num_workers", std::to_string(FLAGS_num_workers)},
                {"backend", FLAGS_backend},
                {"version", std::string(tessera::cli::Version())}})
        .Set(1);
  }
  // Readiness goes to `http` from now on (null: nowhere). Borrowed.
  void set_http(tessera::metrics::HttpEndpoint* http) { http_ = http; }
  void OnProgress(const tw::TrainProgress& p) override {
    step_.Set(static_cast<double>(p.step));
    if (p.samples > samples_seen_) samples_.Inc(p.samples - samples_seen_);
    samples_seen_ = std::max(samples_seen_, p.samples);
    rate_.Set(p.samples_per_s);
    loss_.Set(p.loss);
    auc_.Set(p.running_auc);
    logloss_.Set(p.running_logloss);
  }
  void OnReady(bool ready, std::string_view why) override {
    if (http_) http_->SetReady(ready, std::string(why));
  }
  void OnTest(double auc, double logloss) override {
    test_auc_.Set(auc);
    test_logloss_.Set(logloss);
  }
  void OnRowCache(const tw::RowCacheStats& c) override {
    // Reports come from one thread at a time (progress, then the end of training).
    cache_hits_.Inc(c.hits - std::min(c.hits, cache_seen_.hits));
    cache_misses_.Inc(c.misses - std::min(c.misses, cache_seen_.misses));
    cache_flushed_.Inc(c.flushed_rows - std::min(c.flushed_rows, cache_seen_.flushed_rows));
    cache_rows_.Set(static_cast<double>(c.rows));
    cache_deferred_.Set(static_cast<double>(c.deferred_rows));
    cache_seen_ = c;
  }

 private:
  tessera::metrics::HttpEndpoint* http_ = nullptr;
  tessera::metrics::Gauge& step_;
  tessera::metrics::Counter& samples_;
  tessera::metrics::Gauge &rate_, &loss_, &auc_, &logloss_, &test_auc_, &test_logloss_;
  tessera::metrics::Counter &cache_hits_, &cache_misses_, &cache_flushed_;
  tessera::metrics::Gauge &cache_rows_, &cache_deferred_;
  uint64_t samples_seen_ = 0;  // progress reports come from one thread
  tw::RowCacheStats cache_seen_;
};

// The cluster: --servers, or the cluster map of --coordinator. Returns the exit status of a bad
// command line, or nothing.
std::optional<int> ClusterFromFlags(tw::JobOptions* o) {
  if (!FLAGS_coordinator.empty()) {
    if (!FLAGS_servers.empty()) {
      return tessera::cli::UsageError(kTool, "give --servers or --coordinator, not both (with "
                                             "--coordinator the cluster map names the servers)");
    }
    auto url = tessera::CoordinatorUrl::Parse(FLAGS_coordinator);
    if (!url.ok()) {
      return tessera::cli::UsageError(kTool, "--coordinator: " + url.status().ToString());
    }
    o->cluster_map = [coordinator = *url]()
        -> tessera::Result<std::unique_ptr<tessera::ClusterMapSource>> {
      TESSERA_ASSIGN_OR_RETURN(auto source, tessera::EtcdClusterMapSource::Create(coordinator));
      return std::unique_ptr<tessera::ClusterMapSource>(std::move(source));
    };
  } else {
    auto servers = tessera::ParseClusterList(FLAGS_servers);
    if (!servers.ok()) {
      return tessera::cli::UsageError(kTool, "--servers: " + servers.status().ToString());
    }
    o->servers = *servers;
  }
  o->curve_server_key_file = FLAGS_curve_server_key_file;
  o->curve_client_key_file = FLAGS_curve_client_key_file;
  o->request_timeout_ms = FLAGS_request_timeout_ms;
  o->retry_for_ms = FLAGS_retry_for_ms;
  o->admin_root = FLAGS_admin_root;
  return std::nullopt;
}

// The node, the data and the training loop: flags without checks of their own here.
void NodeAndDataFromFlags(tw::JobOptions* o) {
  o->worker_id = FLAGS_worker_id;
  o->num_workers = FLAGS_num_workers;
  o->local_ranks = FLAGS_local_ranks;
  o->backend = FLAGS_backend;
  o->threads = FLAGS_threads;
  o->data = FLAGS_data;
  o->schema = FLAGS_schema;
  o->skip_bad_lines = FLAGS_skip_bad_lines;
  o->train_samples = FLAGS_train_samples;
  o->test_samples = FLAGS_test_samples;
  o->seed = FLAGS_seed;
  o->synthetic_max_cardinality = FLAGS_synthetic_max_cardinality;
  o->zipf = FLAGS_zipf;
  o->interaction_std = FLAGS_interaction_std;
  o->bias_std = FLAGS_bias_std;
  o->planted_dim = FLAGS_planted_dim;
  o->epochs = FLAGS_epochs;
  o->shuffle_buffer = FLAGS_shuffle_buffer;
  o->holdout_mod = FLAGS_holdout_mod;
  o->batch_size = FLAGS_batch_size;
  o->max_steps = FLAGS_max_steps;
  o->prefetch = FLAGS_prefetch;
  o->data_threads = FLAGS_data_threads;
  o->prefetch_depth = FLAGS_prefetch_depth;
  o->max_pushes_in_flight = FLAGS_max_pushes_in_flight;
  o->staleness = -1;  // async
  if (FLAGS_consistency == "bsp") {
    o->staleness = 0;
  } else if (FLAGS_consistency == "ssp") {
    o->staleness = std::max(FLAGS_staleness, 1);
  }
  o->cache_rows = FLAGS_cache_rows;
  o->cache_staleness = FLAGS_cache_staleness;
  o->job = FLAGS_job;
  o->resume = FLAGS_resume;
  o->progress_interval_s = FLAGS_progress_interval_s;
  o->evaluate = FLAGS_evaluate;
  o->out_dir = FLAGS_out_dir;
}

// The model (--model was checked before).
void ModelFromFlags(tw::ModelKind kind, tw::JobOptions* o) {
  o->embedding_dim = FLAGS_embedding_dim;
  o->bottom_mlp = FLAGS_bottom_mlp;
  o->top_mlp = FLAGS_top_mlp;
  o->pooling = FLAGS_pooling == "mean" ? tw::Pooling::kMean : tw::Pooling::kSum;
  o->model = kind;
  o->cross_layers = FLAGS_cross_layers;
  o->deep = FLAGS_deep;
  o->wide = FLAGS_wide;
  o->emb_lr = FLAGS_emb_lr;
  o->dense_lr = FLAGS_dense_lr;
  o->wide_lr = FLAGS_wide_lr;
  o->emb_l2 = FLAGS_emb_l2;
  o->dense_l2 = FLAGS_dense_l2;
  o->wide_l2 = FLAGS_wide_l2;
  o->emb_init_acc = FLAGS_emb_init_acc;
  o->emb_init_scale = FLAGS_emb_init_scale;
}

// Validation, early stopping and the learning-rate schedule. Returns the exit status of a bad
// command line, or nothing.
std::optional<int> ScheduleFromFlags(tw::JobOptions* o) {
  o->validate = FLAGS_validate_every != "0";
  if (o->validate && FLAGS_validate_every != "epoch") {
    char* end = nullptr;
    o->validate_every_steps = std::strtoull(FLAGS_validate_every.c_str(), &end, 10);
    if (end == FLAGS_validate_every.c_str() || *end != '\0' || FLAGS_validate_every[0] == '-') {
      return tessera::cli::UsageError(kTool, "--validate_every must be a number of steps, "
                                             "'epoch' or 0, not '" + FLAGS_validate_every + "'");
    }
  }
  const auto early_stopping = tw::ParseEarlyStopping(FLAGS_early_stopping_metric);
  if (!early_stopping.ok()) {
    return tessera::cli::UsageError(kTool, "--early_stopping_metric: " +
                                               early_stopping.status().message());
  }
  if (o->validate && FLAGS_validation_mod < 2) {
    return tessera::cli::UsageError(kTool, "--validation_mod must be at least 2");
  }
  o->validation_mod = FLAGS_validation_mod;
  o->validation_samples = FLAGS_validation_samples;
  o->early_stopping = *early_stopping;
  o->early_stopping_patience = FLAGS_early_stopping_patience;
  if (FLAGS_epochs == 0 && FLAGS_max_steps == 0) {
    return tessera::cli::UsageError(kTool, "--epochs=0 repeats the data without end: give "
                                           "--max_steps too");
  }
  o->lr_decay_by_epochs = FLAGS_lr_decay == "auto";
  auto decay = tw::ParseLrDecay(o->lr_decay_by_epochs ? "none" : FLAGS_lr_decay);
  if (!decay.ok()) {
    return tessera::cli::UsageError(kTool, "--lr_decay must be auto, none, linear or cosine, "
                                           "not '" + FLAGS_lr_decay + "'");
  }
  if (!(FLAGS_lr_final_scale >= 0 && FLAGS_lr_final_scale <= 1)) {
    return tessera::cli::UsageError(kTool, "--lr_final_scale must be in [0, 1]");
  }
  if (!(FLAGS_emb_init_scale >= 0 && FLAGS_emb_init_scale <= 1)) {
    return tessera::cli::UsageError(kTool, "--emb_init_scale must be in [0, 1]");
  }
  o->lr_schedule.warmup_steps = FLAGS_lr_warmup_steps;
  o->lr_schedule.decay = *decay;
  o->lr_schedule.final_scale = static_cast<float>(FLAGS_lr_final_scale);
  o->lr_schedule.decay_steps = FLAGS_lr_decay_steps;
  return std::nullopt;
}

// The flags as JobOptions, with the checks of a bad command line (the message printed; the
// exit status returned instead). The job's observer and output are set by main.
std::optional<int> OptionsFromFlags(tw::JobOptions* o) {
  if (!tessera::cli::CheckOneOf(kTool, "backend", FLAGS_backend, {"cpu", "cuda", "null"}) ||
      !tessera::cli::CheckOneOf(kTool, "pooling", FLAGS_pooling, {"sum", "mean"}) ||
      !tessera::cli::CheckOneOf(kTool, "consistency", FLAGS_consistency,
                                {"async", "bsp", "ssp"})) {
    return 2;
  }
  const auto model_kind = tw::ParseModelKind(FLAGS_model);
  if (!model_kind.ok()) {
    return tessera::cli::UsageError(kTool, "--model: " + model_kind.status().message());
  }
  if (auto bad = ClusterFromFlags(o)) return bad;
  NodeAndDataFromFlags(o);
  ModelFromFlags(*model_kind, o);
  return ScheduleFromFlags(o);
}

// The search's keys of the report line: the winner and every trial.
void AddSearch(const tw::SearchReport& search, nlohmann::ordered_json* report) {
  nlohmann::ordered_json trials = nlohmann::json::array();
  for (size_t i = 0; i < search.trials.size(); ++i) {
    const tw::TrialResult& t = search.trials[i];
    nlohmann::ordered_json row;
    row["rung"] = t.rung;
    row["trial"] = t.trial;
    row["config"] = t.config.Describe();
    row["steps"] = t.steps;
    row["validation_auc"] = t.validation_auc;
    row["validation_logloss"] = t.validation_logloss;
    if (std::isfinite(t.test_auc)) row["test_auc"] = t.test_auc;
    row["winner"] = i == search.winner;
    trials.push_back(row);
  }
  const tw::TrialResult& w = search.trials[search.winner];
  (*report)["search_winner"] = w.config.Describe();
  (*report)["search_winner_is_default"] = w.trial == 0;
  (*report)["search_dropped_tables"] = search.dropped_tables;
  (*report)["search_tables_not_dropped"] = search.tables_not_dropped;
  if (!search.trials_csv.empty()) (*report)["trials_csv"] = search.trials_csv;
  (*report)["search_trials"] = trials;
}

// The report line (examples/ctr/README.md lists its keys). The training figures are worker 0's
// own (its node's local ranks together, this run only): this process does not see the other
// workers' counts. "data" stays the first key (scripts find the line by it); NaN (no oracle) is
// written as null.
void PrintReport(const tw::JobReport& r, const tw::SearchReport* search = nullptr) {
  const tw::TrainResult& tr = r.train;
  nlohmann::ordered_json report;
  report["data"] = FLAGS_data;
  report["workers"] = FLAGS_num_workers;
  report["local_ranks"] = std::max<uint32_t>(FLAGS_local_ranks, 1);
  report["consistency"] = FLAGS_consistency;
  report["prefetch"] = FLAGS_prefetch;
  report["prefetch_depth"] = FLAGS_prefetch_depth;
  report["max_pushes_in_flight"] = FLAGS_max_pushes_in_flight;
  report["model"] = FLAGS_deep ? FLAGS_model + (FLAGS_wide ? "+wide" : "") : "wide";
  report["embedding_dim"] = r.embedding_dim;
  report["bottom_mlp"] = r.bottom_mlp;
  report["top_mlp"] = r.top_mlp;
  report["lr_decay"] = r.lr_schedule.decay == tw::LrSchedule::Decay::kCosine   ? "cosine"
                       : r.lr_schedule.decay == tw::LrSchedule::Decay::kLinear ? "linear"
                                                                               : "none";
  report["train_samples_worker0"] = tr.samples;
  report["train_seconds"] = tr.seconds;
  report["samples_per_s_worker0"] = tr.samples_per_s;
  report["train_loss"] =
      r.job_samples > 0 ? r.job_loss_sum / static_cast<double>(r.job_samples) : 0;
  report["train_loss_worker0"] = tr.train_loss;
  // Every worker's samples of this run, over the wall time from the first worker's start of
  // training to the last one's end (the workers' clocks: one machine, or synchronized).
  report["train_samples"] = r.job_samples;
  report["train_seconds_cluster"] = r.job_end_s - r.job_start_s;
  report["samples_per_s_cluster"] =
      r.job_end_s > r.job_start_s
          ? static_cast<double>(r.job_samples) / (r.job_end_s - r.job_start_s)
          : 0;
  report["test_samples"] = r.test.samples;
  report["test_auc"] = r.test.auc;
  report["test_logloss"] = r.test.logloss;
  report["oracle_auc"] = r.test.oracle_auc;
  report["oracle_logloss"] = r.test.oracle_logloss;
  report["steps"] = tr.steps;
  report["early_stopped"] = tr.stopped;
  if (r.best_validation) {
    report["best_validation_step"] = r.best_validation->step;
    report["best_validation_auc"] = r.best_validation->auc;
    report["best_validation_logloss"] = r.best_validation->logloss;
    report["early_stopping_metric"] = FLAGS_early_stopping_metric;
    report["tested_step"] = r.tested_step;
    if (r.restored) report["restored_validation_auc"] = r.restored_validation_auc;
  }
  report["metrics_csv"] = r.metrics_csv;
  if (!r.report_html.empty()) report["report_html"] = r.report_html;
  if (FLAGS_skip_bad_lines) report["skipped_lines"] = r.skipped_lines;
  if (r.row_cache) {
    report["cache_rows"] = FLAGS_cache_rows;
    report["cache_staleness"] = FLAGS_cache_staleness;
    report["cache_hits"] = r.row_cache->hits;
    report["cache_misses"] = r.row_cache->misses;
    report["cache_hit_rate"] = r.row_cache->hit_rate();
    report["cache_flushed_rows"] = r.row_cache->flushed_rows;
    report["cache_deferred_rows"] = r.row_cache->deferred_rows;  // 0: all flushed for the test
  }
  if (search != nullptr) AddSearch(*search, &report);
  // A --data path need not be UTF-8; replace what is not rather than throw.
  std::printf("%s\n",
              report.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
}

}  // namespace

int main(int argc, char** argv) {
  tessera::cli::ParseCommandLine(kTool, &argc, &argv);
  tw::JobOptions options;
  if (auto bad = OptionsFromFlags(&options)) return *bad;
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
  worker_metrics.set_http(http.get());
  options.observer = &worker_metrics;

  bool options_error = false;
  if (FLAGS_search > 0) {
    tw::SearchOptions so;
    so.trials = FLAGS_search;
    so.eta = FLAGS_search_eta;
    so.id = FLAGS_search_id;
    auto search = tw::RunSearch(options, so, &options_error);
    if (!search.ok() && options_error) {
      return tessera::cli::UsageError(kTool, search.status().message());
    }
    if (!search.ok()) {
      std::fprintf(stderr, "tessera-worker %u: %s\n", FLAGS_worker_id,
                   search.status().ToString().c_str());
      return 1;
    }
    // Worker 0 tested the winner and reports the search; the others printed their lines.
    if (search->report.tested) PrintReport(search->report, &*search);
    return 0;
  }
  auto report = tw::RunJob(options, &options_error);
  if (!report.ok() && options_error) {
    return tessera::cli::UsageError(kTool, report.status().message());
  }
  if (!report.ok()) {
    std::fprintf(stderr, "tessera-worker %u: %s\n", FLAGS_worker_id,
                 report.status().ToString().c_str());
    return 1;
  }
  if (report->tested) PrintReport(*report);
  return 0;
}
