// bench_transport: raw ZeroMQ DEALER/ROUTER round trips vs Tessera dense push and pull.
//
// For every payload size, server count (1, 2) and window (1 or 8 requests in flight) the same
// bytes travel two ways, alternating repetitions so that the noise of a shared machine hits
// both alike:
//   raw      a DEALER per server talks to a minimal echo ROUTER. "push" sends a 16-byte header
//            and the payload and gets a 16-byte ack; "pull" sends a 16-byte header and gets the
//            header and the payload back, copied into the caller's buffer.
//   touch    pushes only: the same raw push, but the ROUTER adds the payload's floats into a
//            float array of its own before it acks, as a parameter server must (the fair
//            baseline: an ack-only server never reads what it receives, *_vs_zmq_touch).
//   tessera  Client::DensePush / DensePull of a dense SGD table of the same byte size.
//   owned    pushes only: Client::DensePush of a shared_ptr'd buffer, which the client sends
//            without copying it (the tessera side and both raw sides copy the payload into
//            the message: that is the like-for-like comparison; *_owned_vs_zmq_touch).
//   zc       zero-copy raw server (bench_raw_zmq.h): sums every pushed float, answers a pull
//            from its memory uncopied; vs Tessera's zero-copy push / pull (dense16m_*_vs_raw_zmq).
//   whole    16 MiB: a client with dense_chunk_bytes 0 vs the chunked one (*_chunked_vs_unchunked).
// With 2 servers both sides cut the payload into 64 KiB chunks and give each server a
// contiguous half of the chunks, as Tessera's dense placement does.
//
// Servers run as child processes (tessera-server binaries and this program in --echo_server
// mode) unless --server_mode=thread. The last line of output is one JSON object.
#include <gflags/gflags.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "benchmarks/bench_cluster.h"
#include "benchmarks/bench_process.h"
#include "benchmarks/bench_raw_zmq.h"
#include "benchmarks/bench_stats.h"
#include "ps/client/client.h"
#include "ps/routing.h"

DEFINE_bool(quick, false, "Short run (under a minute): fewer, shorter repetitions");
DEFINE_int32(reps, 0, "Repetitions per cell and side (0: 3 with --quick, else 7)");
DEFINE_double(rep_seconds, 0,
              "Target duration of one repetition (0: 0.12 s with --quick, else 0.4 s)");
DEFINE_string(sizes, "4096,65536,1048576,16777216", "Payload sizes in bytes, comma-separated");
DEFINE_string(server_counts, "1,2", "Numbers of servers to run, comma-separated");
DEFINE_string(server_mode, "process",
              "process: tessera-server and echo servers are child processes; thread: they run "
              "in this process");
DEFINE_string(server_binary, "",
              "tessera-server executable (default: tessera-server next to this program)");
DEFINE_uint32(lanes, 2, "Lanes (executor threads) per Tessera server");
DEFINE_string(only, "", "Run only cells whose name contains this text (e.g. push/4KiB)");
DEFINE_bool(loaded, true,
            "Also run the 4 KiB cells of 1 server while a busy-looping process per core competes "
            "for the CPUs (cells .../loaded, keys *_loaded)");
DEFINE_int64(dense_chunk_bytes, -1,
             "Tessera client's ClientOptions::dense_chunk_bytes (-1: the client's default; 0: "
             "one request per server)");
DEFINE_string(echo_server, "",
              "Internal: serve as a raw echo ROUTER bound to this endpoint until SIGTERM");

namespace {

using BenchClock = std::chrono::steady_clock;
using tessera::bench::CpuBurners;
using tessera::bench::Median;

double Seconds(BenchClock::duration d) { return std::chrono::duration<double>(d).count(); }

std::string SizeName(uint64_t bytes) {
  if (bytes >= (1 << 20) && bytes % (1 << 20) == 0) return std::to_string(bytes >> 20) + "MiB";
  if (bytes >= 1024 && bytes % 1024 == 0) return std::to_string(bytes >> 10) + "KiB";
  return std::to_string(bytes) + "B";
}

// ------------------------------------------------------------------ raw echo server

using tessera::bench::kRawPull, tessera::bench::kRawPush, tessera::bench::kRawPushTouch;
using tessera::bench::RawHeader, tessera::bench::RunEchoServer;

volatile sig_atomic_t g_echo_stop = 0;

// ------------------------------------------------------------------ servers

// Tessera servers (a tessera::bench::BenchCluster) and as many echo servers, processes or
// threads.
class Cluster {
 public:
  Cluster() = default;
  Cluster(const Cluster&) = delete;
  Cluster& operator=(const Cluster&) = delete;
  ~Cluster() { Stop(); }

