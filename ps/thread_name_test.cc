#include "ps/thread_name_internal.h"

#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <thread>

namespace tessera::internal {
namespace {

std::string ThisThreadsName() {
  std::ifstream f("/proc/thread-self/comm");
  std::string name;
  std::getline(f, name);
  return name;
}

TEST(ThreadNameTest, NamesTheCallingThreadOnlyAndCutsAt15Bytes) {
  const std::string before = ThisThreadsName();
  std::string inside, cut;
  std::thread([&] {
    NameThisThread("lane-3");
    inside = ThisThreadsName();
    NameThisThread("a-name-of-twenty-bytes");
    cut = ThisThreadsName();
  }).join();
  EXPECT_EQ(inside, "lane-3");
  EXPECT_EQ(cut, "a-name-of-twent");
  EXPECT_EQ(ThisThreadsName(), before) << "another thread's name changed";
}

}  // namespace
}  // namespace tessera::internal
