// Readers, keys, the generator and the generic wrappers.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <algorithm>
#include <random>
#include <set>

#include "ps/feature_keys.h"
#include "worker/batch.h"
#include "worker/csv_reader.h"
#include "worker/data_reader.h"
#include "worker/data_source.h"
#include "worker/metrics.h"
#include "worker/readers.h"
#include "worker/synthetic_data.h"

namespace tessera::worker {
namespace {

class TempDir {
 public:
  TempDir() {
    std::string t = (std::filesystem::temp_directory_path() / "worker_data_test_XXXXXX").string();
    path_ = mkdtemp(t.data());
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string Write(const std::string& name, const std::string& text) const {
    std::string p = path_ + "/" + name;
    std::ofstream(p) << text;
    return p;
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

TEST(Keys, FieldIsInTheTopBitsAndValuesSpread) {
  EXPECT_EQ(FieldOfKey(MakeKey(7, 123)), 7u);
  EXPECT_EQ(FieldOfKey(MakeKey(255, ~uint64_t{0})), 255u);
  EXPECT_NE(MakeKey(1, 5), MakeKey(2, 5));
  EXPECT_NE(MakeKey(1, 5), MakeKey(1, 6));
  EXPECT_EQ(MakeStringKey(3, "abc"), MakeStringKey(3, "abc"));
  EXPECT_NE(MakeStringKey(3, "abc"), MakeStringKey(3, "abd"));
}

std::string CriteoLine(int label, int i) {
  std::string s = std::to_string(label);
  for (int j = 0; j < 13; ++j) s += "\t" + (j == 2 ? std::string() : std::to_string(i + j));
  for (int f = 0; f < 26; ++f) {
    char hex[16];
    std::snprintf(hex, sizeof(hex), "%08x", (i * 31 + f) & 0xff);
    s += "\t" + (f == 5 ? std::string() : std::string(hex));
  }
  return s + "\n";
}

TEST(CriteoReader, ParsesMissingValuesAndShards) {
  TempDir dir;
  std::string text;
  for (int i = 0; i < 20; ++i) text += CriteoLine(i % 3 == 0, i);
  const std::string path = dir.Write("criteo.tsv", text);
  ShardOptions all;
  auto r = OpenCriteo(path, all);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  Batch b;
  b.Clear((*r)->schema());
  ASSERT_TRUE(ReadAll(r->get(), &b).ok());
  ASSERT_TRUE(b.Validate().ok());
  ASSERT_EQ(b.size, 20u);
  EXPECT_EQ(b.labels[0], 1.0f);
  EXPECT_EQ(b.labels[1], 0.0f);
  EXPECT_FLOAT_EQ(b.dense[0], std::log1p(0.0f));
  EXPECT_FLOAT_EQ(b.dense[1], std::log1p(1.0f));
  EXPECT_EQ(b.dense[2], 0.0f);                 // missing integer
  EXPECT_EQ(b.offsets[6] - b.offsets[5], 0u);  // missing categorical: empty bag
  EXPECT_EQ(b.keys.size(), 20u * 25u);
  EXPECT_EQ(FieldOfKey(b.keys[0]), 0u);

  // Train/test split and sharding cover every line once.
  std::multiset<float> seen;
  for (auto part : {ShardOptions::Part::kTrain, ShardOptions::Part::kTest}) {
    for (uint32_t rank = 0; rank < 3; ++rank) {
      ShardOptions s;
      s.rank = rank;
      s.world = 3;
      s.holdout_mod = 4;
      s.part = part;
      auto rr = OpenCriteo(path, s);
      ASSERT_TRUE(rr.ok());
      Batch bb;
      bb.Clear((*rr)->schema());
      ASSERT_TRUE(ReadAll(rr->get(), &bb).ok());
      for (uint32_t i = 0; i < bb.size; ++i) seen.insert(bb.dense[i * 13]);
    }
  }
  EXPECT_EQ(seen.size(), 20u);
  EXPECT_EQ(std::set<float>(seen.begin(), seen.end()).size(), 20u);
}

TEST(CriteoReader, BadLineIsCorruptionWithLineNumber) {
  TempDir dir;
  const std::string path = dir.Write("bad.tsv", CriteoLine(1, 0) + "1\t2\t3\n");
  auto r = OpenCriteo(path, {});
  ASSERT_TRUE(r.ok());
  Batch b;
  b.Clear((*r)->schema());
  auto n = (*r)->Read(10, &b);
  ASSERT_FALSE(n.ok());
  EXPECT_EQ(n.status().code(), StatusCode::kCorruption);
  EXPECT_NE(n.status().message().find(":2:"), std::string::npos) << n.status().ToString();
  EXPECT_EQ(OpenCriteo(dir.path() + "/missing.tsv", {}).status().code(), StatusCode::kNotFound);
}

TEST(LibsvmReader, LibfmByPositionAndLibffmTriples) {
  TempDir dir;
  const std::string fm = dir.Write("a.libfm", "1 10:1 20:1 30:0.5\n-1 11:1 21:1 31:2\n");
  auto r = OpenLibsvm(fm, {});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ((*r)->schema().num_fields, 3u);
  Batch b;
  b.Clear((*r)->schema());
  ASSERT_TRUE(ReadAll(r->get(), &b).ok());
  ASSERT_TRUE(b.Validate().ok());
  ASSERT_EQ(b.size, 2u);
  EXPECT_EQ(b.labels[0], 1.0f);
  EXPECT_EQ(b.labels[1], 0.0f);
  EXPECT_EQ(b.keys[2], MakeKey(2, 30));
  EXPECT_FLOAT_EQ(b.weights[2], 0.5f);
  EXPECT_FLOAT_EQ(b.weights[5], 2.0f);

  const std::string ffm = dir.Write("a.ffm", "0 1:5:1 0:7:1\n1 0:8:1\n");
  auto f = OpenLibsvm(ffm, {}, LibsvmOptions{2, true});
  ASSERT_TRUE(f.ok());
  Batch c;
  c.Clear((*f)->schema());
  ASSERT_TRUE(ReadAll(f->get(), &c).ok());
  ASSERT_EQ(c.size, 2u);
  EXPECT_EQ(c.keys[0], MakeKey(0, 7));  // sorted into field order
  EXPECT_EQ(c.keys[1], MakeKey(1, 5));
  EXPECT_EQ(c.offsets[4] - c.offsets[3], 0u);  // sample 1 has no field 1

  const std::string bad = dir.Write("bad.libsvm", "1 3:x\n");
  auto g = OpenLibsvm(bad, {}, LibsvmOptions{1, true});
  ASSERT_TRUE(g.ok());
  Batch d;
  d.Clear((*g)->schema());
  EXPECT_EQ((*g)->Read(1, &d).status().code(), StatusCode::kCorruption);
}

TEST(MovieLensReader, ClicksSplitByTime) {
  TempDir dir;
  dir.Write("movies.csv",
            "movieId,title,genres\n1,Toy Story (1995),Animation|Comedy\n"
            "2,\"Lion, The (1994)\",Drama\n3,No Year,(no genres listed)\n");
  dir.Write("tags.csv", "userId,movieId,tag,timestamp\n1,1,Pixar,5\n2,1,pixar,6\n");
  std::string ratings = "userId,movieId,rating,timestamp\n";
  for (int i = 0; i < 100; ++i) {
    ratings += std::to_string(i % 7) + "," + std::to_string(1 + i % 3) + "," +
               (i % 2 ? "4.5" : "2.0") + "," + std::to_string(3600 * i) + "\n";
  }
  dir.Write("ratings.csv", ratings);
  ShardOptions train;
  train.part = ShardOptions::Part::kTrain;
  auto r = OpenMovieLens(dir.path(), train);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  Batch b;
  b.Clear((*r)->schema());
  ASSERT_TRUE(ReadAll(r->get(), &b).ok());
  ASSERT_TRUE(b.Validate().ok());
  EXPECT_EQ(b.size, 90u);
  EXPECT_EQ(b.labels[0], 0.0f);
  EXPECT_EQ(b.labels[1], 1.0f);
  // Sample 0: user 0, movie 1 (two genres, a year, one tag after case folding).
  const uint32_t nf = kMovieLensFields;
  EXPECT_EQ(b.offsets[3] - b.offsets[2], 2u);
  EXPECT_EQ(b.offsets[4] - b.offsets[3], 1u);
  EXPECT_EQ(b.offsets[5] - b.offsets[4], 1u);
  // Sample 2: movie 3, no genres and no year.
  EXPECT_EQ(b.offsets[2 * nf + 3] - b.offsets[2 * nf + 2], 0u);
  EXPECT_EQ(b.offsets[2 * nf + 4] - b.offsets[2 * nf + 3], 0u);

  ShardOptions test;
  test.part = ShardOptions::Part::kTest;
  test.rank = 1;
  test.world = 2;
  auto t = OpenMovieLens(dir.path(), test);
  ASSERT_TRUE(t.ok());
  Batch tb;
  tb.Clear((*t)->schema());
  ASSERT_TRUE(ReadAll(t->get(), &tb).ok());
  EXPECT_EQ(tb.size, 5u);
}

TEST(Synthetic, DeterministicShardedSeekableWithKnownOracle) {
  SyntheticOptions o;
  o.num_samples = 4000;
  auto a = SyntheticReader::Create(o);
  ASSERT_TRUE(a.ok());
  Batch all;
  all.Clear((*a)->schema());
  ASSERT_TRUE(ReadAll(a->get(), &all).ok());
  ASSERT_EQ(all.size, 4000u);
  ASSERT_TRUE(all.Validate().ok());
  // Shard 1 of 2, seeked to its 10th sample, is global sample 21.
  SyntheticOptions s = o;
  s.rank = 1;
  s.world = 2;
  auto b = SyntheticReader::Create(s);
  ASSERT_TRUE((*b)->Seek(10).ok());
  Batch one;
  one.Clear((*b)->schema());
  ASSERT_EQ((*b)->Read(1, &one).value(), 1u);
  EXPECT_EQ(one.labels[0], all.labels[21]);
  EXPECT_EQ(one.true_probs[0], all.true_probs[21]);
  EXPECT_EQ(std::vector<float>(one.dense.begin(), one.dense.end()),
            std::vector<float>(all.dense.begin() + 21 * 13, all.dense.begin() + 22 * 13));
  // The planted model separates the classes (its oracle AUC is about 0.71 on 100000 samples),
  // and the click rate is Criteo-like.
  const double auc = Auc(all.true_probs, all.labels);
  EXPECT_GT(auc, 0.67);
  EXPECT_LT(auc, 0.9);
  double clicks = 0;
  for (float y : all.labels) clicks += y;
  EXPECT_GT(clicks / all.size, 0.15);
  EXPECT_LT(clicks / all.size, 0.45);
  // Zipf: the most frequent id of a large field is common.
  std::map<uint64_t, int> counts;
  for (uint32_t i = 0; i < all.size; ++i) {
    if (all.offsets[i * 26 + 3] < all.offsets[i * 26 + 4])
      ++counts[all.keys[all.offsets[i * 26 + 3]]];
  }
  int top = 0;
  for (auto& [k, c] : counts) top = std::max(top, c);
  EXPECT_GT(top, 200);
}

TEST(Wrappers, ShuffleIsAPermutationAndEpochsRepeat) {
  SyntheticOptions o;
  o.num_samples = 1000;
  auto inner = SyntheticReader::Create(o);
  ShuffleReader shuf(std::move(*inner), 100, 5);
  Batch b;
  b.Clear(shuf.schema());
  ASSERT_TRUE(ReadAll(&shuf, &b).ok());
  ASSERT_EQ(b.size, 1000u);
  std::multiset<float> shuffled(b.true_probs.begin(), b.true_probs.end());
  auto plain = SyntheticReader::Create(o);
  Batch p;
  p.Clear((*plain)->schema());
  ASSERT_TRUE(ReadAll(plain->get(), &p).ok());
  EXPECT_EQ(shuffled, std::multiset<float>(p.true_probs.begin(), p.true_probs.end()));
  EXPECT_NE(b.true_probs, p.true_probs);
  // Seek replays deterministically.
  ASSERT_TRUE(shuf.Seek(500).ok());
  Batch rest;
  rest.Clear(shuf.schema());
  ASSERT_TRUE(ReadAll(&shuf, &rest).ok());
  EXPECT_EQ(rest.true_probs, std::vector<float>(b.true_probs.begin() + 500, b.true_probs.end()));

  auto again = SyntheticReader::Create(o);
  EpochReader epochs(std::move(*again), 3);
  Batch e;
  e.Clear(epochs.schema());
  ASSERT_TRUE(ReadAll(&epochs, &e).ok());
  EXPECT_EQ(e.size, 3000u);
  EXPECT_EQ(epochs.position(), 3000u);
}

// ------------------------------------------------------------------ CSV

// The Avazu layout (docs/worker.md, "CSV input"), and the schema documented for it.
constexpr const char* kAvazuHeader =
    "id,click,hour,C1,banner_pos,site_id,site_domain,site_category,app_id,app_domain,"
    "app_category,device_id,device_ip,device_model,device_type,device_conn_type,C14,C15,C16,"
    "C17,C18,C19,C20,C21";
constexpr const char* kAvazuSchema =
    "label=click;categorical=hour,C1,banner_pos,site_id,site_domain,site_category,app_id,"
    "app_domain,app_category,device_id,device_ip,device_model,device_type,device_conn_type,"
    "C14,C15,C16,C17,C18,C19,C20,C21";

// Avazu-like line i: id i, a click every third line, site_id s<i%5>, C15 320 or 0, C16 = i.
std::string AvazuLine(int i) {
  std::string s = std::to_string(1000 + i) + "," + (i % 3 == 0 ? "1" : "0") + ",14102100,1005," +
                  std::to_string(i % 2) + ",s" + std::to_string(i % 5) + ",dom,cat,app" +
                  std::to_string(i % 4) + ",adom,acat,dev,ip" + std::to_string(i) + ",model," +
                  "1,0,15706," + (i % 2 ? "320" : "0") + "," + std::to_string(i) +
                  ",1722,0,35,-1,79";
  return s + "\n";
}

std::string AvazuFile(int lines) {
  std::string text = std::string(kAvazuHeader) + "\n";
  for (int i = 0; i < lines; ++i) text += AvazuLine(i);
  return text;
}

Result<std::unique_ptr<DataReader>> OpenCsvWith(const std::string& path, const std::string& schema,
                                                ShardOptions shard = {},
                                                SkippedLines* skipped = nullptr,
                                                bool skip = false) {
  TESSERA_ASSIGN_OR_RETURN(CsvSchema s, ParseCsvSchema(schema));
  CsvOptions o;
  o.schema = s;
  o.skip_bad_lines = skip;
  o.skipped = skipped;
  return OpenCsv(path, shard, o);
}

Batch ReadCsv(DataReader* r) {
  Batch b;
  b.Clear(r->schema());
  Status s = ReadAll(r, &b);
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_TRUE(b.Validate().ok());
  return b;
}

TEST(CsvSchema, ParsesTheDocumentedSyntaxAndRefusesMistakes) {
  auto s = ParseCsvSchema(
      " label=click; numeric=hour:none, price:log ,age;categorical=site_id,app_id,device_type;"
      "delimiter=\\t;header=false;");
  // header=false wants indexes: refused, naming the column.
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("'click'"), std::string::npos) << s.status().ToString();

  auto t = ParseCsvSchema(
      "label=click; numeric=hour:none, price:log ,age;categorical=site_id,app_id,device_type;"
      "delimiter=\\t;header=true;");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->label, "click");
  ASSERT_EQ(t->numeric.size(), 3u);
  EXPECT_EQ(t->numeric[0].column, "hour");
  EXPECT_EQ(t->numeric[0].transform, NumericTransform::kNone);
  EXPECT_EQ(t->numeric[1].column, "price");
  EXPECT_EQ(t->numeric[1].transform, NumericTransform::kLog);
  EXPECT_EQ(t->numeric[2].transform, NumericTransform::kNone);  // the default
  EXPECT_EQ(t->categorical, (std::vector<std::string>{"site_id", "app_id", "device_type"}));
  EXPECT_EQ(t->delimiter, '\t');
  EXPECT_TRUE(t->header);
  // Defaults: comma, a header.
  auto d = ParseCsvSchema("label=0;categorical=1");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->delimiter, ',');
  EXPECT_TRUE(d->header);
  EXPECT_EQ(ParseCsvSchema("label=y;categorical=a;delimiter=|")->delimiter, '|');
  EXPECT_EQ(ParseCsvSchema("label=y;categorical=a;delimiter=semicolon")->delimiter, ';');
  EXPECT_EQ(ParseCsvSchema("label=y;categorical=a;delimiter= ")->delimiter, ' ');

