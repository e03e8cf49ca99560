// bench_host_stall: how long this machine itself stops every CPU at once, with nothing of
// Tessera running: the floor under any tail latency measured here (docs/benchmarks.md, "The
// machine's own freezes").
//
// One spinning thread per CPU reads the monotonic clock in a loop; a gap of more than --gap_ms
// between two reads means that thread did not run then. A *freeze* is an interval in which every
// spinner was in such a gap at once: one thread preempted by another leaves the other CPUs
// spinning, so a freeze is time no CPU of the machine ran any of them (on a virtual machine: its
// vCPUs all descheduled by the host). Three phases, in repetitions alternating between them:
//   cpus       the spinners alone (every CPU busy);
//   disk       a spinner on every CPU but one (at least one spinner) and a writer thread (1 MiB
//              writes to a file in --dir, fdatasync every 64 MiB, the file started again at
//              --file_mb): the disk busy, a CPU left for the writer;
//   cpus+disk  every CPU spinning and the writer: what a server that saturates its CPUs while
//              writing a checkpoint or its log does to the machine.
// Each phase reports freezes a second, freeze ms a second, the longest freeze and the median
// time between the starts of consecutive freezes; medians over repetitions. The last line of
// output is one JSON object.
#include <fcntl.h>
#include <gflags/gflags.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "benchmarks/bench_cluster.h"
#include "benchmarks/bench_stats.h"

DEFINE_double(seconds, 3, "Length of each phase of each repetition");
DEFINE_int32(reps, 3, "Repetitions of the three phases, alternating");
DEFINE_double(gap_ms, 5, "A spinner's clock reads further apart than this: it did not run");
DEFINE_int32(cpus, 0, "Spinning threads (0: one per CPU, std::thread::hardware_concurrency)");
DEFINE_string(dir, "", "Directory for the writer's file (default: a temporary directory)");
DEFINE_int32(file_mb, 256, "The writer starts its file again at this size");

namespace {

using Clock = std::chrono::steady_clock;

double MsSince(Clock::time_point t0, Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(t - t0).count();
}

// A gap of one spinner: [begin, end) in ms since the phase began.
struct Gap {
  double begin, end;
};

// Spins until `stop`, recording every gap over --gap_ms.
void Spin(Clock::time_point t0, const std::atomic<bool>& stop, std::vector<Gap>* gaps) {
  double last = MsSince(t0, Clock::now());
  while (!stop.load(std::memory_order_relaxed)) {
    const double now = MsSince(t0, Clock::now());
    if (now - last > FLAGS_gap_ms) gaps->push_back({last, now});
    last = now;
  }
}

// Opens (creates, truncates) the writer's file: a regular file only. A symbolic link there is
// refused rather than followed (the file it names would be overwritten), and so is a FIFO (an
// open for writing would wait for a reader) or anything else. -1, said on stderr, on failure.
int OpenWriterFile(const std::string& path) {
  const int fd =
      ::open(path.c_str(), O_WRONLY | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0600);
  struct stat st {};
  const char* why = nullptr;
  if (fd < 0) {
    why = std::strerror(errno);
  } else if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    why = "not a regular file";
  } else if (::ftruncate(fd, 0) != 0) {
    why = std::strerror(errno);
  }
  if (why == nullptr) return fd;
  std::fprintf(stderr, "bench_host_stall: cannot write %s: %s\n", path.c_str(), why);
  if (fd >= 0) ::close(fd);
  return -1;
}

// Writes 1 MiB blocks to `path` until `stop`: fdatasync every 64 MiB, the file truncated and
// started again at --file_mb. Returns the MiB written.
double Write(const std::string& path, const std::atomic<bool>& stop) {
  const int fd = OpenWriterFile(path);
  if (fd < 0) return 0;
  const std::string block(1 << 20, 'x');
  double mib = 0;
  int in_file = 0;
  while (!stop.load(std::memory_order_relaxed)) {
    if (::write(fd, block.data(), block.size()) != static_cast<ssize_t>(block.size())) {
      std::fprintf(stderr, "bench_host_stall: writing %s: %s (the writer stopped)\n",
                   path.c_str(), std::strerror(errno));
      break;
    }
    ++mib;
    if (++in_file % 64 == 0) (void)::fdatasync(fd);
    if (in_file >= FLAGS_file_mb) {
      (void)::fdatasync(fd);
      if (::ftruncate(fd, 0) != 0 || ::lseek(fd, 0, SEEK_SET) != 0) {
        std::fprintf(stderr, "bench_host_stall: starting %s again: %s (the writer stopped)\n",
                     path.c_str(), std::strerror(errno));
        break;
      }
      in_file = 0;
    }
  }
  ::close(fd);
  return mib;
}

// The intervals every spinner was in a gap at once: the intersection of their gap lists.
std::vector<Gap> Freezes(const std::vector<std::vector<Gap>>& spinners) {
  std::vector<Gap> common = spinners.empty() ? std::vector<Gap>{} : spinners[0];
  for (size_t s = 1; s < spinners.size(); ++s) {
    std::vector<Gap> next;
    for (const Gap& a : common) {
      for (const Gap& b : spinners[s]) {
        const double begin = std::max(a.begin, b.begin), end = std::min(a.end, b.end);
        if (end - begin > FLAGS_gap_ms) next.push_back({begin, end});
      }
    }
    common = std::move(next);
  }
  return common;
}

