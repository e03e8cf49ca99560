// What the benchmarks of the elastic tier share (bench_elastic, bench_dense_move): a real etcd
// process on free loopback ports, three servers following a map in it, a client of that map,
// the scales run by tessera-ctl scale's controller, and a log of timestamped push completions
// read as rates.
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

#include <functional>
#include <memory>
#include <span>

#include "benchmarks/bench_cluster.h"
#include "ps/client/client.h"
#include "ps/control/scale.h"
#include "ps/coord/cluster_map.h"
#include "ps/coord/coordinator_url.h"
#include "ps/coord/etcd_client.h"
#include "ps/coord/etcd_map_source.h"
#include "ps/coord/slot_map_store.h"
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

// Three tessera-server processes (2 lanes) on free loopback ports, all named in --cluster, each
// following the map at etcd `url`: memory-only when `data_root` is empty, else each on RocksDB
// in DATA_ROOT/server-<rank> (strict durability unless `flags` say otherwise).
struct MapServers {
  std::vector<std::string> endpoints;
  std::vector<std::unique_ptr<ServerProcess>> processes;
};
inline Result<MapServers> StartMapServers(const std::string& binary, const std::string& url,
                                          const std::vector<std::string>& flags,
                                          const std::string& data_root = "") {
  MapServers out;
  std::string cluster_list;
  for (int i = 0; i < 3; ++i) {
    out.endpoints.push_back("tcp://127.0.0.1:" + std::to_string(FreePort()));
    cluster_list += (i ? "," : "") + out.endpoints.back();
  }
  for (int r = 0; r < 3; ++r) {
    std::vector<std::string> argv = {binary, "--listen=" + out.endpoints[r],
                                     "--cluster=" + cluster_list, "--rank=" + std::to_string(r),
                                     "--lanes=2", "--coordinator=" + url};
    if (!data_root.empty()) {
      argv.push_back("--data_dir=" + data_root + "/server-" + std::to_string(r));
    }
    argv.insert(argv.end(), flags.begin(), flags.end());
    out.processes.push_back(std::make_unique<ServerProcess>());
    TESSERA_RETURN_IF_ERROR(out.processes.back()->Start(argv).status());
  }
  return out;
}

// `first` stored as the map at `url`, and a client that follows it.
struct MapClient {
  CoordinatorUrl url;
  std::unique_ptr<EtcdClient> etcd;
  std::unique_ptr<Client> client;
};
inline Result<MapClient> CreateMapAndClient(const std::string& url, const ClusterMap& first) {
  MapClient out;
  TESSERA_ASSIGN_OR_RETURN(out.url, CoordinatorUrl::Parse(url));
  TESSERA_ASSIGN_OR_RETURN(out.etcd, EtcdClient::Create(out.url.etcd_options()));
  TESSERA_RETURN_IF_ERROR(SlotMapStore(out.etcd.get(), out.url.prefix).Create(first));
  TESSERA_ASSIGN_OR_RETURN(auto source, EtcdClusterMapSource::Create(out.url));
  ClientOptions co;
  co.request_timeout_ms = 60000;
  co.retry_for_ms = 120000;
  TESSERA_ASSIGN_OR_RETURN(out.client, Client::Create(co, std::move(source)));
  return out;
}

// One scale of a run: to `servers` live servers; its time and report.
struct ScaleRun {
  const char* name;
  uint32_t servers;
  Clock::time_point begin{}, end{};
  ScaleReport report{};
};
// Runs the scales of `runs` in turn with `so`, calling `pause` after each; the first error,
// named after its scale.
inline Status RunScales(MapClient& m, ScaleOptions so, std::span<ScaleRun> runs,
                        const std::function<void()>& pause) {
  ClientOptions base;
  base.request_timeout_ms = 120000;
  for (ScaleRun& run : runs) {
    so.servers = run.servers;
    run.begin = Clock::now();
    auto r = ScaleCluster(*m.etcd, m.url.prefix, base, so);
    run.end = Clock::now();
    if (!r.ok()) return r.status().WithContext(run.name);
    run.report = *r;
    pause();
  }
  return Status::OK();
}

}  // namespace tessera::bench
