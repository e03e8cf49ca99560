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

/// Corruption "PATH:LINE: what" for the line `r` returned last.
inline Status ParseError(const ShardedLineReader& r, std::string_view what) {
  return Status::Corruption(r.path() + ":" + std::to_string(r.line_number()) + ": " +
                            std::string(what));
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

/// The frame shared by the line-oriented readers: owns the sharded line stream (file, line
/// splitting, sharding by rank), the schema and the position, and hands each selected line to
/// ParseLine. A reader only says how one line becomes one sample. Not thread-safe.
class LineReader : public DataReader {
 public:
  const Schema& schema() const final { return schema_; }
  Status Rewind() final {
    position_ = 0;
    return lines_->Rewind();
  }
  uint64_t position() const final { return position_; }

  Result<uint32_t> Read(uint32_t max_samples, Batch* batch) final {
    uint32_t n = 0;
    while (n < max_samples) {
      TESSERA_ASSIGN_OR_RETURN(const bool more, lines_->Next(&line_));
      if (!more) break;
      TESSERA_ASSIGN_OR_RETURN(const bool appended, ParseLine(line_, batch));
      if (!appended) continue;
      ++batch->size;
      ++n;
    }
    position_ += n;
    return n;
  }

 protected:
  LineReader(std::unique_ptr<ShardedLineReader> lines, const Schema& schema)
      : lines_(std::move(lines)), schema_(schema) {}

  // Appends the sample of `line` to `batch` (everything but batch->size, which Read counts).
  // False: the line is not a sample of this reader (skipped, not counted). Errors are
  // Corruption naming the file and line (Error()).
  virtual Result<bool> ParseLine(std::string_view line, Batch* batch) = 0;

  // The line stream (for error messages that name the file and line).
  const ShardedLineReader& lines() const { return *lines_; }
  Status Error(std::string_view what) const { return ParseError(*lines_, what); }

 private:
  std::unique_ptr<ShardedLineReader> lines_;
  const Schema schema_;
  std::string line_;
  uint64_t position_ = 0;
};

}  // namespace tessera::worker::internal
