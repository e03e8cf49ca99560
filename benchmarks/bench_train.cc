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
// Repetitions alternate the configurations (rep-major order) so that drift on a shared machine
// hits them all; reported figures are medians. The last line of output is one JSON object with
// ps_vs_inprocess_{prefetch,no_prefetch} (1 server + 1 worker vs 1 in-process trainer) and
// ps2x2_vs_inprocess2_{prefetch,no_prefetch} (2 + 2 vs 2 in-process trainers), plus the raw
// samples/s of every configuration.
#include <gflags/gflags.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cmath>
#include <cstdio>
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

namespace tw = tessera::worker;
using tessera::Result;
using tessera::Status;

namespace {

using BenchClock = std::chrono::steady_clock;
using tessera::bench::Median;

// ------------------------------------------------------------------ training runs

struct Config {
  std::string name;
  bool tessera;      // parameters on servers (else in local memory)
  uint32_t workers;  // trainers (threads), each with its own data shard
  bool prefetch;
};

struct RunResult {
  uint64_t samples = 0;
  double seconds = 0;
  double samples_per_s = 0;
  double train_loss = 0;
};

// Trains `samples` samples with `workers` trainers and returns the aggregate throughput, timed
// from the first trainer's start of Train() to the last one's end (Init, table creation and
// server start are not timed).
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

