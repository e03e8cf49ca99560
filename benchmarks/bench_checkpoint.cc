// bench_checkpoint: time to take a consistent checkpoint of a large table, and the pause it
// causes to a client that keeps pushing meanwhile, next to that client's latency without a
// checkpoint, for a RocksDB-backed server and a memory-only one in the same run.
//
// Two tessera-server child processes with 2 lanes each: one on RocksDB (its data in a temporary
// directory), one memory-only. Each gets a table of --rows rows x --dim floats (Adagrad: value +
// accumulator), filled by pushes. Then, in repetitions alternating between the two servers
// (bench_stats.h), a "trainer" thread pushes 1000-key batches in a loop: for 0.5 s not counted
// (the server has just resumed, see below), alone for at least 1 s (2 s without --quick) and
// 100 pushes (the baseline: its p50 and p99 push latency), then while a checkpoint is taken
// (the pause is its longest push latency then). pause_vs_p99 is pause / p99 per repetition; every
// figure is a median over repetitions. The server not measured is paused (SIGSTOP, bench_cluster.h
// RunOnly), so that the RocksDB server's background work never lands in the memory server's
// figures. The last line of output is one JSON object.
#include <gflags/gflags.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "benchmarks/bench_cluster.h"
#include "benchmarks/bench_stats.h"
#include "ps/client/client.h"

DEFINE_bool(quick, false, "1M rows instead of --rows, 1 s before each checkpoint (about a minute)");
DEFINE_uint64(rows, 10000000, "Rows in each server's table");
DEFINE_uint32(dim, 16, "Floats per row");
DEFINE_int32(reps, 3, "Checkpoints per server, alternating between the servers");
DEFINE_string(dir, "",
              "Directory to write the checkpoints in, as <engine>-<rep>/ (default: a temp dir; "
              "each checkpoint there is removed once measured)");
DEFINE_string(server_binary, "", "tessera-server (default: next to this program)");
DEFINE_int32(write_back_wait_s, 120,
             "After the fill, wait (at most this long, or fail) until the server's stats show no "
             "row left to write back (0: do not wait: checkpoints then meet the fill's backlog)");
DEFINE_bool(verbose, false,
            "Print each checkpoint's five longest pushes: when each began, in ms after the "
            "checkpoint request was sent, and how long it took");
DEFINE_int32(checkpoint_timeout_s, 0,
             "Fail when a checkpoint takes longer (0: 120 s with --quick, else 1200 s)");

