#include "tests/elastic/etcd_fixture.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "tests/cluster_fixture.h"
#include "tests/spawn.h"

#ifndef TESSERA_ETCD_BINARY
#define TESSERA_ETCD_BINARY "/usr/bin/etcd"
#endif

namespace tessera::testing {

const char* EtcdProcess::Binary() { return TESSERA_ETCD_BINARY; }

bool EtcdProcess::Available() { return access(Binary(), X_OK) == 0; }

std::string EtcdProcess::SkipMessage() {
  return std::string("no etcd at ") + Binary() +
         ": `bash scripts/install_deps.sh` installs it (Debian etcd-server)";
}

EtcdProcess::EtcdProcess() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "tessera-etcd-XXXXXX").string();
  if (mkdtemp(tmpl.data()) != nullptr) dir_ = tmpl;
}

EtcdProcess::~EtcdProcess() {
  Kill();
  if (!dir_.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
}

EtcdOptions EtcdProcess::options(int timeout_ms) const {
  EtcdOptions o;
  o.host = "127.0.0.1";
  o.port = client_port_;
  o.timeout_ms = timeout_ms;
  return o;
}

std::string EtcdProcess::url(const std::string& prefix) const {
  return "etcd://127.0.0.1:" + std::to_string(client_port_) + "/" + prefix;
}

std::string EtcdProcess::LogTail() const {
  std::ifstream in(dir_ + "/etcd.log");
  std::stringstream ss;
  ss << in.rdbuf();
  std::string all = ss.str();
  return all.size() > 3000 ? all.substr(all.size() - 3000) : all;
}

Status EtcdProcess::Start() {
  if (dir_.empty()) return Status::IOError("cannot create a temp dir for etcd");
  Status s;
  // A port picked free may be taken by the time etcd binds it: pick again.
  for (int attempt = 0; attempt < 3; ++attempt) {
    client_port_ = PickFreePort();
    peer_port_ = PickFreePort();
    if (client_port_ == peer_port_) continue;
    s = Spawn();
    if (s.ok()) return s;
    Kill();
    std::filesystem::remove_all(dir_ + "/data");
  }
  return s;
}

Status EtcdProcess::Restart(uint16_t client_port) {
  Kill();
  if (client_port != 0) client_port_ = client_port;
  return Spawn();
}

Status EtcdProcess::Spawn() {
  const std::string client = "http://127.0.0.1:" + std::to_string(client_port_);
  const std::string peer = "http://127.0.0.1:" + std::to_string(peer_port_);
  std::vector<std::string> args = {Binary(),
                                   "--name=t",
                                   "--data-dir=" + dir_ + "/data",
                                   "--listen-client-urls=" + client,
                                   "--advertise-client-urls=" + client,
                                   "--listen-peer-urls=" + peer,
                                   "--initial-advertise-peer-urls=" + peer,
                                   "--initial-cluster=t=" + peer};
  args.insert(args.end(), extra_args_.begin(), extra_args_.end());
  const int log = OpenLog(dir_ + "/etcd.log");
  const pid_t pid = SpawnChild(args, log, log);
  if (log >= 0) close(log);
  if (pid < 0) return Status::IOError("fork failed");
  pid_ = pid;
  return WaitUntilServing();
}

Status EtcdProcess::WaitUntilServing() {
  auto client = EtcdClient::Create(options(1000));
  if (!client.ok()) return client.status();
  // Generous: a loaded machine may take long to start etcd; the wait ends as soon as it reads.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  Status last;
  while (std::chrono::steady_clock::now() < until) {
    int st;
    if (waitpid(pid_, &st, WNOHANG) == pid_) {
      pid_ = -1;
      return Status::Unavailable("etcd exited at start; its log:\n" + LogTail());
    }
    auto r = (*client)->Get("/probe");
    if (r.ok()) return Status::OK();
    // With auth enabled (etcd_auth_test) etcd refuses a read without a user: it serves.
    if (r.status().code() == StatusCode::kInvalidArgument &&
        r.status().message().find("user name is empty") != std::string::npos) {
      return Status::OK();
    }
    last = r.status();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  Kill();
  return Status::Unavailable("etcd did not answer within 60 s (" + last.ToString() +
                             "); its log:\n" + LogTail());
}

void EtcdTest::SetUp() {
  if (!EtcdProcess::Available()) GTEST_SKIP() << EtcdProcess::SkipMessage();
  Status s = etcd_.Start();
  ASSERT_TRUE(s.ok()) << s.ToString();
  auto c = EtcdClient::Create(etcd_.options());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  client_ = std::move(c).value();
}

bool WaitFor(const std::function<bool()>& done, std::chrono::milliseconds limit) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() >= until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

int64_t StatOf(const std::string& stats, const std::string& key) {
  std::istringstream in(stats);
  std::string k;
  int64_t v;
  while (in >> k >> v) {
    if (k == key) return v;
    in.ignore(1 << 20, '\n');
  }
  return -1;
}

double MsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

void EtcdProcess::Kill() {
  if (pid_ <= 0) return;
  kill(pid_, SIGKILL);
  int st;
  waitpid(pid_, &st, 0);
  pid_ = -1;
}

}  // namespace tessera::testing