  bool Start(uint32_t n, const std::string& self, const std::string& server_binary) {
    const bool threads = FLAGS_server_mode == "thread";
    if (const tessera::Status st = tessera_.Start(n, FLAGS_server_mode, server_binary, FLAGS_lanes);
        !st.ok()) {
      if (threads) {
        std::fprintf(stderr, "bench: server: %s\n", st.ToString().c_str());
      } else {
        std::fprintf(stderr, "bench: %s\n", st.message().c_str());
      }
      return false;
    }
    for (uint32_t r = 0; r < n; ++r) {
      if (threads) {
        auto bound = std::make_shared<std::promise<std::string>>();
        std::future<std::string> ready = bound->get_future();
        echo_threads_.emplace_back([this, bound] {
          RunEchoServer("tcp://127.0.0.1:*", &echo_stop_, &g_echo_stop,
                        [&bound](const std::string& ep) { bound->set_value(ep); });
        });
        echo_endpoints.push_back(ready.get());
      } else {
        auto e = std::make_unique<tessera::bench::ServerProcess>();
        auto ep = e->Start({self, "--echo_server=tcp://127.0.0.1:*"}, "echo ready");
        if (!ep.ok()) {
          std::fprintf(stderr, "bench: %s\n", ep.status().message().c_str());
          return false;
        }
        echo_endpoints.push_back(*ep);
        echo_processes_.push_back(std::move(e));
      }
    }
    return true;
  }

  void Stop() {
    echo_stop_.store(true);
    for (auto& t : echo_threads_) t.join();
    echo_threads_.clear();
    tessera_.Stop();
    echo_processes_.clear();
  }

  const std::vector<std::string>& tessera_endpoints() const { return tessera_.endpoints(); }
  std::vector<std::string> echo_endpoints;

 private:
  tessera::bench::BenchCluster tessera_;
  std::atomic<bool> echo_stop_{false};
  std::vector<std::thread> echo_threads_;
  std::vector<std::unique_ptr<tessera::bench::ServerProcess>> echo_processes_;
};

// ------------------------------------------------------------------ workloads

// Byte range [begin, end) of a `bytes` payload that server `s` of `n` gets: exactly the part
// Tessera's dense placement gives that server for the table of that size.
std::pair<uint64_t, uint64_t> PartOf(uint64_t table_id, uint64_t bytes, uint32_t s, uint32_t n) {
  const tessera::DenseRange r = tessera::DenseRangeOfServer(table_id, bytes / 4, s, n);
  return {r.begin * 4, r.end * 4};
}

std::string TableName(uint64_t bytes) { return "bench_dense_" + std::to_string(bytes); }

// One repetition's result.
struct RepResult {
  double seconds = 0;
  uint64_t ops = 0;
  std::vector<double> latencies_us;
};

// Runs ops until `target_s` has passed (and at least `min_ops` completed), keeping `window`
// in flight. Issue(i) starts op i; Complete(i) blocks until op i is done. Ops complete in order.
template <typename IssueFn, typename CompleteFn>
RepResult RunWindow(uint32_t window, double target_s, uint64_t min_ops, IssueFn issue,
                    CompleteFn complete) {
  RepResult r;
  std::deque<std::pair<uint64_t, BenchClock::time_point>> q;
  const auto start = BenchClock::now();
  const auto until = start + std::chrono::duration_cast<BenchClock::duration>(
                                 std::chrono::duration<double>(target_s));
  uint64_t next = 0;
  bool issuing = true;
  while (issuing || !q.empty()) {
    while (issuing && q.size() < window) {
      q.emplace_back(next, BenchClock::now());
      issue(next++);
    }
    auto [id, t0] = q.front();
    q.pop_front();
    complete(id);
    const auto now = BenchClock::now();
    r.latencies_us.push_back(std::chrono::duration<double, std::micro>(now - t0).count());
    ++r.ops;
    if (issuing && now >= until && next >= min_ops) issuing = false;
  }
  r.seconds = Seconds(BenchClock::now() - start);
  return r;
}

// Raw ZeroMQ client: one DEALER per server.
class RawClient {
 public:
  explicit RawClient(const std::vector<std::string>& endpoints) : ctx_(1) {
    for (const auto& ep : endpoints) {
      zmq::socket_t s(ctx_, zmq::socket_type::dealer);
      s.set(zmq::sockopt::linger, 0);
      s.set(zmq::sockopt::sndhwm, 0);
      s.set(zmq::sockopt::rcvhwm, 0);
      s.connect(ep);
      dealers_.push_back(std::move(s));
    }
    ops_.resize(kRing);
  }

