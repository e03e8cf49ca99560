// Opening the request log over what is not a segment file (issue 35, item 9): a directory (or
// a FIFO) named like a segment is refused with an IOError naming it, never an exception.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <string>

#include "storage/log_file_internal.h"
#include "storage/test_util_internal.h"

namespace tessera::internal {
namespace {

Result<std::unique_ptr<LogFile>> OpenLog(const std::string& dir) {
  LogFileOptions o;
  o.dir = dir;
  return LogFile::Open(o);
}

std::string FirstSegment(const std::string& dir) {
  for (const auto& e : std::filesystem::directory_iterator(dir)) return e.path().string();
  return "";
}

TEST(LogFileOpenTest, ADirectoryOrAFifoInPlaceOfASegmentIsAnIOErrorNamingIt) {
  for (const bool fifo : {false, true}) {
    TempDir dir;
    const std::string log_dir = dir.Sub("request-log");
    {
      auto log = OpenLog(log_dir);
      ASSERT_TRUE(log.ok()) << log.status().ToString();
      ASSERT_TRUE((*log)->Append(1, "one").ok());
    }
    const std::string segment = FirstSegment(log_dir);
    ASSERT_FALSE(segment.empty());
    std::filesystem::remove(segment);
    if (fifo) {
      ASSERT_EQ(mkfifo(segment.c_str(), 0600), 0);
    } else {
      std::filesystem::create_directory(segment);
    }
    auto again = OpenLog(log_dir);
    ASSERT_FALSE(again.ok()) << (fifo ? "fifo" : "directory");
    EXPECT_EQ(again.status().code(), StatusCode::kIOError) << again.status().ToString();
    EXPECT_NE(again.status().message().find(segment), std::string::npos)
        << again.status().ToString();
    EXPECT_NE(again.status().message().find("not a regular file"), std::string::npos)
        << again.status().ToString();
  }
}

}  // namespace
}  // namespace tessera::internal
