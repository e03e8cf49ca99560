#include "benchmarks/bench_cluster.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>
#include <set>
#include <thread>

namespace tessera::bench {

namespace {

// What a stop signal must clean up: the running children, then their logs and the temporary
// directories.
struct Leftovers {
  std::mutex mu;
  std::set<pid_t> children;
  std::set<std::string> paths;
};

Leftovers& TheLeftovers() {
  static Leftovers* const leftovers = new Leftovers;  // never destroyed: used until _exit
  return *leftovers;
}

void RememberChild(pid_t pid) {
  Leftovers& l = TheLeftovers();
  std::lock_guard<std::mutex> lock(l.mu);
  l.children.insert(pid);
}

void ForgetChild(pid_t pid) {
  Leftovers& l = TheLeftovers();
  std::lock_guard<std::mutex> lock(l.mu);
  l.children.erase(pid);
}

void RememberPath(const std::string& path) {
  Leftovers& l = TheLeftovers();
  std::lock_guard<std::mutex> lock(l.mu);
  l.paths.insert(path);
}

void ForgetPath(const std::string& path) {
  Leftovers& l = TheLeftovers();
  std::lock_guard<std::mutex> lock(l.mu);
  l.paths.erase(path);
}

}  // namespace

Result<std::string> ServerProcess::Start(const std::vector<std::string>& argv,
                                         const std::string& ready, std::chrono::seconds timeout) {
  Stop();
  argv_ = argv;
  ready_ = ready;
  char log_tmpl[] = "/tmp/tessera-bench-XXXXXX";
  const int log = mkstemp(log_tmpl);
  if (log >= 0) {
    log_path_ = log_tmpl;
    RememberPath(log_path_);
  }
  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0) {
    if (log >= 0) close(log);
    Stop();
    return Status::IOError("pipe2 failed");
  }
  std::vector<std::string> args = argv;
  std::vector<char*> cargs;
  for (auto& a : args) cargs.push_back(a.data());
  cargs.push_back(nullptr);
  const pid_t parent = getpid();
  pid_ = fork();
  if (pid_ < 0) {
    close(out[0]);
    close(out[1]);
    if (log >= 0) close(log);
    Stop();
    return Status::IOError("fork failed");
  }
  if (pid_ == 0) {
    // Only async-signal-safe calls between fork and exec.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(1);
    // CleanUpOnStopSignals() blocks the stop signals here; the child must still obey them.
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    dup2(out[1], 1);
    if (log >= 0) dup2(log, 2);
    execv(cargs[0], cargs.data());
    _exit(127);
  }
  RememberChild(pid_);
  close(out[1]);
  if (log >= 0) close(log);
  std::string seen, endpoint;
  const auto until = std::chrono::steady_clock::now() + timeout;
  while (endpoint.empty() && std::chrono::steady_clock::now() < until) {
    pollfd p{out[0], POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    char buf[512];
    const ssize_t n = read(out[0], buf, sizeof(buf));
    if (n <= 0) break;
    seen.append(buf, static_cast<size_t>(n));
    const size_t line = seen.find(ready);
    const size_t eol = line == std::string::npos ? line : seen.find('\n', line);
    if (eol == std::string::npos) continue;
    const size_t at = seen.find("endpoint=", line);
    if (at < eol) endpoint = seen.substr(at + 9, eol - at - 9);
    while (!endpoint.empty() && (endpoint.back() == '\r' || endpoint.back() == ' ')) {
      endpoint.pop_back();
    }
    break;
  }
  close(out[0]);
  if (endpoint.empty()) {
    std::ifstream in(log_path_);
    const std::string err(std::istreambuf_iterator<char>(in), {});
    Stop();
    return Status::Unavailable(argv[0] + " did not start; its stderr:\n" + err);
  }
  return endpoint;
}

std::string ServerProcess::LogLine(const std::string& text) const {
  std::ifstream in(log_path_);
  std::string found;
  for (std::string line; std::getline(in, line);) {
    if (line.find(text) != std::string::npos) found = line;
  }
  return found;
}

Result<std::string> ServerProcess::Restart(std::chrono::seconds timeout) {
  const std::vector<std::string> argv = argv_;  // Start() assigns argv_
  const std::string ready = ready_;
  return Start(argv, ready, timeout);
}

void ServerProcess::Stop() { Reap(/*gracefully=*/true); }

void ServerProcess::Kill() { Reap(/*gracefully=*/false); }

void ServerProcess::Pause() {
  if (pid_ > 0) kill(pid_, SIGSTOP);
}

void ServerProcess::Resume() {
  if (pid_ > 0) kill(pid_, SIGCONT);
}

void ServerProcess::Reap(bool gracefully) {
  if (pid_ > 0) {
    int st;
    bool reaped = false;
    if (gracefully) {
      kill(pid_, SIGTERM);
      kill(pid_, SIGCONT);  // a paused process handles SIGTERM only once it runs
      for (int i = 0; i < 100 && !reaped; ++i) {
        reaped = waitpid(pid_, &st, WNOHANG) == pid_;
        if (!reaped) std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    }
    if (!reaped) {
      kill(pid_, SIGKILL);
      waitpid(pid_, &st, 0);
    }
    ForgetChild(pid_);
    pid_ = -1;
  }
  if (!log_path_.empty()) {
    unlink(log_path_.c_str());
    ForgetPath(log_path_);
    log_path_.clear();
  }
}

Status BenchCluster::Start(uint32_t n, const std::string& mode, const std::string& server_binary,
                           uint32_t lanes, const std::vector<std::string>& extra_flags) {
  Stop();
  // Each server binds a free port itself ("*"); --cluster only tells a process the cluster size
  // (the benchmark's clients are given the real endpoints), so no port can be raced for.
  std::string cluster;
  for (uint32_t i = 0; i < n; ++i) {
    cluster += (i ? "," : "") + std::string("tcp://127.0.0.1:") + std::to_string(1 + i);
  }
  for (uint32_t r = 0; r < n; ++r) {
    if (mode == "thread") {
      ServerOptions o;
      o.listen = "tcp://127.0.0.1:*";
      o.rank = r;
      o.num_servers = n;
      o.lanes = lanes;
      TESSERA_ASSIGN_OR_RETURN(auto s, Server::Create(o));
      endpoints_.push_back(s->endpoint());
      servers_.push_back(std::move(s));
      continue;
    }
    auto p = std::make_unique<ServerProcess>();
    std::vector<std::string> argv = {server_binary, "--listen=tcp://127.0.0.1:*",
                                     "--cluster=" + cluster, "--rank=" + std::to_string(r),
                                     "--lanes=" + std::to_string(lanes)};
    for (std::string f : extra_flags) {
      for (size_t pos; (pos = f.find("{rank}")) != std::string::npos;) {
        f.replace(pos, 6, std::to_string(r));
      }
      argv.push_back(std::move(f));
    }
    TESSERA_ASSIGN_OR_RETURN(std::string ep, p->Start(argv));
    endpoints_.push_back(ep);
    processes_.push_back(std::move(p));
  }
  return Status::OK();
}

pid_t BenchCluster::pid(uint32_t rank) const {
  return rank < processes_.size() && processes_[rank] ? processes_[rank]->pid() : -1;
}

std::string BenchCluster::LogLine(uint32_t rank, const std::string& text) const {
  return rank < processes_.size() && processes_[rank] ? processes_[rank]->LogLine(text) : "";
}

void BenchCluster::Kill(uint32_t rank) {
  if (rank < processes_.size()) processes_[rank]->Kill();
}

void BenchCluster::Pause() {
  for (auto& p : processes_) p->Pause();
}

void BenchCluster::Resume() {
  for (auto& p : processes_) p->Resume();
}

Status BenchCluster::Restart(uint32_t rank, std::chrono::seconds timeout) {
  if (rank >= processes_.size()) {
    return Status::InvalidArgument("no server process of rank " + std::to_string(rank));
  }
  TESSERA_ASSIGN_OR_RETURN(endpoints_[rank], processes_[rank]->Restart(timeout));
  return Status::OK();
}

void BenchCluster::Stop() {
  servers_.clear();
  processes_.clear();
  endpoints_.clear();
}

void RunOnly(const std::vector<BenchCluster*>& all, const BenchCluster& active) {
  for (BenchCluster* c : all) {
    if (c == &active) {
      c->Resume();
    } else {
      c->Pause();
    }
  }
}

TempDir::TempDir(const std::string& prefix) {
  std::string tmpl = (std::filesystem::temp_directory_path() / (prefix + "XXXXXX")).string();
  if (mkdtemp(tmpl.data()) == nullptr) {
    std::perror(("mkdtemp " + tmpl).c_str());
    std::exit(1);
  }
  path_ = tmpl;
  RememberPath(path_);
}

TempDir::~TempDir() {
  ForgetPath(path_);
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

void CleanUpOnStopSignals() {
  static sigset_t stop_signals;
  sigemptyset(&stop_signals);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&stop_signals, sig);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  // A plain thread, not a signal handler: it may lock, reap and remove files. The lock stays
  // held to the end, so no server starts and no directory appears after the sweep.
  std::thread([] {
    int sig = 0;
    sigwait(&stop_signals, &sig);
    Leftovers& l = TheLeftovers();
    l.mu.lock();
    for (pid_t pid : l.children) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
    std::error_code ec;
    for (const std::string& path : l.paths) std::filesystem::remove_all(path, ec);
    std::fprintf(stderr, "stopped by signal %d; servers killed, temporary files removed\n", sig);
    _exit(128 + sig);
  }).detach();
}

std::string DefaultServerBinary(const char* argv0) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path self = fs::canonical("/proc/self/exe", ec);
  if (ec) self = fs::absolute(argv0 != nullptr ? argv0 : "", ec);
  const fs::path dir = self.parent_path();
  const fs::path next_to = dir / "tessera-server";
  if (fs::exists(next_to, ec)) return next_to.string();
  // Benchmarks live in build/benchmarks/, the server at the top of the build tree.
  const fs::path build_root = dir / "../tessera-server";
  if (fs::exists(build_root, ec)) return fs::weakly_canonical(build_root, ec).string();
  return next_to.string();
}

std::vector<uint64_t> ParseList(const std::string& s) {
  std::vector<uint64_t> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t end = s.find(',', start);
    if (end == std::string::npos) end = s.size();
    const std::string item = s.substr(start, end - start);
    if (!item.empty()) {
      uint64_t v = 0;
      auto [p, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
      if (ec != std::errc() || p != item.data() + item.size()) {
        std::fprintf(stderr, "not a number in list '%s': '%s'\n", s.c_str(), item.c_str());
        std::exit(2);
      }
      out.push_back(v);
    }
    start = end + 1;
  }
  return out;
}

}  // namespace tessera::bench
