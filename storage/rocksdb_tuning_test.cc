// The RocksDB configuration's checks of StorageOptions::rocksdb_table_options (the string
// tessera-server --rocksdb_table_options passes through).
#include <gtest/gtest.h>

#include <string>

#include "storage/storage.h"
#include "storage/test_util_internal.h"

namespace tessera {
namespace {

using internal::TempDir;

// Hostile rocksdb_table_options (tessera-server --rocksdb_table_options): each fails the open
// with InvalidArgument naming the option string, cut short when long, and opens nothing.
TEST(RocksDbTuningTest, BadTableOptionStringsAreRefusedClearly) {
  TempDir dir;
  const std::string huge(1 << 20, 'a');
  for (const std::string& bad :
       {std::string("no_such_option=1"), std::string("{{{"), std::string("=;="),
        std::string("write_buffer_size=99999999999999999999999"),
        std::string("write_buffer_size=-1"), std::string("write_buffer_size= \t-5"),
        std::string("block_based_table_factory={block_size=-4096}"),
        std::string("block_based_table_factory={block_size=abc}"), huge + "=1"}) {
    StorageOptions o;
    o.data_dir = dir.Sub("db");
    o.rocksdb_table_options = bad;
    auto r = OpenStorageEngine(o);
    ASSERT_FALSE(r.ok()) << bad.substr(0, 80);
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().ToString();
    EXPECT_NE(r.status().message().find("rocksdb_table_options '"), std::string::npos)
        << r.status().ToString();
    EXPECT_LT(r.status().message().size(), 1000u) << bad.substr(0, 80);
  }
  // A sound string still opens.
  StorageOptions o;
  o.data_dir = dir.Sub("ok");
  o.rocksdb_table_options = "write_buffer_size=33554432;max_write_buffer_number=2";
  EXPECT_TRUE(OpenStorageEngine(o).ok());
}

}  // namespace
}  // namespace tessera
