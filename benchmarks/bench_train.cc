// bench_train: samples/s of the CTR training loop (DLRM + wide part on generated Criteo-shaped
// data, worker/trainer.h) with its parameters on Tessera servers, against the same model and
// data trained in this process with the parameters in local memory (CreateLocalStore: the
// servers' optimizers and initializers, no network), in the same run, with and without
// prefetch (the next batch's pull in flight while the current batch computes).
//
// Configurations: in-process with 1 and 2 trainers (threads sharing one local store), Tessera
// with 1 server + 1 worker and 2 servers + 2 workers. Workers are threads of this program, each
// with its own Client, data shard and backend, as tessera-worker runs them. Servers are
// tessera-server child processes (found next to the build's root, --server_binary overrides)
// or, with --server_mode=thread or when no binary is found, tessera::Server objects in this
// process; the first output line says which. Every run gets fresh servers (memory tier) or a
// fresh local store, so each trains the same samples from the same initial parameters.
//
// A PyTorch cell (issue 13): benchmarks/pytorch_dlrm.py, the same model, optimizers, data,
// batch and threads in plain PyTorch, run by a Python interpreter (--python; CMake's choice by
// default: /usr/bin/python3 first) as one more configuration of the same alternation. Skipped,
// with a message naming scripts/install_bench_deps.sh, when the interpreter or torch is missing.
//
// Training samples are generated before the timed phase (--pregenerate, on by default) and read
// from memory, as the PyTorch cell has its samples ready before it starts its clock: samples/s
// counts the training loop alone on both sides. (Before issue 13 the generator ran inside the
// timed loop: --pregenerate=false.)
//
// After each run the trained model is scored on the test stream (--test_samples; not timed),
// so every configuration reports a test AUC (median over repetitions).
//
// Repetitions alternate the configurations (rep-major order) so that drift on a shared machine
// hits them all; reported figures are medians. The last line of output is one JSON object with
// ps_vs_inprocess_{prefetch,no_prefetch} (1 server + 1 worker vs 1 in-process trainer) and
// ps2x2_vs_inprocess2_{prefetch,no_prefetch} (2 + 2 vs 2 in-process trainers),
// tessera_1s1w_vs_pytorch and tessera_inprocess_vs_pytorch (prefetch on vs the PyTorch cell;
// only when it ran), plus the raw samples/s and test AUC of every configuration.
#include <fcntl.h>
#include <gflags/gflags.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <barrier>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "benchmarks/bench_cluster.h"
#include "benchmarks/bench_process.h"
#include "benchmarks/bench_stats.h"
#include "ps/client/client.h"
#include "ps/status.h"
#include "worker/backend.h"
#include "worker/data_reader.h"
#include "worker/data_source.h"
#include "worker/model.h"
#include "worker/param_store.h"
#include "worker/trainer.h"

DEFINE_bool(quick, false, "Short run (under a minute): fewer samples and repetitions");
DEFINE_uint64(train_samples, 0,
              "Samples trained per run, all workers together (0: 48000 with --quick, else "
              "300000)");
DEFINE_int32(reps, 0, "Repetitions of every configuration (0: 3 with --quick, else 5)");
DEFINE_uint32(batch_size, 1024, "Samples per step per worker");
DEFINE_int32(threads, 1, "CPU backend threads per worker");
DEFINE_uint32(embedding_dim, 16, "Embedding width");
DEFINE_string(bottom_mlp, "64", "Bottom MLP hidden widths, comma-separated");
DEFINE_string(top_mlp, "64", "Top MLP hidden widths, comma-separated");
DEFINE_bool(wide, true, "Train the wide part (FTRL) too");
DEFINE_uint64(synthetic_max_cardinality, 20000, "Cap of the Criteo cardinalities");
DEFINE_string(server_mode, "process",
              "process: tessera-server child processes; thread: servers in this process");
DEFINE_string(server_binary, "",
              "tessera-server executable (default: <build>/tessera-server, this program being "
              "<build>/examples/ctr/bench_train)");
