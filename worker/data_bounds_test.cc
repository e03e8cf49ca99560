// Bounds on what the data readers take from schemas and files (issue 35, items 8 and 10): a
// column index over the bound is refused when the schema is parsed, and a line over the
// line-length bound is an error naming its file and line, never a read without end.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "worker/batch.h"
#include "worker/csv_reader.h"
#include "worker/data_reader.h"

namespace tessera::worker {
namespace {

// A file in a fresh temp directory, removed with it.
class TempFile {
 public:
  explicit TempFile(const std::string& contents) {
    std::string tmpl = (std::filesystem::temp_directory_path() / "tessera-bounds-XXXXXX").string();
    dir_ = mkdtemp(tmpl.data());
    path_ = dir_ + "/data.csv";
    std::ofstream(path_, std::ios::binary) << contents;
  }
  ~TempFile() { std::filesystem::remove_all(dir_); }
  const std::string& path() const { return path_; }

 private:
  std::string dir_;
  std::string path_;
};

TEST(CsvSchemaBounds, AColumnIndexOverTheBoundIsRefusedNamingTheClauseAndTheBound) {
  for (const char* bad : {"label=4294967295;categorical=0;header=false",
                          "label=0;categorical=4294967295;header=false",
                          "label=0;categorical=1;numeric=65536;header=false",
                          "label=99999999999999999999;categorical=1;header=false"}) {
    auto r = ParseCsvSchema(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(r.status().message().find("65535"), std::string::npos) << r.status().ToString();
  }
  EXPECT_NE(ParseCsvSchema("label=4294967295;categorical=0;header=false")
                .status()
                .message()
                .find("label=4294967295"),
            std::string::npos);
  EXPECT_NE(ParseCsvSchema("label=0;categorical=4294967295;header=false")
                .status()
                .message()
                .find("categorical=4294967295"),
            std::string::npos);
  EXPECT_TRUE(ParseCsvSchema("label=65535;categorical=0;header=false").ok());
}

TEST(CsvSchemaBounds, OpenCsvRefusesAnIndexOverTheBoundOfASchemaItWasGivenDirectly) {
  TempFile f("1,2\n0,3\n");
  CsvOptions o;
  o.schema.label = "4294967295";
  o.schema.categorical = {"0"};
  o.schema.header = false;
  auto r = OpenCsv(f.path(), ShardOptions{}, o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().ToString();
  // At the bound: a line with too few columns is a malformed line, not a crash.
  o.schema.label = "65535";
  auto at = OpenCsv(f.path(), ShardOptions{}, o);
  ASSERT_TRUE(at.ok()) << at.status().ToString();
  Batch b;
  b.Clear((*at)->schema());
  EXPECT_EQ((*at)->Read(4, &b).status().code(), StatusCode::kCorruption);
}

}  // namespace
}  // namespace tessera::worker
