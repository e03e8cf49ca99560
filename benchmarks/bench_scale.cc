// bench_scale: a table 10x and 100x larger than the server's memory budget, on skewed (Zipf
// s=1.05) and uniform keys, against a memory-only server holding the whole table and against
// the disk's own rates, measured in the same run, alternating (docs/benchmarks.md, "Scale").
//
// One tessera-server child process on RocksDB (strict durability, 2 lanes) and one memory-only
// server, each filled with the same `rows` rows x dim 16 (Adagrad) through the normal push path;
// the measurements start once the durable server is idle (the fill's compactions done).
//  - Zipf pushes and pulls with --memory_budget_mb at 1/10 of the table's raw bytes, against the
//    memory-only server (caller keys per second, medians): zipf_push_vs_memory,
//    zipf_pull_vs_memory.
//  - The same server restarted at 1/100 (restart_s: start to ready, recovery included), uniform
//    pulls: rows its lanes read from disk per second (the servers' disk_reads counters: one per
//    distinct missed row that exists on disk) against 4 KiB preads at random offsets of a file as
//    large as the server's data directory, with O_DIRECT (the device, not the page cache), from
//    as many threads as the server has lanes: uniform_miss_vs_disk_random_read. Before each of
//    the server's phases the page cache of its data files is dropped (posix_fadvise DONTNEED).
//  - The strict server's request-log bytes per second while it takes Zipf pushes (its
//    request_log_appended_bytes stat: the records' headers and payloads written; the segment
//    files' sizes do not tell, a segment being preallocated to its 64 MiB when it starts) against
//    write(2) of 1 MiB blocks + one fdatasync of a 256 MiB file on the same file system, the
//    server paused and the page cache synced first: strict_log_vs_disk_seq_write.
//  - Bytes per row: the memory-only server's RSS, the data directory's; a checkpoint and a
//    restore of the whole table (GB/s of the checkpoint's bytes, and against the sequential
//    write rate; the restore with --restore). Resharding at this size: bench_elastic --durable
//    --rows=N --server_flags=--memory_budget_mb=M (it needs a coordinator and a map change).
//
// Usage: bench_scale [--quick] [--rows=N] [--batches=10000,100000] [--reps=3] [--log_only]
// [--fsync] [--only=zipf] [--tier_server_b=PATH]. --quick: 10M rows, batches of 10,000 keys.
// --log_only: the fill and the strict log phase alone (e.g. --log_only --rows=1000000
// --batches=10000 for a one-minute A/B of the log); --fsync: the durable server runs with
// --fsync. --only=zipf: the fill and the Zipf phase only (no restart, uniform, checkpoint).
// --tier_server_b: a second server binary for the durable server; the Zipf phase then alternates
// the two binaries on the same data (restarted between them, each turn after the same warm-up)
// and the memory-only server, and adds the keys *_b (an A/B of two builds with one fill). Both
// binaries then run restarted, with a memory tier that holds only the rows read since: compare
// *_b with the keys without _b of the same run, not with a run without --tier_server_b. Prints
// a table and one JSON line.
#include <fcntl.h>
#include <gflags/gflags.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "benchmarks/bench_cluster.h"
#include "benchmarks/bench_keys.h"
#include "benchmarks/bench_process.h"
#include "benchmarks/bench_stats.h"
#include "ps/client/client.h"

DEFINE_bool(quick, false,
            "10M rows and batches of 10,000 keys (6-12 minutes on a busy 2-core machine, most of "
            "it the fill)");
DEFINE_uint64(rows, 100000000,
              "Rows in the table (1000000000 for a 1B-row run on a large machine)");
DEFINE_uint32(dim, 16, "Row dimension (Adagrad: as many state floats)");
DEFINE_string(batches, "10000,100000", "Keys per push or pull; one cell per size");
DEFINE_int32(reps, 3, "Alternating repetitions (medians)");
DEFINE_double(min_rep_s, 2, "Shortest phase of a repetition, in seconds");
DEFINE_string(server, "", "tessera-server binary (default: next to this program)");
DEFINE_string(dir, "", "Directory for the data (default: a temporary directory)");
DEFINE_int32(settle_s, 180,
             "After the fill, wait until the durable server is idle (under 0.1 core over 2 s: "
             "RocksDB's compactions of the fill done), at most this long");
