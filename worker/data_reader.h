// Streaming data readers: the interface and the generic wrappers (epochs, shuffle buffer).
#pragma once

#include <cstdint>
#include <fstream>
#include <istream>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "ps/status.h"
#include "worker/batch.h"

namespace tessera::worker {

/// Samples cut off a reader's stream but not yet made: raw lines to parse, indexes to
/// generate, or (by default) samples already read. ReadChunk cuts it on the reading thread;
/// Parse may then run on any thread while the reader goes on (even past Rewind or Seek): a
/// chunk holds what it needs and refers to no state of the reader that reading changes (only
/// to its fixed parts: a chunk must not outlive its reader). Not thread-safe: one thread
/// parses it, once.
class DataChunk {
 public:
  virtual ~DataChunk() = default;
  /// Samples that Parse appends when it succeeds.
  virtual uint32_t size() const = 0;
  /// Appends the chunk's samples, in order, to `batch` (whose schema must be the reader's).
  /// The errors are those Read would have returned for these samples (Corruption naming the
  /// file and line, ...), in the same order; `batch` is then partly filled.
  virtual Status Parse(Batch* batch) = 0;
};

/// A stream of samples. Readers never load a whole file: they read as they are asked.
/// Not thread-safe: one thread reads.
class DataReader {
 public:
  virtual ~DataReader() = default;
  virtual const Schema& schema() const = 0;
  /// Appends up to `max_samples` samples to `batch` (whose schema must be schema()); returns
  /// how many were appended. 0 means the end of the data. Parse errors fail with Corruption
  /// naming the file and line.
  virtual Result<uint32_t> Read(uint32_t max_samples, Batch* batch) = 0;
  /// The samples that Read(max_samples) would append, as a chunk whose Parse makes them on any
  /// thread (the data pipeline's parallel part, worker/feed.h): afterwards position() is what
  /// it would be after that Read, and a chunk of size 0 means the end of the data. An error of
  /// the sequential part (a file that cannot be read, a line over kMaxLineBytes) comes back
  /// here, or from the chunk's Parse after the samples before it when some were cut; after
  /// one, ReadChunk keeps failing until Rewind or Seek. The default Reads here and the chunk
  /// hands the batch over; SyntheticReader, the Criteo, libSVM and CSV readers (not CSV with
  /// skip_bad_lines, whose sample count is only known once parsed), EpochReader and
  /// FilterByIndex / ShardReader over them cut and leave the work to Parse. ShuffleReader,
  /// MovieLens (whose lines may belong to another part) and InMemoryReader use the default.
  virtual Result<std::unique_ptr<DataChunk>> ReadChunk(uint32_t max_samples);
  /// Starts over at the first sample.
  virtual Status Rewind() = 0;
  /// Samples returned since the start (or the last Rewind).
  virtual uint64_t position() const = 0;
  /// Moves to `position` samples from the start (a restarted worker resumes here). The default
  /// rewinds and reads; readers that can jump do.
  virtual Status Seek(uint64_t position);
};

/// Which lines of a line-oriented file a reader returns: every holdout_mod-th line (the last of
/// each group of holdout_mod) is held out for testing, the others are training lines; the
/// selected lines are then dealt round-robin to `world` readers.
struct ShardOptions {
  /// This reader's index in [0, world). Default: 0.
  uint32_t rank = 0;
  /// Number of readers sharing the data. Default: 1.
  uint32_t world = 1;
  /// 0: no held-out part. N > 1: line i is a test line iff i % N == N - 1. Default: 0.
  uint32_t holdout_mod = 0;
  enum class Part { kAll, kTrain, kTest };
  /// Which part to return. Default: all lines.
  Part part = Part::kAll;
};

/// Reads the lines of a text file that ShardOptions select, streaming. Not thread-safe.
/// The longest line the line-oriented readers take: 1 MiB, far above any sample's line (a
/// Criteo line is about 200 bytes). A longer one, or a file without line breaks such as
/// /dev/zero, is an error naming the file and line, never read into memory without end.
inline constexpr size_t kMaxLineBytes = size_t{1} << 20;

/// The next line of `in` (its '\n' dropped) into *line: true, or false at the end of the
/// stream. A line of more than `max_bytes` is InvalidArgument "a line of more than N bytes"
/// (the caller adds the file and line), after reading at most `max_bytes` + 4 KiB of it.
Result<bool> GetBoundedLine(std::istream& in, std::string* line,
                            size_t max_bytes = kMaxLineBytes);

class ShardedLineReader {
 public:
  /// `skip_header`: the first line is a header and never data.
  static Result<std::unique_ptr<ShardedLineReader>> Open(const std::string& path,
                                                         const ShardOptions& options,
                                                         bool skip_header);
  /// The next selected line; false at the end of the file. InvalidArgument "PATH:LINE: ..."
  /// for a line over kMaxLineBytes.
  Result<bool> Next(std::string* line);
  /// 1-based line number of the last line returned (for error messages).
  uint64_t line_number() const { return line_number_; }
  const std::string& path() const { return path_; }
  Status Rewind();

