// bench_dense_move: a dense part moving while a client pushes (docs/elasticity.md, "Moving dense
// parts"). A real etcd and three tessera-server processes (memory tier, 2 lanes) follow a map
// of all three, so each serves a part of the dense table; one client pushes the whole table
// (--floats floats, Adagrad: as many again of optimizer state) and waits, back to back. The
// controller of `tessera-ctl scale` (in this process) then drains server 2 (`scale 2`: its part
// moves to server 0), and takes it back (`scale 3`: a part moves to it again).
//
// Figures, in the same run (after 5 untimed pushes that create the chunks): the median and the
// longest push before any scale (the baseline),
// the longest push during each scale (it includes the part's hold: requests for a moving part
// wait at its new primary until the copy is in), the push rate over each whole scale against
// the rate before (caller floats: the whole table per push), and the controller's longest hold.
// Ends with one line of JSON ("bench":"dense_move").
#include <gflags/gflags.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "benchmarks/bench_cluster.h"
#include "benchmarks/bench_etcd.h"
#include "benchmarks/bench_stats.h"

DEFINE_uint64(floats, 3 << 20, "Floats in the dense table (each of the 3 parts a third)");
DEFINE_double(phase_s, 2, "Seconds of pushing before, between and after the scales");
DEFINE_string(server_binary, "", "tessera-server (default: next to this program)");
DEFINE_string(etcd, "/usr/bin/etcd", "The etcd binary");

namespace {

using tessera::Status;
using tessera::bench::Clock;

int Fail(const Status& s) {
  std::fprintf(stderr, "bench_dense_move: %s\n", s.ToString().c_str());
  return 1;
}

// Each push's start and end, from the pushing thread.
struct PushTimes {
  std::mutex mu;
  std::vector<std::pair<Clock::time_point, Clock::time_point>> done;
  std::atomic<bool> stop{false};
  Status error;

  // Milliseconds of the pushes that ended in [from, to).
  std::vector<double> Ms(Clock::time_point from, Clock::time_point to) {
    std::lock_guard<std::mutex> l(mu);
    std::vector<double> out;
    for (auto& [begin, end] : done) {
      if (end >= from && end < to) {
        out.push_back(std::chrono::duration<double, std::milli>(end - begin).count());
      }
    }
    return out;
  }
};

double Max(const std::vector<double>& v) {
  return v.empty() ? 0 : *std::max_element(v.begin(), v.end());
}

// Prints the figures of the run: the pushes before the scales (from `t_before`) and during
// each of `moves`, and the JSON line.
void PrintFigures(PushTimes& pushes, Clock::time_point t_before,
                  const tessera::bench::ScaleRun (&moves)[2]) {
  const std::vector<double> before = pushes.Ms(t_before, moves[0].begin);
  const double median = tessera::bench::Median(before);
  const double rate_before =
      before.size() / std::chrono::duration<double>(moves[0].begin - t_before).count();
  std::printf(
      "dense table of %llu floats (+%llu Adagrad state) in 3 parts; one client pushing "
      "the whole table back to back\n",
      static_cast<unsigned long long>(FLAGS_floats), static_cast<unsigned long long>(FLAGS_floats));
  std::printf("  before: %zu pushes, median %.2f ms, longest %.2f ms\n", before.size(), median,
              Max(before));
  std::string json = "{\"bench\":\"dense_move\",\"floats\":" + std::to_string(FLAGS_floats) +
                     ",\"push_median_ms_before\":" + std::to_string(median) +
                     ",\"push_max_ms_before\":" + std::to_string(Max(before));
  for (const tessera::bench::ScaleRun& m : moves) {
    const std::vector<double> during = pushes.Ms(m.begin, m.end);
    const double secs = std::chrono::duration<double>(m.end - m.begin).count();
    const double ratio = during.size() / std::max(1e-9, secs) / std::max(1e-9, rate_before);
    std::printf(
        "  %-10s %.3f s, %u dense parts moved, longest hold %.1f ms: %zu pushes, the "
        "longest %.2f ms (%.1fx the median before); push rate %.2fx of before\n",
        m.name, secs, m.report.dense_parts_moved, m.report.max_hold_ms, during.size(), Max(during),
        Max(during) / std::max(1e-9, median), ratio);
    const std::string n = m.name;
    json += ",\"" + n + "_seconds\":" + std::to_string(secs) + ",\"" + n +
            "_dense_parts_moved\":" + std::to_string(m.report.dense_parts_moved) + ",\"" + n +
            "_max_hold_ms\":" + std::to_string(m.report.max_hold_ms) + ",\"" + n +
            "_push_max_ms\":" + std::to_string(Max(during)) + ",\"" + n +
            "_push_rate_ratio\":" + std::to_string(ratio);
  }
  std::printf("%s}\n", json.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  tessera::bench::CleanUpOnStopSignals();
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  const std::string binary = FLAGS_server_binary.empty()
                                 ? tessera::bench::DefaultServerBinary(argv[0])
                                 : FLAGS_server_binary;
  if (access(FLAGS_etcd.c_str(), X_OK) != 0) {
    return Fail(Status::NotFound("no etcd at " + FLAGS_etcd +
                                 " (Debian: apt-get install etcd-server; or --etcd)"));
  }
  const tessera::bench::TempDir root("tessera-bench-dense-move-");
  tessera::bench::Etcd etcd;
  if (Status s = etcd.Start(root.path(), FLAGS_etcd); !s.ok()) return Fail(s);
  const std::string url = etcd.url("bench");
  auto servers = tessera::bench::StartMapServers(binary, url, {});
  if (!servers.ok()) return Fail(servers.status());
  const std::vector<std::string>& endpoints = servers->endpoints;
  auto map = tessera::bench::CreateMapAndClient(
      url, tessera::ClusterMap::Uniform({{"server-0", endpoints[0]},
                                         {"server-1", endpoints[1]},
                                         {"server-2", endpoints[2]}}));
  if (!map.ok()) return Fail(map.status());
  tessera::Client& c = *map->client;
  tessera::OptimizerSpec adagrad;
  adagrad.kind = tessera::OptimizerKind::kAdagrad;
  auto table = c.CreateTable(tessera::TableSpec::Dense("mlp", FLAGS_floats, adagrad));
  if (!table.ok()) return Fail(table.status());

  const std::vector<float> grads(FLAGS_floats, 0.001f);
  // Warm-up, not timed: the first pushes create the chunks and their optimizer state.
  for (int i = 0; i < 5; ++i) {
    if (Status s = c.Wait(c.DensePush(*table, 0, grads)); !s.ok()) return Fail(s);
  }
  PushTimes pushes;
  std::thread pusher([&] {
    while (!pushes.stop.load()) {
      const auto begin = Clock::now();
      Status s = c.Wait(c.DensePush(*table, 0, grads));
      if (!s.ok()) {
        pushes.error = s;
        return;
      }
      std::lock_guard<std::mutex> l(pushes.mu);
      pushes.done.push_back({begin, Clock::now()});
    }
  });
  auto phase = [] { std::this_thread::sleep_for(std::chrono::duration<double>(FLAGS_phase_s)); };
  tessera::bench::ScaleRun moves[2] = {{"scale_down", 2}, {"scale_up", 3}};
  const auto t_before = Clock::now();
  phase();
  const Status error = tessera::bench::RunScales(*map, {}, moves, phase);
  pushes.stop = true;
  pusher.join();
  if (!error.ok()) return Fail(error);
  if (!pushes.error.ok()) return Fail(pushes.error.WithContext("pushes"));

  PrintFigures(pushes, t_before, moves);
  return 0;
}
