// The frame and the parsing helpers that the line-oriented readers (readers.cc, csv_reader.cc)
// share. Internal: use the Open* functions of readers.h and csv_reader.h.
#pragma once

#include <charconv>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "ps/status.h"
#include "worker/data_reader.h"

namespace tessera::worker::internal {

/// Corruption "PATH:LINE: what".
inline Status ParseError(const std::string& path, uint64_t line_no, std::string_view what) {
  return Status::Corruption(path + ":" + std::to_string(line_no) + ": " + std::string(what));
}

/// GetBoundedLine (kMaxLineBytes), its error naming `path` and `line_no` ("PATH:LINE: ...").
inline Result<bool> NextLineOf(std::istream& in, const std::string& path, uint64_t line_no,
                               std::string* line) {
  Result<bool> r = GetBoundedLine(in, line);
  if (!r.ok()) return r.status().WithContext(path + ":" + std::to_string(line_no));
  return r;
}

/// Splits `s` on `sep` into `out` (views into s). An empty `s` is one empty piece.
inline void Split(std::string_view s, char sep, std::vector<std::string_view>* out) {
  out->clear();
  size_t start = 0;
  while (true) {
    size_t pos = s.find(sep, start);
    if (pos == std::string_view::npos) {
      out->push_back(s.substr(start));
      return;
    }
    out->push_back(s.substr(start, pos - start));
    start = pos + 1;
  }
}

/// Splits one CSV line on `sep`, honoring double quotes as RFC 4180 does within a line: a
/// quoted field may hold `sep`, and `""` inside quotes is one `"`. False when a quote is left
/// open (a field with a line break in it, which a line-oriented reader cannot hold).
inline bool SplitQuoted(std::string_view s, char sep, std::vector<std::string>* out) {
  out->clear();
  std::string cur;
  bool quoted = false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (quoted) {
      if (c == '"' && i + 1 < s.size() && s[i + 1] == '"') {
        cur.push_back('"');
        ++i;
      } else if (c == '"') {
        quoted = false;
      } else {
        cur.push_back(c);
      }
    } else if (c == '"') {
      quoted = true;
    } else if (c == sep) {
      out->push_back(std::move(cur));
      cur.clear();
    } else {
      cur.push_back(c);
    }
  }
  out->push_back(std::move(cur));
  return !quoted;
}

/// Parses all of `s` as a number (no sign '+', no spaces); false otherwise.
template <typename T>
bool ParseNumber(std::string_view s, T* v, int base = 10) {
  if (s.empty()) return false;
  if constexpr (std::is_integral_v<T>) {
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), *v, base);
    return ec == std::errc() && p == s.data() + s.size();
  } else {
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), *v);
    return ec == std::errc() && p == s.data() + s.size();
  }
}

/// Turns one line of a file into one sample; a reader's lines may be parsed on several
/// threads, each with a parser of its own (a parser holds scratch buffers). Not thread-safe.
class LineParser {
 public:
  virtual ~LineParser() = default;
  /// Appends the sample of `line`, line `line_no` of the file, to `batch` (everything but
  /// batch->size, which the caller counts). false: the line is not a sample of this reader
  /// (skipped, not counted). Errors are Corruption "PATH:LINE: what" (ParseError).
  virtual Result<bool> Parse(std::string_view line, uint64_t line_no, Batch* batch) = 0;
};

/// The lines a LineReader cut for a data thread (ReadChunk), with their line numbers, parsed
/// by a parser of their own; an error met while cutting comes after them.
class LineChunk final : public DataChunk {
 public:
  explicit LineChunk(std::unique_ptr<LineParser> parser) : parser_(std::move(parser)) {}
  void Add(std::string_view line, uint64_t line_no) {
    text_.append(line);
    ends_.push_back(text_.size());
    line_nos_.push_back(line_no);
  }
  void Defer(Status error) { deferred_ = std::move(error); }
  uint32_t size() const override { return static_cast<uint32_t>(ends_.size()); }
  Status Parse(Batch* batch) override {
    size_t begin = 0;
    for (size_t i = 0; i < ends_.size(); ++i) {
      const std::string_view line(text_.data() + begin, ends_[i] - begin);
      begin = ends_[i];
      TESSERA_ASSIGN_OR_RETURN(const bool appended, parser_->Parse(line, line_nos_[i], batch));
      // Only readers whose every line is a sample (or an error) cut chunks.
      if (!appended) return Status::Internal("a line chunk's line is no sample");
      ++batch->size;
    }
    return deferred_;
  }

 private:
  std::unique_ptr<LineParser> parser_;
  std::string text_;          // the lines, back to back
  std::vector<size_t> ends_;  // where each ends in text_
  std::vector<uint64_t> line_nos_;
  Status deferred_;
};

/// The frame shared by the line-oriented readers: owns the sharded line stream (file, line
/// splitting, sharding by rank), the schema and the position, and hands each selected line to
/// a LineParser. A reader only says how one line becomes one sample (NewParser). Not
/// thread-safe; its chunks (ReadChunk) parse on any thread.
class LineReader : public DataReader {
 public:
  const Schema& schema() const final { return schema_; }
  Status Rewind() final {
    position_ = 0;
    cut_error_ = Status::OK();
    return lines_->Rewind();
  }
  uint64_t position() const final { return position_; }

  Result<uint32_t> Read(uint32_t max_samples, Batch* batch) final {
    if (parser_ == nullptr) parser_ = NewParser();
    uint32_t n = 0;
    while (n < max_samples) {
      TESSERA_ASSIGN_OR_RETURN(const bool more, lines_->Next(&line_));
      if (!more) break;
      TESSERA_ASSIGN_OR_RETURN(const bool appended,
                               parser_->Parse(line_, lines_->line_number(), batch));
      if (!appended) continue;
      ++batch->size;
      ++n;
    }
    position_ += n;
    return n;
  }

  // The next max_samples lines, unparsed, where every line is a sample (or an error).
  Result<std::unique_ptr<DataChunk>> ReadChunk(uint32_t max_samples) final {
    if (!EveryLineIsASample()) return DataReader::ReadChunk(max_samples);
    TESSERA_RETURN_IF_ERROR(cut_error_);
    auto chunk = std::make_unique<LineChunk>(NewParser());
    while (chunk->size() < max_samples) {
      Result<bool> more = lines_->Next(&line_);
      if (!more.ok()) {
        cut_error_ = more.status();
        if (chunk->size() == 0) return cut_error_;
        chunk->Defer(cut_error_);
        break;
      }
      if (!*more) break;
      chunk->Add(line_, lines_->line_number());
    }
    position_ += chunk->size();
    return std::unique_ptr<DataChunk>(std::move(chunk));
  }

 protected:
  LineReader(std::unique_ptr<ShardedLineReader> lines, const Schema& schema)
      : lines_(std::move(lines)), schema_(schema) {}

  /// A parser of this reader's lines. It may be used on another thread while the reader reads
  /// on: it must share only the reader's fixed parts (options, side tables).
  virtual std::unique_ptr<LineParser> NewParser() const = 0;
  /// Whether the parser never skips a line (returns false): then ReadChunk cuts lines for
  /// the data threads to parse, else it parses them itself (the default ReadChunk).
  virtual bool EveryLineIsASample() const = 0;

  const std::string& path() const { return lines_->path(); }

 private:
  std::unique_ptr<ShardedLineReader> lines_;
  const Schema schema_;
  std::unique_ptr<LineParser> parser_;  // Read's
  std::string line_;
  uint64_t position_ = 0;
  Status cut_error_;  // ReadChunk's sticky error
};

}  // namespace tessera::worker::internal
