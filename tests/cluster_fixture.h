// Starts real tessera-server processes on 127.0.0.1 for multi-process tests.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ps/client/client.h"
#include "ps/status.h"

namespace tessera::testing {

/// Returns a TCP port on 127.0.0.1 that was free a moment ago.
uint16_t PickFreePort();

/// Options of a local cluster.
struct LocalClusterOptions {
  uint32_t num_servers = 2;
  uint32_t lanes = 2;
  /// Give every server a RocksDB data directory under the cluster's temp dir.
  bool with_data_dirs = false;
  /// Every server's --admin_root (checkpoints, restores, exports). Empty: `admin` in the
  /// cluster's temp dir (see LocalCluster::admin_root()). Another cluster's root lets this one
  /// restore its checkpoints.
  std::string admin_root;
  /// Extra flags passed to every server.
  std::vector<std::string> extra_flags;
};

/// Options for `n` memory-only servers with 2 lanes each.
inline LocalClusterOptions Servers(uint32_t n) {
  LocalClusterOptions o;
  o.num_servers = n;
  return o;
}

/// A cluster of tessera-server processes on free loopback ports, in a temp dir of its own.
/// Every process is killed and the temp dir removed on destruction (children also die with
/// the test process: PR_SET_PDEATHSIG); with TESSERA_KEEP_CLUSTER_DIR set in the environment
/// the dir (servers' logs and data) is kept for a post-mortem and its path printed. Not
/// thread-safe.
class LocalCluster {
 public:
  explicit LocalCluster(LocalClusterOptions options);
  ~LocalCluster();
  LocalCluster(const LocalCluster&) = delete;
  LocalCluster& operator=(const LocalCluster&) = delete;

  /// Starts every server and waits until each prints its ready line.
  Status Start();
  const std::vector<std::string>& endpoints() const { return endpoints_; }
  /// kill -9 of server i (waits until it is gone).
  void Kill(uint32_t i);
  /// SIGTERM of server i; returns its exit code (-1, after kill -9, when it did not exit
  /// within `timeout_s`).
  int Stop(uint32_t i, int timeout_s = 10);
  /// Starts server i again (same port and data directory).
  Status Restart(uint32_t i);
  bool running(uint32_t i) const { return pids_[i] > 0; }
  const std::string& dir() const { return dir_; }
  /// The servers' --admin_root (for ClientOptions::admin_root).
  std::string admin_root() const;
  /// The process id of server i (-1 when it is not running).
  pid_t pid(uint32_t i) const { return pids_[i]; }
  std::string data_dir(uint32_t i) const;
  /// The log file of server i.
  std::string log_path(uint32_t i) const;

 private:
  Status Spawn(uint32_t i);
  LocalClusterOptions options_;
  std::string dir_;
  std::vector<std::string> endpoints_;
  std::vector<pid_t> pids_;
};

/// GET `path` from http://127.0.0.1:`port`: the whole response (status line, headers, body),
/// or "" when nothing answered within `timeout_ms`.
std::string HttpGet(uint32_t port, const std::string& path, int timeout_ms = 5000);

/// A client of `cluster`'s servers (`o.servers` set to them); null, with a test failure saying
/// why, when it cannot be created.
std::unique_ptr<Client> ConnectClient(const LocalCluster& cluster, ClientOptions o = {});

/// The value of line `name` ("name value") of a server's stats text (Client::ServerStats),
/// -1 when it has no such line (the first line, the version, is not one).
int64_t StatValue(const std::string& stats, const std::string& name);

/// Runs `argv` and returns its exit code, with stdout+stderr in *output (for CLI tests).
int RunCommand(const std::vector<std::string>& argv, std::string* output, int timeout_s = 60);

}  // namespace tessera::testing
