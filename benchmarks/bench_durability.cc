// bench_durability: what durability costs a server, next to a memory-only server in the same
// run: push throughput with uniform and Zipf keys, the pull latency of a reader while a trainer
// pushes, and the time a durable server takes to answer again after a crash.
//
// Three 1-server clusters run as child processes (2 lanes each): memory-only, RocksDB relaxed
// and RocksDB strict (with the request log that keeps multi-lane pushes whole). Every
// measurement alternates its repetitions between the configurations (bench_stats.h: forwards,
// then backwards, ...) and reports medians. While one configuration is measured the others'
// servers are paused (SIGSTOP, bench_cluster.h RunOnly): on a machine of 2 cores, a RocksDB
// server's background work would otherwise slow whichever configuration runs after it, and not
// itself.
//
// - Push throughput: pushes of --keys keys x --dim floats (Adagrad), keys uniform over
//   --key_space ids, or Zipf (--zipf_s over as many ids; bench_keys.h, as bench_sparse; memory
//   and strict only). A repetition pushes back to back for at least --min_rep_s seconds (3 with
//   --quick, else 10) rather than a fixed number of pushes: the durable server's background
//   work (a row flusher every few seconds, RocksDB flushes and compactions) must fall inside
//   the timed window, or a short repetition would time only the fast path and leave the bill
//   for after the timer stops.
// - Serving under training (memory and strict): a reader with its own client and thread pulls
//   batches of --read_keys Zipf keys back to back, alone for --idle_s seconds (right after its
//   server resumes, so next to whatever background work that server still owes), then for
//   --min_rep_s seconds while a trainer pushes uniform batches. The p99 of each repetition's
//   pulls; medians over repetitions.
// - Strict log against the disk (strict, uniform keys): the request-log bytes per second that
//   strict pushes write (the server's request_log_appended_bytes over a repetition of pushes,
//   as long as the push repetitions), alternating with the disk's own sequential write rate
//   measured the way `dd bs=4M conv=fdatasync` does: --disk_write_mib MiB written in 4 MiB
//   writes to a new file next to the servers' data, one fdatasync at the end, all timed.
// - Recovery (strict): the server is SIGKILLed right after a push and started again on its data
//   directory; recovery_s runs from the restart until a new client's pull of a few rows
//   returns. The rows must read back as before the kill, or the run fails.
//
// The last line of output is one JSON object.
#include <fcntl.h>
#include <gflags/gflags.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "benchmarks/bench_cluster.h"
#include "benchmarks/bench_keys.h"
#include "benchmarks/bench_process.h"
#include "benchmarks/bench_stats.h"
#include "ps/client/client.h"

DEFINE_bool(quick, false, "Short run (about 2 minutes): 3 repetitions of 3 s");
DEFINE_uint32(keys, 100000, "Keys per push");
DEFINE_uint32(dim, 16, "Floats per key");
DEFINE_uint64(key_space, 2000000, "Distinct ids keys are drawn from");
DEFINE_double(zipf_s, 1.05, "Exponent of the Zipf keys (as bench_sparse)");
DEFINE_int32(reps, 0, "Repetitions per configuration (0: 3 with --quick, else 7)");
DEFINE_double(min_rep_s, 0,
              "Shortest repetition of pushes, in seconds; it ends after the push under way "
              "then (0: 3 with --quick, else 10)");
DEFINE_double(idle_s, 0,
              "Reader alone per serving repetition, in seconds (0: 1 with --quick, else 3)");
DEFINE_uint32(read_keys, 64, "Keys per pull of the serving reader");
DEFINE_string(server_binary, "", "tessera-server (default: next to this program)");
DEFINE_string(server_flags, "",
              "Extra flags for every tessera-server, comma-separated, e.g. "
              "--row_commit_interval_ms=0");
DEFINE_uint64(seed, 42, "Seed of the key generator");
DEFINE_uint32(disk_write_mib, 512,
              "MiB the disk's sequential write measurement writes (4 MiB writes, then fdatasync)");

