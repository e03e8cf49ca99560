// Click data in CSV (or any single-character-delimited) files, described by a column schema.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "ps/mutex.h"
#include "ps/status.h"
#include "worker/data_reader.h"

namespace tessera::worker {

/// What a numeric column's value x becomes as a dense feature.
enum class NumericTransform {
  kNone,  ///< x as it is.
  kLog,   ///< log(1 + max(x, 0)), as the Criteo reader does with its integer features.
};

/// One numeric (dense) column of a CsvSchema.
struct CsvNumericColumn {
  /// A header name, or a 0-based column index (decimal) when the file has no header.
  std::string column;
  NumericTransform transform = NumericTransform::kNone;
};

/// Which columns of a delimited text file make a sample, parsed from a schema string
/// (ParseCsvSchema). Columns the schema does not name are ignored.
struct CsvSchema {
  /// The label column (a header name or index). A number; > 0 is a click. Required.
  std::string label;
  /// Dense features, in this order. Default: none.
  std::vector<CsvNumericColumn> numeric;
  /// Categorical fields: column i of the list is field i, and its value v becomes key
  /// MakeStringKey(i, v) (= MakeKey(i, HashBytes(v))). 1 to kMaxFields of them. Required.
  std::vector<std::string> categorical;
  /// The column separator; never '"', '\n' or '\r'. Default: ','.
  char delimiter = ',';
  /// Whether the first line names the columns (columns are then named by header name; without
  /// a header, by 0-based index). Default: true.
  bool header = true;
};

/// The largest column index a schema may name (65,535: a row of 65,536 columns, far beyond
/// the 24 of Avazu or the 40 of Criteo). Bounds what a sample parse indexes and sizes by it
/// (every line holds at least max index + 1 columns).
inline constexpr uint32_t kMaxCsvColumnIndex = 65535;

/// Parses a schema string: clauses `key=value` separated by ';' (spaces around keys, values
/// and list items are ignored; an empty clause is allowed):
///   label=COL                              required
///   categorical=COL,COL,...                required, at least one column
///   numeric=COL[:none|:log],COL...         optional; the transform defaults to none
///   delimiter=C                            one character, or tab, \t, comma, semicolon, pipe,
///                                          space; default ','
///   header=true|false                      default true
/// e.g. `label=click;numeric=hour:none,price:log;categorical=site_id,app_id;header=true`.
/// InvalidArgument naming the clause for an unknown key, a missing label or categorical list,
/// a bad transform or delimiter, a non-index column without a header, an index over
/// kMaxCsvColumnIndex, or a column used twice in one role (a column may be both numeric and categorical; the label is neither).
Result<CsvSchema> ParseCsvSchema(std::string_view text);

/// The distinct line numbers that CSV readers skipped as malformed (CsvOptions::skip_bad_lines).
/// Several readers of one file (ranks, parts, passes, epochs) may share one; a line skipped
/// again counts once. Thread-safe.
class SkippedLines {
 public:
  void Add(uint64_t line_number);
  /// Distinct lines skipped so far.
  uint64_t count() const;
  /// The message of the first malformed line recorded ("PATH:LINE: what"); empty if none.
  std::string first_error() const;
  /// Records `error` as first_error() if there is none yet.
  void NoteError(const std::string& error);

 private:
  mutable Mutex mu_;
  std::unordered_set<uint64_t> lines_ ABSL_GUARDED_BY(mu_);
  std::string first_error_ ABSL_GUARDED_BY(mu_);
};

/// Options of the CSV reader.
struct CsvOptions {
  CsvSchema schema;
  /// A malformed line (wrong number of columns, a label or numeric value that is not a finite
  /// number, an unclosed quote) is skipped and counted instead of failing the read. Then every
  /// reader parses the whole part and keeps every world-th good sample (sharding by sample, not
  /// by line), so that ranks and the validation part agree whatever is skipped: world times the
  /// parsing of line sharding. Default: false (a malformed line is Corruption "PATH:LINE: ...").
  bool skip_bad_lines = false;
  /// Where skipped lines are counted; may be null. Borrowed: must outlive the reader.
  SkippedLines* skipped = nullptr;
};

/// A CSV file as click data (streaming; train/test by line with shard.holdout_mod, dealt
/// round-robin to shard.world readers): one dense feature per numeric column, one field per
/// categorical column (an empty value is an empty bag: no key), label 1 when the label is > 0.
/// Quoted fields ("a,b", "" for a quote) are honored within a line; a trailing '\r' and a UTF-8
/// byte order mark are dropped. With a header, a data line must have as many columns as the
/// header; without one, more columns than the largest index used. Empty lines are skipped.
/// Spaces around a label or numeric value are ignored; an empty numeric value is 0; a
/// categorical value is hashed exactly as it is (after unquoting).
/// Errors: NotFound (no file), InvalidArgument naming the column when the header lacks a column
/// of the schema (or has it twice) or the file has no header line; Read fails with Corruption
/// naming the file and line of a malformed line (unless skip_bad_lines).
Result<std::unique_ptr<DataReader>> OpenCsv(const std::string& path, const ShardOptions& shard,
                                            const CsvOptions& options);

}  // namespace tessera::worker
