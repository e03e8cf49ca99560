// bench_elastic: online resharding (docs/elasticity.md) under load. A real etcd and three
// tessera-server processes (--coordinator; the map starts with two of them) hold a sparse table
// of --rows rows; one client pushes batches back to back while the tier scales 2 -> 3 and then
// 3 -> 2 (the controller of tessera-ctl scale, run in this process).
//
// Figures (one client thread, caller keys: every key of a push counts, all unique):
// - push keys/s in 0.25 s windows before any move (the baseline, same run, same client),
//   during each scale, and after; the ratio during/before is the median window during the
//   moves over the median window before them, and also the whole scale's keys over its time;
// - time to move the rows each scale moved, and rows/s;
// - the longest time requests for a batch's slots waited (flip to copy in).
// Then replication and fail-over (--failover), on three more servers with data directories:
// - push keys/s of the same client loop on a map without backups and on one made with
//   --replication=2 (each push waits for the backup of its slots), the two tiers alternated four
//   times in the same run: the ratio of the medians is the cost of replication;
// - kill -9 of server 1 while pushing on the replicated map: the fail-over time is the
//   longest gap between two push completions after the kill (the dead server's lease TTL,
//   etcd's expiry check, the promotion's poll, the new map's way to the client, the resend);
//   push keys/s after the fail-over (two servers left).
//
// Each part ends with one line of JSON ("bench":"elastic", then "bench":"elastic_failover").
#include <gflags/gflags.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <mutex>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "benchmarks/bench_cluster.h"
#include "benchmarks/bench_etcd.h"
#include "benchmarks/bench_process.h"
#include "benchmarks/bench_stats.h"
#include "ps/client/client.h"
#include "ps/control/scale.h"
#include "ps/coord/cluster_map.h"
#include "ps/coord/coordinator_url.h"
#include "ps/coord/etcd_client.h"
#include "ps/coord/etcd_map_source.h"
#include "ps/coord/slot_map_store.h"

DEFINE_bool(quick, false, "Short run: 300k rows, 1 s phases");
DEFINE_uint64(rows, 0, "Rows in the table (0: 3M, or 300k with --quick)");
DEFINE_uint32(dim, 16, "Floats per row (Adagrad: as many again of state)");
DEFINE_uint32(keys, 10000, "Keys per push");
DEFINE_double(phase_s, 0, "Seconds of pushing before, between and after the scales (0: 3, 1 quick)");
DEFINE_uint32(batch_slots, 1024, "Slots per map flip (tessera-ctl scale --batch_slots)");
DEFINE_double(pace, 0.5, "Share of wall time the controller moves (tessera-ctl scale --pace)");
DEFINE_string(server_binary, "", "tessera-server (default: next to this program)");
DEFINE_string(server_flags, "", "Extra flags for every tessera-server, comma-separated");
DEFINE_string(etcd, "/usr/bin/etcd", "The etcd binary");
DEFINE_bool(scale, true, "Measure online resharding (2 -> 3 -> 2 servers)");
DEFINE_uint32(replication, 1, "Resharding: copies of each slot in the map (2: every slot and "
              "dense part has a backup, which each scale moves and rebalances)");
DEFINE_bool(durable, false,
            "Resharding: the three servers on RocksDB (a data directory each, strict durability; "
            "add --server_flags=--memory_budget_mb=N for a table larger than the memory tier)");
DEFINE_bool(failover, true, "Measure replication's cost and the fail-over time of a kill -9");
DEFINE_uint32(ttl_s, 3, "Fail-over: the servers' lease TTL (--coordinator_ttl_s)");