namespace {

using BenchClock = std::chrono::steady_clock;
using KeyBatches = std::vector<std::vector<uint64_t>>;
using tessera::Result;
using tessera::Status;
using tessera::bench::Median;
using tessera::bench::Percentile;
using tessera::bench::RunOnly;

// The Zipf ranks of the pushes' keys and of the reader's are the same law over the same ids, so
// the rows the reader wants hottest are the ones the Zipf pushes change most.
struct Workload {
  KeyBatches uniform, zipf, reads;
  std::vector<float> grads;
  double zipf_unique = 0;  // mean fraction of a Zipf push's keys that are distinct
};

// One 1-server cluster, a trainer's client on it and, for the serving measurement, a reader's.
struct Config {
  std::string name;
  std::vector<std::string> flags;
  tessera::bench::BenchCluster cluster;
  std::unique_ptr<tessera::Client> client, reader;
  tessera::Table table;
};

// The reader's pulls over one phase of a serving repetition.
struct ReadSummary {
  double p50_ms = 0, p99_ms = 0, max_ms = 0, pulls_per_s = 0;
};

// The figures of one serving repetition: the reader alone, then next to the trainer.
struct ServingRep {
  ReadSummary idle, training;
  double trainer_keys_per_s = 0;
};

double Seconds(BenchClock::duration d) { return std::chrono::duration<double>(d).count(); }

double Ms(BenchClock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

double MinRepSeconds() {
  if (FLAGS_min_rep_s > 0) return FLAGS_min_rep_s;
  return FLAGS_quick ? 3 : 10;
}

double IdleSeconds() {
  if (FLAGS_idle_s > 0) return FLAGS_idle_s;
  return FLAGS_quick ? 1 : 3;
}

Workload MakeWorkload() {
  // 4 distinct pushes per key law with --quick: fewer rows to create in the warm-up.
  const size_t batches = FLAGS_quick ? 4 : 8;
  Workload w;
  w.uniform = tessera::bench::UniformBatches(batches, FLAGS_keys, FLAGS_key_space, FLAGS_seed);
  w.zipf = tessera::bench::ZipfBatches(batches, FLAGS_keys, FLAGS_key_space, FLAGS_zipf_s,
                                       FLAGS_seed + 1);
  w.reads = tessera::bench::ZipfBatches(256, FLAGS_read_keys, FLAGS_key_space, FLAGS_zipf_s,
                                        FLAGS_seed + 2);
  w.grads.assign(size_t{FLAGS_keys} * FLAGS_dim, 0.01f);
  for (const auto& b : w.zipf) w.zipf_unique += tessera::bench::UniqueFraction(b) / batches;
  return w;
}

// A client of the cluster; Create() fails when the server does not answer a ping within
// `connect_timeout_ms`.
Result<std::unique_ptr<tessera::Client>> Connect(const tessera::bench::BenchCluster& cluster,
                                                 int64_t connect_timeout_ms = 10000) {
  tessera::ClientOptions co;
  co.servers = cluster.endpoints();
  co.connect_timeout_ms = connect_timeout_ms;
  return tessera::Client::Create(co);
}

Status StartConfig(Config& c, const std::string& binary) {
  std::vector<std::string> flags = c.flags;
  for (std::string& f : tessera::bench::SplitFlags(FLAGS_server_flags)) flags.push_back(f);
  TESSERA_RETURN_IF_ERROR(c.cluster.Start(1, "process", binary, 2, flags));
  TESSERA_ASSIGN_OR_RETURN(c.client, Connect(c.cluster));
  const tessera::OptimizerSpec adagrad{.kind = tessera::OptimizerKind::kAdagrad,
                                       .learning_rate = 0.05f};
  TESSERA_ASSIGN_OR_RETURN(
      c.table, c.client->CreateTable(tessera::TableSpec::Sparse("d", FLAGS_dim, adagrad)));
  return Status::OK();
}

// Pushes the batches in turn, back to back, until at least `min_s` seconds and `min_pushes`
// pushes are done; the caller's keys per second (duplicates included, as bench_sparse).
Result<double> PushFor(Config& c, const KeyBatches& batches, const std::vector<float>& grads,
                       double min_s, size_t min_pushes = 1) {
  const auto t0 = BenchClock::now();
  size_t pushes = 0;
  uint64_t keys = 0;
  while (pushes < min_pushes || Seconds(BenchClock::now() - t0) < min_s) {
    const auto& batch = batches[pushes++ % batches.size()];
    TESSERA_RETURN_IF_ERROR(
        c.client->Wait(c.client->Push(c.table, batch, grads)).WithContext(c.name + ": push"));
    keys += batch.size();
  }
  return static_cast<double>(keys) / Seconds(BenchClock::now() - t0);
}

// Pulls `keys` from `client` and waits; the rows, keys.size() x dim floats.
Result<std::vector<float>> PullRows(tessera::Client& client, const tessera::Table& table,
                                    const std::vector<uint64_t>& keys) {
  std::vector<float> rows(keys.size() * table.spec.dim);
  TESSERA_RETURN_IF_ERROR(client.Wait(client.Pull(table, keys, rows.data())));
  return rows;
}

ReadSummary Summarize(std::vector<double> lat_ms, double seconds) {
  ReadSummary r;
  r.pulls_per_s = static_cast<double>(lat_ms.size()) / seconds;
  if (!lat_ms.empty()) r.max_ms = *std::max_element(lat_ms.begin(), lat_ms.end());
  r.p50_ms = Percentile(lat_ms, 0.5);
  r.p99_ms = Percentile(std::move(lat_ms), 0.99);
  return r;
}

// Runs `work` (returning Status) on this thread while the config's reader pulls w.reads in turn,
// back to back, on a thread of its own, timing every pull, until `work` is done.
template <typename Work>
Result<ReadSummary> ReadDuring(Config& c, const Workload& w, Work&& work) {
  std::atomic<bool> stop{false};
  std::vector<double> lat_ms;
  Status read_error;
  const auto start = BenchClock::now();
  std::thread reader([&] {
    std::vector<float> out(size_t{FLAGS_read_keys} * FLAGS_dim);
    for (size_t i = 0; !stop.load(std::memory_order_relaxed); ++i) {
      const auto t0 = BenchClock::now();
      read_error = c.reader->Wait(c.reader->Pull(c.table, w.reads[i % w.reads.size()], out.data()));
      if (!read_error.ok()) return;
      lat_ms.push_back(Ms(BenchClock::now() - t0));
    }
  });
  const Status worked = work();
  stop = true;
  reader.join();
  TESSERA_RETURN_IF_ERROR(read_error.WithContext(c.name + ": reader pull"));
  TESSERA_RETURN_IF_ERROR(worked);
  return Summarize(std::move(lat_ms), Seconds(BenchClock::now() - start));
}

// One serving repetition: the reader alone, then the reader next to a trainer.
Result<ServingRep> MeasureServing(Config& c, const Workload& w) {
  ServingRep rep;
  auto wait = [] {
    std::this_thread::sleep_for(std::chrono::duration<double>(IdleSeconds()));
    return Status::OK();
  };
  auto train = [&]() -> Status {
    Result<double> rate = PushFor(c, w.uniform, w.grads, MinRepSeconds());
    if (rate.ok()) rep.trainer_keys_per_s = *rate;
    return rate.status();
  };
  TESSERA_ASSIGN_OR_RETURN(rep.idle, ReadDuring(c, w, wait));
  TESSERA_ASSIGN_OR_RETURN(rep.training, ReadDuring(c, w, train));
  return rep;
}

// Push throughput: one row of the table per key law and configuration.
struct PushVariant {
  std::string name;
  Config* config;
  const KeyBatches* keys;
};

// Warms up every variant (one push of each batch: creates the rows, not timed), then measures
// keys/s in alternating repetitions; samples[variant][rep].
Result<std::vector<std::vector<double>>> MeasurePushes(
    const std::vector<tessera::bench::BenchCluster*>& all, const std::vector<PushVariant>& variants,
    const Workload& w, int reps) {
  for (const auto& v : variants) {
    RunOnly(all, v.config->cluster);
    TESSERA_RETURN_IF_ERROR(PushFor(*v.config, *v.keys, w.grads, 0, v.keys->size()).status());
  }
  Status error;
  auto rates = tessera::bench::AlternateRepetitions(
      variants.size(), reps, [&](size_t i, int) -> std::optional<double> {
        RunOnly(all, variants[i].config->cluster);
        Result<double> r =
            PushFor(*variants[i].config, *variants[i].keys, w.grads, MinRepSeconds());
        if (!r.ok()) error = r.status();
        return r.ok() ? std::optional<double>(*r) : std::nullopt;
      });
  if (!rates) return error;
  return *rates;
}

// Serving repetitions, alternating between `configs`; reps[config][rep].
Result<std::vector<std::vector<ServingRep>>> MeasureServingAll(
    const std::vector<tessera::bench::BenchCluster*>& all, const std::vector<Config*>& configs,
    const Workload& w, int reps) {
  for (Config* c : configs) {
    RunOnly(all, c->cluster);
    TESSERA_ASSIGN_OR_RETURN(c->reader, Connect(c->cluster));
    for (const auto& keys : w.reads) {  // the rows the reader wants, loaded once before timing
      TESSERA_RETURN_IF_ERROR(PullRows(*c->reader, c->table, keys).status());
    }
  }
  std::vector<std::vector<ServingRep>> out(configs.size());
  Status error;
  tessera::bench::ForEachAlternating(configs.size(), reps, [&](size_t i, int) {
    RunOnly(all, configs[i]->cluster);
    Result<ServingRep> r = MeasureServing(*configs[i], w);
    if (!r.ok()) error = r.status();
    if (r.ok()) out[i].push_back(*r);
    return r.ok();
  });
  TESSERA_RETURN_IF_ERROR(error);
  for (Config* c : configs) c->reader.reset();
  return out;
}

// The disk's sequential write rate in bytes/s, as `dd if=/dev/zero of=FILE bs=4M
// count=N conv=fdatasync` reports it: N 4 MiB writes to a new file in `dir`, one fdatasync, the
// time from open to the end of the fdatasync. The file is deleted after.
Result<double> DiskSeqWriteRate(const std::string& dir) {
  constexpr size_t kBlock = size_t{4} << 20;
  const std::string path = dir + "/disk-seq-write";
  std::vector<char> block(kBlock);
  for (size_t i = 0; i < kBlock; ++i) block[i] = static_cast<char>(i * 131 + 7);  // not zeros
  const size_t blocks = std::max<uint32_t>(1, FLAGS_disk_write_mib / 4);
  const auto t0 = BenchClock::now();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Status::IOError("creating " + path);
  Status s;
  for (size_t b = 0; b < blocks && s.ok(); ++b) {
    for (size_t done = 0; done < kBlock;) {
      const ssize_t w = ::write(fd, block.data() + done, kBlock - done);
      if (w <= 0) {
        s = Status::IOError("writing " + path);
        break;
      }
      done += static_cast<size_t>(w);
    }
  }
  if (s.ok() && ::fdatasync(fd) != 0) s = Status::IOError("fdatasync " + path);
  const double seconds = Seconds(BenchClock::now() - t0);
  ::close(fd);
  ::unlink(path.c_str());
  TESSERA_RETURN_IF_ERROR(s);
  return static_cast<double>(blocks * kBlock) / seconds;
}

// A counter of server 0's stats ("name value" lines).
Result<uint64_t> ServerCounter(Config& c, const std::string& counter) {
  TESSERA_ASSIGN_OR_RETURN(std::string stats, c.client->ServerStats(0));
  std::istringstream lines(stats);
  for (std::string name, value; lines >> name && std::getline(lines, value);) {
    if (name == counter) return static_cast<uint64_t>(std::stoull(value));
  }
  return Status::NotFound(c.name + " reports no " + counter);
}

// The strict server's request-log bytes per second over one push repetition.
Result<double> StrictLogRate(Config& c, const Workload& w) {
  TESSERA_ASSIGN_OR_RETURN(uint64_t before, ServerCounter(c, "request_log_appended_bytes"));
  const auto t0 = BenchClock::now();
  TESSERA_RETURN_IF_ERROR(PushFor(c, w.uniform, w.grads, MinRepSeconds()).status());
  const double seconds = Seconds(BenchClock::now() - t0);
  TESSERA_ASSIGN_OR_RETURN(uint64_t after, ServerCounter(c, "request_log_appended_bytes"));
  return static_cast<double>(after - before) / seconds;
}

// Alternating repetitions of the strict log rate and of the disk's sequential write rate (the
// servers paused during the latter); samples[0] the log, samples[1] the disk, bytes/s.
Result<std::vector<std::vector<double>>> MeasureLogVsDisk(
    const std::vector<tessera::bench::BenchCluster*>& all, Config& strict, const Workload& w,
    const std::string& dir, int reps) {
  Status error;
  auto rates = tessera::bench::AlternateRepetitions(2, reps, [&](size_t i, int) {
    Result<double> r = Status::OK();
    if (i == 0) {
      RunOnly(all, strict.cluster);
      r = StrictLogRate(strict, w);
    } else {
      RunOnly(all, strict.cluster);
      strict.cluster.Pause();
      ::sync();  // what the pushes left dirty is written before the timer starts
      r = DiskSeqWriteRate(dir);
    }
    if (!r.ok()) error = r.status();
    return r.ok() ? std::optional<double>(*r) : std::nullopt;
  });
  if (!rates) return error;
  return *rates;
}

struct Recovery {
  double ready_s, recovery_s;
  size_t rows;
  std::string server_line;  // the restarted server's own account: storage open, replay
};

// A row of `dim` floats that is all zeros: the initializer's value, never pushed.
bool IsInitial(const float* row) {
  for (uint32_t d = 0; d < FLAGS_dim; ++d) {
    if (row[d] != 0) return false;
  }
  return true;
}

// Counts the rows of `after` that are initial and those that differ from `before`.
Status CheckRecovered(const std::vector<float>& before, const std::vector<float>& after) {
  size_t initial = 0, changed = 0;
  const size_t rows = before.size() / FLAGS_dim;
  for (size_t r = 0; r < rows; ++r) {
    const float* a = after.data() + r * FLAGS_dim;
    if (IsInitial(a)) ++initial;
    if (!std::equal(a, a + FLAGS_dim, before.data() + r * FLAGS_dim)) ++changed;
  }
  if (initial == 0 && changed == 0) return Status::OK();
  return Status::Corruption("after the restart " + std::to_string(initial) + " of " +
                            std::to_string(rows) + " pushed rows read back as never pushed and " +
                            std::to_string(changed) +
                            " differ from what the server returned before the kill: "
                            "acknowledged pushes were lost");
}

// Pushes once, reads some rows that push changed and some Zipf rows pushed before, SIGKILLs the
// server, restarts it on the same data directory and times a fresh client's pull of those rows.
Result<Recovery> MeasureRecovery(Config& c, const Workload& w) {
  const std::vector<uint64_t>& last = w.uniform.back();
  const std::vector<uint64_t>& hot = w.zipf.front();  // pushed in the warm-up and every Zipf rep
  std::vector<uint64_t> check(last.begin(), last.begin() + std::min<size_t>(32, last.size()));
  check.insert(check.end(), hot.begin(), hot.begin() + std::min<size_t>(32, hot.size()));
  TESSERA_RETURN_IF_ERROR(PushFor(c, {last}, w.grads, 0).status());
  TESSERA_ASSIGN_OR_RETURN(std::vector<float> before, PullRows(*c.client, c.table, check));
  for (size_t r = 0; r < check.size(); ++r) {
    if (IsInitial(before.data() + r * FLAGS_dim)) {
      return Status::Internal("key " + std::to_string(check[r]) +
                              " reads as never pushed before the kill: nothing to check");
    }
  }
  c.client.reset();
  c.cluster.Kill(0);
  const auto t0 = BenchClock::now();
  TESSERA_RETURN_IF_ERROR(c.cluster.Restart(0, std::chrono::seconds(300)));
  Recovery rec{Seconds(BenchClock::now() - t0), 0, check.size(), ""};
  // A server may print its ready line before it has replayed its log: the client then waits
  // (and its pull retries, ClientOptions::retry_for_ms) until the server answers.
  TESSERA_ASSIGN_OR_RETURN(c.client, Connect(c.cluster, /*connect_timeout_ms=*/300000));
  TESSERA_ASSIGN_OR_RETURN(std::vector<float> after, PullRows(*c.client, c.table, check));
  rec.recovery_s = Seconds(BenchClock::now() - t0);
  for (const char* what : {"replayed ", "storage open in"}) {
    const std::string line = c.cluster.LogLine(0, what);
    if (line.empty()) continue;
    if (!rec.server_line.empty()) rec.server_line += " / ";
    rec.server_line += line;
  }
  TESSERA_RETURN_IF_ERROR(CheckRecovered(before, after));
  return rec;
}

void PrintPushes(const std::vector<PushVariant>& variants,
                 const std::vector<std::vector<double>>& rates) {
  std::printf("%-26s %14s %10s\n", "push throughput", "keys/s", "vs memory");
  for (size_t i = 0; i < variants.size(); ++i) {
    // The memory row of the same key law is the first variant with the same keys.
    size_t mem = 0;
    while (variants[mem].keys != variants[i].keys) ++mem;
    std::printf("%-26s %14.0f %10.3f\n", variants[i].name.c_str(), Median(rates[i]),
                Median(rates[i]) / Median(rates[mem]));
  }
  std::fflush(stdout);
}

// The median over serving repetitions of one figure of one phase.
double MedianOf(const std::vector<ServingRep>& reps, ReadSummary ServingRep::*phase,
                double ReadSummary::*figure) {
  return tessera::bench::MedianOver(reps, [&](const ServingRep& r) { return r.*phase.*figure; });
}

void PrintServing(const std::vector<Config*>& configs,
                  const std::vector<std::vector<ServingRep>>& reps) {
  std::printf("%-16s %-38s %-38s\n", "", "reader alone: latency ms, pulls/s",
              "next to the trainer: latency ms, pulls/s");
  std::printf("%-16s %8s %8s %9s %10s %8s %8s %9s %10s %14s\n", "serving", "p50", "p99", "max",
              "pulls/s", "p50", "p99", "max", "pulls/s", "trainer keys/s");
  for (size_t i = 0; i < configs.size(); ++i) {
    const auto& r = reps[i];
    std::printf("%-16s %8.3f %8.3f %9.1f %10.0f %8.3f %8.3f %9.1f %10.0f %14.0f\n",
                configs[i]->name.c_str(), MedianOf(r, &ServingRep::idle, &ReadSummary::p50_ms),
                MedianOf(r, &ServingRep::idle, &ReadSummary::p99_ms),
                MedianOf(r, &ServingRep::idle, &ReadSummary::max_ms),
                MedianOf(r, &ServingRep::idle, &ReadSummary::pulls_per_s),
                MedianOf(r, &ServingRep::training, &ReadSummary::p50_ms),
                MedianOf(r, &ServingRep::training, &ReadSummary::p99_ms),
                MedianOf(r, &ServingRep::training, &ReadSummary::max_ms),
                MedianOf(r, &ServingRep::training, &ReadSummary::pulls_per_s),
                tessera::bench::MedianOver(r, &ServingRep::trainer_keys_per_s));
  }
  std::fflush(stdout);
}

// Prints the JSON line: the push rates `r` (the variants of main), the serving latencies `s`
// (memory, strict) and the recovery.
void PrintJson(const std::vector<std::vector<double>>& r,
               const std::vector<std::vector<ServingRep>>& s,
               const std::vector<std::vector<double>>& log_disk, const Recovery& rec, int reps) {
  const double log_rate = Median(log_disk[0]), disk_rate = Median(log_disk[1]);
  const double mem_u = Median(r[0]), relaxed_u = Median(r[1]), strict_u = Median(r[2]);
  const double mem_z = Median(r[3]), strict_z = Median(r[4]);
  const double mem_p99 = MedianOf(s[0], &ServingRep::training, &ReadSummary::p99_ms);
  const double strict_p99 = MedianOf(s[1], &ServingRep::training, &ReadSummary::p99_ms);
  std::printf(
      "{\"bench\":\"durability\",\"keys\":%u,\"dim\":%u,\"key_space\":%llu,\"zipf_s\":%.2f,"
      "\"reps\":%d,\"min_rep_s\":%.1f,\"memory_keys_per_s\":%.0f,\"relaxed_keys_per_s\":%.0f,"
      "\"strict_keys_per_s\":%.0f,\"memory_zipf_keys_per_s\":%.0f,\"strict_zipf_keys_per_s\":%.0f,"
      "\"server_strict_vs_relaxed_push\":%.3f,\"server_strict_vs_memory_push\":%.3f,"
      "\"server_strict_vs_memory_push_zipf\":%.3f,\"serving_idle_p99_ms_memory\":%.3f,"
      "\"serving_idle_p99_ms_strict\":%.3f,\"serving_p99_under_training_ms_memory\":%.3f,"
      "\"serving_p99_under_training_ms_strict\":%.3f,"
      "\"serving_p99_under_training_vs_memory\":%.2f,\"strict_log_bytes_per_s\":%.0f,"
      "\"disk_seq_write_bytes_per_s\":%.0f,\"strict_log_vs_disk_seq_write\":%.3f,"
      "\"recovery_ready_s\":%.3f,\"recovery_s\":%.3f}\n",
      FLAGS_keys, FLAGS_dim, static_cast<unsigned long long>(FLAGS_key_space), FLAGS_zipf_s, reps,
      MinRepSeconds(), mem_u, relaxed_u, strict_u, mem_z, strict_z, strict_u / relaxed_u,
      strict_u / mem_u, strict_z / mem_z, MedianOf(s[0], &ServingRep::idle, &ReadSummary::p99_ms),
      MedianOf(s[1], &ServingRep::idle, &ReadSummary::p99_ms), mem_p99, strict_p99,
      strict_p99 / mem_p99, log_rate, disk_rate, log_rate / disk_rate, rec.ready_s,
      rec.recovery_s);
}

int Fail(const Status& s) {
  std::fprintf(stderr, "bench_durability: FAILED: %s\n", s.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  tessera::bench::CleanUpOnStopSignals();
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  const int reps = FLAGS_reps > 0 ? FLAGS_reps : (FLAGS_quick ? 3 : 7);
  const std::string binary = FLAGS_server_binary.empty()
                                 ? tessera::bench::DefaultServerBinary(argv[0])
                                 : FLAGS_server_binary;
  const Workload w = MakeWorkload();
  // Declared before the servers, so that they stop before their data directories go.
  const tessera::bench::TempDir root("tessera-bench-durability-");
  std::vector<Config> configs(3);
  Config &memory = configs[0], &relaxed = configs[1], &strict = configs[2];
  memory.name = "memory";
  relaxed.name = "rocksdb_relaxed";
  relaxed.flags = {"--data_dir=" + root.path() + "/relaxed", "--durability=relaxed"};
  strict.name = "rocksdb_strict";
  strict.flags = {"--data_dir=" + root.path() + "/strict", "--durability=strict"};
  std::vector<tessera::bench::BenchCluster*> clusters;
  for (auto& c : configs) {
    if (Status s = StartConfig(c, binary); !s.ok()) return Fail(s.WithContext(c.name));
    clusters.push_back(&c.cluster);
  }
  std::printf(
      "bench_durability: 1 server per configuration (child process, 2 lanes); pushes of %u keys "
      "x dim %u (Adagrad), keys uniform over %llu ids or Zipf s=%.2f over as many (%.1f%% of a "
      "push's keys distinct); every repetition pushes back to back for at least %.1f s, so that "
      "the durable server's periodic background work counts; %d repetitions, alternating, the "
      "servers not measured paused (SIGSTOP); medians\n",
      FLAGS_keys, FLAGS_dim, static_cast<unsigned long long>(FLAGS_key_space), FLAGS_zipf_s,
      100 * w.zipf_unique, MinRepSeconds(), reps);
  std::fflush(stdout);

  const std::vector<PushVariant> variants = {{"memory uniform", &memory, &w.uniform},
                                             {"rocksdb_relaxed uniform", &relaxed, &w.uniform},
                                             {"rocksdb_strict uniform", &strict, &w.uniform},
                                             {"memory zipf", &memory, &w.zipf},
                                             {"rocksdb_strict zipf", &strict, &w.zipf}};
  Result<std::vector<std::vector<double>>> rates = MeasurePushes(clusters, variants, w, reps);
  if (!rates.ok()) return Fail(rates.status());
  PrintPushes(variants, *rates);

  std::printf(
      "serving: a reader (own client and thread) pulls %u Zipf keys back to back, alone for "
      "%.1f s, then while a trainer pushes uniform batches for at least %.1f s; p99 of each "
      "repetition's pulls, medians\n",
      FLAGS_read_keys, IdleSeconds(), MinRepSeconds());
  std::fflush(stdout);
  const std::vector<Config*> serving_configs = {&memory, &strict};
  auto serving = MeasureServingAll(clusters, serving_configs, w, reps);
  if (!serving.ok()) return Fail(serving.status());
  PrintServing(serving_configs, *serving);

  auto log_disk = MeasureLogVsDisk(clusters, strict, w, root.path(), reps);
  if (!log_disk.ok()) return Fail(log_disk.status().WithContext("strict log against the disk"));
  std::printf(
      "strict log: %.1f MB/s of request log during strict pushes (uniform); the disk's "
      "sequential write (%u MiB in 4 MiB writes + fdatasync, alternating): %.1f MB/s; "
      "ratio %.3f (medians)\n",
      Median((*log_disk)[0]) / 1e6, FLAGS_disk_write_mib, Median((*log_disk)[1]) / 1e6,
      Median((*log_disk)[0]) / Median((*log_disk)[1]));
  std::fflush(stdout);

  RunOnly(clusters, strict.cluster);
  Result<Recovery> rec = MeasureRecovery(strict, w);
  if (!rec.ok()) return Fail(rec.status().WithContext("recovery of rocksdb_strict"));
  std::printf(
      "recovery: rocksdb_strict SIGKILLed right after a push, restarted on its data directory: "
      "ready line after %.2f s, a new client's pull answered after %.2f s; all %zu rows read "
      "back as before the kill\n",
      rec->ready_s, rec->recovery_s, rec->rows);
  if (!rec->server_line.empty()) {
    std::printf("recovery: the server: %s\n", rec->server_line.c_str());
  }

  PrintJson(*rates, *serving, *log_disk, *rec, reps);
  return 0;
}
