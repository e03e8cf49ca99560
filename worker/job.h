// A training job from start to report: what tessera-worker runs on each node. The program reads
// its flags into JobOptions and calls RunJob; a test or another program can run a job the same
// way, in its own process.
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ps/client/client.h"
#include "ps/cluster_map_source.h"
#include "ps/status.h"
#include "worker/data_source.h"
#include "worker/model.h"
#include "worker/report.h"
#include "worker/row_cache.h"
#include "worker/synthetic_data.h"
#include "worker/trainer.h"
#include "worker/validation.h"

namespace tessera::worker {

/// Follows a running job from outside it: metrics, readiness probes. Every method does nothing
/// unless overridden. Called from the job's threads (progress from local rank 0's); an
/// implementation must be thread-safe and must not block.
class JobObserver {
 public:
  virtual ~JobObserver() = default;
  /// Each progress report of this node, before its progress line is written.
  virtual void OnProgress(const TrainProgress& /*progress*/) {}
  /// true once local rank 0 is set up and trains; false, with why, when training has ended.
  virtual void OnReady(bool /*ready*/, std::string_view /*why*/) {}
  /// Worker 0's test figures, before its test line is written.
  virtual void OnTest(double /*auc*/, double /*logloss*/) {}
  /// The hot-row cache's figures so far (with cache_rows), with each progress report and once
  /// training has ended.
  virtual void OnRowCache(const RowCacheStats& /*stats*/) {}
};

/// JobOptions::bottom_mlp / top_mlp: sized from the embedding width (DefaultMlp).
inline constexpr char kAutoMlp[] = "auto";

/// What a job runs, on which cluster, with which model and data. A value type; the defaults are
/// tessera-worker's (each field names its flag). Borrowed pointers must outlive RunJob.
struct JobOptions {
  // ---- the cluster
  /// Data endpoints of the servers in rank order (--servers). Exactly one of `servers` and
  /// `cluster_map` is given. Default: none.
  std::vector<std::string> servers;
  /// Instead of `servers`: makes the source of the cluster map that names the servers and
  /// routes keys; the job follows its newer versions (--coordinator). Called once, when the job
  /// connects; an error fails the job with the context "--coordinator". Default: none.
  std::function<Result<std::unique_ptr<ClusterMapSource>>()> cluster_map;
  /// File holding the servers' CurveZMQ public key (--curve_server_key_file); empty: no
  /// encryption. Default: empty.
  std::string curve_server_key_file;
  /// File holding this worker's own CurveZMQ secret key (--curve_client_key_file); empty: a
  /// fresh key pair. Default: empty.
  std::string curve_client_key_file;
  /// Timeout of one request, in milliseconds (--request_timeout_ms). Default: 60000.
  int64_t request_timeout_ms = 60000;
  /// How long calls to a server that is down are retried before the job fails, in milliseconds;
  /// 0: no retries (--retry_for_ms). Default: 120000.
  int64_t retry_for_ms = 120000;
  /// The servers' --admin_root as this node sees it: worker 0 keeps the best validated state
  /// there and restores it before the test; empty: the final state is tested (--admin_root).
  /// Default: empty.
  std::string admin_root;

  // ---- this node
  /// This node's rank among the job's workers (--worker_id). Default: 0.
  uint32_t worker_id = 0;
  /// Workers (nodes) in the job (--num_workers). Default: 1.
  uint32_t num_workers = 1;
  /// Local ranks reduced inside this node before one push: CPU threads, or one GPU each with
  /// backend "cuda" (0 counts as 1 rank, but the data is dealt to num_workers * local_ranks
  /// shards as given) (--local_ranks). At most kMaxLocalRanks (256, worker/local_ranks.h):
  /// RunJob refuses more as an options error. Default: 1.
  uint32_t local_ranks = 1;
  /// "cpu", "cuda", or "null": no model, zero gradients (CreateNullBackend), which measures the
  /// feed: data, keys, pulls and pushes without a model; RunJob refuses any other as an options
  /// error (--backend). Default: "cpu".
  std::string backend = "cpu";
  /// CPU backend threads per local rank (--threads). Default: 1.
  int32_t threads = 1;

