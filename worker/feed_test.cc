// The data pipeline (worker/feed.h) against sequential reading: for every reader kind, with
// real files and the training readers' wrappers (sharding, validation hold-out, epochs,
// shuffle), the feed hands over exactly the batches, indexes and positions of Read +
// IndexBatch, whatever its threads and depth; errors come in order; resuming at a feed's
// position continues at the right sample; training gives bit-identical results.
#include "worker/feed.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "worker/backend.h"
#include "worker/batch.h"
#include "worker/csv_reader.h"
#include "worker/data_reader.h"
#include "worker/data_source.h"
#include "worker/job.h"
#include "worker/model.h"
#include "worker/param_store.h"
#include "worker/readers.h"
#include "worker/synthetic_data.h"
#include "worker/trainer.h"

namespace tessera::worker {
namespace {

class TempDir {
 public:
  TempDir() {
    std::string t = (std::filesystem::temp_directory_path() / "worker_feed_test_XXXXXX").string();
    path_ = mkdtemp(t.data());
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string Write(const std::string& name, const std::string& text) const {
    std::string p = path_ + "/" + name;
    std::ofstream(p, std::ios::binary) << text;
    return p;
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// A Criteo line: some integers and categoricals missing, hexadecimal ids (a few of more than
// 16 digits, which are hashed as strings).
std::string CriteoLine(std::mt19937_64& rng) {
  std::string s = std::to_string(rng() % 4 == 0 ? 1 : 0);
  for (int j = 0; j < 13; ++j) {
    s += "\t";
    if (rng() % 7 != 0) s += std::to_string(static_cast<int>(rng() % 500) - 5);
  }
  for (int f = 0; f < 26; ++f) {
    s += "\t";
    if (rng() % 9 == 0) continue;
    char hex[40];
    std::snprintf(hex, sizeof(hex), "%08llx", static_cast<unsigned long long>(rng() % 300));
    s += hex;
    if (rng() % 50 == 0) s += "0123456789abcdef";
  }
  return s;
}

std::string CriteoText(int lines, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string text;
  for (int i = 0; i < lines; ++i) text += CriteoLine(rng) + "\n";
  return text;
}

std::string LibsvmText(int lines) {
  std::mt19937_64 rng(5);
  std::string text = "1 3:1 7:0.5 11:2 13:1 17:1\n";  // 5 fields, by position
  for (int i = 1; i < lines; ++i) {
    text += std::to_string(rng() % 3 == 0 ? 1 : -1);
    const int n = 2 + static_cast<int>(rng() % 6);
    for (int k = 0; k < n; ++k) {
      text += " " + std::to_string(rng() % 400) + ":" + std::to_string((rng() % 8) * 0.25);
    }
    text += "\n";
  }
  return text;
}

std::string CsvText(int lines) {
  std::mt19937_64 rng(9);
  std::string text = "click,hour,site,app,price\n";
  for (int i = 0; i < lines; ++i) {
    text += std::to_string(rng() % 5 == 0 ? 1 : 0) + "," + std::to_string(rng() % 24) + ",";
    text += rng() % 10 == 0 ? "\"s,q" + std::to_string(rng() % 20) + "\""
                            : "s" + std::to_string(rng() % 90);
    text += "," + (rng() % 6 == 0 ? std::string() : "a" + std::to_string(rng() % 70));
    text += "," + std::to_string((rng() % 1000) / 10.0) + "\n";
  }
  return text;
}

constexpr char kCsvSchema[] = "label=click;numeric=hour,price:log;categorical=site,app";

void WriteMovieLens(const TempDir& dir, int ratings) {
  std::filesystem::create_directories(dir.path() + "/ml");
  std::string movies = "movieId,title,genres\n";
  for (int m = 1; m <= 60; ++m) {
    movies += std::to_string(m) + ",\"Film " + std::to_string(m) + ", The (19" +
              std::to_string(50 + m % 40) + ")\"," + (m % 3 ? "Drama|Comedy" : "Action") + "\n";
  }
  dir.Write("ml/movies.csv", movies);
  dir.Write("ml/tags.csv", "userId,movieId,tag,timestamp\n1,3,Funny,5\n2,3,dark,6\n4,9,Epic,7\n");
  std::mt19937_64 rng(3);
  std::string text = "userId,movieId,rating,timestamp\n";
  for (int i = 0; i < ratings; ++i) {
    text += std::to_string(1 + rng() % 80) + "," + std::to_string(1 + rng() % 70) + "," +
            std::to_string(1 + rng() % 5) + "." + (rng() % 2 ? "5" : "0") + "," +
            std::to_string(1000000 + (rng() % 100000) * 60) + "\n";
  }
  dir.Write("ml/ratings.csv", text);
}

// The training reader of one kind of data: rank 1 of 2, a validation hold-out, two epochs.
struct Kind {
  const char* name;
  uint32_t shuffle_buffer;
};

class FeedData {
 public:
  FeedData() {
    criteo_ = dir_.Write("criteo.tsv", CriteoText(3000, 1));
    libsvm_ = dir_.Write("train.libsvm", LibsvmText(3000));
    csv_ = dir_.Write("train.csv", CsvText(3000));
    WriteMovieLens(dir_, 4000);
  }
  DataSourceOptions Options(const std::string& kind) const {
    DataSourceOptions o;
    o.rank = 1;
    o.world = 2;
    o.epochs = 2;
    o.holdout_mod = 10;
    o.validation_mod = 7;
    if (kind == "synthetic") {
      o.spec = "synthetic";
      o.train_samples = 4000;
      o.synthetic.cardinalities = CriteoLikeCardinalities(500);
    } else if (kind == "criteo") {
      o.spec = "criteo:" + criteo_;
    } else if (kind == "libsvm") {
      o.spec = "libsvm:" + libsvm_;
    } else if (kind == "csv") {
      o.spec = "csv:" + csv_;
      o.schema = kCsvSchema;
    } else {
      o.spec = "movielens:" + dir_.path() + "/ml";
    }
    return o;
  }
  const TempDir& dir() const { return dir_; }

 private:
  TempDir dir_;
  std::string criteo_, libsvm_, csv_;
};

// What a reader hands over: its batches (with their index and position), then how it ends.
struct Stream {
  std::vector<ReadyBatch> batches;
  Status error;  // OK: the data ended
  uint64_t end_position = 0;
};

// Read + IndexBatch, as the trainer did before the feed; at most `limit` batches.
Stream ReadSequentially(DataReader* reader, uint32_t batch_size, size_t limit = SIZE_MAX) {
  Stream s;
  while (s.batches.size() < limit) {
    ReadyBatch r;
    r.batch.Clear(reader->schema());
    Result<uint32_t> n = reader->Read(batch_size, &r.batch);
    if (!n.ok()) {
      s.error = n.status();
      return s;
    }
    if (*n == 0) {
      s.end_position = reader->position();
      return s;
    }
    IndexBatch(r.batch, &r.index);
    r.position = reader->position();
    s.batches.push_back(std::move(r));
  }
  return s;
}

// The same through a BatchFeed, reusing one ReadyBatch as the trainer does.
Stream ReadThroughFeed(DataReader* reader, const FeedOptions& options, size_t limit = SIZE_MAX) {
  Stream s;
  auto feed = BatchFeed::Start(reader, options);
  EXPECT_TRUE(feed.ok()) << feed.status().ToString();
  if (!feed.ok()) return s;
  ReadyBatch r;
  while (s.batches.size() < limit) {
    Result<bool> more = (*feed)->Next(&r);
    if (!more.ok()) {
      s.error = more.status();
      // Final: the same error again.
      Result<bool> again = (*feed)->Next(&r);
      EXPECT_FALSE(again.ok());
      if (!again.ok()) {
        EXPECT_EQ(again.status(), s.error);
      }
      return s;
    }
    if (!*more) {
      s.end_position = r.position;
      EXPECT_EQ(r.batch.size, 0u);
      Result<bool> again = (*feed)->Next(&r);
      EXPECT_TRUE(again.ok() && !*again);
      return s;
    }
    s.batches.push_back(r);
  }
  return s;
}

// "" when equal, else the first difference.
std::string Diff(const ReadyBatch& a, const ReadyBatch& b) {
  const Batch &x = a.batch, &y = b.batch;
  if (x.size != y.size) return "size " + std::to_string(x.size) + " vs " + std::to_string(y.size);
  if (x.dense != y.dense) return "dense";
  if (x.labels != y.labels) return "labels";
  if (x.offsets != y.offsets) return "offsets";
  if (x.keys != y.keys) return "keys";
  if (x.weights != y.weights) return "weights";
  if (x.true_probs != y.true_probs) return "true_probs";
  if (a.index.unique_keys != b.index.unique_keys) return "unique_keys";
  if (a.index.rows != b.index.rows) return "rows";
  if (a.position != b.position) {
    return "position " + std::to_string(a.position) + " vs " + std::to_string(b.position);
  }
  return "";
}

void ExpectSameStream(const Stream& want, const Stream& got, const std::string& what) {
  ASSERT_EQ(want.batches.size(), got.batches.size()) << what;
  for (size_t i = 0; i < want.batches.size(); ++i) {
    ASSERT_EQ(Diff(want.batches[i], got.batches[i]), "") << what << ": batch " << i;
  }
  EXPECT_EQ(want.error, got.error) << what;
  EXPECT_EQ(want.end_position, got.end_position) << what;
}

std::unique_ptr<DataReader> Open(const DataSourceOptions& o) {
  auto r = OpenTrainData(o);
  EXPECT_TRUE(r.ok()) << o.spec << ": " << r.status().ToString();
  return r.ok() ? std::move(*r) : nullptr;
}

constexpr uint32_t kBatch = 97;  // batches cross the epochs' and the chunks' boundaries

class FeedKinds : public ::testing::TestWithParam<Kind> {
 protected:
  DataSourceOptions Options() const {
    DataSourceOptions o = data_.Options(GetParam().name);
    o.shuffle_buffer = GetParam().shuffle_buffer;
    return o;
  }
  FeedData data_;
};

TEST_P(FeedKinds, SameBatchesAsSequentialReadWithAnyThreadsAndDepth) {
  auto seq_reader = Open(Options());
  ASSERT_NE(seq_reader, nullptr);
  const Stream want = ReadSequentially(seq_reader.get(), kBatch);
  ASSERT_TRUE(want.error.ok()) << want.error.ToString();
  ASSERT_GT(want.batches.size(), 10u);
  for (uint32_t threads : {1u, 4u}) {
    for (uint32_t depth : {1u, 0u}) {
      auto reader = Open(Options());
      ASSERT_NE(reader, nullptr);
      const Stream got =
          ReadThroughFeed(reader.get(), {.batch_size = kBatch, .threads = threads, .depth = depth});
      ExpectSameStream(want, got,
                       std::string(GetParam().name) + " threads " + std::to_string(threads) +
                           " depth " + std::to_string(depth));
    }
  }
}

// A worker resumed at a position its feed handed over (Trainer::Init seeks there) continues
// with the batches that followed it.
TEST_P(FeedKinds, SeekToAFeedPositionContinuesWithTheNextBatches) {
  auto seq_reader = Open(Options());
  ASSERT_NE(seq_reader, nullptr);
  const Stream whole = ReadSequentially(seq_reader.get(), kBatch);
  ASSERT_TRUE(whole.error.ok());
  for (size_t done : {size_t{1}, size_t{7}, whole.batches.size() / 2 + 1}) {
    auto first = Open(Options());
    ASSERT_NE(first, nullptr);
    const Stream head = ReadThroughFeed(first.get(), {.batch_size = kBatch, .threads = 3}, done);
    ASSERT_EQ(head.batches.size(), done);
    const uint64_t position = head.batches.back().position;
    auto resumed = Open(Options());
    ASSERT_NE(resumed, nullptr);
    ASSERT_TRUE(resumed->Seek(position).ok());
    const Stream tail = ReadThroughFeed(resumed.get(), {.batch_size = kBatch, .threads = 3});
    Stream want;
    want.batches.assign(whole.batches.begin() + static_cast<std::ptrdiff_t>(done),
                        whole.batches.end());
    want.end_position = whole.end_position;
    ExpectSameStream(want, tail, "resumed after batch " + std::to_string(done));
  }
}

INSTANTIATE_TEST_SUITE_P(Readers, FeedKinds,
                         ::testing::Values(Kind{"synthetic", 0}, Kind{"criteo", 0},
                                           Kind{"libsvm", 0}, Kind{"csv", 0}, Kind{"movielens", 0},
                                           Kind{"criteo", 300}),
                         [](const ::testing::TestParamInfo<Kind>& info) {
                           return std::string(info.param.name) +
                                  (info.param.shuffle_buffer ? "Shuffled" : "");
                         });

// A malformed line (no skipping) fails the batch that holds it: the feed hands over the
// batches before it, then the same error as Read, then that error again.
TEST(Feed, ParseErrorComesInOrderAfterTheGoodBatches) {
  TempDir dir;
  std::string text = CriteoText(1000, 2);
  // Line 700 loses its label.
  size_t at = 0;
  for (int i = 0; i < 699; ++i) at = text.find('\n', at) + 1;
  text.insert(at, "x");
  const std::string path = dir.Write("bad.tsv", text);
  DataSourceOptions o;
  o.spec = "criteo:" + path;
  o.holdout_mod = 0;
  o.validation_mod = 0;
  auto seq = Open(o);
  ASSERT_NE(seq, nullptr);
  const Stream want = ReadSequentially(seq.get(), 64);
  ASSERT_EQ(want.error.code(), StatusCode::kCorruption);
  ASSERT_NE(want.error.message().find("bad.tsv:700:"), std::string::npos) << want.error.message();
  ASSERT_EQ(want.batches.size(), 10u);  // lines 1..640
  for (uint32_t threads : {1u, 4u}) {
    for (uint32_t depth : {1u, 2u, 0u}) {
      auto reader = Open(o);
      ASSERT_NE(reader, nullptr);
      ExpectSameStream(
          want,
          ReadThroughFeed(reader.get(), {.batch_size = 64, .threads = threads, .depth = depth}),
          "threads " + std::to_string(threads) + " depth " + std::to_string(depth));
    }
  }
}

// An error of the sequential part (a line over kMaxLineBytes) comes after the samples cut
// before it, and after a parse error of an earlier line in the same batch, as in Read.
TEST(Feed, LineTooLongComesAfterAnEarlierBadLineOfItsBatch) {
  TempDir dir;
  const std::string good = CriteoText(300, 3);
  std::vector<std::string> lines;
  for (size_t b = 0, e; (e = good.find('\n', b)) != std::string::npos; b = e + 1) {
    lines.push_back(good.substr(b, e - b));
  }
  const std::string long_line(kMaxLineBytes + 10, 'a');
  for (int variant = 0; variant < 4; ++variant) {
    const bool with_bad_line = variant % 2 == 1;
    // 3: FilterByIndex cuts its inner reader's chunks; 0: the Criteo reader alone.
    const uint32_t validation_mod = variant < 2 ? 3 : 0;
    std::string text;
    for (size_t i = 0; i < lines.size(); ++i) {
      if (i == 150) text += long_line + "\n";  // line 151
      text += (with_bad_line && i == 147 ? "2" + lines[i].substr(1) : lines[i]) + "\n";
    }
    const std::string path = dir.Write("long.tsv", text);
    DataSourceOptions o;
    o.spec = "criteo:" + path;
    o.holdout_mod = 0;
    o.validation_mod = validation_mod;
    auto seq = Open(o);
    ASSERT_NE(seq, nullptr);
    const Stream want = ReadSequentially(seq.get(), 32);
    ASSERT_FALSE(want.error.ok());
    ASSERT_NE(want.error.message().find(with_bad_line ? "long.tsv:148:" : "long.tsv:151"),
              std::string::npos)
        << want.error.message();
    for (uint32_t threads : {1u, 4u}) {
      auto reader = Open(o);
      ASSERT_NE(reader, nullptr);
      ExpectSameStream(want, ReadThroughFeed(reader.get(), {.batch_size = 32, .threads = threads}),
                       std::string(with_bad_line ? "bad line first" : "long line") +
                           " validation_mod " + std::to_string(validation_mod) + " threads " +
                           std::to_string(threads));
    }
  }
}

// A malformed line that the validation hold-out drops, last in the file: Read parses it (and
// fails) before the next epoch; so does the feed, whatever the batch size.
TEST(Feed, MalformedHeldOutLastLineFailsAsInRead) {
  TempDir dir;
  std::string text = CriteoText(299, 6);
  text += "not a criteo line\n";  // line 300: sample 299, held out (299 % 3 == 2)
  const std::string path = dir.Write("last.tsv", text);
  DataSourceOptions o;
  o.spec = "criteo:" + path;
  o.holdout_mod = 0;
  o.validation_mod = 3;
  o.epochs = 2;
  for (uint32_t batch : {10u, 7u, 200u}) {
    auto seq = Open(o);
    ASSERT_NE(seq, nullptr);
    const Stream want = ReadSequentially(seq.get(), batch);
    ASSERT_NE(want.error.message().find("last.tsv:300:"), std::string::npos)
        << want.error.ToString();
    for (uint32_t threads : {1u, 3u}) {
      auto reader = Open(o);
      ASSERT_NE(reader, nullptr);
      ExpectSameStream(want,
                       ReadThroughFeed(reader.get(), {.batch_size = batch, .threads = threads}),
                       "batch " + std::to_string(batch) + " threads " + std::to_string(threads));
    }
  }
}

// CSV with skip_bad_lines: the same batches and the same skipped lines as sequential reading.
TEST(Feed, CsvSkippedLinesAreCountedAsInRead) {
  TempDir dir;
  std::string text = CsvText(2000);
  std::string bad;
  size_t line = 1, b = 0;
  for (size_t e; (e = text.find('\n', b)) != std::string::npos; b = e + 1, ++line) {
    std::string l = text.substr(b, e - b + 1);
    if (line > 1 && line % 37 == 0) l = "1,2,three\n";     // too few columns
    if (line > 1 && line % 101 == 0) l = "x,2,s1,a1,3\n";  // label not a number
    bad += l;
  }
  const std::string path = dir.Write("skip.csv", bad);
  for (uint32_t world : {1u, 2u}) {  // 2: sharded by sample after parsing (a ShardReader)
    SkippedLines seq_skipped, feed_skipped;
    DataSourceOptions o;
    o.spec = "csv:" + path;
    o.schema = kCsvSchema;
    o.skip_bad_lines = true;
    o.world = world;
    o.rank = world - 1;
    o.epochs = 2;
    o.skipped_lines = &seq_skipped;
    auto seq = Open(o);
    ASSERT_NE(seq, nullptr);
    const Stream want = ReadSequentially(seq.get(), 50);
    ASSERT_TRUE(want.error.ok()) << want.error.ToString();
    o.skipped_lines = &feed_skipped;
    auto reader = Open(o);
    ASSERT_NE(reader, nullptr);
    ExpectSameStream(want, ReadThroughFeed(reader.get(), {.batch_size = 50, .threads = 4}),
                     "world " + std::to_string(world));
    EXPECT_GT(seq_skipped.count(), 50u);
    EXPECT_EQ(feed_skipped.count(), seq_skipped.count());
    EXPECT_EQ(feed_skipped.first_error(), seq_skipped.first_error());
  }
}

// A chunk is parsed on another thread after its reader moved on (rewound, even), and gives
// the samples Read gives.
TEST(Feed, ChunksParseOnOtherThreadsAfterTheReaderMovedOn) {
  TempDir dir;
  const std::string path = dir.Write("c.tsv", CriteoText(500, 4));
  auto seq = OpenCriteo(path, {});
  ASSERT_TRUE(seq.ok());
  auto reader = OpenCriteo(path, {});
  ASSERT_TRUE(reader.ok());
  std::vector<std::unique_ptr<DataChunk>> chunks;
  std::vector<uint64_t> positions;
  for (int i = 0; i < 6; ++i) {
    auto c = (*reader)->ReadChunk(90);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    positions.push_back((*reader)->position());
    chunks.push_back(std::move(*c));
  }
  EXPECT_EQ(chunks.back()->size(), 500u - 5 * 90);
  ASSERT_TRUE((*reader)->Rewind().ok());
  std::vector<Batch> parsed(chunks.size());
  std::vector<Status> status(chunks.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < chunks.size(); ++i) {
    threads.emplace_back([&, i] {
      parsed[i].Clear((*reader)->schema());
      status[i] = chunks[i]->Parse(&parsed[i]);
    });
  }
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < chunks.size(); ++i) {
    ASSERT_TRUE(status[i].ok()) << status[i].ToString();
    ReadyBatch want, got;
    want.batch.Clear((*seq)->schema());
    ASSERT_TRUE((*seq)->Read(90, &want.batch).ok());
    want.position = (*seq)->position();
    got.batch = parsed[i];
    got.position = positions[i];
    EXPECT_EQ(Diff(want, got), "") << "chunk " << i;
  }
}

// The destructor stops and joins the threads while they wait for room in a full queue, while
// they make batches, and before any batch was taken.
TEST(Feed, DestroyingAFeedWithAFullQueueReturns) {
  SyntheticOptions s;
  s.cardinalities = CriteoLikeCardinalities(1000);  // num_samples 0: endless
  auto reader = SyntheticReader::Create(s);
  ASSERT_TRUE(reader.ok());
  {
    auto feed = BatchFeed::Start(reader->get(), {.batch_size = 256, .threads = 4, .depth = 3});
    ASSERT_TRUE(feed.ok());
    ReadyBatch r;
    ASSERT_TRUE((*feed)->Next(&r).ok());
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while ((*feed)->queued() < 3 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    ASSERT_EQ((*feed)->queued(), 3u);  // full: every thread waits for room
  }
  for (int i = 0; i < 20; ++i) {
    auto feed = BatchFeed::Start(reader->get(), {.batch_size = 64, .threads = 4, .depth = 2});
    ASSERT_TRUE(feed.ok());
  }
}

TEST(Feed, StartRefusesBadOptionsAndDefaultsFromTheCores) {
  SyntheticOptions s;
  s.num_samples = 10;
  auto reader = SyntheticReader::Create(s);
  ASSERT_TRUE(reader.ok());
  EXPECT_EQ(BatchFeed::Start(nullptr, {}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(BatchFeed::Start(reader->get(), {.batch_size = 0}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(BatchFeed::Start(reader->get(), {.threads = kMaxDataThreads + 1}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(BatchFeed::Start(reader->get(), {.depth = kMaxFeedDepth + 1}).status().code(),
            StatusCode::kInvalidArgument);
  auto feed = BatchFeed::Start(reader->get(), {.batch_size = 4});
  ASSERT_TRUE(feed.ok());
  EXPECT_EQ((*feed)->threads(), DefaultDataThreads());
  EXPECT_EQ((*feed)->depth(), 2 * DefaultDataThreads() + 2);
  const uint32_t cores = std::max(1u, std::thread::hardware_concurrency());
  EXPECT_GE(DefaultDataThreads(), 1u);
  EXPECT_LE(DefaultDataThreads(), std::min(8u, std::max(1u, cores - 1)));
  EXPECT_EQ(DefaultDataThreads(100000), 1u);
  EXPECT_EQ(DefaultDataThreads(0), DefaultDataThreads(1));
}

// --data_threads over the bound is the options' fault (tessera-worker exits 2), found before
// the job connects anywhere (no server runs at the address).
TEST(Feed, RunJobRefusesDataThreadsOverTheBound) {
  JobOptions o;
  o.servers = {"tcp://127.0.0.1:9"};
  o.data_threads = kMaxDataThreads + 1;
  o.request_timeout_ms = 2000;
  o.retry_for_ms = 0;
  std::FILE* sink = std::tmpfile();
  ASSERT_NE(sink, nullptr);
  o.out = sink;
  bool options_error = false;
  auto r = RunJob(o, &options_error);
  std::fclose(sink);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("--data_threads=257 is over the bound 256"),
            std::string::npos)
      << r.status().ToString();
  EXPECT_TRUE(options_error);
}

// Training with 1 and 4 data threads: bit-identical losses and parameters (one worker, the
// store in local memory, bulk-synchronous so no pull races a push).
struct Trained {
  TrainResult result;
  std::vector<float> params, emb, wide;
};

Trained TrainWithDataThreads(const DataSourceOptions& data, uint32_t data_threads) {
  Trained t;
  auto reader = Open(data);
  EXPECT_NE(reader, nullptr);
  if (reader == nullptr) return t;
  ModelConfig c;
  c.num_dense = reader->schema().num_dense;
  c.num_fields = reader->schema().num_fields;
  c.embedding_dim = 4;
  c.bottom_mlp = {8};
  c.top_mlp = {8};
  auto layout = ModelLayout::Create(c);
  EXPECT_TRUE(layout.ok()) << layout.status().ToString();
  auto store = CreateLocalStore();
  auto backend = CreateCpuBackend(*layout, {1});
  EXPECT_TRUE(backend.ok());
  TrainerOptions o;
  o.batch_size = 64;
  o.staleness = 0;
  o.resume = false;
  o.progress_interval_s = 0;
  o.data_threads = data_threads;
  auto trainer = Trainer::Create(o, *layout, store.get(), backend->get(), reader.get());
  EXPECT_TRUE(trainer.ok()) << trainer.status().ToString();
  EXPECT_TRUE((*trainer)->Init().ok());
  auto r = (*trainer)->Train();
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  if (!r.ok()) return t;
  t.result = *r;
  // Every parameter: the dense tables, and the rows of every key of the data.
  t.params.resize(layout->num_params());
  for (const auto& d : layout->dense_tables()) {
    auto id = store->AddTable(d.spec);
    EXPECT_TRUE(id.ok());
    EXPECT_TRUE(store->DensePull(*id, 0, d.spec.length, t.params.data() + d.offset).Wait().ok());
  }
  auto all = Open(data);
  Batch b;
  b.Clear(all->schema());
  EXPECT_TRUE(ReadAll(all.get(), &b).ok());
  IndexedBatch ib;
  IndexBatch(b, &ib);
  auto emb = store->AddTable(layout->embedding_table());
  auto wide = store->AddTable(layout->wide_table());
  EXPECT_TRUE(emb.ok() && wide.ok());
  t.emb.resize(ib.unique_keys.size() * c.embedding_dim);
  t.wide.resize(ib.unique_keys.size());
  EXPECT_TRUE(store->Pull(*emb, ib.unique_keys, t.emb.data()).Wait().ok());
  EXPECT_TRUE(store->Pull(*wide, ib.unique_keys, t.wide.data()).Wait().ok());
  return t;
}

TEST(FeedTraining, SameResultWithOneAndFourDataThreads) {
  FeedData data;
  for (const char* kind : {"synthetic", "criteo"}) {
    DataSourceOptions o = data.Options(kind);
    const Trained one = TrainWithDataThreads(o, 1);
    const Trained four = TrainWithDataThreads(o, 4);
    ASSERT_GT(one.result.steps, 20u) << kind;
    EXPECT_EQ(one.result.steps, four.result.steps) << kind;
    EXPECT_EQ(one.result.samples, four.result.samples) << kind;
    EXPECT_EQ(one.result.train_loss, four.result.train_loss) << kind;  // bit for bit
    EXPECT_TRUE(one.params == four.params) << kind << ": dense parameters differ";
    EXPECT_TRUE(one.emb == four.emb) << kind << ": embeddings differ";
    EXPECT_TRUE(one.wide == four.wide) << kind << ": wide weights differ";
  }
}

}  // namespace
}  // namespace tessera::worker
