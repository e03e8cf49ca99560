// What the benchmarks of the elastic tier share (bench_elastic, bench_dense_move): a real etcd
// process on free loopback ports, and a log of timestamped push completions read as rates.
#pragma once

#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "ps/coord/etcd_client.h"
#include "ps/status.h"

namespace tessera::bench {

using Clock = std::chrono::steady_clock;

inline uint16_t FreePort() {
  // Bound and released at once: free a moment ago (the benchmark's own loopback only).
  for (int i = 0; i < 50; ++i) {
    const uint16_t p = static_cast<uint16_t>(20000 + std::random_device()() % 30000);
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(p);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
    close(fd);
    if (ok) return p;
  }
  return 0;
}

// etcd on free loopback ports with its data under `dir`; killed on destruction.
class Etcd {
 public:
  Status Start(const std::string& dir, const std::string& binary) {
    port_ = FreePort();
    const uint16_t peer_port = FreePort();
    const std::string client = "http://127.0.0.1:" + std::to_string(port_);
    const std::string peer = "http://127.0.0.1:" + std::to_string(peer_port);
    std::vector<std::string> args = {binary, "--name=b", "--data-dir=" + dir + "/etcd",
                                     "--listen-client-urls=" + client,
                                     "--advertise-client-urls=" + client,
                                     "--listen-peer-urls=" + peer,
                                     "--initial-advertise-peer-urls=" + peer,
                                     "--initial-cluster=b=" + peer};
    const std::string log = dir + "/etcd.log";
    pid_ = fork();
    if (pid_ < 0) return Status::IOError("fork failed");
    if (pid_ == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (!freopen(log.c_str(), "w", stderr) || !freopen(log.c_str(), "a", stdout)) _exit(127);
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    tessera::EtcdOptions o;
    o.port = port_;
    o.timeout_ms = 1000;
    auto c = tessera::EtcdClient::Create(o);
    if (!c.ok()) return c.status();
    for (int i = 0; i < 600; ++i) {
      if ((*c)->Get("/probe").ok()) return Status::OK();
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return Status::Unavailable("etcd (" + binary + ") did not answer in 30 s; see " + log);
  }
  ~Etcd() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  std::string url(const std::string& prefix) const {
    return "etcd://127.0.0.1:" + std::to_string(port_) + "/" + prefix;
  }

 private:
  pid_t pid_ = -1;
  uint16_t port_ = 0;
};

// Push completions, timestamped, from the pushing thread.
struct Pushes {
  std::mutex mu;
  std::vector<std::pair<Clock::time_point, uint64_t>> done;  // completion, keys
  std::atomic<bool> stop{false};
  Status error;
};

// Keys/s of each `window` between `from` and `to`.
inline std::vector<double> Windows(Pushes& p, Clock::time_point from, Clock::time_point to,
                            double window_s) {
  std::vector<double> out;
  std::lock_guard<std::mutex> l(p.mu);
  const auto w = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(window_s));
  for (auto t = from; t + w <= to; t += w) {
    uint64_t keys = 0;
    for (auto& [at, k] : p.done) {
      if (at >= t && at < t + w) keys += k;
    }
    out.push_back(static_cast<double>(keys) / window_s);
  }
  return out;
}

inline double Rate(Pushes& p, Clock::time_point from, Clock::time_point to) {
  std::lock_guard<std::mutex> l(p.mu);
  uint64_t keys = 0;
  for (auto& [at, k] : p.done) {
    if (at >= from && at < to) keys += k;
  }
  return static_cast<double>(keys) / std::chrono::duration<double>(to - from).count();
}

}  // namespace tessera::bench