DEFINE_uint32(lanes, 2, "Lanes (executor threads) per Tessera server");
DEFINE_uint64(test_samples, 0,
              "Test samples every trained model is scored on (0: 20000 with --quick, else "
              "100000)");
DEFINE_bool(pregenerate, true,
            "Generate every worker's training samples before the timed phase (held in memory), "
            "as the PyTorch cell does; false: the reader generates them while training is timed");
DEFINE_bool(pytorch, true,
            "Run the PyTorch baseline cell (benchmarks/pytorch_dlrm.py) next to the Tessera ones");
DEFINE_string(python, "",
              "Python interpreter of the PyTorch cell (default: the one CMake chose, "
              "/usr/bin/python3 first)");
DEFINE_string(pytorch_script, "",
              "The PyTorch baseline script (default: benchmarks/pytorch_dlrm.py of the source "
              "tree this program was built from)");

#ifndef TESSERA_SOURCE_DIR
#define TESSERA_SOURCE_DIR "."
#endif
#ifndef TESSERA_BENCH_PYTHON
#define TESSERA_BENCH_PYTHON "/usr/bin/python3"
#endif

namespace tw = tessera::worker;
using tessera::Result;
using tessera::Status;

namespace {

using BenchClock = std::chrono::steady_clock;
using tessera::bench::JsonNumberField;
using tessera::bench::JsonStringField;
using tessera::bench::LastJsonLine;
using tessera::bench::LoadAverage;
using tessera::bench::Median;
using tessera::bench::ProcessCpuSeconds;
using tessera::bench::RunCapture;
using tessera::bench::SelfCpuSeconds;

// ------------------------------------------------------------------ training runs

struct Config {
  std::string name;
  bool tessera;      // parameters on servers (else in local memory, or PyTorch's)
  uint32_t workers;  // trainers (threads), each with its own data shard
  bool prefetch;
  bool pytorch = false;  // the PyTorch baseline (benchmarks/pytorch_dlrm.py), 1 process
};

struct RunResult {
  uint64_t samples = 0;
  double seconds = 0;
  double samples_per_s = 0;
  double train_loss = 0;
  double test_auc = std::nan("");
  double oracle_auc = std::nan("");
  // CPU seconds every process of the cell spent while training (this program's threads and
  // its server processes, or the PyTorch process), per trained sample, in microseconds: a
  // figure that other load on the machine changes much less than wall time.
  double cpu_us_per_sample = std::nan("");
  std::string blas;  // PyTorch cell: the BLAS its process loaded
};

// What a worker of RunOnce did.
struct PerWorker {
  Status status;
  tw::TrainResult result;
  BenchClock::time_point start, end;
};

// A worker's data reader, backend and trainer.
struct WorkerParts {
  std::unique_ptr<tw::DataReader> reader;
  std::unique_ptr<tw::Backend> backend;
  std::unique_ptr<tw::Trainer> trainer;
};

// Opens worker `w`'s data shard (`samples` samples over the workers of `cfg`), backend and
// trainer on `store` into `parts`, and runs the trainer's Init.
Status SetUpWorker(const Config& cfg, const tw::ModelLayout& layout,
                   const tw::DataSourceOptions& data, uint64_t samples, uint32_t w,
                   tw::ParamStore* store, WorkerParts& parts) {
  tw::DataSourceOptions mine = data;
  mine.rank = w;
  mine.world = cfg.workers;
  mine.train_samples = samples;
  TESSERA_ASSIGN_OR_RETURN(parts.reader, tw::OpenTrainData(mine));
  if (FLAGS_pregenerate) {
    // The shard's samples generated now, not while timed (the PyTorch cell does the same).
    tw::Batch all;
    all.Clear(parts.reader->schema());
    TESSERA_RETURN_IF_ERROR(tw::ReadAll(parts.reader.get(), &all));
    parts.reader = tw::InMemoryReader(std::move(all));
  }
  TESSERA_ASSIGN_OR_RETURN(parts.backend, tw::CreateCpuBackend(layout, {FLAGS_threads}));
  tw::TrainerOptions o;
  o.batch_size = FLAGS_batch_size;
  o.prefetch = cfg.prefetch;
  o.staleness = -1;
  o.worker_id = w;
  o.job = "bench";
  o.resume = false;
  o.progress_interval_s = 0;
  TESSERA_ASSIGN_OR_RETURN(parts.trainer, tw::Trainer::Create(o, layout, store, parts.backend.get(),
                                                              parts.reader.get()));
  return parts.trainer->Init();
}

// The workers' results `per` summed up (`cpu_s`: the CPU seconds of the cell while training);
// the first worker's error.
Result<RunResult> Aggregate(const Config& cfg, const std::vector<PerWorker>& per, double cpu_s) {
  RunResult r;
  BenchClock::time_point start = BenchClock::time_point::max(), end{};
  double loss = 0;
  for (const PerWorker& p : per) {
    if (!p.status.ok()) return p.status.WithContext(cfg.name);
    r.samples += p.result.samples;
    loss += p.result.train_loss * static_cast<double>(p.result.samples);
    start = std::min(start, p.start);
    end = std::max(end, p.end);
  }
  r.seconds = std::chrono::duration<double>(end - start).count();
  r.samples_per_s = r.seconds > 0 ? static_cast<double>(r.samples) / r.seconds : 0;
  r.train_loss = r.samples > 0 ? loss / static_cast<double>(r.samples) : 0;
  if (r.samples > 0) {
    r.cpu_us_per_sample = 1e6 * cpu_s / static_cast<double>(r.samples);
  }
  return r;
}

// Trains `samples` samples with `workers` trainers and returns the aggregate throughput, timed
// from the first trainer's start of Train() to the last one's end (Init, table creation and
// server start are not timed).
// After training (not timed), worker 0's view of the parameters is scored on the test stream.
Result<RunResult> RunOnce(const Config& cfg, const tw::ModelLayout& layout,
                          const tw::DataSourceOptions& data, uint64_t samples,
                          const std::string& server_binary) {
  tessera::bench::BenchCluster cluster;
  std::vector<std::unique_ptr<tessera::Client>> clients;
  std::vector<std::unique_ptr<tw::ParamStore>> stores;
  std::unique_ptr<tw::ParamStore> local;
  if (cfg.tessera) {
    TESSERA_RETURN_IF_ERROR(cluster.Start(cfg.workers, server_binary.empty() ? "thread" : "process",
                                          server_binary, FLAGS_lanes));
  } else {
    local = tw::CreateLocalStore();
  }
  for (uint32_t w = 0; w < cfg.workers && cfg.tessera; ++w) {
    tessera::ClientOptions co;
    co.servers = cluster.endpoints();
    co.worker_id = w;
    co.consistency.num_workers = cfg.workers;
    co.consistency.staleness = -1;
    TESSERA_ASSIGN_OR_RETURN(auto c, tessera::Client::Create(co));
    stores.push_back(tw::CreateClusterStore(c.get()));
    clients.push_back(std::move(c));
  }

  std::vector<PerWorker> per(cfg.workers);
  std::barrier sync(static_cast<std::ptrdiff_t>(cfg.workers));
  // This process's CPU time and that of its server processes (thread servers count in it).
  auto cpu_now = [&] {
    double t = SelfCpuSeconds();
    for (uint32_t s = 0; cfg.tessera && !server_binary.empty() && s < cfg.workers; ++s) {
      t += ProcessCpuSeconds(cluster.pid(s));
    }
    return t;
  };
  double cpu_start = 0;
  auto body = [&](uint32_t w) {
    PerWorker& me = per[w];
    WorkerParts parts;
    tw::ParamStore* store = cfg.tessera ? stores[w].get() : local.get();
    me.status = SetUpWorker(cfg, layout, data, samples, w, store, parts);
    sync.arrive_and_wait();  // every trainer is ready (or failed): start together
    if (w == 0) cpu_start = cpu_now();
    if (!me.status.ok()) return;
    me.start = BenchClock::now();
    auto r = parts.trainer->Train();
    me.end = BenchClock::now();
    if (r.ok()) {
      me.result = *r;
    } else {
      me.status = r.status();
    }
  };
  std::vector<std::thread> threads;
  for (uint32_t w = 1; w < cfg.workers; ++w) threads.emplace_back(body, w);
  body(0);
  for (auto& t : threads) t.join();
  const double cpu_end = cpu_now();

  TESSERA_ASSIGN_OR_RETURN(RunResult r, Aggregate(cfg, per, cpu_end - cpu_start));

  if (data.test_samples > 0) {
    TESSERA_ASSIGN_OR_RETURN(auto test, tw::OpenTestData(data));
    TESSERA_ASSIGN_OR_RETURN(auto backend,
                             tw::CreateCpuBackend(layout, {std::max(FLAGS_threads, 1)}));
    tw::ParamStore* store = cfg.tessera ? stores[0].get() : local.get();
    auto ev = tw::Evaluate(layout, store, backend.get(), test.get());
    if (!ev.ok()) return ev.status().WithContext(cfg.name + " test");
    r.test_auc = ev->auc;
    r.oracle_auc = ev->oracle_auc;
  }
  return r;
}

// ------------------------------------------------------------------ the PyTorch cell

struct PyTorchCell {
  std::string python, script;
  std::vector<std::string> args;  // the model, data and threads flags, same as the C++ cells
};

// Whether the PyTorch cell can run: the interpreter exists and imports torch and numpy (the
// script's --check). Fills `why` when not, and `blas` with the BLAS torch loads when it can.
bool PyTorchAvailable(const PyTorchCell& cell, std::string* why, std::string* blas) {
  std::error_code ec;
  if (!std::filesystem::exists(cell.python, ec)) {
    *why = "no Python interpreter at " + cell.python;
    return false;
  }
  if (!std::filesystem::exists(cell.script, ec)) {
    *why = "no baseline script at " + cell.script;
    return false;
  }
  std::string out;
  const int rc = RunCapture({cell.python, cell.script, "--check"}, &out);
  if (rc != 0) {
    *why = cell.python + " cannot run the baseline (" +
           (rc == 3 ? std::string("torch or numpy missing") : "exit " + std::to_string(rc)) + ")";
    return false;
  }
  const std::string line = LastJsonLine(out);
  *blas = JsonStringField(line, "blas") + " (" + JsonStringField(line, "blas_library") +
          "), torch " + JsonStringField(line, "torch");
  return true;
}

Result<RunResult> RunPyTorch(const PyTorchCell& cell) {
  std::vector<std::string> argv = {cell.python, cell.script};
  argv.insert(argv.end(), cell.args.begin(), cell.args.end());
  std::string out;
  const int rc = RunCapture(argv, &out);
  const std::string line = LastJsonLine(out);
  if (rc != 0 || line.empty()) {
    return Status::Internal("pytorch: " + cell.script + " exited with status " +
                            std::to_string(rc) + (line.empty() ? " and no JSON line" : ""));
  }
  RunResult r;
  r.samples = static_cast<uint64_t>(JsonNumberField(line, "train_samples"));
  r.seconds = JsonNumberField(line, "train_s");
  r.samples_per_s = JsonNumberField(line, "samples_per_s");
  r.train_loss = JsonNumberField(line, "train_loss");
  r.test_auc = JsonNumberField(line, "test_auc");
  r.oracle_auc = JsonNumberField(line, "oracle_auc");
  r.blas = JsonStringField(line, "blas");
  r.cpu_us_per_sample = 1e6 * JsonNumberField(line, "train_cpu_s") /
                        static_cast<double>(std::max<uint64_t>(r.samples, 1));
  if (!std::isfinite(r.samples_per_s) || r.samples_per_s <= 0) {
    return Status::Internal("pytorch: no samples_per_s in its JSON line: " + line);
  }
  return r;
}

std::string JsonNum(double x) {
  if (!std::isfinite(x)) return "null";
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.6g", x);
  return buf;
}

// The tessera-server to spawn: --server_binary, else <build>/tessera-server for this program at
// <build>/examples/ctr/bench_train (or a tessera-server next to it). Empty: run servers in this
// process.
std::string FindServerBinary(const char* argv0, std::string* note) {
  namespace fs = std::filesystem;
  if (FLAGS_server_mode == "thread") {
    *note = "servers: tessera::Server objects in this process (--server_mode=thread)";
    return "";
  }
  if (!FLAGS_server_binary.empty()) {
    *note = "servers: tessera-server child processes (" + FLAGS_server_binary + ")";
    return FLAGS_server_binary;
  }
  std::error_code ec;
  const std::string p = tessera::bench::DefaultServerBinary(argv0);
  if (fs::exists(p, ec)) {
    *note = "servers: tessera-server child processes (" + p + ")";
    return p;
  }
  *note =
      "servers: tessera::Server objects in this process (no tessera-server binary found "
      "next to the build; --server_binary to spawn processes)";
  return "";
}

// The model of --embedding_dim, --bottom_mlp, --top_mlp and --wide.
Result<tw::ModelConfig> ModelConfigFromFlags() {
  tw::ModelConfig mc;
  mc.embedding_dim = FLAGS_embedding_dim;
  TESSERA_ASSIGN_OR_RETURN(mc.bottom_mlp, tw::ParseLayerWidths(FLAGS_bottom_mlp));
  TESSERA_ASSIGN_OR_RETURN(mc.top_mlp, tw::ParseLayerWidths(FLAGS_top_mlp));
  mc.wide = FLAGS_wide;
  mc.table_prefix = "bench";
  return mc;
}

// The PyTorch baseline: the same model, optimizers, samples (`samples` to train, `test_samples`
// to score, the generator's `seed`), batch and threads.
PyTorchCell MakePyTorchCell(uint64_t samples, uint64_t test_samples, uint64_t seed) {
  PyTorchCell pt;
  pt.python = FLAGS_python.empty() ? TESSERA_BENCH_PYTHON : FLAGS_python;
  pt.script = FLAGS_pytorch_script.empty()
                  ? std::string(TESSERA_SOURCE_DIR) + "/benchmarks/pytorch_dlrm.py"
                  : FLAGS_pytorch_script;
  pt.args = {"--train_samples=" + std::to_string(samples),
             "--test_samples=" + std::to_string(test_samples),
             "--batch_size=" + std::to_string(FLAGS_batch_size),
             "--threads=" + std::to_string(std::max(FLAGS_threads, 1)),
             "--embedding_dim=" + std::to_string(FLAGS_embedding_dim),
             "--bottom_mlp=" + FLAGS_bottom_mlp,
             "--top_mlp=" + FLAGS_top_mlp,
             std::string("--wide=") + (FLAGS_wide ? "1" : "0"),
             "--max_cardinality=" + std::to_string(FLAGS_synthetic_max_cardinality),
             "--seed=" + std::to_string(seed)};
  return pt;
}

// The settings of the whole run.
struct RunSettings {
  uint64_t samples = 0, test_samples = 0;  // per run
  int reps = 0;
  std::string server_binary;    // empty: servers in this process
  std::string pytorch_skipped;  // why the PyTorch cell does not run; empty when it does
  double load_start = std::nan(""), load_end = std::nan("");
};

// What the configurations measured: per configuration, the samples/s of every run and the
// medians over runs.
struct Figures {
  std::vector<std::vector<double>> sps;  // samples/s per run
  std::vector<double> med, auc, cpu, loss;
  double oracle_auc = std::nan("");
  std::string pytorch_blas_kind;  // as the PyTorch cell's runs report it
  double total_s = 0;
  double vs_pt_1s1w = std::nan(""), vs_pt_inproc = std::nan("");
};

// The first lines of the output: the servers (`server_note`), the model, data and runs, and the
// PyTorch cell (`pytorch_blas`: the BLAS it loads).
void PrintSetup(const RunSettings& run, const std::string& server_note, const PyTorchCell& pt,
                const std::string& pytorch_blas) {
  std::printf("%s\n", server_note.c_str());
  std::printf(
      "model: DLRM emb %u, bottom [%s], top [%s]%s; generated Criteo-shaped data (cardinality "
      "cap %llu%s); batch %u per worker; %llu samples per run, %llu test samples; %d threads "
      "per worker; %d reps, alternating; %u cores\n",
      FLAGS_embedding_dim, FLAGS_bottom_mlp.c_str(), FLAGS_top_mlp.c_str(),
      FLAGS_wide ? " + wide (FTRL)" : "",
      static_cast<unsigned long long>(FLAGS_synthetic_max_cardinality),
      FLAGS_pregenerate ? ", generated before timing" : ", generated while timed", FLAGS_batch_size,
      static_cast<unsigned long long>(run.samples),
      static_cast<unsigned long long>(run.test_samples), std::max(FLAGS_threads, 1), run.reps,
      std::thread::hardware_concurrency());
  if (run.pytorch_skipped.empty()) {
    std::printf("pytorch: %s %s, %d thread(s), BLAS %s\n", pt.python.c_str(), pt.script.c_str(),
                std::max(FLAGS_threads, 1), pytorch_blas.c_str());
  } else {
    std::printf("pytorch: skipped: %s\n", run.pytorch_skipped.c_str());
  }
  std::fflush(stdout);
}

// Runs every configuration run.reps times, alternating; nothing when a run failed (its error
// printed).
std::optional<Figures> Measure(const std::vector<Config>& configs, const RunSettings& run,
                               const PyTorchCell& pt, const tw::ModelLayout& layout,
                               const tw::DataSourceOptions& data) {
  Figures f;
  f.loss.resize(configs.size());
  std::vector<std::vector<double>> aucs(configs.size()), cpus(configs.size());
  const auto t0 = BenchClock::now();
  // Odd repetitions run the list backwards, so no configuration always follows another.
  auto measured = tessera::bench::AlternateRepetitions(
      configs.size(), run.reps, [&](size_t c, int) -> std::optional<double> {
        auto r = configs[c].pytorch
                     ? RunPyTorch(pt)
                     : RunOnce(configs[c], layout, data, run.samples, run.server_binary);
        if (!r.ok()) {
          std::fprintf(stderr, "bench_train: %s\n", r.status().ToString().c_str());
          return std::nullopt;
        }
        f.loss[c] = r->train_loss;
        if (std::isfinite(r->test_auc)) aucs[c].push_back(r->test_auc);
        if (std::isfinite(r->cpu_us_per_sample)) cpus[c].push_back(r->cpu_us_per_sample);
        if (!configs[c].pytorch && std::isfinite(r->oracle_auc)) f.oracle_auc = r->oracle_auc;
        if (configs[c].pytorch) f.pytorch_blas_kind = r->blas;
        return r->samples_per_s;
      });
  if (!measured) return std::nullopt;
  f.sps = std::move(*measured);
  f.total_s = std::chrono::duration<double>(BenchClock::now() - t0).count();
  f.med.resize(configs.size());
  f.auc.resize(configs.size());
  f.cpu.resize(configs.size());
  for (size_t c = 0; c < configs.size(); ++c) {
    f.med[c] = Median(f.sps[c]);
    f.auc[c] = aucs[c].empty() ? std::nan("") : Median(aucs[c]);
    f.cpu[c] = cpus[c].empty() ? std::nan("") : Median(cpus[c]);
  }
  return f;
}

// The in-process configuration with the same workers and prefetch setting as configs[c].
size_t Baseline(const std::vector<Config>& configs, size_t c) {
  for (size_t b = 0; b < configs.size(); ++b) {
    if (!configs[b].tessera && !configs[b].pytorch && configs[b].workers == configs[c].workers &&
        configs[b].prefetch == configs[c].prefetch) {
      return b;
    }
  }
  return c;
}

// The table of the configurations' figures and what its columns mean.
void PrintTable(const std::vector<Config>& configs, const Figures& f, const RunSettings& run) {
  std::printf("\n%-14s %7s %7s %8s %12s %12s %12s %9s %10s %9s %10s\n", "config", "servers",
              "workers", "prefetch", "samples/s", "min", "max", "vs inproc", "train loss",
              "test AUC", "cpu us/smp");
  for (size_t c = 0; c < configs.size(); ++c) {
    const Config& k = configs[c];
    char vs[32];
    std::snprintf(vs, sizeof(vs), "%9.3f", f.med[c] / f.med[Baseline(configs, c)]);
    std::printf("%-14s %7s %7u %8s %12.0f %12.0f %12.0f %9s %10.4f %9.4f %10.1f\n", k.name.c_str(),
                k.pytorch ? "-" : std::to_string(k.tessera ? k.workers : 0).c_str(), k.workers,
                k.pytorch    ? "-"
                : k.prefetch ? "on"
                             : "off",
                f.med[c], *std::min_element(f.sps[c].begin(), f.sps[c].end()),
                *std::max_element(f.sps[c].begin(), f.sps[c].end()), k.pytorch ? "-" : vs,
                f.loss[c], f.auc[c], f.cpu[c]);
  }
  std::printf(
      "\nvs inproc: median samples/s of the configuration / that of the in-process one with the "
      "same workers and prefetch. samples/s: all the configuration's workers together, training "
      "only (from the first trainer's start to the last one's end). test AUC: median over "
      "repetitions, %llu test samples (oracle AUC %.4f). cpu us/smp: CPU time of every process of "
      "the configuration (its server processes included) while it trained, per sample, median. "
      "Total time %.1f s.\n",
      static_cast<unsigned long long>(run.test_samples), f.oracle_auc, f.total_s);
}

// The last line of the output.
std::string Json(const std::vector<Config>& configs, const Figures& f, const RunSettings& run) {
  auto ratio = [&](size_t c) { return f.med[c] / f.med[Baseline(configs, c)]; };
  std::string json = "{\"bench\":\"train\",\"quick\":";
  json += FLAGS_quick ? "true" : "false";
  json += ",\"server_mode\":\"";
  json += run.server_binary.empty() ? "thread" : "process";
  json += "\",\"samples_per_run\":" + std::to_string(run.samples) +
          ",\"test_samples\":" + std::to_string(run.test_samples) +
          ",\"reps\":" + std::to_string(run.reps) +
          ",\"batch_size\":" + std::to_string(FLAGS_batch_size) +
          ",\"threads\":" + std::to_string(std::max(FLAGS_threads, 1)) +
          ",\"pregenerate\":" + (FLAGS_pregenerate ? "true" : "false") +
          ",\"cores\":" + std::to_string(std::thread::hardware_concurrency());
  json +=
      ",\"loadavg_start\":" + JsonNum(run.load_start) + ",\"loadavg_end\":" + JsonNum(run.load_end);
  json += ",\"ps_vs_inprocess_prefetch\":" + JsonNum(ratio(2));
  json += ",\"ps_vs_inprocess_no_prefetch\":" + JsonNum(ratio(3));
  json += ",\"ps2x2_vs_inprocess2_prefetch\":" + JsonNum(ratio(6));
  json += ",\"ps2x2_vs_inprocess2_no_prefetch\":" + JsonNum(ratio(7));
  if (run.pytorch_skipped.empty()) {
    json += ",\"tessera_1s1w_vs_pytorch\":" + JsonNum(f.vs_pt_1s1w);
    json += ",\"tessera_inprocess_vs_pytorch\":" + JsonNum(f.vs_pt_inproc);
    json += ",\"pytorch_blas\":\"" + f.pytorch_blas_kind + "\"";
  } else {
    std::string why = run.pytorch_skipped;
    std::replace(why.begin(), why.end(), '"', '\'');
    json += ",\"pytorch_skipped\":\"" + why + "\"";
  }
  json += ",\"oracle_auc\":" + JsonNum(f.oracle_auc);
  auto key = [&](size_t c) {
    return configs[c].name + (configs[c].pytorch    ? ""
                              : configs[c].prefetch ? "_prefetch"
                                                    : "_no_prefetch");
  };
  auto per_config = [&](const char* name, const std::vector<double>& v) {
    json += std::string(",\"") + name + "\":{";
    for (size_t c = 0; c < configs.size(); ++c) {
      if (c) json += ",";
      json += "\"" + key(c) + "\":" + JsonNum(v[c]);
    }
    json += "}";
  };
  per_config("samples_per_s", f.med);
  per_config("test_auc", f.auc);
  per_config("cpu_us_per_sample", f.cpu);
  json += "}";
  return json;
}

}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage(
      "Training-loop samples/s with parameters on Tessera vs in local memory (same run)");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  if (FLAGS_server_mode != "process" && FLAGS_server_mode != "thread") {
    std::fprintf(stderr, "bench_train: --server_mode must be process or thread\n");
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  RunSettings run;
  run.samples = FLAGS_train_samples ? FLAGS_train_samples : FLAGS_quick ? 48000 : 300000;
  run.reps = FLAGS_reps > 0 ? FLAGS_reps : (FLAGS_quick ? 3 : 5);
  std::string server_note;
  run.server_binary = FindServerBinary(argv[0], &server_note);

  run.test_samples = FLAGS_test_samples ? FLAGS_test_samples : FLAGS_quick ? 20000 : 100000;
  tw::DataSourceOptions data;
  data.spec = "synthetic";
  data.test_samples = run.test_samples;
  data.synthetic.cardinalities = tw::CriteoLikeCardinalities(FLAGS_synthetic_max_cardinality);
  auto mc = ModelConfigFromFlags();
  if (!mc.ok()) {
    std::fprintf(stderr, "bench_train: %s\n", mc.status().ToString().c_str());
    return 2;
  }
  auto layout = tw::ModelLayout::Create(*mc);
  if (!layout.ok()) {
    std::fprintf(stderr, "bench_train: %s\n", layout.status().ToString().c_str());
    return 1;
  }

  std::vector<Config> configs = {
      {"inprocess_1w", false, 1, true}, {"inprocess_1w", false, 1, false},
      {"tessera_1s1w", true, 1, true},  {"tessera_1s1w", true, 1, false},
      {"inprocess_2w", false, 2, true}, {"inprocess_2w", false, 2, false},
      {"tessera_2s2w", true, 2, true},  {"tessera_2s2w", true, 2, false},
  };
  const PyTorchCell pt = MakePyTorchCell(run.samples, run.test_samples, data.synthetic.seed);
  std::string pytorch_blas;
  if (!FLAGS_pytorch) {
    run.pytorch_skipped = "--pytorch=false";
  } else if (!PyTorchAvailable(pt, &run.pytorch_skipped, &pytorch_blas)) {
    run.pytorch_skipped += "; install with: bash scripts/install_bench_deps.sh";
  } else {
    configs.push_back({"pytorch_1w", false, 1, false, /*pytorch=*/true});
  }
  PrintSetup(run, server_note, pt, pytorch_blas);

  run.load_start = LoadAverage();
  std::optional<Figures> f = Measure(configs, run, pt, *layout, data);
  if (!f) return 1;
  PrintTable(configs, *f, run);
  // Against PyTorch: Tessera's default (prefetch on), 1 worker, over the PyTorch cell.
  const size_t kInproc1 = 0, kTessera1 = 2, kPyTorch = configs.size() - 1;
  if (run.pytorch_skipped.empty()) {
    f->vs_pt_1s1w = f->med[kTessera1] / f->med[kPyTorch];
    f->vs_pt_inproc = f->med[kInproc1] / f->med[kPyTorch];
    std::printf(
        "tessera_1s1w_vs_pytorch: %.3f (median samples/s, 1 server + 1 worker, prefetch on / "
        "PyTorch)\ntessera_inprocess_vs_pytorch: %.3f (1 in-process trainer, prefetch on / "
        "PyTorch)\ntest AUC: tessera_1s1w %.4f, inprocess_1w %.4f, pytorch %.4f\n",
        f->vs_pt_1s1w, f->vs_pt_inproc, f->auc[kTessera1], f->auc[kInproc1], f->auc[kPyTorch]);
  }

  run.load_end = LoadAverage();
  std::printf("1-minute load average: %.2f at the start, %.2f at the end (%u cores)\n",
              run.load_start, run.load_end, std::thread::hardware_concurrency());
  std::printf("%s\n", Json(configs, *f, run).c_str());
  return 0;
}