  // ---- data (DataSourceOptions)
  /// synthetic | criteo:PATH | libsvm:PATH | csv:PATH | movielens:DIR (--data). Default:
  /// "synthetic".
  std::string data = "synthetic";
  /// The columns of csv data (--schema, docs/worker.md "CSV input"). Default: empty.
  std::string schema;
  /// csv: skip malformed lines (counted in JobReport::skipped_lines) instead of failing
  /// (--skip_bad_lines). Default: false.
  bool skip_bad_lines = false;
  /// Synthetic: training samples of all workers together (--train_samples). Default: 2500000.
  uint64_t train_samples = 2500000;
  /// Synthetic: test samples (--test_samples). Default: 100000.
  uint64_t test_samples = 100000;
  /// Synthetic: seed of the planted model (--seed). Default: 1.
  uint64_t seed = 1;
  /// Synthetic: cap of the Criteo cardinalities (--synthetic_max_cardinality). Default: 20000.
  uint64_t synthetic_max_cardinality = 20000;
  /// Synthetic: Zipf exponent of ids (--zipf). Default: 1.2.
  double zipf = 1.2;
  /// Synthetic: standard deviation of the planted interactions' logit part (--interaction_std).
  /// Default: SyntheticOptions's.
  double interaction_std = SyntheticOptions{}.interaction_std;
  /// Synthetic: standard deviation of the planted per-id biases' logit part (--bias_std).
  /// Default: SyntheticOptions's.
  double bias_std = SyntheticOptions{}.bias_std;
  /// Synthetic: width of the planted field vectors, 1..8 (--planted_dim). Default:
  /// SyntheticOptions's.
  uint32_t planted_dim = SyntheticOptions{}.planted_dim;
  /// Passes over the training data; 0: repeat it until max_steps, which must then be set
  /// (--epochs). Default: 1.
  uint32_t epochs = 1;
  /// Shuffle buffer in samples; 0: file order (--shuffle_buffer). Default: 0.
  uint32_t shuffle_buffer = 0;
  /// Files: every N-th line is a test line (--holdout_mod). Default: 10.
  uint32_t holdout_mod = 10;

  // ---- training (TrainerOptions)
  /// Samples per step per local rank; 0: chosen from the data (at most 1024, at least 32, an
  /// epoch of at least kMinStepsPerEpoch steps; a line says which) (--batch_size). Default: 0.
  uint32_t batch_size = 0;
  /// Stop after this many steps; 0: when the data ends (--max_steps). Default: 0.
  uint64_t max_steps = 0;
  /// Pull the next batch while this one computes (--prefetch). Default: true.
  bool prefetch = true;
  /// Threads per local rank that read, parse and index batches ahead of training; the batches
  /// are the same whatever their number (--data_threads). 0: DefaultDataThreads(local_ranks)
  /// (worker/feed.h: the cores divided among the local ranks, less one, 1 to 8); at most
  /// kMaxDataThreads. Default: 0.
  uint32_t data_threads = 0;
  /// Steps prepared ahead of the one computing, their pulls ahead by the rule of
  /// TrainerOptions::prefetch_depth (BSP: none; SSP: min(depth, staleness); async: depth)
  /// (--prefetch_depth). 1 .. kMaxPrefetchDepth (64). Default: 1.
  uint32_t prefetch_depth = 1;
  /// Steps pushed and not yet acknowledged and committed; a restarted worker redoes at most
  /// this many (TrainerOptions::max_pushes_in_flight) (--max_pushes_in_flight). 1 ..
  /// kMaxPrefetchDepth (64). Default: 2.
  uint32_t max_pushes_in_flight = 2;
  /// -1 asynchronous, 0 bulk-synchronous, > 0 bounded staleness in clocks (--consistency,
  /// --staleness). Default: -1.
  int32_t staleness = -1;
  /// Hot-row cache (worker/row_cache.h, docs/worker.md "Hot-row cache"): rows of the most
  /// frequently pulled keys held by this node per sparse table, for training only (validation
  /// and the test read the servers); 0: off. At most kMaxCacheRows; refused with
  /// bulk-synchronous consistency (an options error) (--cache_rows). Default: 0.
  uint64_t cache_rows = 0;
  /// The cache's staleness S in steps: a held value is used for at most S steps after its pull,
  /// a held row's gradients are pushed at most S steps late; 1..kMaxCacheStaleness
  /// (--cache_staleness). Default: 2.
  int32_t cache_staleness = 2;
  /// Job name: table prefix and position records (--job). Default: "ctr".
  std::string job = "ctr";
  /// Resume from this worker's stored position (--resume). Default: true.
  bool resume = true;
  /// Not resuming: this worker's clock starts here (TrainerOptions::start_clock; a search's
  /// trials follow each other on the same servers). Default: 0.
  int64_t start_clock = 0;
  /// Seconds between progress lines (--progress_interval_s). Default: 5.
  double progress_interval_s = 5;
  /// The learning-rate schedule (--lr_warmup_steps, --lr_decay, --lr_decay_steps,
  /// --lr_final_scale). A decay with decay_steps 0 lasts until the planned last step; where
  /// there is none after the warm-up, RunJob fails with *options_error set. Default: factor 1.
  LrSchedule lr_schedule;
  /// Where lr_schedule has no decay and epochs > 1: a cosine decay to lr_schedule.final_scale
  /// until the planned last step (--lr_decay=auto; false: --lr_decay=none). Default: true.
  bool lr_decay_by_epochs = true;

