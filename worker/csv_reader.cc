#include "worker/csv_reader.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <memory>
#include <set>
#include <string_view>
#include <vector>

#include "ps/feature_keys.h"
#include "worker/line_reader_internal.h"

namespace tessera::worker {
namespace {

using internal::LineParser;
using internal::LineReader;
using internal::ParseError;
using internal::ParseNumber;
using internal::Split;
using internal::SplitQuoted;

constexpr std::string_view kBom = "\xEF\xBB\xBF";

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// The items of a comma-separated list, trimmed; empty items are an error of `clause`.
Result<std::vector<std::string>> ListItems(std::string_view value, std::string_view clause) {
  std::vector<std::string_view> parts;
  Split(value, ',', &parts);
  std::vector<std::string> items;
  for (std::string_view p : parts) {
    p = Trim(p);
    if (p.empty()) {
      return Status::InvalidArgument("schema clause '" + std::string(clause) +
                                     "' has an empty column name");
    }
    items.emplace_back(p);
  }
  return items;
}

Result<char> ParseDelimiter(std::string_view v) {
  if (v == "tab" || v == "\\t") return '\t';
  if (v == "comma") return ',';
  if (v == "semicolon") return ';';
  if (v == "pipe") return '|';
  if (v == "space") return ' ';
  if (v.size() == 1 && v[0] != '"' && v[0] != '\n' && v[0] != '\r') return v[0];
  return Status::InvalidArgument("schema delimiter '" + std::string(v) +
                                 "' must be one character (not '\"') or one of tab, \\t, comma, "
                                 "semicolon, pipe, space");
}

// Column `col` of a headerless schema's clause `role`=... as an index: InvalidArgument naming
// the clause unless it is a number in [0, kMaxCsvColumnIndex].
Result<uint32_t> ColumnIndex(std::string_view role, const std::string& col) {
  uint64_t i = 0;
  if (col.empty() || col.find_first_not_of("0123456789") != std::string::npos) {
    return Status::InvalidArgument("schema " + std::string(role) + "=" + col + ": column '" + col +
                                   "': without a header, columns are 0-based indexes");
  }
  if (!ParseNumber(std::string_view(col), &i) || i > kMaxCsvColumnIndex) {
    return Status::InvalidArgument("schema " + std::string(role) + "=" + col +
                                   ": column index " + col + " is over the bound " +
                                   std::to_string(kMaxCsvColumnIndex) +
                                   " (a CSV line may have at most " +
                                   std::to_string(kMaxCsvColumnIndex + 1) + " columns)");
  }
  return static_cast<uint32_t>(i);
}

// A parsed line's columns: views into the line, or into `quoted` when the line has quotes.
struct Columns {
  std::vector<std::string_view> views;
  std::vector<std::string> quoted;
};

// What makes a line a sample: column indexes and checks, fixed once the reader is open.
struct CsvColumns {
  char delimiter;
  uint32_t label;
  std::vector<uint32_t> numeric;
  std::vector<NumericTransform> transforms;
  std::vector<uint32_t> categorical;
  uint32_t exact_columns;  // with a header: the columns a line must have; else 0
  uint32_t min_columns;    // the columns a line must at least have
  bool skip_bad_lines;
  SkippedLines* skipped;
};

class CsvParser final : public LineParser {
 public:
  CsvParser(std::string path, std::shared_ptr<const CsvColumns> columns)
      : path_(std::move(path)), c_(std::move(columns)) {}

  Result<bool> Parse(std::string_view line, uint64_t line_no, Batch* batch) override {
    Status s = ParseSample(line, line_no);
    if (!s.ok()) {
      if (!c_->skip_bad_lines) return s;
      if (c_->skipped != nullptr) {
        c_->skipped->Add(line_no);
        c_->skipped->NoteError(s.message());
      }
      return false;
    }
    // Append only a whole sample: a bad line leaves the batch as it was.
    batch->dense.insert(batch->dense.end(), dense_.begin(), dense_.end());
    for (size_t f = 0; f < keys_.size(); ++f) {
      if (present_[f]) {
        batch->keys.push_back(keys_[f]);
        if (!batch->weights.empty()) batch->weights.push_back(1.0f);
      }
      batch->offsets.push_back(static_cast<uint32_t>(batch->keys.size()));
    }
    batch->labels.push_back(label_value_);
    return true;
  }

 private:
  Status Error(uint64_t line_no, std::string_view what) const {
    return ParseError(path_, line_no, what);
  }

