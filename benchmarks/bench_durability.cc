// bench_durability: push throughput of a server on RocksDB in strict durability (with the
// request log that keeps multi-lane pushes whole) vs relaxed, and vs a memory-only server, in
// one run: three 1-server clusters as child processes, repetitions alternating between them
// (bench_stats.h: forwards, then backwards, ...).
// Pushes of 100k keys x dim 16 (Adagrad), keys uniform over --key_space. Last line: JSON.
#include <gflags/gflags.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "benchmarks/bench_cluster.h"
#include "benchmarks/bench_stats.h"
#include "ps/client/client.h"

DEFINE_bool(quick, false, "Short run (under a minute)");
DEFINE_uint32(keys, 100000, "Keys per push");
DEFINE_uint32(dim, 16, "Floats per key");
DEFINE_uint64(key_space, 2000000, "Distinct keys drawn from");
DEFINE_int32(reps, 0, "Repetitions per configuration (0: 3 with --quick, else 7)");
DEFINE_int32(pushes, 0, "Pushes per repetition (0: 5 with --quick, else 20)");
DEFINE_string(server_binary, "", "tessera-server (default: next to this program)");

namespace {
using BenchClock = std::chrono::steady_clock;
using tessera::bench::Median;
}  // namespace

int main(int argc, char** argv) {
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  const int reps = FLAGS_reps > 0 ? FLAGS_reps : (FLAGS_quick ? 3 : 7);
  const int pushes = FLAGS_pushes > 0 ? FLAGS_pushes : (FLAGS_quick ? 5 : 20);
  const std::string binary = FLAGS_server_binary.empty()
                                 ? tessera::bench::DefaultServerBinary(argv[0])
                                 : FLAGS_server_binary;
  const std::string root = (std::filesystem::temp_directory_path() /
                            ("tessera-bench-durability-" + std::to_string(getpid())))
                               .string();
  struct Config {
    const char* name;
    std::vector<std::string> flags;
    tessera::bench::BenchCluster cluster;
    std::unique_ptr<tessera::Client> client;
    tessera::Table table;
    std::vector<double> rates;
  };
  std::vector<Config> configs(3);
  configs[0].name = "memory";
  configs[1].name = "rocksdb_relaxed";
  configs[1].flags = {"--data_dir=" + root + "/relaxed", "--durability=relaxed"};
  configs[2].name = "rocksdb_strict";
  configs[2].flags = {"--data_dir=" + root + "/strict", "--durability=strict"};
  tessera::OptimizerSpec adagrad{.kind = tessera::OptimizerKind::kAdagrad, .learning_rate = 0.05f};
  for (auto& c : configs) {
    if (auto s = c.cluster.Start(1, "process", binary, 2, c.flags); !s.ok()) {
      std::fprintf(stderr, "bench_durability: %s\n", s.ToString().c_str());
      return 1;
    }
    tessera::ClientOptions co;
    co.servers = c.cluster.endpoints();
    auto client = tessera::Client::Create(co);
    if (!client.ok()) return 1;
    c.client = std::move(*client);
    auto t = c.client->CreateTable(tessera::TableSpec::Sparse("d", FLAGS_dim, adagrad));
    if (!t.ok()) return 1;
    c.table = *t;
  }
  std::mt19937_64 rng(7);
  std::vector<std::vector<uint64_t>> batches(8, std::vector<uint64_t>(FLAGS_keys));
  for (auto& b : batches) {
    for (auto& k : b) k = rng() % FLAGS_key_space;
  }
  std::vector<float> grads(size_t{FLAGS_keys} * FLAGS_dim, 0.01f);
  // `pushes` pushes to configuration c; its keys/s.
  auto run = [&](Config& c) -> std::optional<double> {
    const auto t0 = BenchClock::now();
    for (int p = 0; p < pushes; ++p) {
      auto s = c.client->Wait(c.client->Push(c.table, batches[p % batches.size()], grads));
      if (!s.ok()) {
        std::fprintf(stderr, "bench_durability: %s: %s\n", c.name, s.ToString().c_str());
        return std::nullopt;
      }
    }
    const double secs = std::chrono::duration<double>(BenchClock::now() - t0).count();
    return static_cast<double>(FLAGS_keys) * pushes / secs;
  };
  for (auto& c : configs) {  // warm-up (creates the rows), not measured
    if (!run(c)) return 1;
  }
  auto rates = tessera::bench::AlternateRepetitions(configs.size(), reps,
                                                    [&](size_t c, int) { return run(configs[c]); });
  if (!rates) return 1;
  for (size_t c = 0; c < configs.size(); ++c) configs[c].rates = (*rates)[c];
  std::printf(
      "bench_durability: 1 server (child process, 2 lanes), pushes of %u keys x dim %u "
      "(Adagrad), %d pushes x %d repetitions, medians\n",
      FLAGS_keys, FLAGS_dim, pushes, reps);
  std::printf("%-18s %14s %10s\n", "configuration", "keys/s", "vs memory");
  const double mem = Median(configs[0].rates);
  for (auto& c : configs) {
    std::printf("%-18s %14.0f %10.2f\n", c.name, Median(c.rates), Median(c.rates) / mem);
  }
  const double relaxed = Median(configs[1].rates), strict = Median(configs[2].rates);
  std::printf(
      "{\"bench\":\"durability\",\"keys\":%u,\"dim\":%u,\"memory_keys_per_s\":%.0f,"
      "\"relaxed_keys_per_s\":%.0f,\"strict_keys_per_s\":%.0f,"
      "\"server_strict_vs_relaxed_push\":%.3f,\"server_strict_vs_memory_push\":%.3f}\n",
      FLAGS_keys, FLAGS_dim, mem, relaxed, strict, strict / relaxed, strict / mem);
  for (auto& c : configs) {
    c.client.reset();
    c.cluster.Stop();
  }
  std::error_code ec;
  std::filesystem::remove_all(root, ec);
  return 0;
}
