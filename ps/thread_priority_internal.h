// Background threads below the request path: a nice value per thread (Linux applies nice per
// thread), set relative to the one the thread has.
#pragma once

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

namespace tessera::internal {

/// Lowers the calling thread's CPU priority by `steps` nice levels from its current one (at most
/// to 19), so that on a busy machine the process's other threads (lanes, the I/O thread) get
/// the cores first. Relative, not absolute: a server started under `nice -n 10` would otherwise
/// give its background threads the lanes' own priority. False (errno set) when the kernel
/// refused; the thread then runs at its priority as before.
inline bool LowerThreadPriority(int steps) {
  const auto tid = static_cast<id_t>(gettid());
  errno = 0;
  const int now = getpriority(PRIO_PROCESS, tid);
  if (now == -1 && errno != 0) return false;
  return setpriority(PRIO_PROCESS, tid, std::min(19, now + steps)) == 0;
}

}  // namespace tessera::internal
