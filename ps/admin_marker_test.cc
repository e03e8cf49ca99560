#include "ps/admin_marker.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace tessera {
namespace {

namespace fs = std::filesystem;

class AdminMarkerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "tessera-admin-marker-XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  Result<AdminMarker> Read(const std::string& text, std::string_view what = "checkpoint") {
    const std::string path = dir_ + "/MARKER";
    std::ofstream(path) << text;
    return ReadAdminMarker(path, what);
  }
  std::string dir_;
};

TEST_F(AdminMarkerTest, AStaticClusterMarkerNamesServersZeroToN) {
  auto m = Read("tessera checkpoint\nservers 3\ncut_clock -1\n");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->server_ids, (std::vector<uint32_t>{0, 1, 2}));
  EXPECT_EQ(*m->SignedNumber("cut_clock"), -1);
  EXPECT_EQ(m->Number("map_version").status().code(), StatusCode::kCorruption);
}

TEST_F(AdminMarkerTest, AMapClusterMarkerListsItsIds) {
  auto m = Read("tessera export\nversion 4\nservers 3\nserver_ids 0 2 5\nmap_version 17\n",
                "export");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->server_ids, (std::vector<uint32_t>{0, 2, 5}));
  EXPECT_EQ(*m->Number("map_version"), 17u);
  EXPECT_EQ(FormatServerIds(m->server_ids), "0 2 5");
}

TEST_F(AdminMarkerTest, BadMarkersAreCorruptionNamingTheRule) {
  EXPECT_EQ(ReadAdminMarker(dir_ + "/none", "checkpoint").status().code(),
            StatusCode::kNotFound);
  auto wrong_kind = Read("tessera export\nservers 1\n");
  EXPECT_NE(wrong_kind.status().message().find("not a checkpoint marker"), std::string::npos)
      << wrong_kind.status().ToString();
  EXPECT_EQ(Read("tessera checkpoint\ncut_clock 3\n").status().code(), StatusCode::kCorruption);
  EXPECT_EQ(Read("tessera checkpoint\nservers 0\n").status().code(), StatusCode::kCorruption);
  EXPECT_EQ(Read("tessera checkpoint\nservers x\n").status().code(), StatusCode::kCorruption);
  auto count = Read("tessera checkpoint\nservers 3\nserver_ids 0 2\n");
  EXPECT_NE(count.status().message().find("names 2 servers"), std::string::npos)
      << count.status().ToString();
  auto order = Read("tessera checkpoint\nservers 2\nserver_ids 2 1\n");
  EXPECT_NE(order.status().message().find("ascending"), std::string::npos)
      << order.status().ToString();
  EXPECT_EQ(Read("tessera checkpoint\nservers 1\nserver_ids 70000\n").status().code(),
            StatusCode::kCorruption);
  EXPECT_EQ(Read("tessera checkpoint\nservers 1\nnovalue\n").status().code(),
            StatusCode::kCorruption);
}

}  // namespace
}  // namespace tessera
