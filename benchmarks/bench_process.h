// Child processes and CPU time for the benchmark programs (benchmarks/bench_*.cc): running a
// program and capturing what it prints, reading fields of a flat JSON line, and the CPU seconds
// of this and other processes, and busy processes that load every core. Header-only; Linux.
#pragma once

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace tessera::bench {

// CPU seconds (user + system) of this process, all threads.
inline double SelfCpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

// CPU seconds (user + system) of process `pid` from /proc/<pid>/stat; 0 when unreadable.
inline double ProcessCpuSeconds(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t close_paren = stat.rfind(')');  // the command name may hold spaces
  if (close_paren == std::string::npos) return 0;
  std::istringstream fields(stat.substr(close_paren + 2));
  std::string f;
  double utime = 0, stime = 0;
  for (int i = 3; i <= 15 && fields >> f; ++i) {  // field 3 is the state; 14, 15 the times
    if (i == 14) utime = std::strtod(f.c_str(), nullptr);
    if (i == 15) stime = std::strtod(f.c_str(), nullptr);
  }
  return (utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

// The flags of a comma-separated list (a benchmark's --server_flags), empty items skipped.
inline std::vector<std::string> SplitFlags(const std::string& list) {
  std::vector<std::string> flags;
  std::stringstream items(list);
  for (std::string f; std::getline(items, f, ',');) {
    if (!f.empty()) flags.push_back(f);
  }
  return flags;
}

// Waits, window after window of `window_s`, until `cpu_seconds()` (a sum of processes' CPU
// seconds) grew by less than `quiet_cpu_s` over one, or `limit_s` passed (checked before each
// window); returns the seconds waited. For the background work (write-backs, flushes,
// compactions) servers go on with after a fill.
template <typename CpuSeconds>
double WaitUntilQuiet(CpuSeconds&& cpu_seconds, double window_s, double quiet_cpu_s,
                      double limit_s) {
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  const auto waited = [&t0] { return std::chrono::duration<double>(Clock::now() - t0).count(); };
  while (waited() < limit_s) {
    const double c0 = cpu_seconds();
    std::this_thread::sleep_for(std::chrono::duration<double>(window_s));
    if (cpu_seconds() - c0 < quiet_cpu_s) break;
  }
  return waited();
}

// Runs `argv` (argv[0] a path) with stdout into a pipe (stderr passes through) and returns its
// exit status (-1: not started or killed by a signal) with what it printed.
inline int RunCapture(const std::vector<std::string>& argv, std::string* out) {
  out->clear();
  // Built before fork: the child of a multi-threaded program may only make async-signal-safe
  // calls until it execs (no malloc).
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return -1;
  const pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    return -1;
  }
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // dies with this program
    dup2(fds[1], STDOUT_FILENO);
    execv(args[0], args.data());
    _exit(127);
  }
  close(fds[1]);
  char buf[4096];
  ssize_t n;
  while ((n = read(fds[0], buf, sizeof(buf))) != 0) {
    if (n < 0) {
      if (errno == EINTR) continue;
      break;
    }
    out->append(buf, static_cast<size_t>(n));
  }
  close(fds[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// The last line of `text` that starts with '{' (the script's JSON line), or "".
inline std::string LastJsonLine(const std::string& text) {
  std::istringstream in(text);
  std::string line, last;
  while (std::getline(in, line)) {
    if (!line.empty() && line[0] == '{') last = line;
  }
  return last;
}

// The value of "key" in a flat JSON object line: a number (NaN when absent or not a number) or a
// string without escapes ("" when absent).
inline double JsonNumberField(const std::string& json, const std::string& key) {
  const std::string k = "\"" + key + "\":";
  const size_t p = json.find(k);
  if (p == std::string::npos) return std::nan("");
  const char* s = json.c_str() + p + k.size();
  while (*s == ' ') ++s;
  char* end = nullptr;
  const double v = std::strtod(s, &end);
  return end == s ? std::nan("") : v;
}
inline std::string JsonStringField(const std::string& json, const std::string& key) {
  const std::string k = "\"" + key + "\":";
  size_t p = json.find(k);
  if (p == std::string::npos) return "";
  p = json.find('"', p + k.size());
  if (p == std::string::npos) return "";
  const size_t e = json.find('"', p + 1);
  return e == std::string::npos ? "" : json.substr(p + 1, e - p - 1);
}

// The 1-minute load average (the benchmark shares the machine with whatever else runs).
inline double LoadAverage() {
  std::ifstream in("/proc/loadavg");
  double l = std::nan("");
  in >> l;
  return l;
}

// One busy-looping child process per core while it lives (bench_transport's "loaded" cells
// measure how the client and server keep up when other processes compete for the CPUs).
class CpuBurners {
 public:
  CpuBurners() {
    const long cores = std::max(1L, sysconf(_SC_NPROCESSORS_ONLN));
    for (long i = 0; i < cores; ++i) {
      const pid_t pid = fork();
      if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        for (;;) asm volatile("" ::: "memory");  // spin: a loop the compiler keeps
      }
      if (pid > 0) pids_.push_back(pid);
    }
  }
  ~CpuBurners() {
    for (pid_t pid : pids_) kill(pid, SIGKILL);
    for (pid_t pid : pids_) waitpid(pid, nullptr, 0);
  }
  CpuBurners(const CpuBurners&) = delete;
  CpuBurners& operator=(const CpuBurners&) = delete;

 private:
  std::vector<pid_t> pids_;
};

}  // namespace tessera::bench