struct PhaseRep {
  double freezes_per_s, freeze_ms_per_s, longest_ms, period_ms, write_mib_s;
};

PhaseRep RunPhase(int spinners, bool disk, const std::string& path) {
  std::atomic<bool> stop{false};
  std::vector<std::vector<Gap>> gaps(spinners);
  const auto t0 = Clock::now();
  std::vector<std::thread> threads;
  for (int i = 0; i < spinners; ++i) threads.emplace_back(Spin, t0, std::cref(stop), &gaps[i]);
  double mib = 0;
  std::thread writer;
  if (disk) writer = std::thread([&] { mib = Write(path, stop); });
  std::this_thread::sleep_for(std::chrono::duration<double>(FLAGS_seconds));
  stop = true;
  for (auto& t : threads) t.join();
  if (writer.joinable()) writer.join();
  const double seconds = MsSince(t0, Clock::now()) / 1000;
  const std::vector<Gap> freezes = Freezes(gaps);
  PhaseRep rep{};
  rep.freezes_per_s = static_cast<double>(freezes.size()) / seconds;
  std::vector<double> starts;
  for (const Gap& f : freezes) {
    rep.freeze_ms_per_s += (f.end - f.begin) / seconds;
    rep.longest_ms = std::max(rep.longest_ms, f.end - f.begin);
    starts.push_back(f.begin);
  }
  std::sort(starts.begin(), starts.end());
  std::vector<double> spacing;
  for (size_t i = 1; i < starts.size(); ++i) spacing.push_back(starts[i] - starts[i - 1]);
  rep.period_ms = spacing.empty() ? 0 : tessera::bench::Percentile(std::move(spacing), 0.5);
  rep.write_mib_s = mib / seconds;
  return rep;
}

struct Phase {
  const char* name;
  bool all_cpus, disk;
  std::vector<PhaseRep> reps;
};

}  // namespace

int main(int argc, char** argv) {
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  if (FLAGS_reps < 1 || FLAGS_seconds <= 0 || FLAGS_gap_ms <= 0 || FLAGS_file_mb < 1) {
    std::fprintf(stderr, "bench_host_stall: --reps, --seconds, --gap_ms, --file_mb: positive\n");
    return 2;
  }
  const int cpus = FLAGS_cpus > 0 ? FLAGS_cpus
                                  : std::max(1u, std::thread::hardware_concurrency());
  const tessera::bench::TempDir tmp("tessera-bench-stall-");
  const std::string path = (FLAGS_dir.empty() ? tmp.path() : FLAGS_dir) + "/stall-writer";
  const int probe = OpenWriterFile(path);  // fail now, not as 0 MiB/s after the phases
  if (probe < 0) return 1;
  ::close(probe);
  std::vector<Phase> phases = {{"cpus", true, false, {}},
                               {"disk", false, true, {}},
                               {"cpus+disk", true, true, {}}};
  std::printf(
      "bench_host_stall: %d spinning threads (one per CPU) read the clock; a freeze is time in "
      "which none of them ran for over %.1f ms; phases of %.1f s: cpus (spinners alone), disk "
      "(a spinner on every CPU but one, and a 1 MiB-block writer, fdatasync every 64 MiB), "
      "cpus+disk; %d "
      "repetitions alternating; medians\n",
      cpus, FLAGS_gap_ms, FLAGS_seconds, FLAGS_reps);
  for (int r = 0; r < FLAGS_reps; ++r) {
    for (Phase& p : phases) {
      p.reps.push_back(RunPhase(p.all_cpus ? cpus : std::max(1, cpus - 1), p.disk, path));
    }
  }
  std::printf("%-10s %10s %14s %12s %12s %10s\n", "phase", "freezes/s", "freeze ms/s",
              "longest ms", "period ms", "MiB/s");
  auto median = [](const Phase& p, double PhaseRep::*f) {
    return tessera::bench::MedianOver(p.reps, f);
  };
  for (const Phase& p : phases) {
    std::printf("%-10s %10.2f %14.1f %12.1f %12.1f %10.0f\n", p.name,
                median(p, &PhaseRep::freezes_per_s), median(p, &PhaseRep::freeze_ms_per_s),
                median(p, &PhaseRep::longest_ms), median(p, &PhaseRep::period_ms),
                median(p, &PhaseRep::write_mib_s));
  }
  std::printf("{\"bench\":\"host_stall\",\"cpus\":%d,\"gap_ms\":%.1f,\"seconds\":%.1f", cpus,
              FLAGS_gap_ms, FLAGS_seconds);
  for (const Phase& p : phases) {
    std::string n = p.name;
    std::replace(n.begin(), n.end(), '+', '_');
    std::printf(
        ",\"freezes_per_s_%s\":%.2f,\"freeze_ms_per_s_%s\":%.1f,\"longest_freeze_ms_%s\":%.1f,"
        "\"freeze_period_ms_%s\":%.1f,\"write_mib_s_%s\":%.0f",
        n.c_str(), median(p, &PhaseRep::freezes_per_s), n.c_str(),
        median(p, &PhaseRep::freeze_ms_per_s), n.c_str(), median(p, &PhaseRep::longest_ms),
        n.c_str(), median(p, &PhaseRep::period_ms), n.c_str(), median(p, &PhaseRep::write_mib_s));
  }
  std::printf("}\n");
  return 0;
}