DEFINE_bool(checkpoint, true, "Measure a checkpoint of the whole table");
DEFINE_bool(log_only, false,
            "Only the strict log phase: the durable server's fill, its warm-up and alternating "
            "Zipf pushes (log bytes) and sequential disk writes; no memory-only server, pulls, "
            "restart or checkpoint. With --rows smaller than --quick's for quick A/B runs");
DEFINE_bool(fsync, false,
            "Run the durable server with --fsync (each group of log records fdatasync'd before "
            "its pushes are acknowledged) instead of strict alone");
DEFINE_string(only, "", "\"zipf\": only the fill and the Zipf phase (empty: every phase)");
DEFINE_string(server_flags, "",
              "Extra flags for the durable server, comma-separated (e.g. "
              "--write_back_interval_ms=5000); not for the memory-only one");
DEFINE_string(tier_server_b, "",
              "A second tessera-server binary for the durable server, alternated with --server "
              "in the Zipf phase on the same data, both restarted first (JSON keys *_b)");
DEFINE_bool(restore, false,
            "Also restore it (200 s for 10M rows on a loaded 2-core machine: not in --quick)");

namespace {

using namespace tessera;         // NOLINT
using namespace tessera::bench;  // NOLINT
using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

uint64_t Rows() { return FLAGS_quick ? 10000000 : FLAGS_rows; }
uint64_t RawBytes() { return Rows() * FLAGS_dim * 2 * sizeof(float); }
uint64_t KeyOf(uint64_t rank0) { return SpreadId(rank0 + 1); }  // Zipf ranks start at 1

double ProcStatusMb(pid_t pid, const std::string& field) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(field + ":", 0) == 0) return std::stod(line.substr(field.size() + 1)) / 1024;
  }
  return 0;
}

double ProcMeminfoMb(const std::string& field) {
  std::ifstream in("/proc/meminfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(field + ":", 0) == 0) return std::stod(line.substr(field.size() + 1)) / 1024;
  }
  return 0;
}

uint64_t BytesUnder(const std::string& dir) {
  uint64_t bytes = 0;
  std::error_code ec;
  for (auto& f : std::filesystem::recursive_directory_iterator(dir, ec)) {
    if (f.is_regular_file(ec)) bytes += f.file_size(ec);
  }
  return bytes;
}

