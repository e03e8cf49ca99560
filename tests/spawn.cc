#include "tests/spawn.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

namespace tessera::testing {

pid_t SpawnChild(const std::vector<std::string>& argv, int out_fd, int err_fd) {
  std::vector<std::string> copy = argv;
  std::vector<char*> cargs;
  for (auto& a : copy) cargs.push_back(a.data());
  cargs.push_back(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid != 0) return pid;  // the parent, or -1
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(1);  // the parent ended before prctl
  if (out_fd >= 0) dup2(out_fd, 1);
  if (err_fd >= 0) dup2(err_fd, 2);
  execv(cargs[0], cargs.data());
  _exit(127);
}

int OpenLog(const std::string& path, bool truncate) {
  return open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | (truncate ? O_TRUNC : O_APPEND),
              0644);
}

std::string ReadLog(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace tessera::testing
