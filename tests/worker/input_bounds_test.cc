// Bounds on what the programs take from flags and paths (issue 35, items 9 and 10): a count
// over its bound is a usage error (exit 2) naming the bound, and an input read from a path
// that never ends (/dev/zero, /dev/urandom) is refused or cut at its size bound, in seconds,
// never read into memory without end.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "tests/worker/worker_cluster_fixture.h"

namespace tessera {
namespace {

using testing::ProgramRun;

// Runs `argv` to its end (killed after `timeout_s`), stdout and stderr together.
ProgramRun RunProgram(const std::vector<std::string>& argv, const std::string& name,
                      double timeout_s = 60) {
  return testing::RunToEnd(
      argv, ::testing::TempDir() + "/bounds-" + name + "-" + std::to_string(getpid()) + ".log",
      timeout_s);
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

// --prefetch_depth and --max_pushes_in_flight size a ring of steps (each a batch and its rows)
// and the steps redone after a restart: 0 or over 64 is a usage error naming the range.
TEST(WorkerInputBounds, PrefetchDepthAndPushesInFlightOutOfRangeAreUsageErrors) {
  for (const std::string flag : {"--prefetch_depth", "--max_pushes_in_flight"}) {
    for (const std::string value : {"0", "65"}) {
      ProgramRun r = RunProgram({TESSERA_WORKER_BINARY, "--servers=tcp://127.0.0.1:9",
                                 flag + "=" + value},
                                flag.substr(2) + value);
      EXPECT_EQ(r.rc, 2) << r.out;
      EXPECT_NE(r.out.find(flag + "=" + value + " is not in [1, 64]"), std::string::npos)
          << r.out;
    }
  }
}

// Item 10: the server's --cluster=@/dev/zero and --flagfile=/dev/urandom read without end
// (~200 MB/s); both are usage errors now, in seconds.
TEST(ServerInputBounds, ClusterFileAndFlagfileThatNeverEndAreRefused) {
  const std::string dir = ::testing::TempDir();
  const std::string nested = dir + "/nested-flags-" + std::to_string(getpid());
  {
    std::FILE* f = std::fopen(nested.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs("--rank=0\n--flagfile=/dev/zero\n", f);
    std::fclose(f);
  }
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{TESSERA_SERVER_BINARY, "--cluster=@/dev/zero", "--rank=0"},
       "cluster file '/dev/zero' holds more than 4194304 bytes"},
      {{TESSERA_SERVER_BINARY, "--flagfile=/dev/urandom"},
       "--flagfile=/dev/urandom is not a regular file"},
      {{TESSERA_SERVER_BINARY, "--flagfile", nested},
       "--flagfile=/dev/zero is not a regular file"},
      {{TESSERA_WORKER_BINARY, "--flagfile=/dev/zero"},
       "--flagfile=/dev/zero is not a regular file"},
      // Seconds the server holds in uint32 milliseconds: 4294968 s would wrap to 704 ms.
      {{TESSERA_SERVER_BINARY, "--cluster=tcp://127.0.0.1:1", "--rank=0",
        "--checkpoint_cut_timeout_s=4294968"},
       "--checkpoint_cut_timeout_s=4294968 is over the bound 4294967"},
      {{TESSERA_SERVER_BINARY, "--cluster=tcp://127.0.0.1:1", "--rank=0",
        "--idle_connection_timeout_s=4294968"},
       "--idle_connection_timeout_s=4294968 is over the bound 4294967"},
  };
  for (const Case& c : cases) {
    ProgramRun r = RunProgram(c.args, "flags", 60);
    EXPECT_EQ(r.rc, 2) << c.args[1] << "\n" << r.out;
    EXPECT_NE(r.out.find(c.message), std::string::npos) << r.out;
  }
  std::remove(nested.c_str());
}

// Item 10: --data=csv:/dev/zero read one endless line into memory; it is an error naming the
// file, the line and the bound once the worker reaches its data (after connecting: a server
// runs).
TEST(WorkerInputBounds, CsvDataFromDevZeroFailsAtTheLineBound) {
  testing::LocalCluster cluster(testing::Servers(1));
  ASSERT_TRUE(cluster.Start().ok());
  ProgramRun r = RunProgram({TESSERA_WORKER_BINARY, "--servers=" + cluster.endpoints()[0],
                             "--job=devzero", "--data=csv:/dev/zero",
                             "--schema=label=0;categorical=1;header=false", "--max_steps=2",
                             "--evaluate=false"},
                            "devzero", 120);
  EXPECT_NE(r.rc, 0) << r.out;
  EXPECT_LT(r.rc, 128) << "killed by a signal, or by the test's time limit\n" << r.out;
  EXPECT_NE(r.out.find("/dev/zero:1: a line of more than 1048576 bytes"), std::string::npos)
      << r.out;
}

}  // namespace
}  // namespace tessera
