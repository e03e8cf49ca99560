// bench_sparse: Tessera sparse push (Adagrad applied on the server) and pull throughput and
// latency with Zipf-distributed keys.
//
// Shapes: 100k keys x dim 16 and 1M keys x dim 1 per request; keys drawn from a Zipf law
// (exponent --zipf_s) over --key_space ids. Batches of keys and gradients are generated before
// timing and cycled. For 1 and 2 servers, with 1 request in flight (latency) and with
// --window requests in flight (throughput). keys/s counts the caller's keys (duplicates
// included; the client dedupes them, see "uniq") divided by the number of servers. "call ms"
// is the median time the caller's thread spends inside Push/Pull (dedup, packing, sending),
// the client's share of the work.
//
// Servers run as child processes (tessera-server next to this program) unless
// --server_mode=thread. The last line of output is one JSON object.
#include <gflags/gflags.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <deque>
#include <memory>
#include <sstream>
#include <string>
#include <unordered_set>
#include <vector>

#include "benchmarks/bench_cluster.h"
#include "benchmarks/bench_keys.h"
#include "benchmarks/bench_stats.h"
#include "ps/client/client.h"

DEFINE_bool(quick, false, "Short run (under a minute): fewer, shorter repetitions");
DEFINE_int32(reps, 0, "Repetitions per cell (0: 3 with --quick, else 7)");
DEFINE_double(rep_seconds, 0,
              "Target duration of one repetition (0: 0.2 s with --quick, else 1 s)");
DEFINE_double(zipf_s, 1.05, "Zipf exponent of the key distribution");
DEFINE_uint64(key_space, 10000000, "Number of distinct ids keys are drawn from");
DEFINE_uint32(batches, 8, "Distinct pre-generated requests per shape, cycled (4 with --quick)");
DEFINE_uint32(window, 4,
              "Requests in flight for the throughput rows (not run by --quick unless given)");
DEFINE_string(server_counts, "1,2", "Numbers of servers to run, comma-separated");
DEFINE_string(shapes, "100000x16,1000000x1", "Request shapes KEYSxDIM, comma-separated");
DEFINE_string(server_mode, "process",
              "process: tessera-server child processes; thread: servers in this process");
DEFINE_string(server_binary, "",
              "tessera-server executable (default: tessera-server next to this program)");
DEFINE_uint32(lanes, 2, "Lanes (executor threads) per Tessera server");
DEFINE_uint64(seed, 42, "Seed of the key and gradient generator");

