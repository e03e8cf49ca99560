// bench_feed: how fast the worker feeds its model, against how fast the model computes (issue
// 36). One worker, in this process, runs the real job (worker/job.h RunJob: data, keys, pulls,
// pushes, the trainer's threads) against fresh tessera-server child processes on 127.0.0.1
// (memory tier, started anew for every run); the cells are:
//
//   data_only     the training reader (worker/data_source.h OpenTrainData) through the
//                 trainer's BatchFeed (worker/feed.h: read or generated, keyed, indexed on the
//                 feed's --data_threads threads), drained by this thread;
//   feed_{1,2}s   the whole job with --backend=null (no model, zero gradients), 1 and 2 servers;
//   compute_only  the CPU backend's ForwardBackward over batches already read, indexed and
//                 given parameters (no data, no servers), with the job's --threads;
//   job_{1,2}s    the whole job with --backend=cpu, 1 and 2 servers;
//   cuda_compute_only, cuda_job_1s   the same with the CUDA backend, where a GPU is present.
//
// samples/s are one worker's own samples over its own time (per worker, not a cluster total):
// the job's TrainResult (Train() alone: no set-up, no table creation), the loops' wall time for
// data_only and compute_only. CPU per sample, in microseconds, over the same window (from the
// job's JobObserver::OnReady(true), right before Train(), to OnReady(false), right after it):
//   train_thread  the thread that runs the training loop (rank 0 runs on the caller's thread):
//                 CLOCK_THREAD_CPUTIME_ID;
//   other_threads this process's CPU (getrusage RUSAGE_SELF: every thread, ended ones included)
//                 minus train_thread: the client's I/O thread, the trainer's commit thread, and
//                 OpenMP's threads with --threads > 1;
//   servers       the server processes' utime + stime (/proc/<pid>/stat, clock ticks).
// The stages derived from them (1 server): data = data_only's process CPU; loop = feed_1s's
// train_thread (the data is prepared on the feed's threads: this is the loop's own work, keys,
// pull and push calls, waits); client_io = feed_1s's other_threads minus data (the client's
// I/O thread and the commit thread); server = feed_1s's servers; compute = compute_only's
// process CPU.
//
// Repetitions alternate the cells (rep-major: A B C, C B A, ...); figures are medians. The last
// line of output is one JSON object with every figure (docs/benchmarks.md, "bench_feed").
#include <gflags/gflags.h>
#include <signal.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "benchmarks/bench_cluster.h"
#include "benchmarks/bench_process.h"
#include "benchmarks/bench_stats.h"
#include "ps/status.h"
#include "worker/backend.h"
#include "worker/batch.h"
#include "worker/data_source.h"
#include "worker/feed.h"
#include "worker/job.h"
#include "worker/model.h"

namespace tw = tessera::worker;
using tessera::Result;
using tessera::Status;

DEFINE_bool(quick, false, "Short run (under a minute on 2 cores): fewer samples and repetitions");
DEFINE_int32(reps, 0, "Repetitions of every cell (0: 3 with --quick, else 5)");
DEFINE_uint64(train_samples, 0,
              "Samples each run trains or reads (0: 100000 with --quick, else 500000)");
DEFINE_uint32(batch_size, 1024, "Samples per step (the job's --batch_size; must be > 0)");
DEFINE_string(server_binary, "",
              "tessera-server executable (default: <build>/tessera-server, this program being "
              "<build>/benchmarks/bench_feed)");
DEFINE_uint32(lanes, 2, "Lanes (executor threads) per tessera-server");
DEFINE_bool(cuda, true, "Run the CUDA cells where a GPU is present");