  // Starts op `id`: push of `src` or pull into `dst` (bytes each), split over servers.
  void Issue(uint64_t id, uint32_t op, const char* src, char* dst, uint64_t bytes,
             uint64_t table_id) {
    Op& o = ops_[id % kRing];
    o.id = id;
    o.dst = dst;
    o.remaining = 0;
    const uint32_t n = static_cast<uint32_t>(dealers_.size());
    for (uint32_t s = 0; s < n; ++s) {
      const auto [b, e] = PartOf(table_id, bytes, s, n);
      if (b >= e) continue;
      ++o.remaining;
      RawHeader h{id, op, static_cast<uint32_t>(e - b)};
      if (op == tessera::bench::kRawZcPush) {
        dealers_[s].send(zmq::const_buffer(&h, sizeof(h)), zmq::send_flags::sndmore);
        zmq::message_t payload = tessera::bench::ZeroCopyFrame(src + b, e - b);
        dealers_[s].send(payload, zmq::send_flags::none);
      } else if (op == kRawPush || op == kRawPushTouch) {
        dealers_[s].send(zmq::const_buffer(&h, sizeof(h)), zmq::send_flags::sndmore);
        // Copied like Tessera copies the caller's span.
        zmq::message_t payload(src + b, e - b);
        dealers_[s].send(payload, zmq::send_flags::none);
      } else {
        o.offset[s] = b;
        dealers_[s].send(zmq::const_buffer(&h, sizeof(h)), zmq::send_flags::none);
      }
    }
  }

  // Receives replies until op `id` is complete.
  void Complete(uint64_t id) {
    std::vector<zmq::pollitem_t> items;
    for (auto& d : dealers_) items.push_back({d.handle(), 0, ZMQ_POLLIN, 0});
    while (ops_[id % kRing].remaining > 0) {
      zmq::poll(items.data(), items.size(), std::chrono::milliseconds(-1));
      for (size_t s = 0; s < dealers_.size(); ++s) {
        if (!(items[s].revents & ZMQ_POLLIN)) continue;
        for (;;) {
          std::vector<zmq::message_t> parts;
          auto got = zmq::recv_multipart(dealers_[s], std::back_inserter(parts),
                                         zmq::recv_flags::dontwait);
          if (!got) break;
          RawHeader h;
          std::memcpy(&h, parts[0].data(), sizeof(h));
          Op& o = ops_[h.id % kRing];
          if (parts.size() == 2) std::memcpy(o.dst + o.offset[s], parts[1].data(), parts[1].size());
          --o.remaining;
        }
      }
    }
  }

