// Files opened from an admin root: a FIFO, a device or a link out of the root is refused at
// once (never waited on, never read without end); a regular file inside reads back whole.
#include "ps/read_file_internal.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace tessera::internal {
namespace {

class ReadFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/tessera_read_file_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = std::filesystem::canonical(tmpl).string();
    root_ = dir_ + "/root";
    std::filesystem::create_directories(root_ + "/ckpt");
    Write(root_ + "/ckpt/lane-0", "rows");
    Write(dir_ + "/outside", "other rows");
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  static void Write(const std::string& path, const std::string& data) {
    std::ofstream(path, std::ios::binary) << data;
  }
  Result<std::string> Read(const std::string& path, uint64_t max = UINT64_MAX) {
    return ReadRegularFile(path, ReadFileOptions{.inside = root_, .max_bytes = max});
  }
  std::string dir_, root_;
};

TEST_F(ReadFileTest, ARegularFileInsideReadsBackWhole) {
  auto r = Read(root_ + "/ckpt/lane-0");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, "rows");
  EXPECT_EQ(Read(root_ + "/ckpt/lane-9").status().code(), StatusCode::kNotFound);
}

TEST_F(ReadFileTest, AFifoIsRefusedWithoutWaitingForAWriter) {
  const std::string fifo = root_ + "/ckpt/lane-1";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  // Without O_NONBLOCK the open waits for a writer that never comes: the test would hang.
  auto r = Read(fifo);
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition) << r.status().ToString();
  EXPECT_NE(r.status().message().find(fifo), std::string::npos) << r.status().ToString();
  EXPECT_NE(r.status().message().find("FIFO"), std::string::npos) << r.status().ToString();
  // Without a root too: a FIFO is never a file to read.
  EXPECT_EQ(ReadRegularFile(fifo, {}).status().code(), StatusCode::kFailedPrecondition);
}

TEST_F(ReadFileTest, LinksToADeviceOrOutOfTheRootAreRefused) {
  const std::string zero = root_ + "/ckpt/lane-2";
  std::filesystem::create_symlink("/dev/zero", zero);
  auto r = Read(zero);
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition) << r.status().ToString();
  // Followed without a root, /dev/zero is still no regular file (no read without end).
  EXPECT_EQ(ReadRegularFile(zero, {}).status().code(), StatusCode::kFailedPrecondition);

  const std::string out = root_ + "/ckpt/lane-3";
  std::filesystem::create_symlink(dir_ + "/outside", out);
  r = Read(out);
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition) << r.status().ToString();
  EXPECT_NE(r.status().message().find("symbolic link"), std::string::npos)
      << r.status().ToString();

  // A link in a directory component: the file resolves outside the root.
  std::filesystem::create_directories(dir_ + "/elsewhere");
  Write(dir_ + "/elsewhere/lane-0", "rows");
  std::filesystem::create_directory_symlink(dir_ + "/elsewhere", root_ + "/server-0");
  r = Read(root_ + "/server-0/lane-0");
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition) << r.status().ToString();
  EXPECT_NE(r.status().message().find("outside the admin root"), std::string::npos)
      << r.status().ToString();
}

TEST_F(ReadFileTest, ADirectoryOrAFileOverTheBoundIsRefused) {
  EXPECT_EQ(Read(root_ + "/ckpt").status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(Read(root_ + "/ckpt/lane-0", 3).status().code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(Read(root_ + "/ckpt/lane-0", 4).ok());
}

}  // namespace
}  // namespace tessera::internal
