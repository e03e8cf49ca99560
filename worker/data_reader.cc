#include "worker/data_reader.h"

#include <algorithm>

namespace tessera::worker {
namespace {

// The default chunk: samples read already, handed over by Parse.
class ReadBatchChunk final : public DataChunk {
 public:
  explicit ReadBatchChunk(Batch samples) : size_(samples.size), samples_(std::move(samples)) {}
  uint32_t size() const override { return size_; }
  Status Parse(Batch* batch) override {
    if (batch->size == 0) {
      std::swap(*batch, samples_);  // the usual case: no copy
    } else {
      batch->Append(samples_);
    }
    return Status::OK();
  }

 private:
  const uint32_t size_;
  Batch samples_;
};

class Generated final : public DataChunk {
 public:
  Generated(uint32_t count, std::function<void(uint32_t, Batch*)> generate)
      : count_(count), generate_(std::move(generate)) {}
  uint32_t size() const override { return count_; }
  Status Parse(Batch* batch) override {
    for (uint32_t i = 0; i < count_; ++i) generate_(i, batch);
    return Status::OK();
  }

 private:
  const uint32_t count_;
  std::function<void(uint32_t, Batch*)> generate_;
};

// The chunks a wrapper cut from its inner reader, in order; of each, all samples or those at
// the listed indexes (FilterByIndex). An error met while cutting after some chunks were cut
// comes after their samples (and their errors).
class ChunkList final : public DataChunk {
 public:
  explicit ChunkList(const Schema& schema) : schema_(schema) {}
  void Add(std::unique_ptr<DataChunk> chunk) {
    size_ += chunk->size();
    parts_.push_back({std::move(chunk), false, {}});
  }
  void AddSome(std::unique_ptr<DataChunk> chunk, std::vector<uint32_t> keep) {
    size_ += static_cast<uint32_t>(keep.size());
    parts_.push_back({std::move(chunk), true, std::move(keep)});
  }
  void Defer(Status error) { deferred_ = std::move(error); }
  bool empty() const { return parts_.empty(); }
  uint32_t size() const override { return size_; }
  Status Parse(Batch* batch) override {
    for (Part& p : parts_) {
      if (!p.filtered) {
        TESSERA_RETURN_IF_ERROR(p.chunk->Parse(batch));
        continue;
      }
      scratch_.Clear(schema_);
      TESSERA_RETURN_IF_ERROR(p.chunk->Parse(&scratch_));
      if (scratch_.size != p.chunk->size()) {
        return Status::Internal("a chunk of " + std::to_string(p.chunk->size()) +
                                " samples parsed into " + std::to_string(scratch_.size));
      }
      for (uint32_t i : p.keep) batch->AppendSample(scratch_, i);
    }
    return deferred_;
  }