 private:
  static constexpr size_t kRing = 1024;
  static constexpr size_t kMaxServers = 8;
  struct Op {
    uint64_t id = 0;
    char* dst = nullptr;
    uint32_t remaining = 0;
    uint64_t offset[kMaxServers] = {};
  };
  zmq::context_t ctx_;
  std::vector<zmq::socket_t> dealers_;
  std::vector<Op> ops_;
};

struct Cell {
  uint32_t servers;
  bool push;
  uint64_t bytes;
  uint32_t window;
  bool loaded = false;  // busy-looping processes compete for every core
  std::string Name() const {
    return std::string(push ? "push" : "pull") + "/" + SizeName(bytes) + "/s" +
           std::to_string(servers) + "/w" + std::to_string(window) + (loaded ? "/loaded" : "");
  }
};

struct Side {
  std::vector<double> mbps;  // per repetition
  std::vector<double> ops_per_s;
  std::vector<double> latencies_us;
  void Add(const RepResult& r, uint64_t bytes) {
    ops_per_s.push_back(r.ops / r.seconds);
    mbps.push_back(r.ops * static_cast<double>(bytes) / r.seconds / 1e6);
    latencies_us.insert(latencies_us.end(), r.latencies_us.begin(), r.latencies_us.end());
  }
};

struct Row {
  Cell cell;
  double raw_mbps, tes_mbps, raw_lat_us, tes_lat_us, raw_rate, tes_rate;
  // Pushes: the touching raw server's figures (0 for pulls).
  double touch_mbps = 0, touch_lat_us = 0, touch_rate = 0;
  double owned_mbps = 0;  // Tessera's zero-copy push (pushes only)
  double zc_mbps = 0;     // the zero-copy raw server that reads the data (bench_raw_zmq.h)
  double whole_mbps = 0;  // 16 MiB: the unchunked client's zero-copy push or pull
  double tput_ratio() const { return raw_mbps > 0 ? tes_mbps / raw_mbps : 0; }
  double lat_ratio() const { return raw_lat_us > 0 ? tes_lat_us / raw_lat_us : 0; }
  double touch_ratio() const { return touch_mbps > 0 ? tes_mbps / touch_mbps : 0; }
  double owned_touch_ratio() const { return touch_mbps > 0 ? owned_mbps / touch_mbps : 0; }
  // Tessera against the zero-copy raw server: its zero-copy push (owned), or its pull.
  double zc_ratio() const { return zc_mbps > 0 ? (cell.push ? owned_mbps : tes_mbps) / zc_mbps : 0; }
  double zc_copy_ratio() const { return zc_mbps > 0 ? tes_mbps / zc_mbps : 0; }
};

std::string JsonNum(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.6g", v);
  return buf;
}

int EchoServerMain() {
  struct sigaction sa {};
  sa.sa_handler = [](int) { g_echo_stop = 1; };
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  try {
    RunEchoServer(FLAGS_echo_server, nullptr, &g_echo_stop, [](const std::string& ep) {
      std::printf("echo ready endpoint=%s\n", ep.c_str());
      std::fflush(stdout);
    });
  } catch (const zmq::error_t& e) {
    std::fprintf(stderr, "echo server: %s\n", e.what());
    return 1;
  }
  return 0;
}

// Whether every size of --sizes and count of --server_counts is valid; prints what is not.
bool ValidSizesAndCounts(const std::vector<uint64_t>& sizes, const std::vector<uint64_t>& counts) {
  for (uint64_t s : sizes) {
    if (s == 0 || s % 4 != 0 || s > (uint64_t{1} << 30)) {
      std::fprintf(stderr, "bench_transport: sizes must be multiples of 4 up to 1 GiB\n");
      return false;
    }
  }
  for (uint64_t c : counts) {
    if (c < 1 || c > 8) {
      std::fprintf(stderr, "bench_transport: server counts must be 1..8\n");
      return false;
    }
  }
  return true;
}

// The first lines of the output: the setup and the table's header.
void PrintHeader(int reps, double rep_s) {
  std::printf(
      "bench_transport: servers as %s, %u lanes per Tessera server, %d reps x %.2f s "
      "per side and cell (alternating raw / Tessera), medians; MB = 1e6 bytes\n",
      FLAGS_server_mode == "process" ? "separate processes" : "threads of this process",
      FLAGS_lanes, reps, rep_s);
  std::printf(
      "raw: the server acks pushes unread; touch: it adds each pushed payload into its own "
      "floats first (pushes only); ratios are Tessera / raw, and Tessera / touch; own: "
      "Tessera's zero-copy push, and its ratio to touch\n");
  std::printf(
      "zc: the zero-copy raw server that reads every float (bench_raw_zmq.h); its ratio is "
      "Tessera's zero-copy push (own) or its pull / zc\n");
  std::printf("%-22s %10s %10s %6s %10s %10s %6s %10s %10s %6s %10s %6s %10s %6s %10s %6s\n",
              "cell", "raw MB/s", "tes MB/s", "ratio", "raw us", "tes us", "ratio", "raw op/s",
              "tes op/s", "ratio", "touch MB/s", "ratio", "own MB/s", "ratio", "zc MB/s", "ratio");
  std::fflush(stdout);
}

// What the cells of one payload size run against: the clients, the dense table, and the
// payloads.
struct Target {
  tessera::Client& client;
  RawClient& raw;
  const tessera::Table table;
  const char* src;
  char* dst;
  std::span<const float> grads;                           // src as floats
  std::shared_ptr<const std::vector<float>> owned_grads;  // a copy, for the zero-copy push
  // A client that sends one request per server (dense_chunk_bytes 0), for the 16 MiB cells'
  // "whole" side: chunked against unchunked in the same run.
  tessera::Client& whole_client;
};

// Prints the table line of `row`.
void PrintRow(const Row& row) {
  std::printf(
      "%-22s %10.1f %10.1f %6.2f %10.1f %10.1f %6.2f %10.0f %10.0f %6.2f %10.1f %6.2f "
      "%10.1f %6.2f %10.1f %6.2f\n",
      row.cell.Name().c_str(), row.raw_mbps, row.tes_mbps, row.tput_ratio(), row.raw_lat_us,
      row.tes_lat_us, row.lat_ratio(), row.raw_rate, row.tes_rate,
      row.raw_rate > 0 ? row.tes_rate / row.raw_rate : 0, row.touch_mbps, row.touch_ratio(),
      row.owned_mbps, row.owned_touch_ratio(), row.zc_mbps, row.zc_ratio());
  std::fflush(stdout);
}

// Measures `cell` against `t`: a warm-up of every path, then `reps` repetitions of `rep_s` per
// side, alternating; prints its line. The first error of a Tessera request.
tessera::Result<Row> MeasureCell(const Cell& cell, Target& t, int reps, double rep_s) {
  const bool push = cell.push;
  const uint32_t window = cell.window;
  const uint64_t bytes = cell.bytes, nfloats = bytes / 4;
  float* out = reinterpret_cast<float*>(t.dst);
  // Short runs for big payloads would be a handful of ops: ask for a few at least.
  const uint64_t min_ops = 8;
  std::optional<CpuBurners> burners;
  if (cell.loaded) burners.emplace();
  std::vector<tessera::Handle> handles(window);
  tessera::Status error;
  auto run_raw_op = [&](double secs, uint32_t op) {
    return RunWindow(
        window, secs, min_ops,
        [&](uint64_t id) { t.raw.Issue(id, op, t.src, t.dst, bytes, t.table.id); },
        [&](uint64_t id) { t.raw.Complete(id); });
  };
  auto run_raw = [&](double secs) { return run_raw_op(secs, push ? kRawPush : kRawPull); };
  auto run_tessera = [&](double secs, bool owned = false, bool whole = false) {
    tessera::Client& c = whole ? t.whole_client : t.client;
    return RunWindow(
        window, secs, min_ops,
        [&](uint64_t id) {
          handles[id % window] = !push   ? c.DensePull(t.table, 0, nfloats, out)
                                 : owned ? c.DensePush(t.table, 0, t.owned_grads)
                                         : c.DensePush(t.table, 0, t.grads);
        },
        [&](uint64_t id) {
          tessera::Status s = c.Wait(handles[id % window]);
          if (!s.ok() && error.ok()) error = s;
        });
  };
  // Warm up every path (connections, lazily created chunks, page faults).
  run_raw(rep_s / 4);
  if (push) run_raw_op(rep_s / 4, kRawPushTouch);
  run_tessera(rep_s / 4);
  if (push) run_tessera(rep_s / 4, true);
  const uint32_t zc_op = push ? tessera::bench::kRawZcPush : tessera::bench::kRawZcPull;
  run_raw_op(rep_s / 4, zc_op);
  const bool has_whole = bytes == (uint64_t{16} << 20);
  if (has_whole) run_tessera(rep_s / 4, push, true);
  Side raw_side, tes_side, touch_side, owned_side, zc_side, whole_side;
  // Sides in turn, the order reversed on odd repetitions: raw, Tessera, zero-copy raw
  // (, touch, owned) (, whole: zero-copy push or pull of the unchunked client).
  const size_t sides = (push ? 5 : 3) + (has_whole ? 1 : 0);
  tessera::bench::ForEachAlternating(sides, reps, [&](size_t side, int) {
    if (has_whole && side == sides - 1) {
      whole_side.Add(run_tessera(rep_s, push, true), bytes);
    } else if (side == 0) {
      raw_side.Add(run_raw(rep_s), bytes);
    } else if (side == 1) {
      tes_side.Add(run_tessera(rep_s), bytes);
    } else if (side == 2) {
      zc_side.Add(run_raw_op(rep_s, zc_op), bytes);
    } else if (side == 3) {
      touch_side.Add(run_raw_op(rep_s, kRawPushTouch), bytes);
    } else {
      owned_side.Add(run_tessera(rep_s, true), bytes);
    }
    return true;
  });
  if (!error.ok()) return error;
  Row row{cell,
          Median(raw_side.mbps),
          Median(tes_side.mbps),
          Median(raw_side.latencies_us),
          Median(tes_side.latencies_us),
          Median(raw_side.ops_per_s),
          Median(tes_side.ops_per_s)};
  row.zc_mbps = Median(zc_side.mbps);
  row.whole_mbps = Median(whole_side.mbps);
  if (push) {
    row.touch_mbps = Median(touch_side.mbps);
    row.touch_lat_us = Median(touch_side.latencies_us);
    row.touch_rate = Median(touch_side.ops_per_s);
    row.owned_mbps = Median(owned_side.mbps);
  }
  PrintRow(row);
  return row;
}

// Creates the dense table of each size of `sizes` on the cluster of `client` (`nservers`
// servers) and measures its cells into `rows`. 0, or 1 after printing an error.
int MeasureSizes(tessera::Client& client, tessera::Client& whole_client, RawClient& raw,
                 uint32_t nservers,
                 const std::vector<uint64_t>& sizes, std::vector<char>& src, std::vector<char>& dst,
                 int reps, double rep_s, std::vector<Row>& rows) {
  for (uint64_t bytes : sizes) {
    tessera::OptimizerSpec opt;
    opt.kind = tessera::OptimizerKind::kSgd;
    opt.learning_rate = 0.01f;
    auto table_or = client.CreateTable(tessera::TableSpec::Dense(TableName(bytes), bytes / 4, opt));
    if (!table_or.ok()) {
      std::fprintf(stderr, "bench_transport: CreateTable: %s\n",
                   table_or.status().ToString().c_str());
      return 1;
    }
    const std::span<const float> grads(reinterpret_cast<const float*>(src.data()), bytes / 4);
    Target target{client,
                  raw,
                  *table_or,
                  src.data(),
                  dst.data(),
                  grads,
                  std::make_shared<const std::vector<float>>(grads.begin(), grads.end()),
                  whole_client};
    for (bool push : {true, false}) {
      for (uint32_t window : {1u, 8u}) {
        for (bool loaded : {false, true}) {
          if (loaded && (!FLAGS_loaded || bytes != 4096 || nservers != 1)) continue;
          const Cell cell{nservers, push, bytes, window, loaded};
          if (!FLAGS_only.empty() && cell.Name().find(FLAGS_only) == std::string::npos) continue;
          auto row = MeasureCell(cell, target, reps, rep_s);
          if (!row.ok()) {
            std::fprintf(stderr, "bench_transport: %s: %s\n", cell.Name().c_str(),
                         row.status().ToString().c_str());
            return 1;
          }
          rows.push_back(*row);
        }
      }
    }
  }
  return 0;
}

// The "rows" array of the JSON line.
std::string JsonRows(const std::vector<Row>& rows) {
  std::string json = "[";
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    json += std::string(i ? "," : "") + "{\"cell\":\"" + r.cell.Name() +
            "\",\"raw_MBps\":" + JsonNum(r.raw_mbps) + ",\"tessera_MBps\":" + JsonNum(r.tes_mbps) +
            ",\"raw_latency_us\":" + JsonNum(r.raw_lat_us) +
            ",\"tessera_latency_us\":" + JsonNum(r.tes_lat_us) +
            ",\"raw_ops_per_s\":" + JsonNum(r.raw_rate) +
            ",\"tessera_ops_per_s\":" + JsonNum(r.tes_rate) +
            ",\"raw_zc_MBps\":" + JsonNum(r.zc_mbps) +
            ",\"unchunked_MBps\":" + JsonNum(r.whole_mbps) +
            (r.cell.push ? ",\"touch_MBps\":" + JsonNum(r.touch_mbps) +
                               ",\"touch_latency_us\":" + JsonNum(r.touch_lat_us) +
                               ",\"touch_ops_per_s\":" + JsonNum(r.touch_rate) +
                               ",\"owned_MBps\":" + JsonNum(r.owned_mbps)
                         : std::string()) +
            "}";
  }
  return json + "]";
}