namespace {

using tessera::Status;
using tessera::bench::Clock;
using tessera::bench::Etcd;
using tessera::bench::FreePort;
using tessera::bench::Pushes;
using tessera::bench::Rate;
using tessera::bench::Windows;

int Fail(const Status& s) {
  std::fprintf(stderr, "bench_elastic: %s\n", s.ToString().c_str());
  return 1;
}

// Three tessera-server processes with data directories under `dir`, following the map at
// `url` (created here as tessera-ctl map init makes it: with backups of slots and dense parts
// when `replicated`), a client of that map and a table of `rows` rows, each pushed once.
struct Tier {
  std::vector<std::unique_ptr<tessera::bench::ServerProcess>> servers;
  std::unique_ptr<tessera::Client> client;
  tessera::Table table;
  std::string admin_root;
};

// Seconds of a checkpoint of `tier` into a new directory, and the bytes of its lane files.
tessera::Result<std::pair<double, uint64_t>> TimeCheckpoint(Tier& tier, int n) {
  const std::string name = "ckpt-" + std::to_string(n);
  const auto t0 = Clock::now();
  TESSERA_RETURN_IF_ERROR(tier.client->Checkpoint(name).status());
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  uint64_t bytes = 0;
  std::error_code ec;
  for (const auto& f :
       std::filesystem::recursive_directory_iterator(tier.admin_root + "/" + name, ec)) {
    if (f.is_regular_file() && f.path().filename().string().rfind("lane-", 0) == 0) {
      bytes += f.file_size();
    }
  }
  return std::make_pair(secs, bytes);
}

tessera::Result<std::unique_ptr<Tier>> StartTier(const std::string& binary, const std::string& url,
                                                 const std::string& dir, uint64_t rows,
                                                 bool replicated) {
  auto tier = std::make_unique<Tier>();
  std::vector<std::string> endpoints;
  std::string cluster_list;
  for (int i = 0; i < 3; ++i) {
    endpoints.push_back("tcp://127.0.0.1:" + std::to_string(FreePort()));
    cluster_list += (i ? "," : "") + endpoints.back();
  }
  for (int r = 0; r < 3; ++r) {
    std::vector<std::string> argv = {binary, "--listen=" + endpoints[r], "--cluster=" + cluster_list,
                                     "--rank=" + std::to_string(r), "--lanes=2",
                                     "--data_dir=" + dir + "/server-" + std::to_string(r),
                                     "--coordinator=" + url,
                                     "--coordinator_ttl_s=" + std::to_string(FLAGS_ttl_s),
                                     "--admin_root=" + dir + "/admin"};
    for (const std::string& f : tessera::bench::SplitFlags(FLAGS_server_flags)) argv.push_back(f);
    tier->servers.push_back(std::make_unique<tessera::bench::ServerProcess>());
    auto started = tier->servers.back()->Start(argv);
    if (!started.ok()) return started.status();
  }
  auto parsed = tessera::CoordinatorUrl::Parse(url);
  TESSERA_ASSIGN_OR_RETURN(auto etcd_client, tessera::EtcdClient::Create(parsed->etcd_options()));
  tessera::SlotMapStore store(etcd_client.get(), parsed->prefix);
  TESSERA_ASSIGN_OR_RETURN(
      tessera::ClusterMap map,
      tessera::ClusterMap::Replicated(
          {{"server-0", endpoints[0]}, {"server-1", endpoints[1]}, {"server-2", endpoints[2]}},
          replicated ? 2 : 1));
  TESSERA_RETURN_IF_ERROR(store.Create(map));
  TESSERA_ASSIGN_OR_RETURN(auto source, tessera::EtcdClusterMapSource::Create(*parsed));
  tessera::ClientOptions co;
  co.request_timeout_ms = 2000;  // a push lost with a killed server is sent again soon
  co.retry_for_ms = 120000;
  co.admin_root = dir + "/admin";  // the servers' --admin_root, on this machine
  tier->admin_root = co.admin_root;
  TESSERA_ASSIGN_OR_RETURN(tier->client, tessera::Client::Create(co, std::move(source)));
  tessera::OptimizerSpec adagrad;
  adagrad.kind = tessera::OptimizerKind::kAdagrad;
  TESSERA_ASSIGN_OR_RETURN(tier->table, tier->client->CreateTable(
                                            tessera::TableSpec::Sparse("emb", FLAGS_dim, adagrad)));
  std::vector<float> grads(size_t{FLAGS_keys} * FLAGS_dim, 0.01f);
  for (uint64_t at = 0; at < rows; at += FLAGS_keys) {
    std::vector<uint64_t> keys;
    for (uint64_t k = at; k < std::min(rows, at + FLAGS_keys); ++k) keys.push_back(k + 1);
    TESSERA_RETURN_IF_ERROR(tier->client->Wait(tier->client->Push(
        tier->table, keys, std::span<const float>(grads.data(), keys.size() * FLAGS_dim))));
  }
  return tier;
}

// Pushes batches of random keys to `tier` back to back from a thread until `stop`, recording
// each completion in `pushes`.
std::thread Pusher(Tier& tier, uint64_t rows, Pushes& pushes, uint64_t seed) {
  return std::thread([&tier, rows, &pushes, seed] {
    std::mt19937_64 rng(seed);
    std::vector<float> grads(size_t{FLAGS_keys} * FLAGS_dim, 0.01f);
    std::vector<uint64_t> keys(FLAGS_keys);
    tessera::Client& c = *tier.client;
    while (!pushes.stop.load()) {
      keys.resize(FLAGS_keys);
      for (auto& k : keys) k = 1 + rng() % rows;
      std::sort(keys.begin(), keys.end());
      keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
      Status s = c.Wait(c.Push(tier.table, keys,
                               std::span<const float>(grads.data(), keys.size() * FLAGS_dim)));
      if (!s.ok()) {
        std::lock_guard<std::mutex> l(pushes.mu);
        pushes.error = s;
        return;
      }
      std::lock_guard<std::mutex> l(pushes.mu);
      pushes.done.push_back({Clock::now(), keys.size()});
    }
  });
}

// CPU seconds (user + system) of `servers` (a tier's, or the resharding part's).
double ServersCpuSeconds(
    const std::vector<std::unique_ptr<tessera::bench::ServerProcess>>& servers) {
  double s = 0;
  for (const auto& server : servers) s += tessera::bench::ProcessCpuSeconds(server->pid());
  return s;
}
double TierCpuSeconds(const Tier& tier) { return ServersCpuSeconds(tier.servers); }

// What pushing to a tier cost: the CPU seconds of its servers over the whole alternation (its
// write-backs and RocksDB flushes run on while the other tier pushes), those of this process
// while it pushed to the tier (the client; the other tier's client idles meanwhile), and the
// keys its pushes carried.
struct PhaseCost {
  double server_cpu_s = 0;
  double client_cpu_s = 0;
  uint64_t keys = 0;
  double ServerUsPerKey() const { return keys ? server_cpu_s * 1e6 / keys : 0; }
  double ClientUsPerKey() const { return keys ? client_cpu_s * 1e6 / keys : 0; }
};

// Push keys/s of `tier` over `seconds` (median of 0.25 s windows); adds the phase's keys and
// client CPU to `cost`.
tessera::Result<double> Measure(Tier& tier, uint64_t rows, double seconds, uint64_t seed,
                                PhaseCost* cost) {
  Pushes pushes;
  const double client0 = tessera::bench::ProcessCpuSeconds(getpid());
  std::thread t = Pusher(tier, rows, pushes, seed);
  const auto from = Clock::now();
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  const auto to = Clock::now();
  pushes.stop = true;
  t.join();
  if (!pushes.error.ok()) return pushes.error;
  cost->client_cpu_s += tessera::bench::ProcessCpuSeconds(getpid()) - client0;
  for (const auto& [at, keys] : pushes.done) cost->keys += keys;
  return tessera::bench::Median(Windows(pushes, from, to, std::min(0.25, seconds / 4)));
}

// Kills server 1 of `tier` while pushing to it: the fail-over time (the longest gap between
// push completions after the kill) and the push keys/s over the last phase after it.
tessera::Result<std::pair<double, double>> KillAndTimeFailover(Tier& tier, uint64_t rows,
                                                               double phase_s) {
  Pushes pushes;
  std::thread pusher = Pusher(tier, rows, pushes, 99);
  std::this_thread::sleep_for(std::chrono::duration<double>(phase_s / 2));
  const auto t_kill = Clock::now();
  tier.servers[1]->Kill();
  // Until the client follows the fail-over's map, and then a phase has passed after the first
  // push completed past that (or 120 s).
  Clock::time_point switched{};
  for (;;) {
    if (switched == Clock::time_point{} && tier.client->cluster_map_version() > 1) {
      switched = Clock::now();
    }
    Clock::time_point resumed{};
    {
      std::lock_guard<std::mutex> l(pushes.mu);
      if (!pushes.error.ok()) break;
      for (auto it = pushes.done.rbegin();
           switched != Clock::time_point{} && it != pushes.done.rend() && it->first > switched;
           ++it) {
        resumed = it->first;
      }
    }
    if (resumed != Clock::time_point{} &&
        Clock::now() - resumed > std::chrono::duration<double>(phase_s)) {
      break;
    }
    if (Clock::now() - t_kill > std::chrono::seconds(120)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const auto t_end = Clock::now();
  pushes.stop = true;
  pusher.join();
  if (!pushes.error.ok()) return pushes.error.WithContext("pushes across the kill");
  double failover_s = 0;
  {
    std::lock_guard<std::mutex> l(pushes.mu);
    Clock::time_point last = t_kill;
    for (auto& [at, k] : pushes.done) {
      if (at <= t_kill) continue;
      failover_s = std::max(failover_s, std::chrono::duration<double>(at - last).count());
      last = at;
    }
  }
  if (failover_s == 0) return Status::Unavailable("no push completed after the kill");
  const double after = tessera::bench::Median(Windows(
      pushes, t_end - std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(phase_s)),
      t_end, std::min(0.25, phase_s / 4)));
  return std::pair<double, double>{failover_s, after};
}

// The push keys/s (median windows) and the CPU of the unreplicated and the replicated tier.
struct Alternation {
  double plain_rate = 0, repl_rate = 0;
  PhaseCost plain_cost, repl_cost;
};

// The same client loop on each tier in turn, four times (the machine's load drifts; the ratio
// of the medians compares like with like).
tessera::Result<Alternation> Alternate(Tier& plain, Tier& repl, uint64_t rows, double phase_s) {
  Alternation r;
  std::vector<double> plain_rates, repl_rates;
  const double plain_cpu0 = TierCpuSeconds(plain), repl_cpu0 = TierCpuSeconds(repl);
  for (int round = 0; round < 4; ++round) {
    auto a = Measure(plain, rows, phase_s / 2, 7 + round, &r.plain_cost);
    if (!a.ok()) return a.status().WithContext("unreplicated tier");
    auto b = Measure(repl, rows, phase_s / 2, 7 + round, &r.repl_cost);
    if (!b.ok()) return b.status().WithContext("replicated tier");
    plain_rates.push_back(*a);
    repl_rates.push_back(*b);
  }
  r.plain_cost.server_cpu_s = TierCpuSeconds(plain) - plain_cpu0;
  r.repl_cost.server_cpu_s = TierCpuSeconds(repl) - repl_cpu0;
  r.plain_rate = tessera::bench::Median(plain_rates);
  r.repl_rate = tessera::bench::Median(repl_rates);
  return r;
}

int Failover(const std::string& binary, Etcd& etcd, const std::string& root, uint64_t rows,
             double phase_s) {
  auto plain = StartTier(binary, etcd.url("plain"), root + "/plain", rows, false);
  if (!plain.ok()) return Fail(plain.status().WithContext("unreplicated tier"));
  auto repl = StartTier(binary, etcd.url("replicated"), root + "/replicated", rows, true);
  if (!repl.ok()) return Fail(repl.status().WithContext("replicated tier"));
  // Both tiers quiet first (their servers together under a tenth of a core over 3 s, at most
  // 30 s): the fill's write-backs (each second), RocksDB flushes (5 s after the first
  // unflushed write-back) and compactions of the tier started last would otherwise run in the
  // first phases of both.
  const double settle_s = tessera::bench::WaitUntilQuiet(
      [&] { return TierCpuSeconds(**plain) + TierCpuSeconds(**repl); }, 3, 0.3, 30);
  auto alt = Alternate(**plain, **repl, rows, phase_s);
  if (!alt.ok()) return Fail(alt.status());
  const double plain_rate = alt->plain_rate, repl_rate = alt->repl_rate;
  const PhaseCost& plain_cost = alt->plain_cost;
  const PhaseCost& repl_cost = alt->repl_cost;
  // A checkpoint of each tier, alternated twice: a replicated map writes each row once (by its
  // primary), so the bytes match; the time is the copy of the rows off the lanes plus fsync.
  std::vector<double> plain_ckpt, repl_ckpt;
  uint64_t plain_bytes = 0, repl_bytes = 0;
  for (int round = 0; round < 2; ++round) {
    auto a = TimeCheckpoint(**plain, round);
    if (!a.ok()) return Fail(a.status().WithContext("checkpoint, unreplicated tier"));
    auto b = TimeCheckpoint(**repl, round);
    if (!b.ok()) return Fail(b.status().WithContext("checkpoint, replicated tier"));
    plain_ckpt.push_back(a->first);
    repl_ckpt.push_back(b->first);
    plain_bytes = a->second;
    repl_bytes = b->second;
  }
  (*plain)->servers.clear();
  // kill -9 of server 1 while pushing on the replicated tier.
  auto killed = KillAndTimeFailover(**repl, rows, phase_s);
  if (!killed.ok()) return Fail(killed.status());
  const auto [failover_s, after] = *killed;
  std::printf("replication (3 servers with data directories, one client, %u keys per push; "
              "median of 0.25 s windows, tiers alternated 4 times):\n", FLAGS_keys);
  std::printf("  (after %.1f s for both tiers' fills to be written back)\n", settle_s);
  std::printf("  push keys/s without backups  %12.0f\n", plain_rate);
  std::printf("  push keys/s, --replication=2 %12.0f  (%.2fx)\n", repl_rate, repl_rate / plain_rate);
  std::printf("  kill -9 of server 1: fail-over %.2f s (lease TTL %u s); push keys/s after %.0f "
              "(%.2fx of before, 2 servers left)\n",
              failover_s, FLAGS_ttl_s, after, after / repl_rate);
  // CPU per key (each caller key once: the pushes' keys are unique) of the tiers' servers
  // (over the whole alternation) and of the client (its four phases). On a machine the job
  // saturates, replicated_cpu_ratio is what replicated_ratio tends to; it does not swing with
  // the windows' push counts. (The last phase's rows still to be written back are not in it.)
  const double plain_us = plain_cost.ServerUsPerKey() + plain_cost.ClientUsPerKey();
  const double repl_us = repl_cost.ServerUsPerKey() + repl_cost.ClientUsPerKey();
  const double cpu_ratio = repl_us > 0 ? plain_us / repl_us : 0;
  std::printf("  CPU us per key (servers + client): without backups %.3f + %.3f, "
              "--replication=2 %.3f + %.3f (unreplicated / replicated: %.2f)\n",
              plain_cost.ServerUsPerKey(), plain_cost.ClientUsPerKey(),
              repl_cost.ServerUsPerKey(), repl_cost.ClientUsPerKey(), cpu_ratio);
  const double plain_ckpt_s = tessera::bench::Median(plain_ckpt);
  const double repl_ckpt_s = tessera::bench::Median(repl_ckpt);
  std::printf("  checkpoint (no pushes running; median of 2, alternated): unreplicated %.3f s, "
              "%.1f MB of lane files; --replication=2 %.3f s (%.2fx), %.1f MB (each row once)\n",
              plain_ckpt_s, plain_bytes / 1e6, repl_ckpt_s, repl_ckpt_s / plain_ckpt_s,
              repl_bytes / 1e6);
  std::printf("{\"bench\":\"elastic_failover\",\"rows\":%llu,\"push_keys_per_s_unreplicated\":%.0f,"
              "\"push_keys_per_s_replicated\":%.0f,\"replicated_ratio\":%.3f,\"ttl_s\":%u,"
              "\"failover_s\":%.3f,\"push_keys_per_s_after_failover\":%.0f,"
              "\"checkpoint_s_unreplicated\":%.3f,\"checkpoint_s_replicated\":%.3f,"
              "\"checkpoint_bytes_unreplicated\":%llu,\"checkpoint_bytes_replicated\":%llu,"
              "\"server_cpu_us_per_key_unreplicated\":%.3f,\"server_cpu_us_per_key_replicated\":%.3f,"
              "\"client_cpu_us_per_key_unreplicated\":%.3f,\"client_cpu_us_per_key_replicated\":%.3f,"
              "\"replicated_cpu_ratio\":%.3f,\"settle_s\":%.1f}\n",
              static_cast<unsigned long long>(rows), plain_rate, repl_rate,
              repl_rate / plain_rate, FLAGS_ttl_s, failover_s, after, plain_ckpt_s, repl_ckpt_s,
              static_cast<unsigned long long>(plain_bytes),
              static_cast<unsigned long long>(repl_bytes), plain_cost.ServerUsPerKey(),
              repl_cost.ServerUsPerKey(), plain_cost.ClientUsPerKey(), repl_cost.ClientUsPerKey(),
              cpu_ratio, settle_s);
  return 0;
}

// Pushes every row of `table` (`rows` rows) once, --keys at a time.
Status Fill(tessera::Client& c, const tessera::Table& table, uint64_t rows,
            const std::vector<float>& grads) {
  for (uint64_t at = 0; at < rows; at += FLAGS_keys) {
    std::vector<uint64_t> keys;
    for (uint64_t k = at; k < std::min(rows, at + FLAGS_keys); ++k) keys.push_back(k + 1);
    Status s =
        c.Wait(c.Push(table, keys, std::span<const float>(grads.data(), keys.size() * FLAGS_dim)));
    if (!s.ok()) return s;
  }
  return Status::OK();
}

// Pushes batches of random keys of `table` back to back from a thread until `pushes.stop`,
// recording each completion in `pushes`.
std::thread ScalePusher(tessera::Client& c, const tessera::Table& table, uint64_t rows,
                        const std::vector<float>& grads, Pushes& pushes) {
  return std::thread([&c, &table, rows, &grads, &pushes] {
    std::mt19937_64 rng(7);
    std::vector<uint64_t> keys(FLAGS_keys);
    while (!pushes.stop.load()) {
      for (auto& k : keys) k = 1 + rng() % rows;
      std::sort(keys.begin(), keys.end());
      keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
      Status s = c.Wait(
          c.Push(table, keys, std::span<const float>(grads.data(), keys.size() * FLAGS_dim)));
      if (!s.ok()) {
        pushes.error = s;
        return;
      }
      std::lock_guard<std::mutex> l(pushes.mu);
      pushes.done.push_back({Clock::now(), keys.size()});
      keys.resize(FLAGS_keys);
    }
  });
}

// Prints the push rates before (from `t_before`), during and after (to `t_after`) the `moves`,
// what each moved, and the JSON line.
void PrintScaleFigures(Pushes& pushes, Clock::time_point t_before, Clock::time_point t_after,
                       const tessera::bench::ScaleRun (&moves)[2], uint64_t rows, double phase_s) {
  const double window = std::min(0.25, phase_s / 4);
  const double before =
      tessera::bench::Median(Windows(pushes, t_before, moves[0].begin, window));
  std::printf("push keys/s (one client, %u keys per push), median of %.2f s windows; pace %.2f, "
              "%u-slot batches:\n",
              FLAGS_keys, window, FLAGS_pace, FLAGS_batch_slots);
  std::printf("  before the moves      %12.0f\n", before);
  // The quieter of the two phases without moves (both on 2 servers) is the stricter baseline:
  // on some runs the pushes still speed up after the fill, and `before` then flatters.
  const double after = tessera::bench::Median(Windows(pushes, moves[1].end, t_after, window));
  const double quiet = std::max(before, after);
  std::string json = "{\"bench\":\"elastic\",\"replication\":" +
                     std::to_string(FLAGS_replication) +
                     ",\"durable\":" + (FLAGS_durable ? "true" : "false") +
                     ",\"rows\":" + std::to_string(rows) +
                     ",\"pace\":" + std::to_string(FLAGS_pace) +
                     ",\"push_keys_per_s_before\":" + std::to_string(before);
  for (const tessera::bench::ScaleRun& m : moves) {
    const double during = tessera::bench::Median(Windows(pushes, m.begin, m.end, window));
    const double overall = Rate(pushes, m.begin, m.end);
    const double secs = std::chrono::duration<double>(m.end - m.begin).count();
    std::printf("  during %-10s     %12.0f  (%.2fx; the whole %.2f s: %.0f, %.2fx; %.2fx and "
                "%.2fx of the faster of before and after)\n",
                m.name, during, during / before, secs, overall, overall / before, during / quiet,
                overall / quiet);
    std::printf("    moved %u slots (and gave %u a new backup) in %.2f s, %u flips: %llu rows "
                "copied ahead (%.0f rows/s), %llu again during the holds; %.1f MB; longest hold "
                "%.0f ms\n",
                m.report.slots_moved, m.report.slots_backed, m.report.seconds, m.report.batches,
                static_cast<unsigned long long>(m.report.rows_ahead),
                m.report.rows_ahead / std::max(1e-9, m.report.seconds),
                static_cast<unsigned long long>(m.report.rows_in_hold), m.report.bytes_moved / 1e6,
                m.report.max_hold_ms);
    const std::string n = m.name;
    json += ",\"" + n + "_push_ratio_median_window\":" + std::to_string(during / before) +
            ",\"" + n + "_push_ratio_overall\":" + std::to_string(overall / before) + ",\"" + n +
            "_push_ratio_median_window_vs_quiet\":" + std::to_string(during / quiet) + ",\"" + n +
            "_push_ratio_overall_vs_quiet\":" + std::to_string(overall / quiet) + ",\"" + n +
            "_rows_ahead\":" + std::to_string(m.report.rows_ahead) + ",\"" + n +
            "_rows_in_hold\":" + std::to_string(m.report.rows_in_hold) + ",\"" + n +
            "_seconds\":" + std::to_string(m.report.seconds) + ",\"" + n +
            "_rows_per_s\":" + std::to_string(m.report.rows_ahead / std::max(1e-9, m.report.seconds)) +
            ",\"" + n + "_max_hold_ms\":" + std::to_string(m.report.max_hold_ms);
  }
  std::printf("  after the moves       %12.0f\n", after);
  json += ",\"push_keys_per_s_after\":" + std::to_string(after) + "}";
  std::printf("%s\n", json.c_str());
}

// Durable servers write a fill back, flush and compact it for a while after it: waits until the
// three are together under a tenth of a core over 3 s (at most 5 minutes), so that the phase
// before the moves is not slowed by it. Returns the seconds waited.
double WaitForFillWrittenBack(const tessera::bench::MapServers& servers) {
  return tessera::bench::WaitUntilQuiet([&servers] { return ServersCpuSeconds(servers.processes); },
                                        3, 0.3, 300);
}

}  // namespace

int main(int argc, char** argv) {
  tessera::bench::CleanUpOnStopSignals();
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  const uint64_t rows = FLAGS_rows != 0 ? FLAGS_rows : (FLAGS_quick ? 300000 : 3000000);
  const double phase_s = FLAGS_phase_s > 0 ? FLAGS_phase_s : (FLAGS_quick ? 1.0 : 3.0);
  const std::string binary = FLAGS_server_binary.empty()
                                 ? tessera::bench::DefaultServerBinary(argv[0])
                                 : FLAGS_server_binary;
  if (access(FLAGS_etcd.c_str(), X_OK) != 0) {
    return Fail(Status::NotFound("no etcd at " + FLAGS_etcd +
                                 " (Debian: apt-get install etcd-server; or --etcd)"));
  }
  const tessera::bench::TempDir root("tessera-bench-elastic-");
  Etcd etcd;
  if (Status s = etcd.Start(root.path(), FLAGS_etcd); !s.ok()) return Fail(s);
  if (!FLAGS_scale) return FLAGS_failover ? Failover(binary, etcd, root.path(), rows, phase_s) : 0;
  const std::string url = etcd.url("bench");
  const std::vector<std::string> flags = tessera::bench::SplitFlags(FLAGS_server_flags);
  // Three servers on free ports named in --cluster (each registers its entry in etcd); the map
  // names the first two.
  auto servers = tessera::bench::StartMapServers(binary, url, flags,
                                                 FLAGS_durable ? root.path() + "/scale" : "");
  if (!servers.ok()) return Fail(servers.status());
  const std::vector<std::string>& endpoints = servers->endpoints;
  auto first = tessera::ClusterMap::Replicated(
      {{"server-0", endpoints[0]}, {"server-1", endpoints[1]}}, FLAGS_replication);
  if (!first.ok()) return Fail(first.status());
  auto map = tessera::bench::CreateMapAndClient(url, *first);
  if (!map.ok()) return Fail(map.status());
  tessera::Client& c = *map->client;
  tessera::OptimizerSpec adagrad;
  adagrad.kind = tessera::OptimizerKind::kAdagrad;
  auto table = c.CreateTable(tessera::TableSpec::Sparse("emb", FLAGS_dim, adagrad));
  if (!table.ok()) return Fail(table.status());

  // Fill: every row pushed once.
  const std::vector<float> grads(size_t{FLAGS_keys} * FLAGS_dim, 0.01f);
  const auto fill_start = Clock::now();
  if (Status s = Fill(c, *table, rows, grads); !s.ok()) return Fail(s.WithContext("fill"));
  const double fill_s = std::chrono::duration<double>(Clock::now() - fill_start).count();
  const double settle_s = FLAGS_durable ? WaitForFillWrittenBack(*servers) : 0;
  char settled[64] = "";
  if (FLAGS_durable) std::snprintf(settled, sizeof(settled), ", quiet %.1f s later", settle_s);
  std::printf("table of %llu rows x %u floats (+%u Adagrad state) on 2 servers, replication %u, "
              "%s; filled in %.1f s%s\n",
              static_cast<unsigned long long>(rows), FLAGS_dim, FLAGS_dim, FLAGS_replication,
              FLAGS_durable ? "RocksDB" : "memory only", fill_s, settled);

  Pushes pushes;
  std::thread pusher = ScalePusher(c, *table, rows, grads, pushes);
  auto sleep_phase = [&] { std::this_thread::sleep_for(std::chrono::duration<double>(phase_s)); };
  tessera::ScaleOptions so;
  so.batch_slots = FLAGS_batch_slots;
  so.pace = FLAGS_pace;
  tessera::bench::ScaleRun moves[2] = {{"scale_up", 3}, {"scale_down", 2}};
  const auto t_before = Clock::now();
  sleep_phase();
  const Status error = tessera::bench::RunScales(*map, so, moves, sleep_phase);
  const auto t_after = Clock::now();
  pushes.stop = true;
  pusher.join();
  if (!error.ok()) return Fail(error);
  if (!pushes.error.ok()) return Fail(pushes.error.WithContext("pushes"));

  PrintScaleFigures(pushes, t_before, t_after, moves, rows, phase_s);
  if (FLAGS_failover) {
    map->client.reset();  // before its servers
    servers->processes.clear();
    return Failover(binary, etcd, root.path(), rows, phase_s);
  }
  return 0;
}
