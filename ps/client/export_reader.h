// Reads serving exports with no server running: for services that embed Tessera.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ps/status.h"
#include "ps/table_spec.h"

namespace tessera {

namespace internal {
struct ExportTable;
}

/// The latest complete export version under `root` (0 when there is none).
Result<uint64_t> LatestExportVersion(const std::string& root);

/// An export loaded into memory, read-only: a full export plus the deltas written after it,
/// up to the version asked for. Immutable after Open: safe for concurrent lookups from any
/// number of threads.
class ExportReader {
 public:
  /// Opens version `version` of the exports under `root` (0: the version LATEST names).
  /// Corruption when a file fails its checksum; NotFound when the version is missing.
  static Result<std::unique_ptr<ExportReader>> Open(const std::string& root, uint64_t version = 0);
  ~ExportReader();

  uint64_t version() const { return version_; }
  /// Names of the exported tables.
  std::vector<std::string> tables() const;
  /// The spec of a table (NotFound if it is not in the export).
  Result<TableSpec> spec(const std::string& table) const;

  /// Writes the rows of `keys` (dim floats each) to `out` in order. A key without a row gets
  /// the table's initializer value, as a server would answer.
  Status Lookup(const std::string& table, std::span<const uint64_t> keys, float* out) const;
  /// Copies elements [offset, offset + length) of a dense table to `out`.
  Status DenseRead(const std::string& table, uint64_t offset, uint64_t length, float* out) const;
  /// Number of rows a sparse table holds in the export.
  Result<uint64_t> RowCount(const std::string& table) const;

 private:
  ExportReader() = default;
  Result<const internal::ExportTable*> Find(const std::string& table) const;
  uint64_t version_ = 0;
  std::vector<std::unique_ptr<internal::ExportTable>> tables_;
};

}  // namespace tessera