// The last line of the output: the headline figures (1 server) and every row.
std::string Json(const std::vector<Row>& rows, int reps) {
  // Sync/8-in-flight figures take the worse of push and pull.
  auto find = [&](bool push, uint64_t bytes, uint32_t window, bool loaded = false) -> const Row* {
    for (const Row& r : rows) {
      if (r.cell.servers == 1 && r.cell.push == push && r.cell.bytes == bytes &&
          r.cell.window == window && r.cell.loaded == loaded) {
        return &r;
      }
    }
    return nullptr;
  };
  std::string json = "{\"bench\":\"transport\",\"server_mode\":\"" + FLAGS_server_mode +
                     "\",\"reps\":" + std::to_string(reps);
  auto put = [&](const std::string& key, double v) { json += ",\"" + key + "\":" + JsonNum(v); };
  for (uint64_t bytes : {uint64_t{1} << 20, uint64_t{16} << 20}) {
    for (bool push : {true, false}) {
      const std::string base = std::string("dense_") + (push ? "push_" : "pull_") + SizeName(bytes);
      if (const Row* r = find(push, bytes, 1)) {
        put(base + "_vs_zmq", r->tput_ratio());
        if (push) put(base + "_vs_zmq_touch", r->touch_ratio());
        if (push) put(base + "_owned_vs_zmq_touch", r->owned_touch_ratio());
      }
      if (const Row* r = find(push, bytes, 8)) {
        put(base + "_inflight8_vs_zmq", r->tput_ratio());
        if (push) put(base + "_inflight8_vs_zmq_touch", r->touch_ratio());
      }
    }
  }
  // The zero-copy raw server that reads the data (bench_raw_zmq.h), 16 MiB, 1 and 8 in flight.
  for (bool push : {true, false}) {
    for (uint32_t window : {1u, 8u}) {
      const Row* r = find(push, uint64_t{16} << 20, window);
      if (r == nullptr) continue;
      const std::string key = std::string("dense16m_") + (push ? "push" : "pull") +
                              (window == 8 ? "_inflight8" : "") + "_vs_raw_zmq";
      put(key, r->zc_ratio());
      // The chunked client against one request per server (both zero-copy for pushes).
      if (r->whole_mbps > 0) {
        put(std::string("dense16m_") + (push ? "push" : "pull") +
                (window == 8 ? "_inflight8" : "") + "_chunked_vs_unchunked",
            (push ? r->owned_mbps : r->tes_mbps) / r->whole_mbps);
      }
      if (push) put(std::string("dense16m_push") + (window == 8 ? "_inflight8" : "") +
                        "_copy_vs_raw_zmq", r->zc_copy_ratio());
    }
  }
  const Row* sp = find(true, 4096, 1);
  const Row* sl = find(false, 4096, 1);
  if (sp && sl) {
    put("sync_4KiB_latency_vs_zmq", std::max(sp->lat_ratio(), sl->lat_ratio()));
    put("sync_4KiB_push_latency_vs_zmq", sp->lat_ratio());
    put("sync_4KiB_pull_latency_vs_zmq", sl->lat_ratio());
  }
  for (bool loaded : {false, true}) {
    const std::string suffix = loaded ? "_loaded" : "";
    const Row* ip = find(true, 4096, 8, loaded);
    const Row* il = find(false, 4096, 8, loaded);
    if (ip && il) {
      const double rp = ip->tes_rate / ip->raw_rate, rl = il->tes_rate / il->raw_rate;
      put("inflight8_4KiB_rate_vs_zmq" + suffix, std::min(rp, rl));
      put("inflight8_4KiB_push_rate_vs_zmq" + suffix, rp);
      put("inflight8_4KiB_pull_rate_vs_zmq" + suffix, rl);
    }
    if (!loaded) continue;
    const Row* lp = find(true, 4096, 1, true);
    const Row* ll = find(false, 4096, 1, true);
    if (lp && ll) put("sync_4KiB_latency_vs_zmq_loaded", std::max(lp->lat_ratio(), ll->lat_ratio()));
  }
  return json + ",\"rows\":" + JsonRows(rows) + "}";
}

}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage(
      "bench_transport [--quick]\nRaw ZeroMQ DEALER/ROUTER vs Tessera dense push/pull.");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  if (!FLAGS_echo_server.empty()) return EchoServerMain();
  if (FLAGS_server_mode != "process" && FLAGS_server_mode != "thread") {
    std::fprintf(stderr, "bench_transport: --server_mode must be process or thread\n");
    return 2;
  }
  const int reps = FLAGS_reps > 0 ? FLAGS_reps : (FLAGS_quick ? 3 : 7);
  const double rep_s = FLAGS_rep_seconds > 0 ? FLAGS_rep_seconds : (FLAGS_quick ? 0.12 : 0.4);
  const std::string self = std::filesystem::canonical("/proc/self/exe").string();
  const std::string server_binary = !FLAGS_server_binary.empty()
                                        ? FLAGS_server_binary
                                        : tessera::bench::DefaultServerBinary(argv[0]);
  if (FLAGS_server_mode == "process" && access(server_binary.c_str(), X_OK) != 0) {
    std::fprintf(stderr, "bench_transport: no tessera-server at %s (see --server_binary)\n",
                 server_binary.c_str());
    return 2;
  }
  const std::vector<uint64_t> sizes = tessera::bench::ParseList(FLAGS_sizes);
  const std::vector<uint64_t> counts = tessera::bench::ParseList(FLAGS_server_counts);
  if (!ValidSizesAndCounts(sizes, counts)) return 2;
  PrintHeader(reps, rep_s);

  std::vector<Row> rows;
  uint64_t max_bytes = 0;
  for (uint64_t s : sizes) max_bytes = std::max(max_bytes, s);
  std::vector<char> src(max_bytes), dst(max_bytes);
  {
    // Small finite gradients: SGD keeps the table finite for any number of pushes.
    float* f = reinterpret_cast<float*>(src.data());
    for (uint64_t i = 0; i < max_bytes / 4; ++i) f[i] = 1e-6f * static_cast<float>(i % 7);
  }

  for (uint64_t nservers : counts) {
    Cluster cluster;
    if (!cluster.Start(static_cast<uint32_t>(nservers), self, server_binary)) return 1;
    tessera::ClientOptions co;
    co.servers = cluster.tessera_endpoints();
    if (FLAGS_dense_chunk_bytes >= 0) co.dense_chunk_bytes = FLAGS_dense_chunk_bytes;
    auto client_or = tessera::Client::Create(co);
    co.dense_chunk_bytes = 0;
    auto whole_or = tessera::Client::Create(co);
    if (!client_or.ok() || !whole_or.ok()) {
      std::fprintf(stderr, "bench_transport: client: %s\n",
                   (client_or.ok() ? whole_or.status() : client_or.status()).ToString().c_str());
      return 1;
    }
    std::unique_ptr<tessera::Client> client = std::move(*client_or);
    RawClient raw(cluster.echo_endpoints);
    if (int rc = MeasureSizes(*client, **whole_or, raw, static_cast<uint32_t>(nservers), sizes, src,
                              dst, reps, rep_s, rows);
        rc != 0) {
      return rc;
    }
    client.reset();
  }
  std::printf("%s\n", Json(rows, reps).c_str());
  return 0;
}