 private:
  ShardedLineReader(std::string path, ShardOptions options, bool skip_header)
      : path_(std::move(path)), options_(options), skip_header_(skip_header) {}
  bool Selected(uint64_t data_line);

  std::string path_;
  ShardOptions options_;
  bool skip_header_;
  std::ifstream in_;
  uint64_t line_number_ = 0;
  uint64_t data_line_ = 0;  // index among data lines
  uint64_t part_line_ = 0;  // index among lines of the selected part
};

/// Repeats another reader `epochs` times (0: forever). position() counts every epoch.
class EpochReader final : public DataReader {
 public:
  EpochReader(std::unique_ptr<DataReader> inner, uint32_t epochs)
      : inner_(std::move(inner)), epochs_(epochs) {}
  const Schema& schema() const override { return inner_->schema(); }
  Result<uint32_t> Read(uint32_t max_samples, Batch* batch) override;
  /// The inner reader's chunks, across epochs.
  Result<std::unique_ptr<DataChunk>> ReadChunk(uint32_t max_samples) override;
  Status Rewind() override;
  uint64_t position() const override { return position_; }
  /// The epoch being read (0-based).
  uint32_t epoch() const { return epoch_; }

 private:
  std::unique_ptr<DataReader> inner_;
  uint32_t epochs_;
  uint32_t epoch_ = 0;
  uint64_t position_ = 0;
};

/// Shuffles a stream with a buffer of `buffer_size` samples (deterministic by seed): each
/// returned sample is drawn at random from the buffer, which is refilled from the inner reader.
class ShuffleReader final : public DataReader {
 public:
  ShuffleReader(std::unique_ptr<DataReader> inner, uint32_t buffer_size, uint64_t seed);
  const Schema& schema() const override { return inner_->schema(); }
  Result<uint32_t> Read(uint32_t max_samples, Batch* batch) override;
  Status Rewind() override;
  uint64_t position() const override { return position_; }

 private:
  Status Fill();
  void Compact();

  std::unique_ptr<DataReader> inner_;
  uint32_t buffer_size_;
  uint64_t seed_;
  std::mt19937_64 rng_;
  Batch pool_;
  std::vector<uint32_t> live_;
  bool inner_done_ = false;
  uint64_t position_ = 0;
};

/// A chunk of `count` samples that `generate(i, batch)` appends one by one (i = 0 .. count - 1,
/// in order; each call appends sample i, batch->size included). `generate` runs on the thread
/// that parses the chunk: it must be thread-safe and outlive the chunk.
std::unique_ptr<DataChunk> GeneratorChunk(uint32_t count,
                                          std::function<void(uint32_t, Batch*)> generate);

/// Keeps every `world`-th sample of another reader, starting at `rank` (for sources that cannot
/// deal their lines themselves). position() counts the samples kept.
std::unique_ptr<DataReader> ShardReader(std::unique_ptr<DataReader> inner, uint32_t rank,
                                        uint32_t world);

/// Keeps the samples of `inner` whose 0-based index in `inner`'s order `keep` accepts.
/// position() counts the samples kept. ShardReader is this with `i % world == rank`.
std::unique_ptr<DataReader> FilterByIndex(std::unique_ptr<DataReader> inner,
                                          std::function<bool(uint64_t)> keep);

/// The samples of `samples` (held in memory), in order; Seek jumps.
std::unique_ptr<DataReader> InMemoryReader(Batch samples);

/// Reads every remaining sample of `reader` into `out` (for small test sets).
Status ReadAll(DataReader* reader, Batch* out);

}  // namespace tessera::worker
