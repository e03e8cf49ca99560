// The RocksDB engine's row writer thread (write-back, rocksdb_write_back.cc) as the operating
// system sees it.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>

#include "storage/test_util_internal.h"

namespace tessera {
namespace {

using internal::MustOpen;
using internal::TempDir;

// The nice value of this process's thread named `name` (/proc/self/task/TID/comm and stat),
// or nullopt when there is none.
std::optional<int> NiceOfThread(const std::string& name) {
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(task.path() / "comm");
    std::string c;
    std::getline(comm, c);
    if (c != name) continue;
    std::ifstream stat(task.path() / "stat");
    std::string line;
    std::getline(stat, line);
    // Fields after the ")" that ends the command: state is field 3, nice field 19.
    std::istringstream rest(line.substr(line.rfind(')') + 2));
    std::string field;
    for (int i = 3; i < 19; ++i) rest >> field;
    int nice = 0;
    rest >> nice;
    return nice;
  }
  return std::nullopt;
}

// The row writer (write-back) is background work: it runs 5 nice levels below the thread that
// opened the engine (the lanes' level), relative to it, so that a server started under nice
// still puts its lanes first.
TEST(RocksDbEngineTest, RowWriterRunsBelowTheLanesPriority) {
  TempDir dir;
  errno = 0;
  const int mine = getpriority(PRIO_PROCESS, static_cast<id_t>(gettid()));
  ASSERT_EQ(errno, 0);
  auto engine = MustOpen(dir.path());
  std::optional<int> writer;
  for (int i = 0; i < 500 && !(writer = NiceOfThread("tessera-rows")); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));  // the thread names itself
  }
  ASSERT_TRUE(writer.has_value()) << "no thread named tessera-rows";
  EXPECT_EQ(*writer, std::min(19, mine + 5));
}

}  // namespace
}  // namespace tessera
