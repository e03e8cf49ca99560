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
// Pre-deduped rows (--presorted, 1 server): a request of unique sorted keys (the caller did
// the dedup), Tessera's zero-copy Push(shared_ptr keys, shared_ptr grads) and Pull, alternating
// with a raw ZeroMQ server in a child process (bench_raw_zmq.h) that gets the same keys and
// gradients without copies, reads every key and float, and answers a pull with the rows'
// bytes from its own memory without a copy, which the client copies into the caller's buffer.
// keys/s there counts the request's keys (all unique).
//
// Servers run as child processes (tessera-server next to this program) unless
// --server_mode=thread. The last line of output is one JSON object.
#include <gflags/gflags.h>
#include <unistd.h>

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <memory>
#include <sstream>
#include <string>
#include <unordered_set>
#include <vector>

#include "benchmarks/bench_cluster.h"
#include "benchmarks/bench_keys.h"
#include "benchmarks/bench_raw_zmq.h"
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
DEFINE_string(presorted, "100000x16",
              "Shape KEYSxDIM of the pre-deduped rows (unique sorted keys) against the raw "
              "zero-copy ZeroMQ server, 1 server, 1 and 8 in flight; empty: none");
DEFINE_string(raw_server, "", "Internal: serve as the raw zero-copy ROUTER on this endpoint");

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