  struct PerWorker {
    Status status;
    tw::TrainResult result;
    BenchClock::time_point start, end;
  };
  std::vector<PerWorker> per(cfg.workers);
  std::barrier sync(static_cast<std::ptrdiff_t>(cfg.workers));
  auto body = [&](uint32_t w) {
    PerWorker& me = per[w];
    std::unique_ptr<tw::DataReader> reader;
    std::unique_ptr<tw::Backend> backend;
    std::unique_ptr<tw::Trainer> trainer;
    auto setup = [&]() -> Status {
      tw::DataSourceOptions mine = data;
      mine.rank = w;
      mine.world = cfg.workers;
      mine.train_samples = samples;
      TESSERA_ASSIGN_OR_RETURN(reader, tw::OpenTrainData(mine));
      TESSERA_ASSIGN_OR_RETURN(backend, tw::CreateCpuBackend(layout, {FLAGS_threads}));
      tw::TrainerOptions o;
      o.batch_size = FLAGS_batch_size;
      o.prefetch = cfg.prefetch;
      o.staleness = -1;
      o.worker_id = w;
      o.job = "bench";
      o.resume = false;
      o.progress_interval_s = 0;
      tw::ParamStore* store = cfg.tessera ? stores[w].get() : local.get();
      TESSERA_ASSIGN_OR_RETURN(trainer,
                               tw::Trainer::Create(o, layout, store, backend.get(), reader.get()));
      return trainer->Init();
    };
    me.status = setup();
    sync.arrive_and_wait();  // every trainer is ready (or failed): start together
    if (!me.status.ok()) return;
    me.start = BenchClock::now();
    auto r = trainer->Train();
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

// The 1-minute load average (the benchmark shares the machine with whatever else runs).
double LoadAverage() {
  std::ifstream in("/proc/loadavg");
  double l = std::nan("");
  in >> l;
  return l;
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
  const uint64_t samples = FLAGS_train_samples ? FLAGS_train_samples : FLAGS_quick ? 48000 : 300000;
  const int reps = FLAGS_reps > 0 ? FLAGS_reps : (FLAGS_quick ? 3 : 5);
  std::string server_note;
  const std::string server_binary = FindServerBinary(argv[0], &server_note);

  tw::DataSourceOptions data;
  data.spec = "synthetic";
  data.test_samples = 1;
  data.synthetic.cardinalities = tw::CriteoLikeCardinalities(FLAGS_synthetic_max_cardinality);
  tw::ModelConfig mc;
  mc.embedding_dim = FLAGS_embedding_dim;
  auto bottom = tw::ParseLayerWidths(FLAGS_bottom_mlp);
  auto top = tw::ParseLayerWidths(FLAGS_top_mlp);
  if (!bottom.ok() || !top.ok()) {
    std::fprintf(stderr, "bench_train: %s\n",
                 (bottom.ok() ? top.status() : bottom.status()).ToString().c_str());
    return 2;
  }
  mc.bottom_mlp = *bottom;
  mc.top_mlp = *top;
  mc.wide = FLAGS_wide;
  mc.table_prefix = "bench";
  auto layout = tw::ModelLayout::Create(mc);
  if (!layout.ok()) {
    std::fprintf(stderr, "bench_train: %s\n", layout.status().ToString().c_str());
    return 1;
  }

  const std::vector<Config> configs = {
      {"inprocess_1w", false, 1, true}, {"inprocess_1w", false, 1, false},
      {"tessera_1s1w", true, 1, true},  {"tessera_1s1w", true, 1, false},
      {"inprocess_2w", false, 2, true}, {"inprocess_2w", false, 2, false},
      {"tessera_2s2w", true, 2, true},  {"tessera_2s2w", true, 2, false},
  };
  std::printf("%s\n", server_note.c_str());
  std::printf(
      "model: DLRM emb %u, bottom [%s], top [%s]%s; generated Criteo-shaped data (cardinality "
      "cap %llu); batch %u per worker; %llu samples per run; %d reps, alternating; %u cores\n",
      FLAGS_embedding_dim, FLAGS_bottom_mlp.c_str(), FLAGS_top_mlp.c_str(),
      FLAGS_wide ? " + wide (FTRL)" : "",
      static_cast<unsigned long long>(FLAGS_synthetic_max_cardinality), FLAGS_batch_size,
      static_cast<unsigned long long>(samples), reps, std::thread::hardware_concurrency());
  std::fflush(stdout);

  const double load_start = LoadAverage();
  std::vector<double> loss(configs.size());
  const auto t0 = BenchClock::now();
  // Odd repetitions run the list backwards, so no configuration always follows another.
  auto measured = tessera::bench::AlternateRepetitions(
      configs.size(), reps, [&](size_t c, int) -> std::optional<double> {
        auto r = RunOnce(configs[c], *layout, data, samples, server_binary);
        if (!r.ok()) {
          std::fprintf(stderr, "bench_train: %s\n", r.status().ToString().c_str());
          return std::nullopt;
        }
        loss[c] = r->train_loss;
        return r->samples_per_s;
      });
  if (!measured) return 1;
  const std::vector<std::vector<double>> sps = std::move(*measured);  // samples/s per run
  const double total_s = std::chrono::duration<double>(BenchClock::now() - t0).count();

  std::vector<double> med(configs.size());
  for (size_t c = 0; c < configs.size(); ++c) med[c] = Median(sps[c]);
  // The in-process configuration with the same workers and prefetch setting.
  auto baseline = [&](size_t c) {
    for (size_t b = 0; b < configs.size(); ++b) {
      if (!configs[b].tessera && configs[b].workers == configs[c].workers &&
          configs[b].prefetch == configs[c].prefetch) {
        return b;
      }
    }
    return c;
  };
  std::printf("\n%-14s %7s %7s %8s %12s %12s %12s %9s %10s\n", "config", "servers", "workers",
              "prefetch", "samples/s", "min", "max", "vs inproc", "train loss");
  for (size_t c = 0; c < configs.size(); ++c) {
    const Config& k = configs[c];
    std::printf("%-14s %7u %7u %8s %12.0f %12.0f %12.0f %9.3f %10.4f\n", k.name.c_str(),
                k.tessera ? k.workers : 0, k.workers, k.prefetch ? "on" : "off", med[c],
                *std::min_element(sps[c].begin(), sps[c].end()),
                *std::max_element(sps[c].begin(), sps[c].end()), med[c] / med[baseline(c)],
                loss[c]);
  }
  auto ratio = [&](size_t c) { return med[c] / med[baseline(c)]; };
  std::printf(
      "\nvs inproc: median samples/s of the configuration / that of the in-process one with the "
      "same workers and prefetch. Total time %.1f s.\n",
      total_s);

  const double load_end = LoadAverage();
  std::printf("1-minute load average: %.2f at the start, %.2f at the end (%u cores)\n", load_start,
              load_end, std::thread::hardware_concurrency());
  std::string json = "{\"bench\":\"train\",\"quick\":";
  json += FLAGS_quick ? "true" : "false";
  json += ",\"server_mode\":\"";
  json += server_binary.empty() ? "thread" : "process";
  json += "\",\"samples_per_run\":" + std::to_string(samples) +
          ",\"reps\":" + std::to_string(reps) +
          ",\"batch_size\":" + std::to_string(FLAGS_batch_size) +
          ",\"cores\":" + std::to_string(std::thread::hardware_concurrency());
  json += ",\"loadavg_start\":" + JsonNum(load_start) + ",\"loadavg_end\":" + JsonNum(load_end);
  json += ",\"ps_vs_inprocess_prefetch\":" + JsonNum(ratio(2));
  json += ",\"ps_vs_inprocess_no_prefetch\":" + JsonNum(ratio(3));
  json += ",\"ps2x2_vs_inprocess2_prefetch\":" + JsonNum(ratio(6));
  json += ",\"ps2x2_vs_inprocess2_no_prefetch\":" + JsonNum(ratio(7));
  json += ",\"samples_per_s\":{";
  for (size_t c = 0; c < configs.size(); ++c) {
    if (c) json += ",";
    json += "\"" + configs[c].name + (configs[c].prefetch ? "_prefetch" : "_no_prefetch") +
            "\":" + JsonNum(med[c]);
  }
  json += "}}";
  std::printf("%s\n", json.c_str());
  return 0;
}