 private:
  struct Part {
    std::unique_ptr<DataChunk> chunk;
    bool filtered;
    std::vector<uint32_t> keep;  // with `filtered`: the samples kept, ascending
  };
  const Schema schema_;
  std::vector<Part> parts_;
  uint32_t size_ = 0;
  Status deferred_;
  Batch scratch_;
};

// An error while cutting `list`: returned at once when nothing was cut, else deferred.
Result<std::unique_ptr<DataChunk>> CutFailed(std::unique_ptr<ChunkList> list, Status error) {
  if (list->empty()) return error;
  list->Defer(std::move(error));
  return std::unique_ptr<DataChunk>(std::move(list));
}

}  // namespace

Result<std::unique_ptr<DataChunk>> DataReader::ReadChunk(uint32_t max_samples) {
  Batch samples;
  samples.Clear(schema());
  TESSERA_RETURN_IF_ERROR(Read(max_samples, &samples).status());
  return std::unique_ptr<DataChunk>(new ReadBatchChunk(std::move(samples)));
}

std::unique_ptr<DataChunk> GeneratorChunk(uint32_t count,
                                          std::function<void(uint32_t, Batch*)> generate) {
  return std::make_unique<Generated>(count, std::move(generate));
}

Status DataReader::Seek(uint64_t position) {
  TESSERA_RETURN_IF_ERROR(Rewind());
  Batch scratch;
  while (this->position() < position) {
    scratch.Clear(schema());
    const uint64_t want = std::min<uint64_t>(position - this->position(), 4096);
    TESSERA_ASSIGN_OR_RETURN(uint32_t n, Read(static_cast<uint32_t>(want), &scratch));
    if (n == 0) {
      return Status::InvalidArgument("seek to sample " + std::to_string(position) +
                                     " past the end of the data (" +
                                     std::to_string(this->position()) + " samples)");
    }
  }
  return Status::OK();
}

Result<std::unique_ptr<ShardedLineReader>> ShardedLineReader::Open(const std::string& path,
                                                                   const ShardOptions& options,
                                                                   bool skip_header) {
  if (options.world == 0 || options.rank >= options.world) {
    return Status::InvalidArgument("rank " + std::to_string(options.rank) + " not in [0, " +
                                   std::to_string(options.world) + ")");
  }
  if (options.holdout_mod == 1) {
    return Status::InvalidArgument("holdout_mod 1 would hold out every line");
  }
  std::unique_ptr<ShardedLineReader> r(new ShardedLineReader(path, options, skip_header));
  TESSERA_RETURN_IF_ERROR(r->Rewind());
  return r;
}

Status ShardedLineReader::Rewind() {
  in_.close();
  in_.clear();
  in_.open(path_, std::ios::in | std::ios::binary);
  if (!in_.is_open()) return Status::NotFound("cannot open " + path_);
  line_number_ = 0;
  data_line_ = 0;
  part_line_ = 0;
  return Status::OK();
}

bool ShardedLineReader::Selected(uint64_t data_line) {
  const uint32_t mod = options_.holdout_mod;
  const bool test = mod > 1 && data_line % mod == mod - 1;
  switch (options_.part) {
    case ShardOptions::Part::kTrain:
      if (test) return false;
      break;
    case ShardOptions::Part::kTest:
      if (!test) return false;
      break;
    case ShardOptions::Part::kAll:
      break;
  }
  return part_line_++ % options_.world == options_.rank;
}

Result<bool> GetBoundedLine(std::istream& in, std::string* line, size_t max_bytes) {
  line->clear();
  char buf[4096];
  for (;;) {
    in.getline(buf, sizeof(buf));
    const size_t got = static_cast<size_t>(in.gcount());
    if (in.bad()) return Status::IOError("read error");
    if (in.eof()) {  // the last line, without a line break, or nothing
      line->append(buf, got);
      if (line->empty()) return false;
    } else if (!in.fail()) {  // the line break was read (and counted in gcount)
      line->append(buf, got - 1);
    } else {  // the buffer filled before a line break: the line goes on
      line->append(buf, got);
      in.clear();
      if (line->size() <= max_bytes) continue;
    }
    if (line->size() > max_bytes) {
      line->clear();
      return Status::InvalidArgument("a line of more than " + std::to_string(max_bytes) +
                                     " bytes (the readers' line-length bound)");
    }
    return true;
  }
}

Result<bool> ShardedLineReader::Next(std::string* line) {
  for (;;) {
    Result<bool> got = GetBoundedLine(in_, line);
    if (!got.ok()) return got.status().WithContext(path_ + ":" + std::to_string(line_number_ + 1));
    if (!*got) return false;
    ++line_number_;
    if (skip_header_ && line_number_ == 1) continue;
    if (!line->empty() && line->back() == '\r') line->pop_back();
    if (line->empty()) continue;
    if (Selected(data_line_++)) return true;
  }
}

Result<uint32_t> EpochReader::Read(uint32_t max_samples, Batch* batch) {
  uint32_t total = 0;
  while (total < max_samples) {
    TESSERA_ASSIGN_OR_RETURN(uint32_t n, inner_->Read(max_samples - total, batch));
    total += n;
    if (n == 0) {
      if (epochs_ != 0 && epoch_ + 1 >= epochs_) break;
      if (inner_->position() == 0) break;  // empty data: do not spin
      ++epoch_;
      TESSERA_RETURN_IF_ERROR(inner_->Rewind());
    }
  }
  position_ += total;
  return total;
}

// As Read, chunk by chunk.
Result<std::unique_ptr<DataChunk>> EpochReader::ReadChunk(uint32_t max_samples) {
  auto list = std::make_unique<ChunkList>(schema());
  uint32_t total = 0;
  while (total < max_samples) {
    Result<std::unique_ptr<DataChunk>> chunk = inner_->ReadChunk(max_samples - total);
    if (!chunk.ok()) return CutFailed(std::move(list), chunk.status());
    const uint32_t n = (*chunk)->size();
    // Kept even when empty: its parse may still fail (a FilterByIndex chunk whose samples
    // were all dropped), as Read would.
    list->Add(std::move(*chunk));
    if (n > 0) {
      total += n;
      continue;
    }
    if (epochs_ != 0 && epoch_ + 1 >= epochs_) break;
    if (inner_->position() == 0) break;  // empty data: do not spin
    ++epoch_;
    if (Status s = inner_->Rewind(); !s.ok()) return CutFailed(std::move(list), s);
  }
  position_ += total;
  return std::unique_ptr<DataChunk>(std::move(list));
}

Status EpochReader::Rewind() {
  epoch_ = 0;
  position_ = 0;
  return inner_->Rewind();
}

ShuffleReader::ShuffleReader(std::unique_ptr<DataReader> inner, uint32_t buffer_size, uint64_t seed)
    : inner_(std::move(inner)),
      buffer_size_(std::max<uint32_t>(buffer_size, 1)),
      seed_(seed),
      rng_(seed) {
  pool_.Clear(inner_->schema());
}

Status ShuffleReader::Rewind() {
  TESSERA_RETURN_IF_ERROR(inner_->Rewind());
  rng_.seed(seed_);
  pool_.Clear(inner_->schema());
  live_.clear();
  inner_done_ = false;
  position_ = 0;
  return Status::OK();
}

Status ShuffleReader::Fill() {
  while (!inner_done_ && live_.size() < buffer_size_) {
    const uint32_t before = pool_.size;
    TESSERA_ASSIGN_OR_RETURN(
        uint32_t n,
        inner_->Read(std::min<uint32_t>(buffer_size_ - static_cast<uint32_t>(live_.size()), 4096),
                     &pool_));
    if (n == 0) inner_done_ = true;
    for (uint32_t i = before; i < pool_.size; ++i) live_.push_back(i);
  }
  return Status::OK();
}

void ShuffleReader::Compact() {
  Batch fresh;
  fresh.Clear(pool_.schema);
  std::vector<uint32_t> live;
  live.reserve(live_.size());
  for (uint32_t idx : live_) {
    live.push_back(fresh.size);
    fresh.AppendSample(pool_, idx);
  }
  pool_ = std::move(fresh);
  live_ = std::move(live);
}

Result<uint32_t> ShuffleReader::Read(uint32_t max_samples, Batch* batch) {
  uint32_t n = 0;
  while (n < max_samples) {
    TESSERA_RETURN_IF_ERROR(Fill());
    if (live_.empty()) break;
    std::uniform_int_distribution<size_t> pick(0, live_.size() - 1);
    const size_t i = pick(rng_);
    batch->AppendSample(pool_, live_[i]);
    live_[i] = live_.back();
    live_.pop_back();
    ++n;
    if (pool_.size > 4 * buffer_size_ + 4096) Compact();
  }
  position_ += n;
  return n;
}

namespace {
// Keeps the samples of another reader whose index (0-based, in the inner reader's order) a
// predicate accepts.
class IndexFilterReader final : public DataReader {
 public:
  IndexFilterReader(std::unique_ptr<DataReader> inner, std::function<bool(uint64_t)> keep)
      : inner_(std::move(inner)), keep_(std::move(keep)) {
    scratch_.Clear(inner_->schema());
  }
  const Schema& schema() const override { return inner_->schema(); }
  Status Rewind() override {
    seen_ = 0;
    position_ = 0;
    return inner_->Rewind();
  }
  uint64_t position() const override { return position_; }
  Result<uint32_t> Read(uint32_t max_samples, Batch* batch) override {
    uint32_t n = 0;
    while (n < max_samples) {
      scratch_.Clear(inner_->schema());
      TESSERA_ASSIGN_OR_RETURN(uint32_t got, inner_->Read(1, &scratch_));
      if (got == 0) break;
      if (!keep_(seen_++)) continue;
      batch->AppendSample(scratch_, 0);
      ++n;
    }
    position_ += n;
    return n;
  }
  // As Read: the inner samples up to the max_samples-th kept one, cut as chunks of the inner
  // reader; the parse keeps the samples `keep_` accepted here (all are parsed, as Read does).
  Result<std::unique_ptr<DataChunk>> ReadChunk(uint32_t max_samples) override {
    auto list = std::make_unique<ChunkList>(schema());
    uint32_t n = 0;
    while (n < max_samples) {
      // The inner samples that hold the next max_samples - n kept ones.
      // (At most 8 times max_samples + 1024 at once: a predicate that keeps few samples takes
      // several rounds rather than one huge chunk.)
      const uint64_t bound = uint64_t{max_samples} * 8 + 1024;
      uint64_t want = 0;
      for (uint32_t kept = 0; kept < max_samples - n && want < bound; ++want) {
        if (keep_(seen_ + want)) ++kept;
      }
      Result<std::unique_ptr<DataChunk>> chunk = inner_->ReadChunk(static_cast<uint32_t>(want));
      if (!chunk.ok()) return CutFailed(std::move(list), chunk.status());
      const uint32_t got = (*chunk)->size();
      std::vector<uint32_t> keep;
      for (uint32_t i = 0; i < got; ++i) {
        if (keep_(seen_++)) keep.push_back(i);
      }
      n += static_cast<uint32_t>(keep.size());
      // Parsed even when nothing is kept (or it is empty): its errors are Read's.
      list->AddSome(std::move(*chunk), std::move(keep));
      if (got == 0) break;
    }
    position_ += n;
    return std::unique_ptr<DataChunk>(std::move(list));
  }