namespace {

using BenchClock = std::chrono::steady_clock;
using tessera::Result;
using tessera::Status;
using tessera::bench::Percentile;
using tessera::bench::RunOnly;

constexpr uint64_t kTrainerKeys = 1000;
// Pushes of the trainer not counted after the server resumes (see MeasureCheckpoint).
constexpr int kSettleMs = 500;
// Fewest pushes of the baseline.
constexpr size_t kBaselinePushes = 100;

double Ms(BenchClock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

uint64_t Rows() { return FLAGS_quick ? 1000000 : FLAGS_rows; }

// Longest a checkpoint may take before the run fails: a stuck one must not hang the run.
int64_t CheckpointTimeoutMs() {
  if (FLAGS_checkpoint_timeout_s > 0) return int64_t{FLAGS_checkpoint_timeout_s} * 1000;
  return FLAGS_quick ? 120000 : 1200000;
}

// Shortest baseline of pushes before a checkpoint.
int BaselineMs() { return FLAGS_quick ? 1000 : 2000; }

// The figures of one checkpoint.
struct CheckpointRep {
  double checkpoint_s, pause_ms, p50_before_ms, p99_before_ms, pause_vs_p99, p50_during_ms;
  double bytes;
  size_t during;
};

// A server of one storage engine, a client on it and its filled table.
struct Engine {
  std::string name;
  std::vector<std::string> flags;
  tessera::bench::BenchCluster cluster;
  std::unique_ptr<tessera::Client> client;
  tessera::Table table;
  double fill_s = 0, write_back_s = 0;
  std::vector<CheckpointRep> reps;
};

Status StartEngine(Engine& e, const std::string& binary, const std::string& admin_root) {
  std::vector<std::string> flags = e.flags;
  flags.push_back("--admin_root=" + admin_root);
  TESSERA_RETURN_IF_ERROR(e.cluster.Start(1, "process", binary, 2, flags));
  tessera::ClientOptions co;
  co.servers = e.cluster.endpoints();
  co.admin_root = admin_root;
  TESSERA_ASSIGN_OR_RETURN(e.client, tessera::Client::Create(co));
  const tessera::OptimizerSpec adagrad{.kind = tessera::OptimizerKind::kAdagrad,
                                       .learning_rate = 0.01f};
  TESSERA_ASSIGN_OR_RETURN(
      e.table, e.client->CreateTable(tessera::TableSpec::Sparse("big", FLAGS_dim, adagrad)));
  return Status::OK();
}

// Every row gets one update, so that it is stored with its optimizer state.
Status Fill(Engine& e) {
  const auto t0 = BenchClock::now();
  const uint64_t batch = 100000, rows = Rows();
  std::vector<uint64_t> keys;
  std::vector<float> grads;
  for (uint64_t first = 0; first < rows; first += batch) {
    const uint64_t n = std::min(batch, rows - first);
    keys.resize(n);
    grads.assign(n * FLAGS_dim, 0.5f);
    for (uint64_t i = 0; i < n; ++i) keys[i] = first + i;
    TESSERA_RETURN_IF_ERROR(e.client->Wait(e.client->Push(e.table, keys, grads)));
  }
  e.fill_s = Ms(BenchClock::now() - t0) / 1000;
  return Status::OK();
}

// The sum of the server's laneN_dirty_bytes stats: rows changed in memory and not yet written
// back to storage. nullopt when the server reports none.
Result<std::optional<uint64_t>> DirtyBytes(Engine& e) {
  TESSERA_ASSIGN_OR_RETURN(std::string stats, e.client->ServerStats(0));
  std::istringstream lines(stats);
  std::optional<uint64_t> dirty;
  for (std::string name, value; lines >> name && std::getline(lines, value);) {
    if (name.starts_with("lane") && name.ends_with("_dirty_bytes")) {
      dirty = dirty.value_or(0) + std::stoull(value);
    }
  }
  return dirty;
}

// Waits until the server has written back every row the fill changed: a checkpoint taken while
// the fill is still being written back measures that backlog, not the steady state.
Status WaitForWriteBack(Engine& e) {
  const auto t0 = BenchClock::now();
  for (;;) {
    TESSERA_ASSIGN_OR_RETURN(std::optional<uint64_t> dirty, DirtyBytes(e));
    e.write_back_s = Ms(BenchClock::now() - t0) / 1000;
    if (!dirty.has_value() || *dirty == 0) return Status::OK();
    if (e.write_back_s > FLAGS_write_back_wait_s) {
      return Status::DeadlineExceeded(
          std::to_string(*dirty) + " bytes of rows still not written back " +
          std::to_string(FLAGS_write_back_wait_s) + " s after the fill");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

uint64_t BytesUnder(const std::string& dir) {
  uint64_t bytes = 0;
  for (auto& f : std::filesystem::recursive_directory_iterator(dir)) {
    if (f.is_regular_file()) bytes += f.file_size();
  }
  return bytes;
}

// A push of the trainer: when it started and ended, in ms since the repetition began.
struct Push {
  double start, end;
};

// --verbose: the five longest of the pushes that ran into a checkpoint.
void PrintLongest(std::vector<Push> pushes, double ck_begin, double ck_end) {
  auto longer = [](const Push& a, const Push& b) { return a.end - a.start > b.end - b.start; };
  const size_t n = std::min<size_t>(5, pushes.size());
  std::partial_sort(pushes.begin(), pushes.begin() + n, pushes.end(), longer);
  std::printf("  checkpoint %.0f ms; longest pushes (began at ms after its start: took ms):",
              ck_end - ck_begin);
  for (size_t i = 0; i < n; ++i) {
    std::printf(" %.1f: %.1f", pushes[i].start - ck_begin, pushes[i].end - pushes[i].start);
  }
  std::printf("\n");
}

// Splits the trainer's pushes into the baseline (started at `base_begin` or later, ended before
// the checkpoint began) and those that ran into the checkpoint (ended after it began, started
// before it ended).
void Split(const std::vector<Push>& pushes, double base_begin, double ck_begin, double ck_end,
           CheckpointRep& rep) {
  std::vector<double> before, during;
  std::vector<Push> slowest;
  for (const Push& p : pushes) {
    if (p.end < ck_begin) {
      if (p.start >= base_begin) before.push_back(p.end - p.start);
    } else if (p.start <= ck_end) {
      during.push_back(p.end - p.start);
      slowest.push_back(p);
    }
  }
  if (FLAGS_verbose) PrintLongest(std::move(slowest), ck_begin, ck_end);
  rep.during = during.size();
  rep.p50_during_ms = Percentile(during, 0.5);
  rep.pause_ms = Percentile(std::move(during), 1);
  rep.p50_before_ms = Percentile(before, 0.5);
  rep.p99_before_ms = Percentile(std::move(before), 0.99);
  rep.pause_vs_p99 = rep.pause_ms / std::max(1e-9, rep.p99_before_ms);
}

// Sleeps until `min_ms` have passed since `since` and `done` has grown by kBaselinePushes (p99
// of fewer pushes would be their maximum), or `give_up` is set; false after a minute.
bool WaitForBaseline(BenchClock::time_point since, double min_ms, const std::atomic<size_t>& done,
                     const std::atomic<bool>& give_up) {
  const size_t at_start = done.load();
  while (!give_up.load()) {
    const double waited = Ms(BenchClock::now() - since);
    if (waited >= min_ms && done.load() - at_start >= kBaselinePushes) return true;
    if (waited > 60000) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;  // the trainer failed; its error is reported
}

// One checkpoint, named `name` under the admin root, taken while a trainer pushes.
Result<CheckpointRep> MeasureCheckpoint(Engine& e, const std::string& admin_root,
                                        const std::string& name) {
  tessera::Client& c = *e.client;
  std::atomic<bool> stop{false}, trainer_ended{false};
  std::atomic<size_t> done{0};
  std::vector<Push> pushes;
  Status trainer_error;
  const auto t0 = BenchClock::now();
  std::thread trainer([&] {
    std::vector<uint64_t> k(kTrainerKeys);
    std::vector<float> g(kTrainerKeys * FLAGS_dim, 0.1f);
    uint64_t next = 0;
    while (!stop.load() && trainer_error.ok()) {
      for (auto& key : k) key = (next++ * 7919) % Rows();
      const double start = Ms(BenchClock::now() - t0);
      trainer_error = c.Wait(c.Push(e.table, k, g));
      pushes.push_back({start, Ms(BenchClock::now() - t0)});
      done.fetch_add(1);
    }
    trainer_ended = true;  // stopped or failed: nothing more to wait for
  });
  // The first pushes after the server resumes meet the background work it deferred while
  // paused: not the steady state the baseline stands for.
  std::this_thread::sleep_for(std::chrono::milliseconds(kSettleMs));
  const auto base_begin = BenchClock::now();
  const bool baseline = WaitForBaseline(base_begin, BaselineMs(), done, trainer_ended);
  const double ck_begin = Ms(BenchClock::now() - t0);
  Result<int64_t> cut = Status::Unavailable("no checkpoint: the baseline pushes took over 60 s");
  if (baseline) cut = c.Checkpoint(name, tessera::DeadlineAfterMs(CheckpointTimeoutMs()));
  const double ck_end = Ms(BenchClock::now() - t0);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  stop = true;
  trainer.join();
  TESSERA_RETURN_IF_ERROR(trainer_error.WithContext("trainer push"));
  TESSERA_RETURN_IF_ERROR(cut.status().WithContext("checkpoint"));
  CheckpointRep rep{};
  rep.checkpoint_s = (ck_end - ck_begin) / 1000;
  rep.bytes = static_cast<double>(BytesUnder(admin_root + "/" + name));
  Split(pushes, Ms(base_begin - t0), ck_begin, ck_end, rep);
  return rep;
}

// The median over an engine's repetitions of one figure.
template <typename Figure>
double MedianOf(const Engine& e, Figure figure) {
  return tessera::bench::MedianOver(e.reps, figure);
}

void PrintTable(const std::vector<Engine>& engines) {
  std::printf("%-8s %7s %7s %12s %9s %7s %12s %12s %12s %13s %8s %10s\n", "engine", "fill s",
              "wb s", "checkpoint s", "MiB", "MiB/s", "p50 before", "p99 before", "p50 during",
              "pause max ms", "pushes", "pause/p99");
  for (const Engine& e : engines) {
    const double mib = MedianOf(e, &CheckpointRep::bytes) / 1048576.0;
    const double ck_s = MedianOf(e, &CheckpointRep::checkpoint_s);
    std::printf("%-8s %7.1f %7.1f %12.2f %9.1f %7.0f %12.2f %12.2f %12.2f %13.1f %8.0f %10.1f\n",
                e.name.c_str(), e.fill_s, e.write_back_s, ck_s, mib, mib / ck_s,
                MedianOf(e, &CheckpointRep::p50_before_ms),
                MedianOf(e, &CheckpointRep::p99_before_ms),
                MedianOf(e, &CheckpointRep::p50_during_ms), MedianOf(e, &CheckpointRep::pause_ms),
                MedianOf(e, &CheckpointRep::during), MedianOf(e, &CheckpointRep::pause_vs_p99));
  }
}

// The last line: every engine's figures, each key suffixed with the engine's name.
void PrintJson(const std::vector<Engine>& engines) {
  std::printf("{\"bench\":\"checkpoint\",\"rows\":%llu,\"dim\":%u,\"reps\":%d",
              static_cast<unsigned long long>(Rows()), FLAGS_dim, FLAGS_reps);
  for (const Engine& e : engines) {
    const char* n = e.name.c_str();
    std::printf(
        ",\"fill_s_%s\":%.2f,\"write_back_s_%s\":%.2f,\"checkpoint_s_%s\":%.3f,\"bytes_%s\":%.0f,"
        "\"pause_max_ms_%s\":%.2f,"
        "\"push_p50_before_ms_%s\":%.3f,\"push_p99_before_ms_%s\":%.3f,"
        "\"push_p50_during_ms_%s\":%.3f,\"pause_vs_p99_%s\":%.1f",
        n, e.fill_s, n, e.write_back_s, n, MedianOf(e, &CheckpointRep::checkpoint_s), n,
        MedianOf(e, &CheckpointRep::bytes), n, MedianOf(e, &CheckpointRep::pause_ms), n,
        MedianOf(e, &CheckpointRep::p50_before_ms), n, MedianOf(e, &CheckpointRep::p99_before_ms),
        n, MedianOf(e, &CheckpointRep::p50_during_ms), n,
        MedianOf(e, &CheckpointRep::pause_vs_p99));
  }
  std::printf("}\n");
}

int Fail(const Status& s) {
  std::fprintf(stderr, "bench_checkpoint: FAILED: %s\n", s.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  tessera::bench::CleanUpOnStopSignals();
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  if (FLAGS_reps < 1) {
    std::fprintf(stderr, "bench_checkpoint: --reps must be at least 1\n");
    return 2;
  }
  // Declared before the servers, so that they stop before their directories go.
  const tessera::bench::TempDir tmp("tessera-bench-ckpt-");
  const bool keep = !FLAGS_dir.empty();
  // The servers name checkpoints relative to their admin root.
  const std::string admin_root = keep ? FLAGS_dir : tmp.path() + "/ckpt";
  std::error_code ec;
  std::filesystem::create_directories(admin_root, ec);
  const std::string binary = FLAGS_server_binary.empty()
                                 ? tessera::bench::DefaultServerBinary(argv[0])
                                 : FLAGS_server_binary;
  std::vector<Engine> engines(2);
  engines[0].name = "rocksdb";
  engines[0].flags = {"--data_dir=" + tmp.path() + "/rocksdb"};
  engines[1].name = "memory";
  std::vector<tessera::bench::BenchCluster*> clusters;
  for (Engine& e : engines) clusters.push_back(&e.cluster);
  for (Engine& e : engines) {
    Status s = StartEngine(e, binary, admin_root);
    RunOnly(clusters, e.cluster);
    if (s.ok()) s = Fill(e);
    if (s.ok() && FLAGS_write_back_wait_s > 0) s = WaitForWriteBack(e);
    if (!s.ok()) return Fail(s.WithContext(e.name));
  }
  std::printf(
      "bench_checkpoint: %llu rows x dim %u (Adagrad) per server; servers as child processes, 2 "
      "lanes: RocksDB (temp data dir) and memory-only; a trainer pushes %llu-key batches: %d ms "
      "not counted after the server resumes, at least %d ms and %zu pushes alone (the "
      "baseline: p50, p99), then during a checkpoint (the pause: the longest push); %d "
      "repetitions alternating, the server not measured paused (SIGSTOP); medians\n",
      static_cast<unsigned long long>(Rows()), FLAGS_dim,
      static_cast<unsigned long long>(kTrainerKeys), kSettleMs, BaselineMs(), kBaselinePushes,
      FLAGS_reps);
  std::fflush(stdout);
  Status error;
  tessera::bench::ForEachAlternating(engines.size(), FLAGS_reps, [&](size_t i, int round) {
    Engine& e = engines[i];
    RunOnly(clusters, e.cluster);
    const std::string name = e.name + "-" + std::to_string(round);
    Result<CheckpointRep> rep = MeasureCheckpoint(e, admin_root, name);
    if (!rep.ok()) {
      error = rep.status().WithContext(e.name);
      return false;
    }
    e.reps.push_back(*rep);
    // Checkpoints nobody asked to keep go at once: 10M rows take 1.5 GiB each.
    if (!keep) std::filesystem::remove_all(admin_root + "/" + name, ec);
    return true;
  });
  if (!error.ok()) return Fail(error);
  PrintTable(engines);
  PrintJson(engines);
  return 0;
}
