// Readers, keys, the generator and the generic wrappers.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>

#include "worker/data_reader.h"
#include "worker/data_source.h"
#include "worker/keys.h"
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

}  // namespace
}  // namespace tessera::worker