  // Parses `line` into dense_, keys_ and label_value_.
  Status ParseSample(std::string_view line, uint64_t line_no) {
    const CsvColumns& k = *c_;
    if (line_no == 1 && line.starts_with(kBom)) line.remove_prefix(kBom.size());
    if (line.find('"') == std::string_view::npos) {
      Split(line, k.delimiter, &cols_.views);
    } else {
      if (!SplitQuoted(line, k.delimiter, &cols_.quoted)) return Error(line_no, "unclosed quote");
      cols_.views.assign(cols_.quoted.begin(), cols_.quoted.end());
    }
    const std::vector<std::string_view>& c = cols_.views;
    if (k.exact_columns != 0 && c.size() != k.exact_columns) {
      return Error(line_no, "expected " + std::to_string(k.exact_columns) +
                                " columns (as the header), got " + std::to_string(c.size()));
    }
    if (c.size() < k.min_columns) {
      return Error(line_no, "expected at least " + std::to_string(k.min_columns) +
                                " columns, got " + std::to_string(c.size()));
    }
    double y = 0;
    if (!ParseNumber(Trim(c[k.label]), &y) || !std::isfinite(y)) {
      return Error(line_no, "label (column " + std::to_string(k.label) + ") '" +
                                std::string(c[k.label]) + "' is not a number");
    }
    label_value_ = y > 0 ? 1.0f : 0.0f;
    dense_.clear();
    for (size_t j = 0; j < k.numeric.size(); ++j) {
      const std::string_view v = Trim(c[k.numeric[j]]);
      double x = 0;
      if (!v.empty() && (!ParseNumber(v, &x) || !std::isfinite(x))) {
        return Error(line_no, "numeric column " + std::to_string(k.numeric[j]) + " '" +
                                  std::string(v) + "' is not a finite number");
      }
      if (k.transforms[j] == NumericTransform::kLog) x = std::log1p(std::max(x, 0.0));
      dense_.push_back(static_cast<float>(x));
    }
    keys_.assign(k.categorical.size(), 0);
    present_.assign(k.categorical.size(), 0);
    for (size_t f = 0; f < k.categorical.size(); ++f) {
      const std::string_view v = c[k.categorical[f]];
      if (v.empty()) continue;  // an empty bag
      keys_[f] = MakeStringKey(static_cast<uint32_t>(f), v);
      present_[f] = 1;
    }
    return Status::OK();
  }

  const std::string path_;
  const std::shared_ptr<const CsvColumns> c_;
  Columns cols_;
  std::vector<float> dense_;
  std::vector<uint64_t> keys_;  // per field; present_[f] == 0: the value was empty
  std::vector<char> present_;
  float label_value_ = 0;
};

// With skip_bad_lines a chunk's sample count is only known once parsed: ReadChunk is then
// the default (parsed on the reading thread), so skipped lines count as in Read.
class CsvReader final : public LineReader {
 public:
  CsvReader(std::unique_ptr<ShardedLineReader> lines, std::shared_ptr<const CsvColumns> columns)
      : LineReader(std::move(lines),
                   Schema{.num_dense = static_cast<uint32_t>(columns->numeric.size()),
                          .num_fields = static_cast<uint32_t>(columns->categorical.size())}),
        columns_(std::move(columns)) {}

 private:
  std::unique_ptr<LineParser> NewParser() const override {
    return std::make_unique<CsvParser>(path(), columns_);
  }
  bool EveryLineIsASample() const override { return !columns_->skip_bad_lines; }