// ---------------------------------------------------------------- the job's own knobs
// Each JOB_KNOB is a flag of this program with the job's default (JobOptions{}) and the same
// name as the JobOptions field (and tessera-worker flag) it sets: adding a knob is one line.
namespace {
struct JobKnob {
  const char* name;
  void (*apply)(tw::JobOptions*);
};
std::vector<JobKnob>& JobKnobs() {
  static std::vector<JobKnob> knobs;
  return knobs;
}
bool AddJobKnob(const char* name, void (*apply)(tw::JobOptions*)) {
  JobKnobs().push_back({name, apply});
  return true;
}
}  // namespace
#define JOB_KNOB(type, name, help)                  \
  DEFINE_##type(name, tw::JobOptions{}.name, help); \
  [[maybe_unused]] static const bool name##_knob =  \
      AddJobKnob(#name, [](tw::JobOptions* o) { o->name = FLAGS_##name; })

JOB_KNOB(int32, threads, "CPU backend threads (the job's --threads; compute_only uses it too)");
JOB_KNOB(bool, prefetch, "The job's --prefetch (pull the next batch while this one computes)");
JOB_KNOB(uint32, data_threads, "The job's --data_threads (0: DefaultDataThreads); data_only too");
JOB_KNOB(uint64, synthetic_max_cardinality, "The job's --synthetic_max_cardinality");
JOB_KNOB(uint32, embedding_dim, "The job's --embedding_dim");
JOB_KNOB(string, bottom_mlp, "The job's --bottom_mlp");
JOB_KNOB(string, top_mlp, "The job's --top_mlp");

namespace {

using tessera::bench::Median;
using tessera::bench::ProcessCpuSeconds;
using tessera::bench::SelfCpuSeconds;
using WallClock = std::chrono::steady_clock;

double ThreadCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

pid_t ThisThreadId() { return static_cast<pid_t>(syscall(SYS_gettid)); }

// ---------------------------------------------------------------- what a cell measured

// CPU seconds at one instant: the calling (training) thread, this process, the servers.
struct CpuPoint {
  double thread = 0, process = 0, servers = 0;
  pid_t tid = 0;
};

CpuPoint CpuNow(const std::vector<pid_t>& servers) {
  CpuPoint p;
  p.thread = ThreadCpuSeconds();
  p.process = SelfCpuSeconds();
  for (pid_t pid : servers) p.servers += ProcessCpuSeconds(pid);
  p.tid = ThisThreadId();
  return p;
}

// One run of one cell.
struct Run {
  uint64_t samples = 0;
  double samples_per_s = 0;
  // CPU microseconds per sample (see the header): the training thread, this process's other
  // threads, the server processes.
  double train_thread_us = 0, other_threads_us = 0, servers_us = 0;
  // data_only: the part of train_thread_us spent in IndexBatch.
  double index_us = 0;
};

Run FromCpu(uint64_t samples, double samples_per_s, const CpuPoint& a, const CpuPoint& b) {
  Run r;
  r.samples = samples;
  r.samples_per_s = samples_per_s;
  const double per = samples > 0 ? 1e6 / static_cast<double>(samples) : 0;
  r.train_thread_us = (b.thread - a.thread) * per;
  r.other_threads_us = std::max(0.0, (b.process - a.process) - (b.thread - a.thread)) * per;
  r.servers_us = (b.servers - a.servers) * per;
  return r;
}

// ---------------------------------------------------------------- the job's data and model

// The job of this benchmark: one worker, generated Criteo-shaped data, the default model (and
// the knobs), no validation and no test.
tw::JobOptions JobOf(const std::string& backend, uint64_t samples) {
  tw::JobOptions o;
  for (const JobKnob& k : JobKnobs()) k.apply(&o);
  o.backend = backend;
  o.data = "synthetic";
  o.train_samples = samples;
  o.batch_size = FLAGS_batch_size;
  o.validate = false;
  o.evaluate = false;
  o.job = "feed";
  // The model this benchmark measured before widths came from the data.
  o.embedding_dim = 8;
  o.bottom_mlp = "64";
  o.top_mlp = "64";
  return o;
}

// ---------------------------------------------------------------- the cells

// The data pipeline alone: the trainer's BatchFeed (worker/feed.h) on the training reader, with
// the job's --data_threads (0: DefaultDataThreads), drained on this thread until the data ends:
// read or generated, keyed and indexed on the feed's threads. index_us is IndexBatch's CPU per
// sample, measured apart on this thread over the same batches after the timed window.
Result<Run> DataOnly(uint64_t samples) {
  const tw::JobOptions o = JobOf("null", samples);
  TESSERA_ASSIGN_OR_RETURN(auto reader, tw::OpenTrainData(tw::DataOptionsOf(o)));
  tw::FeedOptions fo;
  fo.batch_size = o.batch_size;
  fo.threads = o.data_threads != 0 ? o.data_threads : tw::DefaultDataThreads(1);
  tw::ReadyBatch ready;
  std::vector<tw::Batch> kept;  // a few batches for the IndexBatch figure
  uint64_t n = 0;
  const CpuPoint a = CpuNow({});
  const auto start = WallClock::now();
  {
    TESSERA_ASSIGN_OR_RETURN(auto feed, tw::BatchFeed::Start(reader.get(), fo));
    while (true) {
      TESSERA_ASSIGN_OR_RETURN(bool more, feed->Next(&ready));
      if (!more) break;
      n += ready.batch.size;
      if (kept.size() < 16) kept.push_back(ready.batch);
    }
  }  // the feed's threads have ended: their CPU is in the process figure
  const double s = std::chrono::duration<double>(WallClock::now() - start).count();
  const CpuPoint b = CpuNow({});
  Run r = FromCpu(n, s > 0 ? static_cast<double>(n) / s : 0, a, b);
  tw::IndexedBatch index;
  uint64_t indexed = 0;
  const double t = ThreadCpuSeconds();
  for (const tw::Batch& batch : kept) {
    tw::IndexBatch(batch, &index);
    indexed += batch.size;
  }
  r.index_us = indexed > 0 ? 1e6 * (ThreadCpuSeconds() - t) / static_cast<double>(indexed) : 0;
  if (n != samples) {
    return Status::Internal("data_only read " + std::to_string(n) + " samples, not " +
                            std::to_string(samples));
  }
  return r;
}

// A batch ready for the backend: read, indexed, with its parameter rows.
struct ReadyBatch {
  tw::Batch batch;
  tw::IndexedBatch index;
  std::vector<float> emb, wide;
};

// The most batches compute_only holds (cycled when the run has more): 64 x 1024 samples.
constexpr size_t kMaxReadyBatches = 64;

// The backend alone: ForwardBackward over batches read and indexed before the clock starts
// (those of the job's data, cycled beyond kMaxReadyBatches), with embeddings uniform in
// [-embedding_init_scale, embedding_init_scale] (the servers' initial range), wide weights 0
// (FTRL's start) and dense parameters uniform in [-0.05, 0.05]. One untimed step first.
Result<Run> ComputeOnly(const std::string& backend_name, uint64_t samples) {
  const tw::JobOptions o = JobOf(backend_name, samples);
  TESSERA_ASSIGN_OR_RETURN(auto reader, tw::OpenTrainData(tw::DataOptionsOf(o)));
  TESSERA_ASSIGN_OR_RETURN(const tw::ModelConfig config, tw::ModelConfigOf(o, reader->schema()));
  TESSERA_ASSIGN_OR_RETURN(tw::ModelLayout layout, tw::ModelLayout::Create(config));
  const tw::ModelConfig& c = layout.config();
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> emb_init(-c.embedding_init_scale, c.embedding_init_scale);
  std::uniform_real_distribution<float> param_init(-0.05f, 0.05f);
  std::vector<std::unique_ptr<ReadyBatch>> ready;
  while (ready.size() < kMaxReadyBatches) {
    auto b = std::make_unique<ReadyBatch>();
    b->batch.Clear(reader->schema());
    TESSERA_ASSIGN_OR_RETURN(uint32_t got, reader->Read(o.batch_size, &b->batch));
    if (got == 0) break;
    tw::IndexBatch(b->batch, &b->index);
    const size_t rows = b->index.unique_keys.size();
    b->emb.resize(c.deep ? rows * c.embedding_dim : 0);
    for (float& x : b->emb) x = emb_init(rng);
    b->wide.assign(c.wide ? rows : 0, 0.0f);
    ready.push_back(std::move(b));
  }
  if (ready.empty()) return Status::InvalidArgument("no training data");
  std::vector<float> params(layout.num_params());
  for (float& x : params) x = param_init(rng);
  std::unique_ptr<tw::Backend> backend;
  if (backend_name == "cuda") {
    TESSERA_ASSIGN_OR_RETURN(backend, tw::CreateCudaBackend(layout, 0));
  } else {
    TESSERA_ASSIGN_OR_RETURN(backend, tw::CreateCpuBackend(layout, {o.threads}));
  }
  std::vector<float> probs;
  tw::ModelGrads grads;
  auto step = [&](const ReadyBatch& b) {
    tw::ModelInput in;
    in.batch_size = b.batch.size;
    in.dense = b.batch.dense.data();
    in.labels = b.batch.labels.data();
    in.offsets = b.batch.offsets.data();
    in.rows = b.index.rows.data();
    in.weights = b.batch.weights.empty() ? nullptr : b.batch.weights.data();
    in.num_rows = static_cast<uint32_t>(b.index.unique_keys.size());
    in.embeddings = b.emb.data();
    in.wide = b.wide.data();
    in.params = params.data();
    probs.resize(b.batch.size);
    return backend->ForwardBackward(in, 1.0f, probs.data(), &grads);  // the job's scale
  };
  TESSERA_RETURN_IF_ERROR(step(*ready[0]));  // warm-up, untimed
  uint64_t n = 0;
  const CpuPoint a = CpuNow({});
  const auto start = WallClock::now();
  for (size_t i = 0; n < samples; ++i) {
    const ReadyBatch& b = *ready[i % ready.size()];
    TESSERA_RETURN_IF_ERROR(step(b));
    n += b.batch.size;
  }
  const double s = std::chrono::duration<double>(WallClock::now() - start).count();
  return FromCpu(n, s > 0 ? static_cast<double>(n) / s : 0, a, CpuNow({}));
}

// Takes the CPU figures at the edges of training: RunJob calls OnReady(true) on local rank 0's
// thread right before Train() and OnReady(false) after every rank's Train() returned.
class TrainWindow : public tw::JobObserver {
 public:
  explicit TrainWindow(std::vector<pid_t> servers) : servers_(std::move(servers)) {}
  void OnReady(bool ready, std::string_view) override {
    (ready ? start_ : end_) = CpuNow(servers_);
    (ready ? started_ : ended_) = true;
  }
  // Both edges, on one thread (the training thread), or why not.
  Status Check(pid_t caller) const {
    if (!started_ || !ended_) return Status::Internal("the job never reported ready and done");
    if (start_.tid != caller || end_.tid != caller) {
      return Status::Internal(
          "the job's readiness came from another thread than the caller's; "
          "the training thread's CPU cannot be taken");
    }
    return Status::OK();
  }
  const CpuPoint& start() const { return start_; }
  const CpuPoint& end() const { return end_; }

 private:
  std::vector<pid_t> servers_;
  CpuPoint start_, end_;
  bool started_ = false, ended_ = false;
};

// The last `lines` lines of the file at `path`.
std::string Tail(const std::string& path, size_t lines) {
  std::ifstream in(path);
  std::vector<std::string> all;
  for (std::string l; std::getline(in, l);) all.push_back(l);
  std::string out;
  for (size_t i = all.size() > lines ? all.size() - lines : 0; i < all.size(); ++i) {
    out += all[i] + "\n";
  }
  return out;
}

// The whole job on `servers` fresh tessera-server processes (memory tier) with `backend`.
Result<Run> JobRun(const std::string& backend, uint32_t servers, uint64_t samples,
                   const std::string& server_binary) {
  tessera::bench::TempDir dir("bench_feed_job_");  // before the cluster: removed after it stops
  tessera::bench::BenchCluster cluster;
  TESSERA_RETURN_IF_ERROR(cluster.Start(servers, "process", server_binary, FLAGS_lanes));
  std::vector<pid_t> pids;
  for (uint32_t s = 0; s < servers; ++s) pids.push_back(cluster.pid(s));
  tw::JobOptions o = JobOf(backend, samples);
  o.servers = cluster.endpoints();
  o.out_dir = dir.path();
  const std::string log_path = dir.path() + "/job.log";
  std::FILE* log = std::fopen(log_path.c_str(), "w");
  if (log == nullptr) return Status::IOError("cannot write " + log_path);
  o.out = log;
  TrainWindow window(pids);
  o.observer = &window;
  const pid_t caller = ThisThreadId();
  auto report = tw::RunJob(o);
  std::fclose(log);
  const std::string cell = backend + " job, " + std::to_string(servers) + " server(s)";
  if (!report.ok()) {
    return report.status().WithContext(cell + "; its output ends:\n" + Tail(log_path, 10));
  }
  TESSERA_RETURN_IF_ERROR(window.Check(caller).WithContext(cell));
  const tw::TrainResult& t = report->train;
  if (t.samples != samples) {
    return Status::Internal(cell + " trained " + std::to_string(t.samples) + " samples, not " +
                            std::to_string(samples));
  }
  if (backend == "null" && std::abs(t.train_loss - std::log(2.0)) > 1e-3) {
    return Status::Internal(cell + ": train loss " + std::to_string(t.train_loss) +
                            ", not log 2: the null backend did not run");
  }
  return FromCpu(t.samples, t.samples_per_s, window.start(), window.end());
}

// ---------------------------------------------------------------- cells, repetitions, output

struct Cell {
  Cell(std::string n, std::function<Result<Run>()> r) : name(std::move(n)), run(std::move(r)) {}
  std::string name;
  std::function<Result<Run>()> run;
  std::vector<Run> runs;
  double Med(double Run::*f) const { return tessera::bench::MedianOver(runs, f); }
};

std::string JsonNum(double x) {
  if (!std::isfinite(x)) return "null";
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.6g", x);
  return buf;
}

std::string JsonEscape(std::string s) {
  std::replace(s.begin(), s.end(), '"', '\'');
  std::replace(s.begin(), s.end(), '\n', ' ');
  return s;
}

// The figures derived from the cells' medians (see the header).
struct Summary {
  std::map<std::string, const Cell*> by;  // the cells by name
  // CPU microseconds per sample of each stage, 1 server, and the largest of the feed's.
  std::vector<std::pair<std::string, double>> stages;
  std::string largest;
  // Wall-time ratios (samples/s over compute_only's) and CPU-time ones (compute_only's CPU per
  // sample over the worker process's in the job: less sensitive than wall time to other work
  // on the machine, blind to waits and to overlap).
  double feed_vs = NAN, feed_2s_vs = NAN, job_vs = NAN, job_2s_vs = NAN, data_vs = NAN;
  double feed_vs_cpu = NAN, job_vs_cpu = NAN;
  double Sps(const std::string& n) const {
    return by.count(n) ? by.at(n)->Med(&Run::samples_per_s) : NAN;
  }
  double Us(const std::string& n, double Run::*f) const {
    return by.count(n) ? by.at(n)->Med(f) : NAN;
  }
  double WorkerUs(const std::string& n) const {
    return Us(n, &Run::train_thread_us) + Us(n, &Run::other_threads_us);
  }
};

Summary Summarize(const std::vector<Cell>& cells) {
  Summary m;
  for (const Cell& c : cells) m.by[c.name] = &c;
  const double data = m.WorkerUs("data_only"), compute = m.WorkerUs("compute_only");
  // The data pipeline runs on the feed's threads (other_threads), not the training thread.
  m.stages = {{"data", data},
              {"loop", m.Us("feed_1s", &Run::train_thread_us)},
              {"client_io", m.Us("feed_1s", &Run::other_threads_us) - data},
              {"server", m.Us("feed_1s", &Run::servers_us)},
              {"compute", compute}};
  double most = -1;
  for (size_t i = 0; i + 1 < m.stages.size(); ++i) {  // the feed's stages: all but compute
    if (m.stages[i].second > most) most = m.stages[i].second, m.largest = m.stages[i].first;
  }
  const double c = m.Sps("compute_only");
  m.feed_vs = m.Sps("feed_1s") / c;
  m.feed_2s_vs = m.Sps("feed_2s") / c;
  m.job_vs = m.Sps("job_1s") / c;
  m.job_2s_vs = m.Sps("job_2s") / c;
  m.data_vs = m.Sps("data_only") / c;
  m.feed_vs_cpu = compute / m.WorkerUs("feed_1s");
  m.job_vs_cpu = compute / m.WorkerUs("job_1s");
  return m;
}

void PrintSummary(const std::vector<Cell>& cells, const Summary& m) {
  std::printf("\n%-18s %10s %10s %10s %13s %13s %11s\n", "cell", "samples/s", "min", "max",
              "train_thr us", "other_thr us", "servers us");
  for (const Cell& c : cells) {
    std::vector<double> v;
    for (const Run& r : c.runs) v.push_back(r.samples_per_s);
    std::printf("%-18s %10.0f %10.0f %10.0f %13.2f %13.2f %11.2f\n", c.name.c_str(),
                c.Med(&Run::samples_per_s), *std::min_element(v.begin(), v.end()),
                *std::max_element(v.begin(), v.end()), c.Med(&Run::train_thread_us),
                c.Med(&Run::other_threads_us), c.Med(&Run::servers_us));
  }
  std::printf("\nCPU us per sample, 1 server:");
  for (const auto& [n, v] : m.stages) std::printf(" %s %.2f", n.c_str(), v);
  std::printf(" (data: IndexBatch %.2f, the reader the rest)", m.Us("data_only", &Run::index_us));
  std::printf("\nthe feed's largest stage: %s\n", m.largest.c_str());
  std::printf(
      "feed_vs_compute_only %.3f (2 servers %.3f), job_vs_compute_only %.3f (2 servers %.3f), "
      "data_vs_compute_only %.3f; issue 36 wants >= 5 and >= 0.8\n",
      m.feed_vs, m.feed_2s_vs, m.job_vs, m.job_2s_vs, m.data_vs);
  std::printf(
      "in worker CPU per sample: feed_vs_compute_only_cpu %.3f, job_vs_compute_only_cpu %.3f\n",
      m.feed_vs_cpu, m.job_vs_cpu);
}

// The last line: every figure.
std::string Json(const std::vector<Cell>& cells, const Summary& m, uint64_t samples, int reps,
                 const std::string& no_cuda, double total_s, double load_start, double load_end) {
  std::string j = "{\"bench\":\"feed\",\"quick\":" + std::string(FLAGS_quick ? "true" : "false");
  j += ",\"samples_per_run\":" + std::to_string(samples) + ",\"reps\":" + std::to_string(reps) +
       ",\"batch_size\":" + std::to_string(FLAGS_batch_size) +
       ",\"lanes\":" + std::to_string(FLAGS_lanes) +
       ",\"cores\":" + std::to_string(std::thread::hardware_concurrency());
  j += ",\"job_knobs\":{";
  for (size_t i = 0; i < JobKnobs().size(); ++i) {
    std::string v;
    gflags::GetCommandLineOption(JobKnobs()[i].name, &v);
    j += (i ? ",\"" : "\"") + std::string(JobKnobs()[i].name) + "\":\"" + JsonEscape(v) + "\"";
  }
  j += "}";
  auto key = [&](const std::string& k, double v) { j += ",\"" + k + "\":" + JsonNum(v); };
  key("data_only_samples_per_s", m.Sps("data_only"));
  key("feed_samples_per_s", m.Sps("feed_1s"));
  key("feed_2s_samples_per_s", m.Sps("feed_2s"));
  key("compute_only_samples_per_s", m.Sps("compute_only"));
  key("job_samples_per_s", m.Sps("job_1s"));
  key("job_2s_samples_per_s", m.Sps("job_2s"));
  key("feed_vs_compute_only", m.feed_vs);
  key("job_vs_compute_only", m.job_vs);
  key("feed_2s_vs_compute_only", m.feed_2s_vs);
  key("job_2s_vs_compute_only", m.job_2s_vs);
  key("data_vs_compute_only", m.data_vs);
  key("feed_vs_compute_only_cpu", m.feed_vs_cpu);
  key("job_vs_compute_only_cpu", m.job_vs_cpu);
  for (const auto& [n, v] : m.stages) key("cpu_us_per_sample_" + n, v);
  key("cpu_us_per_sample_data_index", m.Us("data_only", &Run::index_us));
  j += ",\"largest_feed_stage\":\"" + m.largest + "\"";
  for (const Cell& c : cells) {
    if (c.name == "data_only" || c.name.find("compute_only") != std::string::npos) continue;
    key(c.name + "_train_thread_us", c.Med(&Run::train_thread_us));
    key(c.name + "_other_threads_us", c.Med(&Run::other_threads_us));
    key(c.name + "_servers_us", c.Med(&Run::servers_us));
  }
  if (m.by.count("cuda_compute_only")) {
    key("cuda_compute_only_samples_per_s", m.Sps("cuda_compute_only"));
    key("cuda_job_samples_per_s", m.Sps("cuda_job_1s"));
    key("cuda_job_vs_compute_only", m.Sps("cuda_job_1s") / m.Sps("cuda_compute_only"));
  } else {
    j += ",\"cuda_skipped\":\"" + JsonEscape(no_cuda) + "\"";
  }
  key("total_s", total_s);
  key("loadavg_start", load_start);
  key("loadavg_end", load_end);
  return j + "}";
}

// The tessera-server to start: --server_binary, else the build's; exits 1 when none exists
// (this benchmark measures real server processes only).
std::string ServerBinary(const char* argv0) {
  std::string p = FLAGS_server_binary.empty() ? tessera::bench::DefaultServerBinary(argv0)
                                              : FLAGS_server_binary;
  std::error_code ec;
  if (!std::filesystem::exists(p, ec)) {
    std::fprintf(stderr, "bench_feed: no tessera-server at %s (build it, or --server_binary)\n",
                 p.c_str());
    std::exit(1);
  }
  return p;
}

}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage(
      "The worker's feed (data, keys, pulls, pushes) against its model's compute: samples/s and "
      "CPU per sample of each stage (docs/benchmarks.md, bench_feed)");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  tessera::bench::CleanUpOnStopSignals();
  signal(SIGPIPE, SIG_IGN);
  if (FLAGS_batch_size == 0) {
    std::fprintf(stderr, "bench_feed: --batch_size must be > 0\n");
    return 2;
  }
  const uint64_t samples =
      FLAGS_train_samples ? FLAGS_train_samples : (FLAGS_quick ? 100000 : 500000);
  const int reps = FLAGS_reps > 0 ? FLAGS_reps : (FLAGS_quick ? 3 : 5);
  const std::string server_binary = ServerBinary(argv[0]);

  std::vector<Cell> cells = {
      {"data_only", [&] { return DataOnly(samples); }},
      {"feed_1s", [&] { return JobRun("null", 1, samples, server_binary); }},
      {"feed_2s", [&] { return JobRun("null", 2, samples, server_binary); }},
      {"compute_only", [&] { return ComputeOnly("cpu", samples); }},
      {"job_1s", [&] { return JobRun("cpu", 1, samples, server_binary); }},
      {"job_2s", [&] { return JobRun("cpu", 2, samples, server_binary); }},
  };
  std::string no_cuda;
  if (!FLAGS_cuda) {
    no_cuda = "--cuda=false";
  } else if (auto gpus = tw::CudaDeviceCount(); !gpus.ok()) {
    no_cuda = gpus.status().message();
  } else {
    cells.push_back({"cuda_compute_only", [&] { return ComputeOnly("cuda", samples); }});
    cells.push_back({"cuda_job_1s", [&] { return JobRun("cuda", 1, samples, server_binary); }});
  }
  const tw::JobOptions shown = JobOf("cpu", samples);
  std::printf(
      "bench_feed: 1 worker in this process (RunJob), tessera-server processes %s (memory tier, "
      "fresh per run, %u lanes); generated Criteo-shaped data, %llu samples per run, batch %u; "
      "model %s emb %u bottom [%s] top [%s]%s; %d CPU thread(s); %d reps alternating; %u cores\n",
      server_binary.c_str(), FLAGS_lanes, static_cast<unsigned long long>(samples),
      FLAGS_batch_size, std::string(tw::ModelKindName(shown.model)).c_str(), shown.embedding_dim,
      shown.bottom_mlp.c_str(), shown.top_mlp.c_str(), shown.wide ? " + wide" : "", shown.threads,
      reps, std::thread::hardware_concurrency());
  if (!no_cuda.empty()) std::printf("cuda cells skipped: %s\n", no_cuda.c_str());
  std::fflush(stdout);

  const double load_start = tessera::bench::LoadAverage();
  const auto t0 = WallClock::now();
  const bool complete = tessera::bench::ForEachAlternating(cells.size(), reps, [&](size_t c, int) {
    auto r = cells[c].run();
    if (!r.ok()) {
      std::fprintf(stderr, "bench_feed: %s: %s\n", cells[c].name.c_str(),
                   r.status().ToString().c_str());
      return false;
    }
    cells[c].runs.push_back(*r);
    return true;
  });
  if (!complete) return 1;
  const double total_s = std::chrono::duration<double>(WallClock::now() - t0).count();
  const double load_end = tessera::bench::LoadAverage();

  const Summary sum = Summarize(cells);
  PrintSummary(cells, sum);
  std::printf("total %.1f s; 1-minute load average %.2f at the start, %.2f at the end\n", total_s,
              load_start, load_end);
  std::printf("%s\n",
              Json(cells, sum, samples, reps, no_cuda, total_s, load_start, load_end).c_str());
  return 0;
}
