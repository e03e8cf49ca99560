// bench_checkpoint: time to take a consistent checkpoint of a large table, and the pause it
// causes to a client that keeps pushing meanwhile, next to that client's latency without a
// checkpoint (same run).
//
// One server with 2 lanes runs in this process (memory tier, or RocksDB with --data_dir).
// A table of --rows rows x --dim floats (Adagrad: value + accumulator) is filled, then a
// "trainer" thread pushes 1000-key batches in a loop while the checkpoint is taken. The last
// line of output is one JSON object.
#include <gflags/gflags.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <thread>
#include <vector>

#include "benchmarks/bench_stats.h"
#include "ps/client/client.h"
#include "ps/server/server.h"

DEFINE_bool(quick, false, "1M rows instead of --rows (under a minute)");
DEFINE_uint64(rows, 10000000, "Rows in the table");
DEFINE_uint32(dim, 16, "Floats per row");
DEFINE_string(dir, "", "Where to write the checkpoint (default: a temp dir, removed after)");
DEFINE_string(data_dir, "", "Run the server on RocksDB in this directory (default: memory)");

namespace {

using BenchClock = std::chrono::steady_clock;
using tessera::bench::Percentile;

double Ms(BenchClock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

}  // namespace

int main(int argc, char** argv) {
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  const uint64_t rows = FLAGS_quick ? 1000000 : FLAGS_rows;
  const uint32_t dim = FLAGS_dim;
  const std::string tmp =
      (std::filesystem::temp_directory_path() / ("tessera-bench-ckpt-" + std::to_string(getpid())))
          .string();
  const std::string dir = FLAGS_dir.empty() ? tmp + "/ckpt" : FLAGS_dir;
  // The server names checkpoints relative to its admin root: the parent of `dir`.
  std::filesystem::path dir_path = std::filesystem::path(dir).lexically_normal();
  if (!dir_path.has_filename()) dir_path = dir_path.parent_path();  // "DIR/"
  const std::string admin_root = dir_path.has_parent_path() ? dir_path.parent_path().string() : ".";
  const std::string ckpt_name = dir_path.filename().string();

  tessera::ServerOptions so;
  so.listen = "tcp://127.0.0.1:*";
  so.lanes = 2;
  so.storage.data_dir = FLAGS_data_dir;
  so.admin_root = admin_root;
  auto server = tessera::Server::Create(so);
  if (!server.ok()) {
    std::fprintf(stderr, "bench_checkpoint: %s\n", server.status().ToString().c_str());
    return 1;
  }
  tessera::ClientOptions co;
  co.servers = {(*server)->endpoint()};
  co.admin_root = admin_root;
  auto client = tessera::Client::Create(co);
  if (!client.ok()) {
    std::fprintf(stderr, "bench_checkpoint: %s\n", client.status().ToString().c_str());
    return 1;
  }
  auto& c = **client;
  tessera::OptimizerSpec adagrad{.kind = tessera::OptimizerKind::kAdagrad, .learning_rate = 0.01f};
  auto table = c.CreateTable(tessera::TableSpec::Sparse("big", dim, adagrad));
  if (!table.ok()) return 1;

  // Fill: every row gets one update (so it is stored with its optimizer state).
  const auto fill0 = BenchClock::now();
  const uint64_t batch = 100000;
  std::vector<uint64_t> keys(batch);
  std::vector<float> grads(batch * dim, 0.5f);
  for (uint64_t first = 0; first < rows; first += batch) {
    const uint64_t n = std::min(batch, rows - first);
    keys.resize(n);
    grads.resize(n * dim);
    for (uint64_t i = 0; i < n; ++i) keys[i] = first + i;
    if (auto s = c.Wait(c.Push(*table, keys, grads)); !s.ok()) {
      std::fprintf(stderr, "fill: %s\n", s.ToString().c_str());
      return 1;
    }
  }
  const double fill_s = Ms(BenchClock::now() - fill0) / 1000;

  // A trainer pushing small batches; records each push's latency and when it finished.
  std::atomic<bool> stop{false};
  std::vector<std::pair<double, double>> lat;  // (end time ms since t0, latency ms)
  const auto t0 = BenchClock::now();
  std::thread trainer([&] {
    std::vector<uint64_t> k(1000);
    std::vector<float> g(1000 * dim, 0.1f);
    uint64_t next = 0;
    while (!stop.load()) {
      for (auto& key : k) key = (next++ * 7919) % rows;
      const auto a = BenchClock::now();
      if (!c.Wait(c.Push(*table, k, g)).ok()) break;
      const auto b = BenchClock::now();
      lat.emplace_back(Ms(b - t0), Ms(b - a));
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(FLAGS_quick ? 1000 : 2000));
  const double ck_begin = Ms(BenchClock::now() - t0);
  auto cut = c.Checkpoint(ckpt_name);
  const double ck_end = Ms(BenchClock::now() - t0);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  stop = true;
  trainer.join();
  if (!cut.ok()) {
    std::fprintf(stderr, "checkpoint: %s\n", cut.status().ToString().c_str());
    return 1;
  }
  std::vector<double> before, during;
  for (auto& [end, l] : lat) {
    if (end < ck_begin) before.push_back(l);
    // A push that finished during the checkpoint, or the first one after it (it waited).
    else if (end - l <= ck_end)
      during.push_back(l);
  }
  uint64_t bytes = 0;
  for (auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    if (e.is_regular_file()) bytes += e.file_size();
  }
  const double ck_s = (ck_end - ck_begin) / 1000;
  const double pause = during.empty() ? 0 : *std::max_element(during.begin(), during.end());
  std::printf("table: %llu rows x dim %u (Adagrad), filled in %.1f s; server %s\n",
              static_cast<unsigned long long>(rows), dim, fill_s,
              FLAGS_data_dir.empty() ? "memory tier" : "RocksDB");
  std::printf("checkpoint: %.2f s, %.1f MiB written (%.0f MiB/s)\n", ck_s, bytes / 1048576.0,
              bytes / 1048576.0 / ck_s);
  std::printf(
      "trainer push latency: before p50 %.2f ms p99 %.2f ms; during checkpoint max %.1f "
      "ms over %zu pushes\n",
      Percentile(before, 0.5), Percentile(before, 0.99), pause, during.size());
  std::printf(
      "{\"bench\":\"checkpoint\",\"rows\":%llu,\"dim\":%u,\"checkpoint_s\":%.3f,\"bytes\":%llu,"
      "\"pause_max_ms\":%.2f,\"push_p50_before_ms\":%.3f,\"push_p99_before_ms\":%.3f,"
      "\"pause_vs_p99\":%.1f}\n",
      static_cast<unsigned long long>(rows), dim, ck_s, static_cast<unsigned long long>(bytes),
      pause, Percentile(before, 0.5), Percentile(before, 0.99),
      pause / std::max(1e-9, Percentile(before, 0.99)));
  client->reset();
  (*server)->Shutdown();
  std::error_code ec;
  std::filesystem::remove_all(tmp, ec);
  return 0;
}