  const std::shared_ptr<const CsvColumns> columns_;
};

// The header line of `path` split into names (a BOM and a trailing '\r' dropped).
Result<std::vector<std::string>> ReadHeader(const std::string& path, char delimiter) {
  std::ifstream in(path, std::ios::in | std::ios::binary);
  if (!in) return Status::NotFound("cannot open " + path);
  std::string line;
  TESSERA_ASSIGN_OR_RETURN(const bool any, internal::NextLineOf(in, path, 1, &line));
  if (!any) return Status::InvalidArgument(path + ": no header line");
  if (!line.empty() && line.back() == '\r') line.pop_back();
  if (std::string_view(line).starts_with(kBom)) line.erase(0, kBom.size());
  std::vector<std::string> names;
  if (!SplitQuoted(line, delimiter, &names)) {
    return Status::InvalidArgument(path + ":1: unclosed quote in the header");
  }
  return names;
}

}  // namespace

void SkippedLines::Add(uint64_t line_number) {
  MutexLock lock(mu_);
  lines_.insert(line_number);
}

uint64_t SkippedLines::count() const {
  MutexLock lock(mu_);
  return lines_.size();
}

std::string SkippedLines::first_error() const {
  MutexLock lock(mu_);
  return first_error_;
}

void SkippedLines::NoteError(const std::string& error) {
  MutexLock lock(mu_);
  if (first_error_.empty()) first_error_ = error;
}

namespace {

// "numeric=A:log,B,...": the numeric columns of a schema and their transforms.
Status ParseNumericColumns(std::string_view value, std::string_view clause,
                           std::vector<CsvNumericColumn>* out) {
  if (value.empty()) return Status::OK();  // "numeric=": no dense features
  TESSERA_ASSIGN_OR_RETURN(std::vector<std::string> items, ListItems(value, clause));
  for (const std::string& item : items) {
    CsvNumericColumn col;
    const size_t colon = item.rfind(':');
    col.column = Trim(std::string_view(item).substr(0, colon));
    if (colon != std::string::npos) {
      const std::string_view t = Trim(std::string_view(item).substr(colon + 1));
      if (t == "log") {
        col.transform = NumericTransform::kLog;
      } else if (t != "none") {
        return Status::InvalidArgument("numeric column '" + col.column +
                                       "': unknown transform '" + std::string(t) +
                                       "' (want none or log)");
      }
    }
    if (col.column.empty()) {
      return Status::InvalidArgument("schema clause '" + std::string(clause) +
                                     "' has an empty column name");
    }
    out->push_back(std::move(col));
  }
  return Status::OK();
}

// One "key=value" clause of a schema into `s`; `seen_keys` are the keys of the clauses before.
Status ParseSchemaClause(std::string_view clause, std::set<std::string>* seen_keys,
                         CsvSchema* s) {
  const size_t eq = clause.find('=');
  if (eq == std::string_view::npos) {
    return Status::InvalidArgument("schema clause '" + std::string(clause) +
                                   "' is not key=value");
  }
  const std::string key(Trim(clause.substr(0, eq)));
  const std::string_view raw_value = clause.substr(eq + 1);
  const std::string_view value = Trim(raw_value);
  if (!seen_keys->insert(key).second) {
    return Status::InvalidArgument("schema key '" + key + "' given twice");
  }
  if (key == "label") {
    if (value.empty() || value.find(',') != std::string_view::npos) {
      return Status::InvalidArgument("schema clause '" + std::string(clause) +
                                     "' must name one column");
    }
    s->label = std::string(value);
  } else if (key == "categorical") {
    TESSERA_ASSIGN_OR_RETURN(s->categorical, ListItems(value, clause));
  } else if (key == "numeric") {
    return ParseNumericColumns(value, clause, &s->numeric);
  } else if (key == "delimiter") {
    if (raw_value.empty()) {
      return Status::InvalidArgument(
          "schema delimiter is empty (a ';' delimiter is written delimiter=semicolon)");
    }
    TESSERA_ASSIGN_OR_RETURN(s->delimiter,
                             ParseDelimiter(raw_value.size() == 1 ? raw_value : value));
  } else if (key == "header") {
    if (value == "true") {
      s->header = true;
    } else if (value == "false") {
      s->header = false;
    } else {
      return Status::InvalidArgument("schema header must be true or false, not '" +
                                     std::string(value) + "'");
    }
  } else {
    return Status::InvalidArgument("unknown schema key '" + key +
                                   "' (want label, numeric, categorical, delimiter, header)");
  }
  return Status::OK();
}

// Roles: each list names a column once, and the label is no feature; without a header every
// column is an index.
Status CheckSchemaColumns(const CsvSchema& s) {
  std::set<std::string> numeric_cols, categorical_cols;
  for (const auto& n : s.numeric) {
    if (!numeric_cols.insert(n.column).second) {
      return Status::InvalidArgument("numeric column '" + n.column + "' given twice");
    }
  }
  for (const auto& c : s.categorical) {
    if (!categorical_cols.insert(c).second) {
      return Status::InvalidArgument("categorical column '" + c + "' given twice");
    }
  }
  if (numeric_cols.count(s.label) || categorical_cols.count(s.label)) {
    return Status::InvalidArgument("label column '" + s.label + "' is also a feature");
  }
  if (!s.header) {
    TESSERA_RETURN_IF_ERROR(ColumnIndex("label", s.label).status());
    for (const auto& n : s.numeric) {
      TESSERA_RETURN_IF_ERROR(ColumnIndex("numeric", n.column).status());
    }
    for (const auto& c : s.categorical) {
      TESSERA_RETURN_IF_ERROR(ColumnIndex("categorical", c).status());
    }
  }
  return Status::OK();
}

}  // namespace

Result<CsvSchema> ParseCsvSchema(std::string_view text) {
  CsvSchema s;
  std::set<std::string> seen_keys;
  std::vector<std::string_view> clauses;
  Split(text, ';', &clauses);
  for (std::string_view raw : clauses) {
    if (Trim(raw).empty()) continue;
    // Trailing spaces stay for the delimiter clause ("delimiter= " is a space).
    std::string_view clause = raw;
    while (!clause.empty() && clause.front() == ' ') clause.remove_prefix(1);
    TESSERA_RETURN_IF_ERROR(ParseSchemaClause(clause, &seen_keys, &s));
  }
  if (!seen_keys.count("label")) return Status::InvalidArgument("schema has no label=COLUMN");
  if (!seen_keys.count("categorical") || s.categorical.empty()) {
    return Status::InvalidArgument("schema has no categorical=COLUMN,... (at least one)");
  }
  if (s.categorical.size() > kMaxFields) {
    return Status::InvalidArgument("schema has " + std::to_string(s.categorical.size()) +
                                   " categorical columns, at most " + std::to_string(kMaxFields));
  }
  TESSERA_RETURN_IF_ERROR(CheckSchemaColumns(s));
  return s;
}

Result<std::unique_ptr<DataReader>> OpenCsv(const std::string& path, const ShardOptions& shard,
                                            const CsvOptions& options) {
  const CsvSchema& s = options.schema;
  if (s.label.empty() || s.categorical.empty() || s.categorical.size() > kMaxFields) {
    return Status::InvalidArgument("CSV schema needs a label and 1 to " +
                                   std::to_string(kMaxFields) + " categorical columns");
  }
  // Column references to indexes.
  std::vector<std::string> header;
  if (s.header) {
    TESSERA_ASSIGN_OR_RETURN(header, ReadHeader(path, s.delimiter));
  }
  if (header.size() > size_t{kMaxCsvColumnIndex} + 1) {
    return Status::InvalidArgument(path + ": the header has " + std::to_string(header.size()) +
                                   " columns, more than " +
                                   std::to_string(kMaxCsvColumnIndex + 1));
  }
  // (A schema that did not come from ParseCsvSchema is checked here too.)
  auto resolve = [&](std::string_view role, const std::string& col) -> Result<uint32_t> {
    if (!s.header) return ColumnIndex(role, col);
    const auto it = std::find(header.begin(), header.end(), col);
    if (it == header.end()) {
      std::string names;
      for (size_t i = 0; i < header.size() && i < 30; ++i) names += (i ? "," : "") + header[i];
      if (header.size() > 30) names += ",...";
      return Status::InvalidArgument(path + ": column '" + col + "' is not in the header (" +
                                     names + ")");
    }
    if (std::find(it + 1, header.end(), col) != header.end()) {
      return Status::InvalidArgument(path + ": column '" + col + "' is in the header twice");
    }
    return static_cast<uint32_t>(it - header.begin());
  };
  TESSERA_ASSIGN_OR_RETURN(const uint32_t label, resolve("label", s.label));
  uint32_t max_index = label;
  std::vector<uint32_t> numeric, categorical;
  std::vector<NumericTransform> transforms;
  for (const auto& n : s.numeric) {
    TESSERA_ASSIGN_OR_RETURN(const uint32_t i, resolve("numeric", n.column));
    numeric.push_back(i);
    transforms.push_back(n.transform);
    max_index = std::max(max_index, i);
  }
  for (const auto& c : s.categorical) {
    TESSERA_ASSIGN_OR_RETURN(const uint32_t i, resolve("categorical", c));
    categorical.push_back(i);
    max_index = std::max(max_index, i);
  }
  const uint32_t exact = s.header ? static_cast<uint32_t>(header.size()) : 0;

  // Line sharding deals lines; with skipped lines a rank's j-th sample would no longer be the
  // part's (j * world + rank)-th, which the validation split relies on: deal samples instead.
  const bool by_sample = options.skip_bad_lines && shard.world > 1;
  ShardOptions lines_opt = shard;
  if (by_sample) {
    lines_opt.rank = 0;
    lines_opt.world = 1;
  }
  TESSERA_ASSIGN_OR_RETURN(auto lines, ShardedLineReader::Open(path, lines_opt, s.header));
  auto columns = std::make_shared<const CsvColumns>(CsvColumns{
      s.delimiter, label, std::move(numeric), std::move(transforms), std::move(categorical), exact,
      max_index + 1, options.skip_bad_lines, options.skipped});
  std::unique_ptr<DataReader> reader(new CsvReader(std::move(lines), std::move(columns)));
  if (!by_sample) return reader;
  if (shard.rank >= shard.world) {
    return Status::InvalidArgument("rank " + std::to_string(shard.rank) + " not in [0, " +
                                   std::to_string(shard.world) + ")");
  }
  return ShardReader(std::move(reader), shard.rank, shard.world);
}

}  // namespace tessera::worker
