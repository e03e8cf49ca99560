// Child processes for the multi-process tests: fork + exec that dies with the test process.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace tessera::testing {

/// Starts argv[0] (a path) with arguments `argv` as a child process that is killed when the
/// test process ends (PR_SET_PDEATHSIG; a child whose parent already ended exits at once). Its
/// stdout goes to `out_fd` and its stderr to `err_fd` (dup2 in the child; -1: inherited); the
/// caller closes its own copies. The argument vector is built before fork, so the child runs
/// only async-signal-safe calls. Returns the pid, or -1 when fork fails.
pid_t SpawnChild(const std::vector<std::string>& argv, int out_fd, int err_fd);

/// Opens `path` for a child's output (appending, or truncating when `truncate`), close-on-exec
/// (SpawnChild's dup2 keeps it open in the child). -1 on failure.
int OpenLog(const std::string& path, bool truncate = false);

/// The whole of the file at `path` (a child's log); empty when it cannot be read.
std::string ReadLog(const std::string& path);

}  // namespace tessera::testing
