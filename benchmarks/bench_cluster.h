// Tessera servers for a benchmark run: tessera-server child processes or tessera::Server objects
// in the benchmark's own process, and the temporary directories they keep their data in.
// Shared by bench_sparse, bench_transport, bench_train, bench_durability and bench_checkpoint.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ps/server/server.h"
#include "ps/status.h"

namespace tessera::bench {

// A child process that prints a ready line ("<ready> ... endpoint=E") on stdout once it
// serves, e.g. tessera-server. Its stderr goes to a temporary log, shown in the error when the
// process does not start. Stopped (SIGTERM, then SIGKILL after 5 s) on destruction; the child
// dies with this process too (PR_SET_PDEATHSIG), and is killed before this process exits on a
// stop signal when CleanUpOnStopSignals() was called.
class ServerProcess {
 public:
  ServerProcess() = default;
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;
  ~ServerProcess() { Stop(); }

  // Starts `argv` and waits up to `timeout` for a stdout line containing `ready`; returns the
  // endpoint= value of that line. Unavailable ("<argv[0]> did not start; its stderr:\n...")
  // when the line does not come. Call from a thread that outlives the child: the child gets
  // SIGKILL when the thread that started it ends (PR_SET_PDEATHSIG follows the thread).
  Result<std::string> Start(const std::vector<std::string>& argv,
                            const std::string& ready = "tessera-server ready",
                            std::chrono::seconds timeout = std::chrono::seconds(30));

  // Starts the argv of the last Start() again, e.g. after Kill() (a crash-recovery test).
  Result<std::string> Restart(std::chrono::seconds timeout);

  // Stops and reaps the process and removes its log; a no-op when none runs.
  void Stop();

  // SIGKILLs and reaps the process at once (a crash: no chance to flush anything) and removes
  // its log; a no-op when none runs.
  void Kill();

  // SIGSTOP / SIGCONT: a paused process uses no CPU (and its timers fire late, once resumed),
  // so that a benchmark can measure one server at a time on a shared machine. No-ops when none
  // runs. Stop() resumes a paused process first.
  void Pause();
  void Resume();

  // The child's process id, or -1 when none runs.
  pid_t pid() const { return pid_; }

  // The last line of the child's stderr that contains `text`, or "" (none, or no log).
  std::string LogLine(const std::string& text) const;

 private:
  void Reap(bool gracefully);

  pid_t pid_ = -1;
  std::string log_path_;
  std::vector<std::string> argv_;
  std::string ready_;
};

// `n` Tessera servers (rank 0..n-1), as child processes or objects of this process; memory-tier
// unless extra flags (processes only) say otherwise; all stopped by Stop() or on destruction.
class BenchCluster {
 public:
  BenchCluster() = default;
  BenchCluster(const BenchCluster&) = delete;
  BenchCluster& operator=(const BenchCluster&) = delete;
  ~BenchCluster() { Stop(); }

  // mode "process": `server_binary` child processes; "thread": tessera::Server objects. Each
  // server binds a free port itself ("tcp://127.0.0.1:*"). Errors: the first server's that
  // failed to start (for processes, ServerProcess::Start's Unavailable).
  // `extra_flags` go to every server process ("{rank}" in a flag becomes the server's rank).
  Status Start(uint32_t n, const std::string& mode, const std::string& server_binary,
               uint32_t lanes, const std::vector<std::string>& extra_flags = {});

  // The servers' endpoints, by rank.
  const std::vector<std::string>& endpoints() const { return endpoints_; }

  // Mode "process" only: SIGKILLs server `rank` (ServerProcess::Kill).
  void Kill(uint32_t rank);
  // Mode "process" only: the process id of server `rank` (-1 when it does not run).
  pid_t pid(uint32_t rank) const;
  // Mode "process" only: ServerProcess::LogLine of server `rank` ("" otherwise).
  std::string LogLine(uint32_t rank, const std::string& text) const;
  // Mode "process" only: pauses or resumes every server (ServerProcess::Pause, Resume).
  void Pause();
  void Resume();
  // Mode "process" only: starts server `rank` again with the same flags (so on the same
  // --data_dir), waiting up to `timeout` for it to be ready (recovery included); it binds a new
  // free port: endpoints()[rank] changes. Errors: ServerProcess::Start's.
  Status Restart(uint32_t rank, std::chrono::seconds timeout);

  void Stop();

 private:
  std::vector<std::string> endpoints_;
  std::vector<std::unique_ptr<Server>> servers_;
  std::vector<std::unique_ptr<ServerProcess>> processes_;
};

// Resumes `active` and pauses every other cluster of `all` (BenchCluster::Pause), so that one
// cluster at a time is measured on a shared machine: the others' background work (RocksDB
// compactions, row write-back) neither slows it nor goes unmeasured, as it waits for its own
// cluster's next turn.
void RunOnly(const std::vector<BenchCluster*>& all, const BenchCluster& active);

// A new empty directory under the system's temporary directory, named <prefix>XXXXXX, removed
// with its contents on destruction (declare it before the servers that write into it, so that
// they stop first), or by CleanUpOnStopSignals() when a stop signal ends the program.
class TempDir {
 public:
  // Exits with status 1 and a message when the directory cannot be made (nothing measured yet).
  explicit TempDir(const std::string& prefix);
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir();

  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Makes SIGINT, SIGTERM and SIGHUP end the program cleanly from any point: a thread waits for
// them, SIGKILLs every ServerProcess still running, removes their logs and every TempDir, and
// exits with status 128 + signal. Call first thing in main, before any other thread starts (the
// signals are blocked in every thread started afterwards; child processes get them unblocked).
void CleanUpOnStopSignals();

// The tessera-server next to this program (found through /proc/self/exe, else `argv0`):
// <dir>/tessera-server if it exists, else <build>/tessera-server for a program at
// <build>/x/y/program if that exists, else <dir>/tessera-server.
std::string DefaultServerBinary(const char* argv0);

// Parses a comma-separated list of numbers (a flag value); exits with status 2 and a message
// naming the bad item otherwise.
std::vector<uint64_t> ParseList(const std::string& s);

}  // namespace tessera::bench
