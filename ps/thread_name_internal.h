// Names the calling thread for tools that list threads (top -H, perf sched, gdb, /proc):
// without it every thread of a process carries the program's name, and a trace cannot tell a
// lane from the file writer (docs/operations.md, "Threads").
#pragma once

#include <pthread.h>

#include <string>
#include <string_view>

namespace tessera::internal {

/// Linux keeps 15 bytes of a thread's name: longer names are cut there. Best effort: a name
/// the kernel refuses leaves the old one.
inline void NameThisThread(std::string_view name) {
  const std::string cut(name.substr(0, 15));
  (void)pthread_setname_np(pthread_self(), cut.c_str());
}

}  // namespace tessera::internal
