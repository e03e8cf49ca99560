// Record files: checksummed files of rows (checkpoints, serving exports). Format in
// docs/storage.md: magic "TSSNAP01", records, an end record with the count, an XXH3 checksum.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ps/status.h"

namespace tessera::internal {

/// Row metadata as stored in a record (mirrors storage's RowMeta).
struct RecordMeta {
  uint32_t update_count = 0;
  uint32_t last_step = 0;
  uint32_t last_update_s = 0;
};

/// One record: a sparse row or a dense chunk (values, optionally followed by optimizer state).
struct Record {
  enum Kind : uint8_t { kEnd = 0, kSparseRow = 1, kDenseChunk = 2 };
  Kind kind = kEnd;
  uint64_t table_id = 0;
  uint64_t key = 0;  ///< Sparse: the key. Dense: the chunk index.
  RecordMeta meta;
  std::vector<float> row;
};

class Writer;

/// Writes a record file. Not thread-safe.
class RecordWriter {
 public:
  explicit RecordWriter(const std::string& path);
  /// Builds the file's bytes in `*sink` instead (write them with WriteFileDurably).
  explicit RecordWriter(std::string* sink);
  ~RecordWriter();
  bool ok() const;
  void Put(Record::Kind kind, uint64_t table, uint64_t key, const RecordMeta& meta,
           const float* row, uint32_t n);
  /// Writes the end record and checksum, fsyncs and closes.
  Status Finish();

 private:
  std::unique_ptr<Writer> w_;
  uint64_t records_ = 0;
};

/// Writes `data` to `path` and fsyncs it.
Status WriteFileDurably(const std::string& path, std::string_view data);

/// Verifies the checksum of `path` first, then calls `fn` for every record. Corruption if the
/// file is truncated, altered or not a record file. The file is opened with OpenRegularFile
/// (read_file_internal.h): never blocks on a FIFO; FailedPrecondition for anything but a
/// regular file and, with `inside` (a canonical directory, the admin root), for a symbolic
/// link or a file that resolves outside it.
Status ReadRecordFile(const std::string& path, const std::function<Status(const Record&)>& fn,
                      const std::string& inside = {});

/// Small length-prefixed blob files (table specs, metadata records, manifests). ReadBlobs opens
/// as ReadRecordFile does and refuses files over kMaxBlobFileBytes (ResourceExhausted).
Status WriteBlobs(const std::string& path, const std::vector<std::string>& blobs);
inline constexpr uint64_t kMaxBlobFileBytes = uint64_t{1} << 30;
Result<std::vector<std::string>> ReadBlobs(const std::string& path,
                                           const std::string& inside = {});

}  // namespace tessera::internal