  // ---- the model (ModelConfig; the data gives the number of fields and dense features)
  /// Embedding width; 0: from the data, DefaultEmbeddingDim of a profile of the training part's
  /// start (worker/auto_config.h; a line says which) (--embedding_dim). Default: 0.
  uint32_t embedding_dim = 0;
  /// Bottom MLP hidden widths, comma-separated, may be empty; "auto": DefaultMlp of the
  /// embedding width (--bottom_mlp); read by ParseLayerWidths once the data is open (an error
  /// fails the job). Default: "auto".
  std::string bottom_mlp = kAutoMlp;
  /// Top MLP hidden widths, as bottom_mlp (--top_mlp). Default: "auto".
  std::string top_mlp = kAutoMlp;
  /// Embedding bag pooling (--pooling). Default: sum.
  Pooling pooling = Pooling::kSum;
  /// dlrm, deepfm or dcn (--model). Default: dlrm.
  ModelKind model = ModelKind::kDlrm;
  /// dcn: DCN-v2 cross layers before the top MLP (--cross_layers). Default: 3.
  uint32_t cross_layers = 3;
  /// Train the deep part (embeddings and MLPs) (--deep). Default: true.
  bool deep = true;
  /// Train the wide part (FTRL) (--wide). Default: true.
  bool wide = true;
  /// Embedding Adagrad learning rate (--emb_lr). Default: 0.05.
  double emb_lr = 0.05;
  /// MLP Adam learning rate (--dense_lr). Default: 0.003.
  double dense_lr = 0.003;
  /// Wide FTRL alpha (--wide_lr). Default: 0.05.
  double wide_lr = 0.05;
  /// L2 regularization of the embeddings, applied by the servers to the rows a push updates
  /// (--emb_l2). Default: 0.
  double emb_l2 = 0;
  /// L2 regularization of the MLP weights and biases, applied by the servers (--dense_l2).
  /// Default: 0.
  double dense_l2 = 0;
  /// Wide FTRL L2 strength (--wide_l2). Default: 0.1.
  double wide_l2 = 0.1;
  /// Embedding Adagrad initial accumulator (--emb_init_acc). Default: ModelConfig's.
  double emb_init_acc = ModelConfig::DefaultEmbeddingOptimizer().initial_accumulator;
  /// Embedding rows start uniform in [-s, s] (--emb_init_scale). Default: ModelConfig's.
  double emb_init_scale = ModelConfig{}.embedding_init_scale;

  // ---- validation and the test
  /// Validation rounds at all (--validate_every other than 0). Default: true.
  bool validate = true;
  /// With validate: a round after every this many steps; 0: after each epoch; and after the
  /// last step either way (--validate_every). Default: 0 (each epoch).
  uint64_t validate_every_steps = 0;
  /// Files: every N-th training sample is held out for validation (>= 2 with validate)
  /// (--validation_mod). Default: 10.
  uint32_t validation_mod = 10;
  /// Validation samples scored per round, at most (--validation_samples). Default: 20000.
  uint64_t validation_samples = 20000;
  /// The figure that picks the best round and stops early (--early_stopping_metric).
  /// Default: kBoth (the best round by AUC; no stop while either figure improves).
  EarlyStopping early_stopping = EarlyStopping::kBoth;
  /// Stop when the figure has not improved for this many rounds; 0: never
  /// (--early_stopping_patience). Default: 3.
  uint32_t early_stopping_patience = 3;
  /// After training and a barrier of all workers, worker 0 tests the model (--evaluate).
  /// Default: true.
  bool evaluate = true;
  /// Worker 0 writes metrics.csv (the training curve) and report.html here (--out_dir).
  /// Default: ".".
  std::string out_dir = ".";

