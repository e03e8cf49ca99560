// Bounds on what the programs take from flags and paths (issue 35, items 9 and 10): a count
// over its bound is a usage error (exit 2) naming the bound, and an input read from a path
// that never ends (/dev/zero, /dev/urandom) is refused or cut at its size bound, in seconds,
// never read into memory without end.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <vector>

#include "tests/cluster_fixture.h"
#include "tests/worker/worker_process.h"

#ifndef TESSERA_WORKER_BINARY
#error "TESSERA_WORKER_BINARY must name the tessera-worker executable"
#endif

namespace tessera {
namespace {

struct ProgramRun {
  int rc = -1;
  double seconds = 0;
  std::string out;
};

// Runs `argv` to its end (killed after `timeout_s`), stdout and stderr together.
ProgramRun RunProgram(const std::vector<std::string>& argv, const std::string& name,
               double timeout_s = 60) {
  testing::ChildProcess p;
  ProgramRun r;
  const auto start = std::chrono::steady_clock::now();
  const std::string log =
      ::testing::TempDir() + "/bounds-" + name + "-" + std::to_string(getpid()) + ".log";
  if (!p.Start(argv, log)) return r;
  r.rc = p.Wait(timeout_s);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  r.out = p.Output();
  return r;
}

// Item 9: --local_ranks=100000 spawned threads until std::system_error aborted the worker.
// (No server runs at the address: the count is refused before the worker connects.)
TEST(WorkerInputBounds, LocalRanksOverTheBoundIsAUsageErrorNamingIt) {
  for (const char* ranks : {"100000", "257"}) {
    ProgramRun r = RunProgram({TESSERA_WORKER_BINARY, "--servers=tcp://127.0.0.1:9",
                        std::string("--local_ranks=") + ranks},
                       std::string("ranks") + ranks);
    EXPECT_EQ(r.rc, 2) << r.out;
    EXPECT_NE(r.out.find(std::string("--local_ranks=") + ranks + " is over the bound 256"),
              std::string::npos)
        << r.out;
  }
}

}  // namespace
}  // namespace tessera
