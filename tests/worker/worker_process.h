// A tessera-worker (or any) child process for tests: output to a file, SIGKILL on destruction.
#pragma once

#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "tests/spawn.h"

namespace tessera::testing {

/// The numbers ("key":number pairs; true and false as 1 and 0) of the final JSON report line a
/// tessera-worker prints; empty when there is none.
inline std::map<std::string, double> ParseWorkerReport(const std::string& out) {
  std::map<std::string, double> r;
  const size_t start = out.rfind("\n{\"data\"");
  if (start == std::string::npos) return r;
  const std::string line = out.substr(start + 1, out.find('\n', start + 1) - start - 1);
  const std::regex kv(R"re("(\w+)":(-?[0-9.eE+-]+|true|false))re");
  for (auto it = std::sregex_iterator(line.begin(), line.end(), kv); it != std::sregex_iterator();
       ++it) {
    const std::string v = (*it)[2];
    r[(*it)[1]] = v == "true" ? 1 : v == "false" ? 0 : std::stod(v);
  }
  return r;
}

/// One child process. Its stdout and stderr go to `log_path`. The destructor kills it (SIGKILL)
/// if it still runs; it also dies with the test process (PR_SET_PDEATHSIG). Not thread-safe.
class ChildProcess {
 public:
  ChildProcess() = default;
  ~ChildProcess() { Kill(); }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  /// Starts `argv`; false when fork fails.
  bool Start(const std::vector<std::string>& argv, const std::string& log_path) {
    Kill();
    log_path_ = log_path;
    exit_code_ = -1;
    const int log = OpenLog(log_path, /*truncate=*/true);
    const pid_t pid = SpawnChild(argv, log, log);
    if (log >= 0) close(log);
    if (pid < 0) return false;
    pid_ = pid;
    return true;
  }

  /// Whether the child still runs (reaps it when it has exited).
  bool Running() {
    if (pid_ <= 0) return false;
    int st = 0;
    if (waitpid(pid_, &st, WNOHANG) == pid_) {
      pid_ = -1;
      exit_code_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      return false;
    }
    return true;
  }

  /// SIGKILL and reap (no-op when not running).
  void Kill() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    int st = 0;
    waitpid(pid_, &st, 0);
    pid_ = -1;
    exit_code_ = 128 + SIGKILL;
  }

  /// Waits up to `timeout_s` for the exit; returns the exit code, or -1 after killing the child
  /// on timeout.
  int Wait(double timeout_s) {
    const auto until = std::chrono::steady_clock::now() +
                       std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
    while (Running()) {
      if (std::chrono::steady_clock::now() > until) {
        Kill();
        return -1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return exit_code_;
  }

  /// The child's output so far.
  std::string Output() const { return ReadLog(log_path_); }

 private:
  pid_t pid_ = -1;
  int exit_code_ = -1;
  std::string log_path_;
};

/// What RunToEnd saw: the exit code (-1: killed at the timeout or not started), the seconds
/// it ran, its stdout and stderr together.
struct ProgramRun {
  int rc = -1;
  double seconds = 0;
  std::string out;
};

/// Runs `argv` to its end, its output to `log_path`; killed after `timeout_s`.
inline ProgramRun RunToEnd(const std::vector<std::string>& argv, const std::string& log_path,
                           double timeout_s) {
  ChildProcess p;
  ProgramRun r;
  const auto start = std::chrono::steady_clock::now();
  if (!p.Start(argv, log_path)) return r;
  r.rc = p.Wait(timeout_s);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  r.out = p.Output();
  return r;
}

}  // namespace tessera::testing