  for (const char* bad : {"categorical=a", "label=y", "label=y;categorical=", "label=y;cat=a",
                          "label=y;categorical=a;numeric=p:sqrt", "label=y;categorical=a,,b",
                          "label=y;categorical=a;delimiter=ab", "label=y;categorical=a;delimiter=",
                          "label=y;categorical=a;header=yes", "label=y;categorical=a,a",
                          "label=y;categorical=a,y", "label=y;categorical=a;label=z",
                          "label=y,z;categorical=a", "label=y;categorical=a;delimiter=\""}) {
    auto r = ParseCsvSchema(bad);
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_NE(ParseCsvSchema("label=y;categorical=a;numeric=p:sqrt")
                .status()
                .message()
                .find("'sqrt'"),
            std::string::npos);
  // A column may be both numeric and categorical.
  EXPECT_TRUE(ParseCsvSchema("label=y;numeric=hour;categorical=hour").ok());
}

TEST(CsvReader, AvazuLayoutWithHeaderGivesKeysLabelsAndValues) {
  TempDir dir;
  const std::string path = dir.Write("avazu.csv", AvazuFile(30));
  auto r = OpenCsvWith(path, kAvazuSchema);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ((*r)->schema().num_dense, 0u);
  EXPECT_EQ((*r)->schema().num_fields, 22u);
  Batch b = ReadCsv(r->get());
  ASSERT_EQ(b.size, 30u);
  for (int i = 0; i < 30; ++i) EXPECT_EQ(b.labels[i], i % 3 == 0 ? 1.0f : 0.0f) << i;
  EXPECT_EQ(b.keys.size(), 30u * 22u);  // no empty values
  // Field f of the schema is field f of the key; values are hashed as strings.
  EXPECT_EQ(b.keys[0], MakeStringKey(0, "14102100"));  // hour
  EXPECT_EQ(b.keys[3], MakeStringKey(3, "s0"));        // site_id
  EXPECT_EQ(b.keys[22 + 3], MakeStringKey(3, "s1"));   // line 1
  EXPECT_EQ(b.keys[7 * 22 + 10], MakeStringKey(10, "ip7"));  // device_ip of line 7
  for (uint32_t f = 0; f < 22; ++f) EXPECT_EQ(FieldOfKey(b.keys[f]), f);

  // Numeric columns with both transforms; ignored columns (id and most others).
  auto n =
      OpenCsvWith(path, "label=click;numeric=C15:none,C16:log;categorical=site_id,device_type");
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_EQ((*n)->schema().num_dense, 2u);
  EXPECT_EQ((*n)->schema().num_fields, 2u);
  Batch c = ReadCsv(n->get());
  ASSERT_EQ(c.size, 30u);
  for (int i = 0; i < 30; ++i) {
    EXPECT_FLOAT_EQ(c.dense[2 * i], i % 2 ? 320.0f : 0.0f) << i;
    EXPECT_FLOAT_EQ(c.dense[2 * i + 1], static_cast<float>(std::log1p(i))) << i;
    EXPECT_EQ(c.keys[2 * i], MakeStringKey(0, "s" + std::to_string(i % 5))) << i;
    EXPECT_EQ(c.keys[2 * i + 1], MakeStringKey(1, "1")) << i;
  }

  // A column the header lacks: InvalidArgument naming it.
  auto missing = OpenCsvWith(path, "label=click;categorical=site_id,campaign");
  EXPECT_EQ(missing.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(missing.status().message().find("'campaign'"), std::string::npos)
      << missing.status().ToString();
  EXPECT_EQ(OpenCsvWith(dir.path() + "/none.csv", kAvazuSchema).status().code(),
            StatusCode::kNotFound);
}

TEST(CsvReader, ShardsByRankAndHoldsOutEveryNthLine) {
  TempDir dir;
  const std::string path = dir.Write("avazu.csv", AvazuFile(40));
  const std::string schema = "label=click;numeric=C16:none;categorical=site_id";
  // Holdout 4: lines 3, 7, ... test; the rest train, dealt to 2 ranks in turn.
  std::vector<float> got[2];
  for (uint32_t rank = 0; rank < 2; ++rank) {
    ShardOptions s;
    s.rank = rank;
    s.world = 2;
    s.holdout_mod = 4;
    s.part = ShardOptions::Part::kTrain;
    auto r = OpenCsvWith(path, schema, s);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    Batch b = ReadCsv(r->get());
    got[rank] = b.dense;
  }
  std::vector<float> train;
  for (int i = 0; i < 40; ++i) {
    if (i % 4 != 3) train.push_back(static_cast<float>(i));
  }
  ASSERT_EQ(train.size(), 30u);
  std::vector<float> want[2];
  for (size_t j = 0; j < train.size(); ++j) want[j % 2].push_back(train[j]);
  EXPECT_EQ(got[0], want[0]);
  EXPECT_EQ(got[1], want[1]);

  ShardOptions t;
  t.holdout_mod = 4;
  t.part = ShardOptions::Part::kTest;
  auto r = OpenCsvWith(path, schema, t);
  ASSERT_TRUE(r.ok());
  Batch b = ReadCsv(r->get());
  EXPECT_EQ(b.dense, (std::vector<float>{3, 7, 11, 15, 19, 23, 27, 31, 35, 39}));

  // Through the data source: csv:PATH with the schema; 2 ranks split the training part.
  DataSourceOptions o;
  o.spec = "csv:" + path;
  o.schema = schema;
  o.holdout_mod = 4;
  o.validation_mod = 0;
  o.world = 2;
  o.rank = 1;
  auto ds = OpenTrainData(o);
  ASSERT_TRUE(ds.ok()) << ds.status().ToString();
  EXPECT_EQ(ReadCsv(ds->get()).dense, want[1]);
  EXPECT_EQ(SmallestTrainShard(o).value(), 15u);
  EXPECT_FALSE(HasOracle(o));
  o.schema.clear();
  EXPECT_EQ(OpenTrainData(o).status().code(), StatusCode::kInvalidArgument);
}

TEST(CsvReader, HeaderlessByIndexQuotesEmptyValuesAndTabs) {
  TempDir dir;
  // Columns: 0 id (ignored), 1 label, 2 price, 3 city (quoted, with the delimiter inside), 4 tag.
  const std::string path = dir.Write(
      "plain.csv",
      "a,1,3.5,\"Paris, FR\",x\r\n"
      "b,0,,\"Say \"\"hi\"\"\",\n"
      "\n"
      "c,-1, 7 ,Rome,y\n"
      "d,2,1e2,,z\n");
  auto r = OpenCsvWith(path, "label=1;numeric=2:log;categorical=3,4;header=false");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  Batch b = ReadCsv(r->get());
  ASSERT_EQ(b.size, 4u);  // the empty line is no sample
  EXPECT_EQ(b.labels, (std::vector<float>{1, 0, 0, 1}));  // > 0 is a click
  EXPECT_FLOAT_EQ(b.dense[0], std::log1p(3.5f));
  EXPECT_EQ(b.dense[1], 0.0f);  // empty numeric value
  EXPECT_FLOAT_EQ(b.dense[2], std::log1p(7.0f));
  EXPECT_FLOAT_EQ(b.dense[3], std::log1p(100.0f));
  EXPECT_EQ(b.keys[0], MakeStringKey(0, "Paris, FR"));  // quoted: the comma is in the value
  EXPECT_EQ(b.keys[1], MakeStringKey(1, "x"));           // "\r" dropped
  EXPECT_EQ(b.keys[2], MakeStringKey(0, "Say \"hi\""));
  EXPECT_EQ(b.offsets[4] - b.offsets[3], 0u);  // line 2: empty tag, an empty bag
  EXPECT_EQ(b.offsets[7] - b.offsets[6], 0u);  // line 5: empty city
  EXPECT_EQ(b.keys.size(), 6u);

  // Tab-separated, with a header; a quoted header name.
  const std::string tsv = dir.Write("t.tsv", "y\t\"the city\"\n1\tOslo\n0\tBergen\n");
  auto t = OpenCsvWith(tsv, "label=y;categorical=the city;delimiter=\\t");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  Batch tb = ReadCsv(t->get());
  ASSERT_EQ(tb.size, 2u);
  EXPECT_EQ(tb.keys[1], MakeStringKey(0, "Bergen"));
}

TEST(CsvReader, MalformedLineNamesItsLineOrIsSkippedAndCounted) {
  TempDir dir;
  std::string text = AvazuFile(10);
  text += "1010,1,14102100\n";  // line 12: too few columns
  text += AvazuLine(11);
  std::string bad_label = AvazuLine(12);
  bad_label.replace(5, 1, "yes");  // "1012,1,..." -> "1012,yes,..."
  text += bad_label;               // line 14: a label that is no number
  text += "1013,0,\"open quote\n";  // line 15: unclosed quote
  text += AvazuLine(14);
  const std::string path = dir.Write("bad.csv", text);
  const std::string schema = "label=click;numeric=C16:none;categorical=site_id";

  auto r = OpenCsvWith(path, schema);
  ASSERT_TRUE(r.ok());
  Batch b;
  b.Clear((*r)->schema());
  Status s = ReadAll(r->get(), &b);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kCorruption);
  EXPECT_NE(s.message().find(path + ":12:"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("expected 24 columns"), std::string::npos) << s.ToString();

  SkippedLines skipped;
  auto k = OpenCsvWith(path, schema, {}, &skipped, /*skip=*/true);
  ASSERT_TRUE(k.ok());
  Batch kb = ReadCsv(k->get());
  EXPECT_EQ(kb.size, 12u);
  EXPECT_EQ(kb.dense, (std::vector<float>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 14}));
  EXPECT_EQ(skipped.count(), 3u);
  EXPECT_NE(skipped.first_error().find(":12:"), std::string::npos) << skipped.first_error();
  // A second pass (an epoch) skips the same lines: still 3 distinct lines.
  ASSERT_TRUE((*k)->Rewind().ok());
  EXPECT_EQ(ReadCsv(k->get()).size, 12u);
  EXPECT_EQ(skipped.count(), 3u);

  // With skipped lines, 2 ranks deal samples (not lines): every good sample once, in turn, so
  // rank r's j-th sample is the part's (2j + r)-th whatever was skipped.
  std::vector<float> dealt[2];
  for (uint32_t rank = 0; rank < 2; ++rank) {
    ShardOptions sh;
    sh.rank = rank;
    sh.world = 2;
    auto rr = OpenCsvWith(path, schema, sh, &skipped, true);
    ASSERT_TRUE(rr.ok());
    dealt[rank] = ReadCsv(rr->get()).dense;
  }
  EXPECT_EQ(dealt[0], (std::vector<float>{0, 2, 4, 6, 8, 11}));
  EXPECT_EQ(dealt[1], (std::vector<float>{1, 3, 5, 7, 9, 14}));
  EXPECT_EQ(skipped.count(), 3u);
}

TEST(DataSource, ParsesSpecs) {
  DataSourceOptions o;
  o.train_samples = 100;
  o.test_samples = 10;
  auto t = OpenTestData(o);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ((*t)->schema().num_fields, 26u);
  EXPECT_TRUE(HasOracle(o));
  o.spec = "criteo";
  EXPECT_EQ(OpenTrainData(o).status().code(), StatusCode::kInvalidArgument);
  o.spec = "parquet:/x";
  EXPECT_EQ(OpenTrainData(o).status().code(), StatusCode::kInvalidArgument);
}

// IndexBatch (hash table, then a sort of the unique keys) against its definition: the sorted
// distinct keys, and for every entry the position of its key among them. Keys repeat heavily
// and include 0 and the largest key; batches of several sizes reuse the per-thread buffers.
TEST(IndexBatch, MatchesSortedUniqueAndBinarySearch) {
  std::mt19937_64 rng(11);
  IndexedBatch ib;
  for (size_t entries : {0, 1, 2, 7, 1000, 30000, 5}) {
    Batch b;
    b.Clear(Schema{0, 1});
    std::uniform_int_distribution<uint64_t> pick(0, entries / 3 + 1);
    std::vector<uint64_t> pool = {0, ~uint64_t{0}, 1ULL << 63};
    for (size_t i = 0; i < entries / 3 + 2; ++i) pool.push_back(rng());
    for (size_t e = 0; e < entries; ++e) b.keys.push_back(pool[pick(rng) % pool.size()]);
    b.offsets.push_back(static_cast<uint32_t>(entries));
    b.labels.push_back(0);
    b.size = 1;
    ASSERT_TRUE(b.Validate().ok());
    IndexBatch(b, &ib);
    std::vector<uint64_t> want = b.keys;
    std::sort(want.begin(), want.end());
    want.erase(std::unique(want.begin(), want.end()), want.end());
    EXPECT_EQ(ib.unique_keys, want) << entries << " entries";
    ASSERT_EQ(ib.rows.size(), entries);
    for (size_t e = 0; e < entries; ++e) {
      ASSERT_LT(ib.rows[e], want.size());
      EXPECT_EQ(want[ib.rows[e]], b.keys[e]) << "entry " << e << " of " << entries;
    }
  }
}

}  // namespace
}  // namespace tessera::worker