  // ---- where the job reports
  /// Follows the job (metrics, readiness); may be null. Borrowed. Default: null.
  JobObserver* observer = nullptr;
  /// Where the job writes its lines (the reducer, progress, validation rounds, the training and
  /// test results), flushed after each. Errors that do not stop the job (a curve row or
  /// report.html not written) go to stderr. Borrowed. Default: stdout.
  std::FILE* out = stdout;
};

/// A client of the job's cluster as RunJob connects (servers or cluster map, timeouts, admin
/// root, CurveZMQ keys), with the job's worker id. Errors: a key file, the map source, Create's.
Result<std::unique_ptr<Client>> ConnectClient(const JobOptions& options);

/// The data options of a job (its DataSourceOptions as RunJob opens the data): everything but
/// `skipped_lines`, which the caller points at its own counter where it wants the count.
DataSourceOptions DataOptionsOf(const JobOptions& options);

/// The model of a job on data of `schema`, as RunJob builds it: widths, kind, the optimizers'
/// rates and L2, tables under `options.job`. InvalidArgument for bad --bottom_mlp/--top_mlp
/// and for a width left to the data (0, "auto": RunJob resolves those first).
Result<ModelConfig> ModelConfigOf(const JobOptions& options, const Schema& schema);

/// What a job did on this node.
struct JobReport {
  /// This node's training in this run (local rank 0's figures: the node's ranks together).
  TrainResult train;
  /// Whether this node tested the model (worker 0 with `evaluate`): the fields below are set.
  bool tested = false;
  /// Every worker's samples of this run (from their records "<job>/trained/<worker>").
  uint64_t job_samples = 0;
  /// Their summed training loss.
  double job_loss_sum = 0;
  /// The first worker's start and the last one's end of training, in Unix seconds (the
  /// workers' clocks: one machine, or synchronized).
  double job_start_s = 0;
  double job_end_s = 0;
  /// The test figures.
  EvalResult test;
  /// Worker 0: the best validation round, where there was one (also without `evaluate`).
  std::optional<ValidationPoint> best_validation;
  /// The step whose state the test scored: the best round's, restored, or the last step.
  uint64_t tested_step = 0;
  /// Whether the best validated state was restored for the test.
  bool restored = false;
  /// The restored state's validation AUC, scored again after the restore (NaN: not restored).
  double restored_validation_auc = std::numeric_limits<double>::quiet_NaN();
  /// Path of metrics.csv.
  std::string metrics_csv;
  /// Path of report.html; empty when it could not be written (stderr says why).
  std::string report_html;
  /// Malformed lines skipped (skip_bad_lines).
  uint64_t skipped_lines = 0;
  /// The hot-row cache's figures at the end of training (with cache_rows).
  std::optional<RowCacheStats> row_cache;
  /// The model as trained, defaults from the data resolved (embedding width, MLP widths).
  uint32_t embedding_dim = 0;
  std::string bottom_mlp, top_mlp;
  /// The learning-rate schedule as trained (a decay chosen by epochs included).
  LrSchedule lr_schedule;
  /// What report.html shows (set where it was written).
  ReportSummary summary;
  /// The names of the job's tables on the servers (all under the job's name).
  std::vector<std::string> tables;
};

/// Runs the job on this node: sets up its local ranks, connects, trains, validates, and on
/// worker 0 tests the model and writes metrics.csv and report.html. Returns what it did, or why
/// it stopped; a rank that fails stops the node's other ranks. `*options_error` (where not
/// null) says whether an error is the options' fault, found only once the data was counted
/// (tessera-worker exits 2 for it as for a bad command line), rather than the run's. Blocks
/// until the job ends; not for two jobs of one worker id at once.
Result<JobReport> RunJob(const JobOptions& options, bool* options_error = nullptr);

}  // namespace tessera::worker
