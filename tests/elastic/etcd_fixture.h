// A real etcd process on 127.0.0.1 for the elastic tests (label elastic).
#pragma once

#include <gtest/gtest.h>
#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ps/client/client.h"
#include "ps/coord/etcd_client.h"
#include "ps/status.h"

namespace tessera::testing {

/// One single-member etcd on free loopback ports with a temporary --data-dir. Destruction kills
/// it (SIGKILL) and removes the directory, also when the test failed; it also dies with the
/// test process (PR_SET_PDEATHSIG). Not thread-safe.
class EtcdProcess {
 public:
  /// The etcd binary the tests run (TESSERA_ETCD_BINARY, /usr/bin/etcd by default).
  static const char* Binary();
  /// True when Binary() exists; tests GTEST_SKIP otherwise (SkipMessage()).
  static bool Available();
  static std::string SkipMessage();

  EtcdProcess();
  ~EtcdProcess();
  EtcdProcess(const EtcdProcess&) = delete;
  EtcdProcess& operator=(const EtcdProcess&) = delete;

  /// More etcd flags for the next Start or Restart (e.g. "--auth-token-ttl=2").
  void set_extra_args(std::vector<std::string> args) { extra_args_ = std::move(args); }
  /// Picks free client and peer ports, starts etcd and waits until it answers a read
  /// (Unavailable with the end of its log when it does not within 60 s).
  Status Start();
  /// kill -9, and waits until the process is gone.
  void Kill();
  /// Starts etcd again on the same data dir and peer port and waits until it answers; on
  /// `client_port` when not 0 (then client_port() and options() name the new one), so a test
  /// can change the data while clients of the old port cannot reach it.
  Status Restart(uint16_t client_port = 0);
  bool running() const { return pid_ > 0; }

  uint16_t client_port() const { return client_port_; }
  /// Options of a client of this etcd.
  EtcdOptions options(int timeout_ms = 5000) const;
  /// "etcd://127.0.0.1:PORT/PREFIX".
  std::string url(const std::string& prefix) const;
  /// The end of etcd's log (for failure messages).
  std::string LogTail() const;

 private:
  Status Spawn();
  Status WaitUntilServing();
  std::string dir_;
  uint16_t client_port_ = 0;
  uint16_t peer_port_ = 0;
  pid_t pid_ = -1;
  std::vector<std::string> extra_args_;
};

/// A test with its own etcd: skipped when there is no etcd binary, failed when it does not
/// start; `etcd_` and a client `client_` (timeout 5 s) ready in the test body.
class EtcdTest : public ::testing::Test {
 protected:
  void SetUp() override;
  EtcdProcess etcd_;
  std::unique_ptr<EtcdClient> client_;
};

/// Polls `done` every 20 ms until it holds or `limit` passes; returns whether it held. The
/// limits are generous: a slow machine only makes a test take longer.
bool WaitFor(const std::function<bool()>& done, std::chrono::milliseconds limit);

/// The value of `key` in a server's stats text ("key value" lines); -1 when absent.
int64_t StatOf(const std::string& stats, const std::string& key);

/// Milliseconds since `start`.
double MsSince(std::chrono::steady_clock::time_point start);

/// A static client of every one of `endpoints` (stats and admin calls to each server by its
/// index); null, with a test failure, when it cannot be made.
inline std::unique_ptr<Client> AdminClient(const std::vector<std::string>& endpoints) {
  ClientOptions admin;
  admin.servers = endpoints;
  auto c = Client::Create(admin);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? std::move(*c) : nullptr;
}

}  // namespace tessera::testing
