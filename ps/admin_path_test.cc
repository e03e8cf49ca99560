#include "ps/admin_path.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "ps/limits.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

class AdminPathTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "tessera-admin-path-XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    auto root = CanonicalAdminRoot(dir_ + "/root");
    ASSERT_TRUE(root.ok()) << root.status().ToString();
    root_ = *root;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string dir_, root_;
};

TEST_F(AdminPathTest, RelativeNamesResolveUnderTheRoot) {
  auto p = ResolveAdminPath(root_, "ckpt/run1");
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(*p, root_ + "/ckpt/run1");
  EXPECT_TRUE(ResolveAdminPath(root_, "./ckpt").ok());
  // ".." is refused even where it would stay inside (a/..): one rule, easy to state.
  EXPECT_FALSE(ResolveAdminPath(root_, "a/../b").ok());
}

TEST_F(AdminPathTest, EscapesAreRefused) {
  for (const char* bad : {"../x", "a/../../x", "..", "a/..", "/etc/passwd", ""}) {
    auto p = ResolveAdminPath(root_, bad);
    EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_NE(ResolveAdminPath(root_, "/tmp/x").status().message().find("absolute"),
            std::string::npos);
  EXPECT_EQ(ResolveAdminPath(root_, std::string("a\0b", 3)).status().code(),
            StatusCode::kInvalidArgument);
  // A symbolic link inside the root that points out of it.
  fs::create_directories(dir_ + "/outside");
  fs::create_symlink(dir_ + "/outside", root_ + "/link");
  auto p = ResolveAdminPath(root_, "link/ckpt");
  EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument) << p.status().ToString();
  EXPECT_NE(p.status().message().find("outside the admin root"), std::string::npos);
  // A sibling whose name starts like the root is outside too.
  fs::create_directories(dir_ + "/rootx");
  fs::create_symlink(dir_ + "/rootx", root_ + "/sib");
  EXPECT_EQ(ResolveAdminPath(root_, "sib").status().code(), StatusCode::kInvalidArgument);
  // A link that stays inside is fine.
  fs::create_directories(root_ + "/real");
  fs::create_symlink(root_ + "/real", root_ + "/alias");
  auto q = ResolveAdminPath(root_, "alias/ckpt");
  ASSERT_TRUE(q.ok()) << q.status().ToString();
  EXPECT_EQ(*q, root_ + "/real/ckpt");
}

TEST_F(AdminPathTest, LongNamesAreErrorsNotExceptions) {
  EXPECT_EQ(ResolveAdminPath(root_, std::string(5000, 'a')).status().code(),
            StatusCode::kInvalidArgument);
  // Under the request limit, but one component longer than the file system allows.
  auto p = ResolveAdminPath(root_, std::string(300, 'b') + "/x");
  EXPECT_FALSE(p.ok());
  EXPECT_EQ(CanonicalAdminRoot("").status().code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(CanonicalAdminRoot(dir_ + "/" + std::string(300, 'c')).ok());
}

TEST(RequestLimitsTest, BoundsEveryConsistencyField) {
  Header h;
  h.op = Op::kSparsePull;
  EXPECT_TRUE(ValidateRequestLimits(h).ok());
  h.num_workers = kMaxWorkers + 1;
  EXPECT_EQ(ValidateRequestLimits(h).code(), StatusCode::kInvalidArgument);
  h.num_workers = 4;
  h.worker_id = 4;
  EXPECT_EQ(ValidateRequestLimits(h).code(), StatusCode::kInvalidArgument);
  h.worker_id = 3;
  h.clock = -1;
  EXPECT_EQ(ValidateRequestLimits(h).code(), StatusCode::kInvalidArgument);
  h.clock = kMaxClock + 1;
  EXPECT_EQ(ValidateRequestLimits(h).code(), StatusCode::kInvalidArgument);
  h.clock = 5;
  h.staleness = -2;
  EXPECT_EQ(ValidateRequestLimits(h).code(), StatusCode::kInvalidArgument);
  h.staleness = 0;
  EXPECT_TRUE(ValidateRequestLimits(h).ok());
  h.name.assign(kMaxRequestNameBytes + 1, 'n');
  EXPECT_EQ(ValidateRequestLimits(h).code(), StatusCode::kInvalidArgument);
  Header cp;
  cp.op = Op::kCheckpoint;
  cp.clock = -1;  // a cut before any step
  cp.num_workers = 2;
  cp.worker_id = 7;  // the sender is not one of the cut's workers
  EXPECT_TRUE(ValidateRequestLimits(cp).ok());
  Header clock;
  clock.op = Op::kClock;
  clock.worker_id = kMaxWorkers;
  EXPECT_EQ(ValidateRequestLimits(clock).code(), StatusCode::kInvalidArgument);
  Header barrier;
  barrier.op = Op::kBarrier;
  barrier.num_workers = 1;
  EXPECT_EQ(ValidateRequestLimits(barrier).code(), StatusCode::kInvalidArgument);  // no name
  barrier.name = "b";
  EXPECT_TRUE(ValidateRequestLimits(barrier).ok());
}

}  // namespace
}  // namespace tessera