// Drops the page cache of every file under `dir` (clean pages only: run after the writes).
void DropCache(const std::string& dir) {
  std::error_code ec;
  for (auto& f : std::filesystem::recursive_directory_iterator(dir, ec)) {
    if (!f.is_regular_file(ec)) continue;
    const int fd = open(f.path().c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    fdatasync(fd);
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
  }
}

struct Server {
  const char* name;
  BenchCluster cluster;
  std::unique_ptr<Client> client;
  Table table;
};

Status Open(Server& s, const std::string& binary, const std::vector<std::string>& flags,
            bool create) {
  TESSERA_RETURN_IF_ERROR(s.cluster.Start(1, "process", binary, 2, flags));
  ClientOptions co;
  co.servers = s.cluster.endpoints();
  co.admin_root = FLAGS_dir.empty() ? "" : FLAGS_dir;
  TESSERA_ASSIGN_OR_RETURN(s.client, Client::Create(co));
  const OptimizerSpec adagrad{.kind = OptimizerKind::kAdagrad, .learning_rate = 0.05f};
  if (create) {
    TESSERA_ASSIGN_OR_RETURN(s.table,
                             s.client->CreateTable(TableSpec::Sparse("scale", FLAGS_dim, adagrad)));
  } else {
    TESSERA_ASSIGN_OR_RETURN(s.table, s.client->GetTable("scale"));
  }
  return Status::OK();
}

// Every row pushed once (so it is stored with its optimizer state), 100,000 keys a push.
Status Fill(Server& s) {
  constexpr uint64_t kBatch = 100000;
  std::vector<uint64_t> keys;
  const std::vector<float> grads(kBatch * FLAGS_dim, 0.01f);
  for (uint64_t first = 0; first < Rows(); first += kBatch) {
    keys.clear();
    for (uint64_t r = first; r < std::min(Rows(), first + kBatch); ++r) keys.push_back(KeyOf(r));
    TESSERA_RETURN_IF_ERROR(
        s.client
            ->Wait(s.client->Push(s.table, keys, std::span(grads).first(keys.size() * FLAGS_dim)))
            .WithContext(std::string(s.name) + ": fill"));
  }
  return Status::OK();
}

// The sum over the server's lanes of stat `name` (ServerStats lines "laneN_<name> V").
Result<uint64_t> LaneStat(Server& s, const std::string& name) {
  TESSERA_ASSIGN_OR_RETURN(std::string stats, s.client->ServerStats(0));
  std::istringstream lines(stats);
  uint64_t sum = 0;
  for (std::string key, value; lines >> key && std::getline(lines, value);) {
    if (key.starts_with("lane") && key.ends_with("_" + name)) sum += std::stoull(value);
  }
  return sum;
}

// Server-wide stat `name` (a ServerStats line "<name> V").
Result<uint64_t> ServerStat(Server& s, const std::string& name) {
  TESSERA_ASSIGN_OR_RETURN(std::string stats, s.client->ServerStats(0));
  std::istringstream lines(stats);
  for (std::string key, value; lines >> key && std::getline(lines, value);) {
    if (key == name) return static_cast<uint64_t>(std::stoull(value));
  }
  return Status::NotFound(std::string(s.name) + " reports no " + name);
}

Status WaitWrittenBack(Server& s) {
  const auto t0 = Clock::now();
  for (;;) {
    TESSERA_ASSIGN_OR_RETURN(uint64_t dirty, LaneStat(s, "dirty_bytes"));
    if (dirty == 0) return Status::OK();
    if (Seconds(t0) > 600) return Status::DeadlineExceeded("rows not written back in 600 s");
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

// Caller keys per second of back-to-back pushes or pulls for at least --min_rep_s.
Result<double> Run(Server& s, const std::vector<std::vector<uint64_t>>& batches, bool push) {
  const size_t n = batches[0].size();
  const std::vector<float> grads(n * FLAGS_dim, 0.01f);
  std::vector<float> out(n * FLAGS_dim);
  const auto t0 = Clock::now();
  uint64_t keys = 0;
  for (size_t i = 0; i < 2 || Seconds(t0) < FLAGS_min_rep_s; ++i) {
    const auto& b = batches[i % batches.size()];
    TESSERA_RETURN_IF_ERROR(s.client
                                ->Wait(push ? s.client->Push(s.table, b, grads)
                                            : s.client->Pull(s.table, b, out.data()))
                                .WithContext(std::string(s.name) + (push ? ": push" : ": pull")));
    keys += b.size();
  }
  return keys / Seconds(t0);
}

// The disk's sequential write rate: 256 MiB in 1 MiB write(2)s, then one fdatasync (bytes/s).
double DiskSeqWrite(const std::string& dir) {
  const std::string path = dir + "/seq-write";
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return 0;
  std::vector<char> block(1 << 20, 'x');
  constexpr int kBlocks = 256;
  const auto t0 = Clock::now();
  for (int i = 0; i < kBlocks; ++i) {
    if (write(fd, block.data(), block.size()) != static_cast<ssize_t>(block.size())) break;
  }
  fdatasync(fd);
  const double s = Seconds(t0);
  close(fd);
  unlink(path.c_str());
  return kBlocks * double(block.size()) / s;
}

// A file of `bytes` for the random reads (written once, synced).
bool MakeReadFile(const std::string& path, uint64_t bytes) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return false;
  std::vector<char> block(4 << 20);
  SplitMix64 rng(3);
  for (auto& c : block) c = static_cast<char>(rng.Next());
  for (uint64_t done = 0; done < bytes; done += block.size()) {
    if (write(fd, block.data(), block.size()) != static_cast<ssize_t>(block.size())) {
      close(fd);
      return false;
    }
  }
  fdatasync(fd);
  close(fd);
  return true;
}

// 4 KiB preads at random aligned offsets of `path` from `threads` threads for `seconds`, with
// O_DIRECT (the page cache is bypassed): reads per second. *direct says whether O_DIRECT held
// (else the file's cache is dropped first and reads may hit what they bring in).
double DiskRandomRead(const std::string& path, uint64_t bytes, int threads, double seconds,
                      bool* direct) {
  int fd = open(path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
  *direct = fd >= 0;
  if (fd < 0) {
    fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  }
  std::atomic<uint64_t> reads{0};
  const auto t0 = Clock::now();
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t) {
    ts.emplace_back([&, t] {
      void* buf = nullptr;
      if (posix_memalign(&buf, 4096, 4096) != 0) return;
      SplitMix64 rng(100 + t);
      uint64_t n = 0;
      while (Seconds(t0) < seconds) {
        const uint64_t off = (rng.Next() % (bytes / 4096)) * 4096;
        if (pread(fd, buf, 4096, static_cast<off_t>(off)) != 4096) break;
        ++n;
      }
      reads += n;
      free(buf);
    });
  }
  for (auto& t : ts) t.join();
  const double s = Seconds(t0);
  close(fd);
  return reads.load() / s;
}

struct Cell {
  std::vector<double> push_mem, push_tier, pull_mem, pull_tier, push_tier_b, pull_tier_b;
};

// Memory-tier bytes per row of the durable server (its lanes' bytes_in_memory / rows_in_memory).
double TierBytesPerRow(Server& s) {
  auto bytes = LaneStat(s, "bytes_in_memory");
  auto rows = LaneStat(s, "rows_in_memory");
  return bytes.ok() && rows.ok() && *rows > 0 ? double(*bytes) / double(*rows) : 0;
}

// long function: the run's phases in order (fill, Zipf, restart, uniform, checkpoint, report),
// sharing the two servers, their pauses and the figures the report prints.
int Main(int argc, char** argv) {
  CleanUpOnStopSignals();
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  if (!FLAGS_only.empty() && FLAGS_only != "zipf") {
    std::fprintf(stderr, "bench_scale: --only=%s: expected \"zipf\" or nothing\n",
                 FLAGS_only.c_str());
    return 2;
  }
  const std::string binary = FLAGS_server.empty() ? DefaultServerBinary(argv[0]) : FLAGS_server;
  std::vector<uint64_t> batch_sizes = ParseList(FLAGS_quick ? "10000" : FLAGS_batches);
  const TempDir tmp("tessera-bench-scale-");
  const std::string root = FLAGS_dir.empty() ? tmp.path() : FLAGS_dir;
  FLAGS_dir = root;  // the admin root of both servers and clients
  const std::string data = root + "/data";
  const uint64_t raw = RawBytes();
  const uint64_t budget10 = std::max<uint64_t>(1, (raw / 10) >> 20);
  const uint64_t budget100 = std::max<uint64_t>(1, (raw / 100) >> 20);
  auto fail = [](const Status& s) {
    std::fprintf(stderr, "bench_scale: %s\n", s.ToString().c_str());
    return 1;
  };

  Server mem{"memory"}, tier{"tier"};
  std::vector<std::string> tier_flags = {"--data_dir=" + data, "--admin_root=" + root,
                                         "--durability=strict"};
  if (FLAGS_fsync) tier_flags.push_back("--fsync");
  for (std::string& f : tessera::bench::SplitFlags(FLAGS_server_flags)) tier_flags.push_back(f);
  auto with_budget = [&](uint64_t mb) {
    std::vector<std::string> f = tier_flags;
    f.push_back("--memory_budget_mb=" + std::to_string(mb));
    return f;
  };
  // The memory-only server holds the whole table where it fits (its RSS ran at ~1.6x the raw
  // bytes): 1B rows do not fit a small machine.
  const bool with_memory = !FLAGS_log_only && 1.6 * raw < ProcMeminfoMb("MemAvailable") * 1048576.0;
  const auto fill0 = Clock::now();
  Status st = Open(tier, binary, with_budget(budget10), true);
  if (!st.ok()) return fail(st);
  std::vector<BenchCluster*> all = {&tier.cluster};
  if (!(st = Fill(tier)).ok() || !(st = WaitWrittenBack(tier)).ok()) return fail(st);
  const double fill_tier_s = Seconds(fill0);
  // The fill's compactions (random keys into leveled RocksDB) go on after it: measured, they
  // took half the durable server's CPU in the first Zipf phases.
  const double settle_s = tessera::bench::WaitUntilQuiet(
      [&tier] { return ProcessCpuSeconds(tier.cluster.pid(0)); }, 2, 0.2, FLAGS_settle_s);
  double fill_mem_s = 0;
  double mem_rss_mb = 0;
  if (with_memory) {
    // Started only now: a client whose server stayed paused through the durable server's fill
    // and settling gave up on it (not connected after 120 s of retries).
    if (!(st = Open(mem, binary, {"--admin_root=" + root}, true)).ok()) return fail(st);
    all.push_back(&mem.cluster);
    RunOnly(all, mem.cluster);
    const auto t0 = Clock::now();
    if (!(st = Fill(mem)).ok()) return fail(st);
    fill_mem_s = Seconds(t0);
    mem_rss_mb = ProcStatusMb(mem.cluster.pid(0), "VmRSS");
  }
  std::fprintf(stderr, "filled %llu rows: tier %.1f s (written back), memory %.1f s\n",
               static_cast<unsigned long long>(Rows()), fill_tier_s, fill_mem_s);

  // --- Zipf at 1/10, against the memory-only server; the strict log against the disk.
  std::map<uint64_t, Cell> zipf;
  std::vector<double> log_rate, seq_write;
  // Variants: 0 the durable server (--server), 1 the memory-only one, 2 the durable server on
  // --tier_server_b (restarted on the same data whenever the binary changes).
  const bool with_b = !FLAGS_tier_server_b.empty();
  std::string tier_binary = binary;
  double bytes_per_row_a = 0, bytes_per_row_b = 0;
  for (uint64_t b : batch_sizes) {
    const auto batches = ZipfBatches(16, b, Rows(), 1.05, 11 + b);
    auto warm_up = [&]() -> Status {
      // The memory tier learns the hot set.
      RunOnly(all, tier.cluster);
      for (int i = 0; i < 2; ++i) TESSERA_RETURN_IF_ERROR(Run(tier, batches, false).status());
      return Status::OK();
    };
    // With two binaries each is restarted before its first turn: a restarted memory tier holds
    // only the rows read since (not the fill's), so both start alike.
    if (with_b) {
      tier_binary.clear();
    } else if (!(st = warm_up()).ok()) {
      return fail(st);
    }
    Cell& c = zipf[b];
    std::vector<int> order = {0};
    if (with_memory) order.push_back(1);
    if (with_b) order.push_back(2);
    for (int rep = 0; rep < FLAGS_reps; ++rep) {
      for (size_t k = 0; k < order.size(); ++k) {
        const int v = order[rep % 2 == 0 ? k : order.size() - 1 - k];
        const bool tier_turn = v != 1;
        const std::string& want = v == 2 ? FLAGS_tier_server_b : binary;
        if (tier_turn && want != tier_binary) {
          RunOnly(all, tier.cluster);
          if (auto w = WaitWrittenBack(tier); !w.ok()) return fail(w);
          tier.client.reset();
          tier.cluster.Stop();
          if (!(st = Open(tier, want, with_budget(budget10), false)).ok()) return fail(st);
          tier_binary = want;
          if (!(st = warm_up()).ok()) return fail(st);
        }
        Server& s = tier_turn ? tier : mem;
        RunOnly(all, s.cluster);
        // The strict log is measured on --server's turns.
        Result<uint64_t> appended0 = uint64_t{0};
        if (v == 0 && !(appended0 = ServerStat(s, "request_log_appended_bytes")).ok()) {
          return fail(appended0.status());
        }
        const auto t0 = Clock::now();
        auto push = Run(s, batches, true);
        const double push_s = Seconds(t0);
        if (!push.ok()) return fail(push.status());
        if (v == 0) {
          auto appended = ServerStat(s, "request_log_appended_bytes");
          if (!appended.ok()) return fail(appended.status());
          log_rate.push_back((*appended - *appended0) / push_s);
          // The disk alone, as bench_durability measures it: the server paused, what its pushes
          // left dirty written first.
          tier.cluster.Pause();
          ::sync();
          seq_write.push_back(DiskSeqWrite(root));
          RunOnly(all, s.cluster);
        }
        if (FLAGS_log_only) {
          (v == 0 ? c.push_tier : v == 1 ? c.push_mem : c.push_tier_b).push_back(*push);
          continue;
        }
        auto pull = Run(s, batches, false);
        if (!pull.ok()) return fail(pull.status());
        (v == 0 ? c.push_tier : v == 1 ? c.push_mem : c.push_tier_b).push_back(*push);
        (v == 0 ? c.pull_tier : v == 1 ? c.pull_mem : c.pull_tier_b).push_back(*pull);
        if (v != 1) (v == 0 ? bytes_per_row_a : bytes_per_row_b) = TierBytesPerRow(tier);
      }
    }
  }
  if (FLAGS_log_only) {
    const double seq = Median(seq_write), log_bps = Median(log_rate);
    const double keys = Median(zipf.begin()->second.push_tier);
    std::printf(
        "strict%s log %.1f MB/s (pushes %.0f caller keys/s, %.1f log bytes a key) vs the disk's "
        "sequential write + fdatasync %.0f MB/s: %.3fx\n",
        FLAGS_fsync ? " + fsync" : "", log_bps / 1e6, keys, keys > 0 ? log_bps / keys : 0,
        seq / 1e6, seq > 0 ? log_bps / seq : 0);
    std::printf(
        "{\"bench\":\"scale\",\"log_only\":true,\"fsync\":%s,\"rows\":%llu,"
        "\"strict_log_mb_s\":%g,\"disk_seq_write_mb_s\":%g,\"strict_log_vs_disk_seq_write\":%g,"
        "\"zipf_push_tier\":%g}\n",
        FLAGS_fsync ? "true" : "false", static_cast<unsigned long long>(Rows()), log_bps / 1e6,
        seq / 1e6, seq > 0 ? log_bps / seq : 0, keys);
    tier.cluster.Resume();
    return 0;
  }
  const bool all_phases = FLAGS_only != "zipf";
  if (all_phases && tier_binary != binary) {
    // The later phases run on --server.
    RunOnly(all, tier.cluster);
    if (!(st = WaitWrittenBack(tier)).ok()) return fail(st);
    tier.client.reset();
    tier.cluster.Stop();
    if (!(st = Open(tier, binary, with_budget(budget10), false)).ok()) return fail(st);
  }
  RunOnly(all, tier.cluster);
  auto waits = LaneStat(tier, "back_pressure_waits");
  auto rejects = LaneStat(tier, "admission_rejects");
  auto zipf_hits = LaneStat(tier, "memory_hits");
  auto zipf_lookups = LaneStat(tier, "lookups");
  const double tier10_rss_mb = ProcStatusMb(tier.cluster.pid(0), "VmRSS");
  if (!(st = WaitWrittenBack(tier)).ok()) return fail(st);

  uint64_t disk_bytes = 0;
  double restart_s = 0, ckpt_s = 0, restore_s = 0, ckpt_bytes = 0;
  std::vector<double> miss_rate, disk_read_rate, uni_pull_tier, uni_pull_mem;
  bool direct = true;
  if (all_phases) {
    // --- Restart at 1/100: recovery time; uniform pulls against the disk's random reads.
    tier.client.reset();
    tier.cluster.Stop();
    disk_bytes = BytesUnder(data);
    const auto r0 = Clock::now();
    if (!(st = Open(tier, binary, with_budget(budget100), false)).ok()) return fail(st);
    restart_s = Seconds(r0);
    all[0] = &tier.cluster;
    const std::string read_file = root + "/random-read";
    if (!MakeReadFile(read_file, std::max<uint64_t>(disk_bytes, 64 << 20))) {
      return fail(Status::IOError("cannot write " + read_file));
    }
    const uint64_t read_bytes = std::max<uint64_t>(disk_bytes, 64 << 20);
    const auto uniform = UniformBatches(16, batch_sizes[0], Rows(), 5);
    std::vector<std::vector<uint64_t>> uniform_keys = uniform;
    for (auto& b : uniform_keys) {
      for (auto& k : b) k = KeyOf(k);
    }
    for (int rep = 0; rep < FLAGS_reps; ++rep) {
      for (int v = 0; v < 2; ++v) {
        if ((v == 0) == (rep % 2 == 0)) {
          RunOnly(all, tier.cluster);
          DropCache(data);
          auto before = LaneStat(tier, "disk_reads");
          const auto t0 = Clock::now();
          auto pull = Run(tier, uniform_keys, false);
          const double s = Seconds(t0);
          auto after = LaneStat(tier, "disk_reads");
          if (!pull.ok()) return fail(pull.status());
          if (!before.ok() || !after.ok())
            return fail(before.ok() ? after.status() : before.status());
          miss_rate.push_back((*after - *before) / s);
          uni_pull_tier.push_back(*pull);
        } else {
          tier.cluster.Pause();
          disk_read_rate.push_back(
              DiskRandomRead(read_file, read_bytes, 2, FLAGS_min_rep_s, &direct));
          if (with_memory) {
            RunOnly(all, mem.cluster);
            auto pull = Run(mem, uniform_keys, false);
            if (!pull.ok()) return fail(pull.status());
            uni_pull_mem.push_back(*pull);
          }
        }
      }
    }
    std::filesystem::remove(read_file);

    // --- Checkpoint and restore of the whole table (the tier server, at 1/100).
    if (FLAGS_checkpoint) {
      RunOnly(all, tier.cluster);
      if (!(st = WaitWrittenBack(tier)).ok()) return fail(st);
      const auto c0 = Clock::now();
      auto cut = tier.client->Checkpoint("ckpt");
      ckpt_s = Seconds(c0);
      if (!cut.ok()) return fail(cut.status());
      ckpt_bytes = static_cast<double>(BytesUnder(root + "/ckpt"));
      if (FLAGS_restore) {
        const auto q0 = Clock::now();
        if (!(st = tier.client->Restore("ckpt")).ok()) return fail(st);
        restore_s = Seconds(q0);
      }
    }
  }
  mem.cluster.Resume();
  tier.cluster.Resume();

  // --- Report.
  const double seq = Median(seq_write);
  const double log_bps = Median(log_rate);
  std::printf(
      "bench_scale: %llu rows x dim %u (Adagrad), raw %.2f GB; budgets %llu MiB (1/10), "
      "%llu MiB (1/100); %d reps, alternating\n",
      static_cast<unsigned long long>(Rows()), FLAGS_dim, raw / 1e9,
      static_cast<unsigned long long>(budget10), static_cast<unsigned long long>(budget100),
      FLAGS_reps);
  std::ostringstream json;
  json << "{\"bench\":\"scale\",\"rows\":" << Rows() << ",\"dim\":" << FLAGS_dim
       << ",\"budget_1_10_mb\":" << budget10 << ",\"budget_1_100_mb\":" << budget100;
  bool first_batch = true;
  for (const auto& [b, c] : zipf) {
    const double push_r = with_memory ? Median(c.push_tier) / Median(c.push_mem) : 0;
    const double pull_r = with_memory ? Median(c.pull_tier) / Median(c.pull_mem) : 0;
    std::printf(
        "zipf s=1.05, batch %llu, budget 1/10: push %.0f vs memory %.0f keys/s (%.2fx); "
        "pull %.0f vs %.0f (%.2fx)\n",
        static_cast<unsigned long long>(b), Median(c.push_tier), Median(c.push_mem), push_r,
        Median(c.pull_tier), Median(c.pull_mem), pull_r);
    const std::string sfx = first_batch ? "" : "_" + std::to_string(b);
    json << ",\"zipf_push_vs_memory" << sfx << "\":" << push_r << ",\"zipf_pull_vs_memory" << sfx
         << "\":" << pull_r << ",\"zipf_push_tier" << sfx << "\":" << Median(c.push_tier)
         << ",\"zipf_push_memory" << sfx << "\":" << Median(c.push_mem) << ",\"zipf_pull_tier"
         << sfx << "\":" << Median(c.pull_tier) << ",\"zipf_pull_memory" << sfx
         << "\":" << Median(c.pull_mem);
    if (with_b) {
      const double push_b = with_memory ? Median(c.push_tier_b) / Median(c.push_mem) : 0;
      const double pull_b = with_memory ? Median(c.pull_tier_b) / Median(c.pull_mem) : 0;
      std::printf("  server b: push %.0f keys/s (%.2fx of memory), pull %.0f (%.2fx)\n",
                  Median(c.push_tier_b), push_b, Median(c.pull_tier_b), pull_b);
      json << ",\"zipf_push_vs_memory_b" << sfx << "\":" << push_b << ",\"zipf_pull_vs_memory_b"
           << sfx << "\":" << pull_b << ",\"zipf_push_tier_b" << sfx
           << "\":" << Median(c.push_tier_b) << ",\"zipf_pull_tier_b" << sfx
           << "\":" << Median(c.pull_tier_b);
    }
    first_batch = false;
  }
  const double hit_rate = zipf_hits.ok() && zipf_lookups.ok() && *zipf_lookups > 0
                              ? double(*zipf_hits) / double(*zipf_lookups)
                              : 0;
  const double miss = Median(miss_rate), disk_rr = Median(disk_read_rate);
  std::printf("zipf pull hit rate at 1/10 (whole run): %.3f\n", hit_rate);
  std::printf(
      "uniform pull, budget 1/100: %.0f keys/s (memory-only %.0f); rows read from disk "
      "%.0f/s vs the disk's 4 KiB random reads %.0f/s (%s, 2 threads): %.2fx\n",
      Median(uni_pull_tier), Median(uni_pull_mem), miss, disk_rr,
      direct ? "O_DIRECT" : "page cache dropped", disk_rr > 0 ? miss / disk_rr : 0);
  std::printf("strict log %.0f MB/s vs the disk's sequential write + fdatasync %.0f MB/s: %.2fx\n",
              log_bps / 1e6, seq / 1e6, seq > 0 ? log_bps / seq : 0);
  const double disk_per_row = double(disk_bytes) / Rows();
  const double mem_per_row = mem_rss_mb * 1048576.0 / Rows();
  std::printf(
      "bytes per row: memory-only RSS %.0f, on disk %.0f (data dir %.2f GB); tier RSS at "
      "1/10 %.0f MiB; restart %.1f s\n",
      mem_per_row, disk_per_row, disk_bytes / 1e9, tier10_rss_mb, restart_s);
  if (FLAGS_checkpoint && all_phases) {
    std::printf("checkpoint %.2f GB in %.1f s (%.2f GB/s, %.2fx of sequential writes)\n",
                ckpt_bytes / 1e9, ckpt_s, ckpt_bytes / ckpt_s / 1e9, ckpt_bytes / ckpt_s / seq);
  }
  if (FLAGS_restore && all_phases) {
    std::printf("restore %.1f s (%.2f GB/s, %.2fx of sequential writes)\n", restore_s,
                ckpt_bytes / restore_s / 1e9, ckpt_bytes / restore_s / seq);
  }
  json << ",\"tier_memory_bytes_per_row\":" << bytes_per_row_a;
  if (with_b) json << ",\"tier_memory_bytes_per_row_b\":" << bytes_per_row_b;
  json << ",\"zipf_pull_hit_rate\":" << hit_rate
       << ",\"uniform_pull_tier_1_100\":" << Median(uni_pull_tier)
       << ",\"uniform_pull_memory\":" << Median(uni_pull_mem)
       << ",\"uniform_miss_reads_per_s\":" << miss << ",\"disk_random_reads_per_s\":" << disk_rr
       << ",\"disk_random_read_o_direct\":" << (direct ? "true" : "false")
       << ",\"uniform_miss_vs_disk_random_read\":" << (disk_rr > 0 ? miss / disk_rr : 0)
       << ",\"strict_log_mb_s\":" << log_bps / 1e6 << ",\"disk_seq_write_mb_s\":" << seq / 1e6
       << ",\"strict_log_vs_disk_seq_write\":" << (seq > 0 ? log_bps / seq : 0)
       << ",\"memory_rss_bytes_per_row\":" << mem_per_row
       << ",\"disk_bytes_per_row\":" << disk_per_row << ",\"tier_1_10_rss_mb\":" << tier10_rss_mb
       << ",\"restart_s\":" << restart_s << ",\"fill_tier_s\":" << fill_tier_s
       << ",\"fill_memory_s\":" << fill_mem_s << ",\"settle_s\":" << settle_s;
  json << ",\"tier_back_pressure_waits\":" << (waits.ok() ? *waits : 0)
       << ",\"tier_admission_rejects\":" << (rejects.ok() ? *rejects : 0);
  if (FLAGS_checkpoint && all_phases) {
    json << ",\"checkpoint_gb\":" << ckpt_bytes / 1e9 << ",\"checkpoint_s\":" << ckpt_s
         << ",\"checkpoint_gb_s\":" << ckpt_bytes / ckpt_s / 1e9
         << ",\"checkpoint_vs_disk_seq_write\":" << ckpt_bytes / ckpt_s / seq;
  }
  if (FLAGS_restore && all_phases) {
    json << ",\"restore_s\":" << restore_s << ",\"restore_gb_s\":" << ckpt_bytes / restore_s / 1e9
         << ",\"restore_vs_disk_seq_write\":" << ckpt_bytes / restore_s / seq;
  }
  json << ",\"resharding\":\"bench_elastic --durable\"}";
  std::printf("%s\n", json.str().c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return Main(argc, argv); }