namespace {

using BenchClock = std::chrono::steady_clock;
using tessera::bench::Median;
using tessera::bench::Percentile;

using tessera::bench::SplitMix64;
using tessera::bench::ZipfSampler;

// ------------------------------------------------------------------ workload

struct Shape {
  uint64_t keys;
  uint32_t dim;
  std::string Name() const {
    const std::string k = keys % 1000000 == 0 ? std::to_string(keys / 1000000) + "M"
                          : keys % 1000 == 0  ? std::to_string(keys / 1000) + "k"
                                              : std::to_string(keys);
    return k + "x" + std::to_string(dim);
  }
};

struct Batch {
  std::vector<uint64_t> keys;
  std::vector<float> grads;
  size_t unique = 0;
};

std::vector<Batch> MakeBatches(const Shape& shape, uint32_t count, uint64_t seed) {
  const ZipfSampler zipf(FLAGS_key_space, FLAGS_zipf_s);
  SplitMix64 rng(seed);
  std::vector<Batch> out(count);
  for (Batch& b : out) {
    b.keys.resize(shape.keys);
    // Rank -> id through an odd multiplier (a bijection): hot ids are spread over the key
    // space like hashed feature ids, not packed at the bottom.
    for (auto& k : b.keys) k = tessera::bench::SpreadId(zipf(rng));
    b.grads.resize(shape.keys * shape.dim);
    for (auto& g : b.grads) g = static_cast<float>(rng.Uniform() - 0.5) * 0.01f;
    std::unordered_set<uint64_t> seen(b.keys.begin(), b.keys.end());
    b.unique = seen.size();
  }
  return out;
}

struct Row {
  std::string name;
  uint32_t servers;
  bool push;
  Shape shape;
  uint32_t window;
  double keys_per_s_per_server;  // median over repetitions
  double unique_keys_per_s_per_server;
  double lat_median_ms, lat_p99_ms;
  double call_median_ms;  // the caller's thread inside Push/Pull
};

std::string JsonNum(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.6g", v);
  return buf;
}

// Parses --shapes into `shapes`; false after printing what was wrong.
bool ParseShapes(std::vector<Shape>& shapes) {
  std::stringstream in(FLAGS_shapes);
  std::string item;
  while (std::getline(in, item, ',')) {
    const size_t x = item.find('x');
    if (x == std::string::npos) {
      std::fprintf(stderr, "bench_sparse: bad shape '%s' (want KEYSxDIM)\n", item.c_str());
      return false;
    }
    shapes.push_back(
        {std::stoull(item.substr(0, x)), static_cast<uint32_t>(std::stoul(item.substr(x + 1)))});
  }
  return true;
}

// The first lines of the output: the workload and the table's header.
void PrintHeader(const std::vector<Shape>& shapes, const std::vector<std::vector<Batch>>& batches,
                 int reps, double rep_s) {
  std::printf(
      "bench_sparse: servers as %s, %u lanes per server, Zipf s=%.2f over %llu ids, "
      "Adagrad; %d reps x %.2f s per cell, medians; keys/s counts the caller's keys "
      "per server\n",
      FLAGS_server_mode == "process" ? "separate processes" : "threads of this process",
      FLAGS_lanes, FLAGS_zipf_s, static_cast<unsigned long long>(FLAGS_key_space), reps, rep_s);
  for (size_t i = 0; i < shapes.size(); ++i) {
    double u = 0;
    for (const Batch& b : batches[i]) u += static_cast<double>(b.unique) / b.keys.size();
    std::printf("  shape %s: %.1f%% of a request's keys are unique\n", shapes[i].Name().c_str(),
                100.0 * u / batches[i].size());
  }
  std::printf("%-22s %14s %14s %10s %10s %10s\n", "cell", "keys/s/server", "uniq/s/server",
              "med ms", "p99 ms", "call ms");
  std::fflush(stdout);
}

// How long each cell runs.
struct Timing {
  int reps;
  double rep_s;
  uint64_t min_ops;  // requests per repetition at least
};

// Runs the cell of `row` (push or pull of the batches `bs` to `table`, row.window requests in
// flight): a warm-up, then timing.reps repetitions; fills the figures of `row`. The first error
// of a request.
tessera::Status MeasureCell(tessera::Client& client, const tessera::Table& table,
                            const std::vector<Batch>& bs, std::vector<std::vector<float>>& outs,
                            const Timing& timing, Row& row) {
  const bool push = row.push;
  const uint32_t window = row.window;
  const double nservers = row.servers;
  std::vector<double> rates, unique_rates, lat_ms, call_ms;
  tessera::Status error;
  uint64_t seq = 0;
  for (int r = -1; r < timing.reps; ++r) {  // r == -1: warm-up
    std::deque<std::pair<tessera::Handle, BenchClock::time_point>> q;
    uint64_t ops = 0, keys = 0, unique = 0;
    const auto start = BenchClock::now();
    const auto until =
        start + std::chrono::duration_cast<BenchClock::duration>(
                    std::chrono::duration<double>(r < 0 ? timing.rep_s / 4 : timing.rep_s));
    bool issuing = true;
    while (issuing || !q.empty()) {
      while (issuing && q.size() < window) {
        const Batch& b = bs[seq % bs.size()];
        float* out = outs[seq % window].data();
        ++seq;
        const auto t0 = BenchClock::now();
        q.emplace_back(push ? client.Push(table, b.keys, b.grads) : client.Pull(table, b.keys, out),
                       t0);
        if (r >= 0) {
          call_ms.push_back(
              std::chrono::duration<double, std::milli>(BenchClock::now() - t0).count());
        }
        keys += b.keys.size();
        unique += b.unique;
      }
      tessera::Status s = client.Wait(q.front().first);
      if (!s.ok() && error.ok()) error = s;
      const auto now = BenchClock::now();
      if (r >= 0) {
        lat_ms.push_back(std::chrono::duration<double, std::milli>(now - q.front().second).count());
      }
      q.pop_front();
      ++ops;
      if (now >= until && ops >= (r < 0 ? 1 : timing.min_ops)) issuing = false;
    }
    const double secs = std::chrono::duration<double>(BenchClock::now() - start).count();
    if (r >= 0) {
      rates.push_back(static_cast<double>(keys) / secs / nservers);
      unique_rates.push_back(static_cast<double>(unique) / secs / nservers);
    }
  }
  if (!error.ok()) return error;
  row.keys_per_s_per_server = Median(rates);
  row.unique_keys_per_s_per_server = Median(unique_rates);
  row.lat_median_ms = Median(lat_ms);
  row.lat_p99_ms = Percentile(lat_ms, 0.99);
  row.call_median_ms = Median(call_ms);
  return tessera::Status::OK();
}

// Creates the table of `shape` through `client` (a cluster of `nservers`), the rows its batches
// `bs` touch, and measures its cells (push and pull, each of `windows`), printing each and
// adding it to `rows`. 0, or 1 after printing an error.
int MeasureShape(tessera::Client& client, uint64_t nservers, const Shape& shape,
                 const std::vector<Batch>& bs, const std::vector<uint32_t>& windows,
                 const Timing& timing, std::vector<Row>& rows) {
  tessera::OptimizerSpec opt;
  opt.kind = tessera::OptimizerKind::kAdagrad;
  opt.learning_rate = 0.05f;
  opt.initial_accumulator = 0.1f;
  tessera::InitializerSpec init;
  init.kind = tessera::InitializerKind::kUniform;
  init.a = -0.01f;
  init.b = 0.01f;
  auto table_or = client.CreateTable(
      tessera::TableSpec::Sparse("bench_sparse_" + shape.Name(), shape.dim, opt, init));
  if (!table_or.ok()) {
    std::fprintf(stderr, "bench_sparse: CreateTable: %s\n", table_or.status().ToString().c_str());
    return 1;
  }
  const tessera::Table table = *table_or;
  std::vector<std::vector<float>> outs(FLAGS_window, std::vector<float>(shape.keys * shape.dim));
  // Create every row the batches touch, so timing sees the steady state.
  for (const Batch& b : bs) {
    tessera::Status s = client.Wait(client.Pull(table, b.keys, outs[0].data()));
    if (!s.ok()) {
      std::fprintf(stderr, "bench_sparse: warm-up pull: %s\n", s.ToString().c_str());
      return 1;
    }
  }
  for (bool push : {true, false}) {
    for (uint32_t window : windows) {
      Row row{"", static_cast<uint32_t>(nservers), push, shape, window, 0, 0, 0, 0, 0};
      row.name = std::string(push ? "push" : "pull") + "/" + shape.Name() + "/s" +
                 std::to_string(nservers) + "/w" + std::to_string(window);
      if (tessera::Status error = MeasureCell(client, table, bs, outs, timing, row); !error.ok()) {
        std::fprintf(stderr, "bench_sparse: %s: %s\n", row.name.c_str(), error.ToString().c_str());
        return 1;
      }
      std::printf("%-22s %14.3e %14.3e %10.2f %10.2f %10.2f\n", row.name.c_str(),
                  row.keys_per_s_per_server, row.unique_keys_per_s_per_server, row.lat_median_ms,
                  row.lat_p99_ms, row.call_median_ms);
      std::fflush(stdout);
      rows.push_back(row);
    }
  }
  return 0;
}

// The last line of the output: the headline figures (1 server, 1 request in flight) and every
// row.
std::string Json(const std::vector<Row>& rows) {
  std::string json = "{\"bench\":\"sparse\",\"server_mode\":\"" + FLAGS_server_mode +
                     "\",\"zipf_s\":" + JsonNum(FLAGS_zipf_s) +
                     ",\"key_space\":" + std::to_string(FLAGS_key_space);
  auto put = [&](const std::string& key, double v) { json += ",\"" + key + "\":" + JsonNum(v); };
  // Headline: 1 server, 1 request in flight.
  for (const Row& r : rows) {
    if (r.servers != 1 || r.window != 1) continue;
    const std::string base = std::string(r.push ? "push_" : "pull_") +
                             (r.shape.keys == 100000    ? "100k"
                              : r.shape.keys == 1000000 ? "1M"
                                                        : std::to_string(r.shape.keys)) +
                             "_x" + std::to_string(r.shape.dim);
    put(base + "_keys_per_s", r.keys_per_s_per_server);
    put(base + "_latency_median_ms", r.lat_median_ms);
    put(base + "_latency_p99_ms", r.lat_p99_ms);
    put(base + "_call_median_ms", r.call_median_ms);
  }
  json += ",\"rows\":[";
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    json += std::string(i ? "," : "") + "{\"cell\":\"" + r.name +
            "\",\"keys_per_s_per_server\":" + JsonNum(r.keys_per_s_per_server) +
            ",\"unique_keys_per_s_per_server\":" + JsonNum(r.unique_keys_per_s_per_server) +
            ",\"latency_median_ms\":" + JsonNum(r.lat_median_ms) +
            ",\"latency_p99_ms\":" + JsonNum(r.lat_p99_ms) +
            ",\"call_median_ms\":" + JsonNum(r.call_median_ms) + "}";
  }
  json += "]}";
  return json;
}

}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage("bench_sparse [--quick]\nTessera sparse push (Adagrad) and pull.");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  if (FLAGS_server_mode != "process" && FLAGS_server_mode != "thread") {
    std::fprintf(stderr, "bench_sparse: --server_mode must be process or thread\n");
    return 2;
  }
  const int reps = FLAGS_reps > 0 ? FLAGS_reps : (FLAGS_quick ? 3 : 7);
  const double rep_s = FLAGS_rep_seconds > 0 ? FLAGS_rep_seconds : (FLAGS_quick ? 0.2 : 1.0);
  const std::string server_binary = !FLAGS_server_binary.empty()
                                        ? FLAGS_server_binary
                                        : tessera::bench::DefaultServerBinary(argv[0]);
  if (FLAGS_server_mode == "process" && access(server_binary.c_str(), X_OK) != 0) {
    std::fprintf(stderr, "bench_sparse: no tessera-server at %s (see --server_binary)\n",
                 server_binary.c_str());
    return 2;
  }
  std::vector<Shape> shapes;
  if (!ParseShapes(shapes)) return 2;
  const std::vector<uint64_t> counts = tessera::bench::ParseList(FLAGS_server_counts);
  if (FLAGS_window == 0 || FLAGS_batches == 0) {
    std::fprintf(stderr, "bench_sparse: --window and --batches must be positive\n");
    return 2;
  }

  // Requests per repetition at least (1M-key requests take a large part of a second).
  const Timing timing{reps, rep_s, FLAGS_quick ? 2u : 3u};
  const uint32_t num_batches =
      gflags::GetCommandLineFlagInfoOrDie("batches").is_default && FLAGS_quick ? 4 : FLAGS_batches;
  // --quick measures 1 in flight only, unless --window is given.
  std::vector<uint32_t> windows = {1};
  const bool window_set = !gflags::GetCommandLineFlagInfoOrDie("window").is_default;
  if (FLAGS_window > 1 && (!FLAGS_quick || window_set)) windows.push_back(FLAGS_window);

  // Generate every request before timing anything.
  std::vector<std::vector<Batch>> batches;
  for (size_t i = 0; i < shapes.size(); ++i) {
    batches.push_back(MakeBatches(shapes[i], num_batches, FLAGS_seed + i));
  }
  PrintHeader(shapes, batches, reps, rep_s);

  std::vector<Row> rows;
  for (uint64_t nservers : counts) {
    if (nservers < 1 || nservers > 64) {
      std::fprintf(stderr, "bench_sparse: server counts must be 1..64\n");
      return 2;
    }
    tessera::bench::BenchCluster cluster;
    if (const tessera::Status st = cluster.Start(static_cast<uint32_t>(nservers), FLAGS_server_mode,
                                                 server_binary, FLAGS_lanes);
        !st.ok()) {
      if (FLAGS_server_mode == "thread") {
        std::fprintf(stderr, "bench_sparse: server: %s\n", st.ToString().c_str());
      } else {
        std::fprintf(stderr, "bench_sparse: %s\n", st.message().c_str());
      }
      return 1;
    }
    tessera::ClientOptions co;
    co.servers = cluster.endpoints();
    auto client_or = tessera::Client::Create(co);
    if (!client_or.ok()) {
      std::fprintf(stderr, "bench_sparse: client: %s\n", client_or.status().ToString().c_str());
      return 1;
    }
    std::unique_ptr<tessera::Client> client = std::move(*client_or);
    for (size_t si = 0; si < shapes.size(); ++si) {
      if (int rc = MeasureShape(*client, nservers, shapes[si], batches[si], windows, timing, rows);
          rc != 0) {
        return rc;
      }
    }
    client.reset();
  }
  std::printf("%s\n", Json(rows).c_str());
  return 0;
}
