#include "tests/cluster_fixture.h"

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>

#include "tests/spawn.h"

#ifndef TESSERA_SERVER_BINARY
#error "TESSERA_SERVER_BINARY must name the tessera-server executable"
#endif

namespace tessera::testing {

uint16_t PickFreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  uint16_t port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) {
    socklen_t len = sizeof(a);
    getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    port = ntohs(a.sin_port);
  }
  close(fd);
  return port;
}

LocalCluster::LocalCluster(LocalClusterOptions options) : options_(std::move(options)) {
  std::string tmpl = (std::filesystem::temp_directory_path() / "tessera-cluster-XXXXXX").string();
  if (mkdtemp(tmpl.data()) != nullptr) dir_ = tmpl;
  pids_.assign(options_.num_servers, -1);
}

LocalCluster::~LocalCluster() {
  for (uint32_t i = 0; i < pids_.size(); ++i) {
    if (pids_[i] > 0) Kill(i);
  }
  if (dir_.empty()) return;
  if (std::getenv("TESSERA_KEEP_CLUSTER_DIR") != nullptr) {
    std::fprintf(stderr, "kept %s\n", dir_.c_str());
  } else {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
}

std::string LocalCluster::data_dir(uint32_t i) const {
  return dir_ + "/server" + std::to_string(i) + "-data";
}
std::string LocalCluster::admin_root() const {
  return options_.admin_root.empty() ? dir_ + "/admin" : options_.admin_root;
}
std::string LocalCluster::log_path(uint32_t i) const {
  return dir_ + "/server" + std::to_string(i) + ".log";
}

Status LocalCluster::Start() {
  if (dir_.empty()) return Status::IOError("cannot create a temp dir");
  for (int attempt = 0; attempt < 3; ++attempt) {
    endpoints_.clear();
    for (uint32_t i = 0; i < options_.num_servers; ++i) {
      endpoints_.push_back("tcp://127.0.0.1:" + std::to_string(PickFreePort()));
    }
    Status s;
    for (uint32_t i = 0; i < options_.num_servers && s.ok(); ++i) s = Spawn(i);
    if (s.ok()) return s;
    // The servers that did start stop with SIGTERM: one that registered in an etcd
    // (--coordinator) deregisters, so that it can register under its id again at the next
    // attempt (after kill -9 its key would stay until its lease ran out).
    for (uint32_t i = 0; i < pids_.size(); ++i) {
      if (pids_[i] > 0) Stop(i, 10);
    }
    if (attempt == 2) return s;
  }
  return Status::Internal("unreachable");
}

Status LocalCluster::Spawn(uint32_t i) {
  std::string cluster;
  for (auto& e : endpoints_) cluster += (cluster.empty() ? "" : ",") + e;
  std::vector<std::string> args = {TESSERA_SERVER_BINARY, "--cluster=" + cluster,
                                   "--rank=" + std::to_string(i),
                                   "--lanes=" + std::to_string(options_.lanes)};
  if (options_.with_data_dirs) args.push_back("--data_dir=" + data_dir(i));
  args.push_back("--admin_root=" + admin_root());
  for (auto& f : options_.extra_flags) args.push_back(f);
  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0) return Status::IOError("pipe failed");
  const int log = OpenLog(log_path(i));
  const pid_t pid = SpawnChild(args, out[1], log);
  if (log >= 0) close(log);
  close(out[1]);
  if (pid < 0) {
    close(out[0]);
    return Status::IOError("fork failed");
  }
  pids_[i] = pid;
  // Wait for the ready line (or the process to die).
  std::string seen;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < until) {
    pollfd p{out[0], POLLIN, 0};
    int r = poll(&p, 1, 100);
    if (r > 0) {
      char buf[512];
      ssize_t n = read(out[0], buf, sizeof(buf));
      if (n > 0) seen.append(buf, n);
      if (seen.find("tessera-server ready") != std::string::npos) {
        close(out[0]);
        return Status::OK();
      }
      if (n == 0) break;  // stdout closed: the process exited
    }
    int st;
    if (waitpid(pid, &st, WNOHANG) == pid) {
      pids_[i] = -1;
      break;
    }
  }
  close(out[0]);
  if (pids_[i] > 0) Kill(i);
  return Status::Unavailable("server " + std::to_string(i) + " did not start; see " + log_path(i));
}

void LocalCluster::Kill(uint32_t i) {
  if (pids_[i] <= 0) return;
  kill(pids_[i], SIGKILL);
  int st;
  waitpid(pids_[i], &st, 0);
  pids_[i] = -1;
}

std::unique_ptr<Client> ConnectClient(const LocalCluster& cluster, ClientOptions o) {
  o.servers = cluster.endpoints();
  auto r = Client::Create(o);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? std::move(r).value() : nullptr;
}

int64_t StatValue(const std::string& stats, const std::string& name) {
  const size_t pos = stats.find("\n" + name + " ");
  return pos == std::string::npos ? -1 : std::stoll(stats.substr(pos + name.size() + 2));
}

int LocalCluster::Stop(uint32_t i, int timeout_s) {
  if (pids_[i] <= 0) return -1;
  kill(pids_[i], SIGTERM);
  int st = 0;
  for (int k = 0; k < timeout_s * 20; ++k) {
    if (waitpid(pids_[i], &st, WNOHANG) == pids_[i]) {
      pids_[i] = -1;
      return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  Kill(i);
  return -1;
}

Status LocalCluster::Restart(uint32_t i) {
  if (pids_[i] > 0) Kill(i);
  Status s;
  // The port may linger briefly after a kill; retry a few times.
  for (int attempt = 0; attempt < 20; ++attempt) {
    s = Spawn(i);
    if (s.ok()) return s;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  return s;
}

int RunCommand(const std::vector<std::string>& argv, std::string* output, int timeout_s) {
  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0) return -1;
  const pid_t pid = SpawnChild(argv, out[1], out[1]);
  if (pid < 0) {
    close(out[0]);
    close(out[1]);
    return -1;
  }
  close(out[1]);
  output->clear();
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  for (;;) {
    pollfd p{out[0], POLLIN, 0};
    int r = poll(&p, 1, 100);
    if (r > 0) {
      char buf[4096];
      ssize_t n = read(out[0], buf, sizeof(buf));
      if (n <= 0) break;
      output->append(buf, n);
    }
    if (std::chrono::steady_clock::now() > until) {
      kill(pid, SIGKILL);
      break;
    }
  }
  close(out[0]);
  int st = 0;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

}  // namespace tessera::testing

namespace tessera::testing {

std::string HttpGet(uint32_t port, const std::string& path, int timeout_ms) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  timeval tv{timeout_ms / 1000, (timeout_ms % 1000) * 1000};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string out;
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) {
    const std::string req =
        "GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
    if (write(fd, req.data(), req.size()) == static_cast<ssize_t>(req.size())) {
      char buf[8192];
      for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) out.append(buf, n);
    }
  }
  close(fd);
  return out;
}

}  // namespace tessera::testing