// Parses a list of shapes (--shapes) into `shapes`; false after printing what was wrong.
bool ParseShapes(const std::string& text, std::vector<Shape>& shapes) {
  std::stringstream in(text);
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

// ------------------------------------------------------------------ pre-deduped rows

// One pre-deduped cell: Tessera and the raw server, keys/s medians and their ratio.
struct PresortedRow {
  std::string name;
  bool push;
  uint32_t window;
  double tessera_keys_per_s = 0, raw_keys_per_s = 0;
  double ratio() const { return raw_keys_per_s > 0 ? tessera_keys_per_s / raw_keys_per_s : 0; }
};

volatile sig_atomic_t g_raw_stop = 0;

int RawServerMain() {
  struct sigaction sa {};
  sa.sa_handler = [](int) { g_raw_stop = 1; };
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  try {
    tessera::bench::RunEchoServer(FLAGS_raw_server, nullptr, &g_raw_stop, [](const std::string& ep) {
      std::printf("raw ready endpoint=%s\n", ep.c_str());
      std::fflush(stdout);
    });
  } catch (const zmq::error_t& e) {
    std::fprintf(stderr, "raw server: %s\n", e.what());
    return 1;
  }
  return 0;
}

// Runs `issue`/`complete` with `window` in flight for rep_s seconds (at least `min_ops`
// completed); returns ops per second.
template <typename Issue, typename Complete>
double OpsPerSecond(uint32_t window, double rep_s, uint64_t min_ops, Issue issue,
                    Complete complete) {
  const auto start = BenchClock::now();
  const auto until = start + std::chrono::duration_cast<BenchClock::duration>(
                                 std::chrono::duration<double>(rep_s));
  uint64_t issued = 0, done = 0;
  bool issuing = true;
  while (issuing || done < issued) {
    while (issuing && issued - done < window) issue(issued++);
    complete(done++);
    if (BenchClock::now() >= until && done >= min_ops) issuing = false;
  }
  return static_cast<double>(done) / std::chrono::duration<double>(BenchClock::now() - start).count();
}

// The request of the pre-deduped cells: unique sorted ids spread over the key space like hashed
// feature ids, and small gradients.
struct PresortedRequest {
  std::shared_ptr<const std::vector<uint64_t>> keys;
  std::shared_ptr<const std::vector<float>> grads;
};
PresortedRequest MakePresorted(const Shape& shape) {
  std::vector<uint64_t> k(shape.keys);
  for (uint64_t i = 0; i < shape.keys; ++i) k[i] = tessera::bench::SpreadId(i);
  std::sort(k.begin(), k.end());
  k.erase(std::unique(k.begin(), k.end()), k.end());
  SplitMix64 rng(FLAGS_seed);
  std::vector<float> g(k.size() * shape.dim);
  for (float& x : g) x = static_cast<float>(rng.Uniform() - 0.5) * 0.01f;
  return {std::make_shared<const std::vector<uint64_t>>(std::move(k)),
          std::make_shared<const std::vector<float>>(std::move(g))};
}

// The pre-deduped cells on the one-server cluster of `client`: unique sorted keys of
// --presorted's shape, Tessera against the raw server at `raw_endpoint`, alternating. 0, or 1
// after printing an error.
int MeasurePresorted(tessera::Client& client, const std::string& raw_endpoint, const Shape& shape,
                     const Timing& timing, std::vector<PresortedRow>& rows) {
  tessera::OptimizerSpec opt;
  opt.kind = tessera::OptimizerKind::kAdagrad;
  opt.learning_rate = 0.05f;
  opt.initial_accumulator = 0.1f;
  auto table_or = client.CreateTable(
      tessera::TableSpec::Sparse("bench_presorted_" + shape.Name(), shape.dim, opt));
  if (!table_or.ok()) {
    std::fprintf(stderr, "bench_sparse: CreateTable: %s\n", table_or.status().ToString().c_str());
    return 1;
  }
  const tessera::Table table = *table_or;
  const auto [keys, grads] = MakePresorted(shape);
  const uint32_t row_bytes = static_cast<uint32_t>(keys->size() * shape.dim * 4);
  std::vector<std::vector<float>> outs(8, std::vector<float>(keys->size() * shape.dim));
  tessera::bench::RawZcClient raw(raw_endpoint);
  tessera::Status error;
  for (bool push : {true, false}) {
    for (uint32_t window : {1u, 8u}) {
      std::vector<tessera::Handle> handles(window);
      auto tessera_side = [&](double secs) {
        return OpsPerSecond(
            window, secs, timing.min_ops,
            [&](uint64_t id) {
              handles[id % window] = push ? client.Push(table, keys, grads)
                                          : client.Pull(table, *keys, outs[id % window].data());
            },
            [&](uint64_t id) {
              tessera::Status s = client.Wait(handles[id % window]);
              if (!s.ok() && error.ok()) error = s;
            });
      };
      bool raw_ok = true;
      auto raw_side = [&](double secs) {
        return OpsPerSecond(
            window, secs, timing.min_ops,
            [&](uint64_t id) {
              if (push) {
                raw.Issue(id, tessera::bench::kRawZcPush, 0,
                          {{keys->data(), keys->size() * 8}, {grads->data(), grads->size() * 4}});
              } else {
                raw.Issue(id, tessera::bench::kRawZcPull, row_bytes,
                          {{keys->data(), keys->size() * 8}});
              }
            },
            [&](uint64_t id) {
              raw_ok = raw.Complete(push ? nullptr : outs[id % window].data()) && raw_ok;
            });
      };
      tessera_side(timing.rep_s / 4);  // warm-up: rows created, connections up
      raw_side(timing.rep_s / 4);
      std::vector<double> tes, rw;
      tessera::bench::ForEachAlternating(2, timing.reps, [&](size_t side, int) {
        const double ops = side == 0 ? raw_side(timing.rep_s) : tessera_side(timing.rep_s);
        (side == 0 ? rw : tes).push_back(ops * static_cast<double>(keys->size()));
        return error.ok() && raw_ok;
      });
      PresortedRow row{std::string(push ? "push" : "pull") + "/presorted/" + shape.Name() +
                           "/s1/w" + std::to_string(window),
                       push, window, Median(tes), Median(rw)};
      if (!error.ok() || !raw_ok) {
        std::fprintf(stderr, "bench_sparse: %s: %s\n", row.name.c_str(),
                     error.ok() ? "malformed raw reply" : error.ToString().c_str());
        return 1;
      }
      std::printf("%-30s tessera %12.3e keys/s  raw %12.3e keys/s  ratio %5.2f\n",
                  row.name.c_str(), row.tessera_keys_per_s, row.raw_keys_per_s, row.ratio());
      std::fflush(stdout);
      rows.push_back(row);
    }
  }
  return 0;
}

// Parses --shapes and --presorted, and checks --window and --batches; false after printing
// what was wrong.
bool ParseWorkload(std::vector<Shape>& shapes, std::vector<Shape>& presorted) {
  if (!ParseShapes(FLAGS_shapes, shapes)) return false;
  if (!FLAGS_presorted.empty() && !ParseShapes(FLAGS_presorted, presorted)) return false;
  if (FLAGS_window == 0 || FLAGS_batches == 0) {
    std::fprintf(stderr, "bench_sparse: --window and --batches must be positive\n");
    return false;
  }
  return true;
}

// Starts the raw server (this program with --raw_server) and measures the pre-deduped cells.
int RunPresorted(tessera::Client& client, const Shape& shape, const Timing& timing,
                 std::vector<PresortedRow>& rows) {
  tessera::bench::ServerProcess raw;
  const std::string self = std::filesystem::canonical("/proc/self/exe").string();
  auto ep = raw.Start({self, "--raw_server=tcp://127.0.0.1:*"}, "raw ready");
  if (!ep.ok()) {
    std::fprintf(stderr, "bench_sparse: %s\n", ep.status().message().c_str());
    return 1;
  }
  return MeasurePresorted(client, *ep, shape, timing, rows);
}

// The last line of the output: the headline figures (1 server, 1 request in flight) and every
// row.
std::string Json(const std::vector<Row>& rows, const std::vector<PresortedRow>& presorted) {
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
  for (const PresortedRow& r : presorted) {
    const std::string key = std::string("sparse_presorted_") + (r.push ? "push" : "pull") +
                            (r.window == 8 ? "_inflight8" : "") + "_vs_raw_zmq";
    put(key, r.ratio());
  }
  json += ",\"presorted_rows\":[";
  for (size_t i = 0; i < presorted.size(); ++i) {
    const PresortedRow& r = presorted[i];
    json += std::string(i ? "," : "") + "{\"cell\":\"" + r.name +
            "\",\"tessera_keys_per_s\":" + JsonNum(r.tessera_keys_per_s) +
            ",\"raw_keys_per_s\":" + JsonNum(r.raw_keys_per_s) + "}";
  }
  json += "]";
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
  if (!FLAGS_raw_server.empty()) return RawServerMain();
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
  std::vector<Shape> shapes, presorted_shape;
  if (!ParseWorkload(shapes, presorted_shape)) return 2;
  const std::vector<uint64_t> counts = tessera::bench::ParseList(FLAGS_server_counts);

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
  std::vector<PresortedRow> presorted_rows;
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
    if (nservers == 1 && !presorted_shape.empty()) {
      if (int rc = RunPresorted(*client, presorted_shape[0], timing, presorted_rows); rc != 0) {
        return rc;
      }
    }
    client.reset();
  }
  std::printf("%s\n", Json(rows, presorted_rows).c_str());
  return 0;
}
