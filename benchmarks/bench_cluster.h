// Tessera servers for a benchmark run: tessera-server child processes or tessera::Server objects
// in the benchmark's own process. Shared by bench_sparse, bench_transport and bench_train.
#pragma once

#include <sys/types.h>

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
// dies with this process too (PR_SET_PDEATHSIG).
class ServerProcess {
 public:
  ServerProcess() = default;
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;
  ~ServerProcess() { Stop(); }

  // Starts `argv` and waits up to 30 s for a stdout line containing `ready`; returns the
  // endpoint= value of that line. Unavailable ("<argv[0]> did not start; its stderr:\n...")
  // when the line does not come.
  Result<std::string> Start(const std::vector<std::string>& argv,
                            const std::string& ready = "tessera-server ready");

  // Stops and reaps the process and removes its log; a no-op when none runs.
  void Stop();

 private:
  pid_t pid_ = -1;
  std::string log_path_;
};

// `n` memory-tier Tessera servers (rank 0..n-1), as child processes or objects of this
// process; all stopped by Stop() or on destruction.
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

  void Stop();

 private:
  std::vector<std::string> endpoints_;
  std::vector<std::unique_ptr<Server>> servers_;
  std::vector<std::unique_ptr<ServerProcess>> processes_;
};

// The tessera-server next to this program (found through /proc/self/exe, else `argv0`):
// <dir>/tessera-server if it exists, else <build>/tessera-server for a program at
// <build>/x/y/program if that exists, else <dir>/tessera-server.
std::string DefaultServerBinary(const char* argv0);

// Parses a comma-separated list of numbers (a flag value); exits with status 2 and a message
// naming the bad item otherwise.
std::vector<uint64_t> ParseList(const std::string& s);

}  // namespace tessera::bench
