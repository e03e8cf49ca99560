// Bounds on what the data readers take from schemas and files (issue 35, items 8 and 10): a
// column index over the bound is refused when the schema is parsed, and a line over the
// line-length bound is an error naming its file and line, never a read without end.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "worker/batch.h"
#include "worker/csv_reader.h"
#include "worker/data_reader.h"
#include "worker/readers.h"

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


TEST(LineBound, GetBoundedLineKeepsLinesUpToTheBoundAndRefusesLonger) {
  const std::string at(10000, 'a');  // across the 4 KiB reads
  std::istringstream in(at + "\n\n" + std::string(10001, 'b') + "\nlast");
  std::string line;
  auto r = GetBoundedLine(in, &line, 10000);
  ASSERT_TRUE(r.ok() && *r);
  EXPECT_EQ(line, at);
  r = GetBoundedLine(in, &line, 10000);
  ASSERT_TRUE(r.ok() && *r);
  EXPECT_EQ(line, "");
  r = GetBoundedLine(in, &line, 10000);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("more than 10000 bytes"), std::string::npos);
  std::istringstream tail("x\nlast");
  ASSERT_TRUE(*GetBoundedLine(tail, &line));
  ASSERT_TRUE(*GetBoundedLine(tail, &line));
  EXPECT_EQ(line, "last");  // no line break at the end
  EXPECT_FALSE(*GetBoundedLine(tail, &line));
  std::istringstream exact(std::string(4095, 'c') + "\n" + std::string(4096, 'd') + "\n");
  ASSERT_TRUE(*GetBoundedLine(exact, &line));
  EXPECT_EQ(line, std::string(4095, 'c'));
  ASSERT_TRUE(*GetBoundedLine(exact, &line));
  EXPECT_EQ(line, std::string(4096, 'd'));
  EXPECT_FALSE(*GetBoundedLine(exact, &line));
}

// /dev/zero has no line break: every reader stops at the line-length bound with an error
// naming the file and line 1 (before the bound they read it into memory without end).
TEST(LineBound, ReadersOfDevZeroStopAtTheBoundNamingFileAndLine) {
  const std::string want = "/dev/zero:1: a line of more than " + std::to_string(kMaxLineBytes);
  CsvOptions o;
  o.schema.label = "0";
  o.schema.categorical = {"1"};
  o.schema.header = false;
  auto csv = OpenCsv("/dev/zero", ShardOptions{}, o);
  ASSERT_TRUE(csv.ok()) << csv.status().ToString();
  Batch b;
  b.Clear((*csv)->schema());
  Status s = (*csv)->Read(16, &b).status();
  EXPECT_NE(s.message().find(want), std::string::npos) << s.ToString();

  o.schema.header = true;
  o.schema.label = "y";
  o.schema.categorical = {"a"};
  s = OpenCsv("/dev/zero", ShardOptions{}, o).status();
  EXPECT_NE(s.message().find(want), std::string::npos) << s.ToString();

  auto criteo = OpenCriteo("/dev/zero", ShardOptions{});
  ASSERT_TRUE(criteo.ok()) << criteo.status().ToString();
  b.Clear((*criteo)->schema());
  s = (*criteo)->Read(16, &b).status();
  EXPECT_NE(s.message().find(want), std::string::npos) << s.ToString();

  s = OpenLibsvm("/dev/zero", ShardOptions{}, LibsvmOptions{}).status();
  EXPECT_NE(s.message().find(want), std::string::npos) << s.ToString();
}

TEST(LineBound, ALongLineInAFileIsAnErrorNamingItsLine) {
  TempFile f("1,a\n0,b\n1," + std::string(kMaxLineBytes, 'x') + "\n0,c\n");
  CsvOptions o;
  o.schema.label = "0";
  o.schema.categorical = {"1"};
  o.schema.header = false;
  o.skip_bad_lines = true;  // not skippable: the line has no end within the bound
  auto r = OpenCsv(f.path(), ShardOptions{}, o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  Batch b;
  b.Clear((*r)->schema());
  Status s = (*r)->Read(16, &b).status();
  EXPECT_NE(s.message().find(f.path() + ":3: a line of more than"), std::string::npos)
      << s.ToString();
}

}  // namespace
}  // namespace tessera::worker