 private:
  std::unique_ptr<DataReader> inner_;
  std::function<bool(uint64_t)> keep_;
  Batch scratch_;
  uint64_t seen_ = 0;
  uint64_t position_ = 0;
};

class BatchReader final : public DataReader {
 public:
  explicit BatchReader(Batch samples) : samples_(std::move(samples)) {}
  const Schema& schema() const override { return samples_.schema; }
  Status Rewind() override {
    position_ = 0;
    return Status::OK();
  }
  Status Seek(uint64_t position) override {
    if (position > samples_.size) return Status::InvalidArgument("seek past the end");
    position_ = static_cast<uint32_t>(position);
    return Status::OK();
  }
  uint64_t position() const override { return position_; }
  Result<uint32_t> Read(uint32_t max_samples, Batch* batch) override {
    const uint32_t n = std::min(max_samples, samples_.size - position_);
    for (uint32_t i = 0; i < n; ++i) batch->AppendSample(samples_, position_ + i);
    position_ += n;
    return n;
  }

 private:
  Batch samples_;
  uint32_t position_ = 0;
};
}  // namespace

std::unique_ptr<DataReader> FilterByIndex(std::unique_ptr<DataReader> inner,
                                          std::function<bool(uint64_t)> keep) {
  return std::make_unique<IndexFilterReader>(std::move(inner), std::move(keep));
}

std::unique_ptr<DataReader> ShardReader(std::unique_ptr<DataReader> inner, uint32_t rank,
                                        uint32_t world) {
  world = std::max<uint32_t>(world, 1);
  return FilterByIndex(std::move(inner), [rank, world](uint64_t i) { return i % world == rank; });
}

std::unique_ptr<DataReader> InMemoryReader(Batch samples) {
  return std::make_unique<BatchReader>(std::move(samples));
}

Status ReadAll(DataReader* reader, Batch* out) {
  while (true) {
    TESSERA_ASSIGN_OR_RETURN(uint32_t n, reader->Read(1u << 16, out));
    if (n == 0) return Status::OK();
  }
}

}  // namespace tessera::worker
