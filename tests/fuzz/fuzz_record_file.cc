// libFuzzer target: the checkpoint and export file readers (ps/record_file_internal.h
// ReadRecordFile and ReadBlobs) on a file written from the input.
//
// Input: one byte of flags, then the file's bytes. Flag bit 0 appends the file's XXH3 checksum
// (as RecordWriter and WriteBlobs end a file), so that mutated files reach the parsers instead
// of stopping at the checksum; without it the checksum check itself is fuzzed. Flag bit 1 makes
// the record callback fail on the second record (a restore that stops half-way).
//
// Checks beyond sanitizers: every record handed out has a known kind and at most 2^24 floats;
// a file that reads back OK is re-written with RecordWriter and must read back to the same
// records (the reader accepts nothing the writer cannot express).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "ps/record_file_internal.h"
#include "tests/fuzz/fuzz_input.h"

namespace tessera {
namespace {

using internal::Record;

void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz_record_file: invariant failed: %s\n", what);
    std::abort();
  }
}

bool SameRecord(const Record& a, const Record& b) {
  return a.kind == b.kind && a.table_id == b.table_id && a.key == b.key &&
         a.meta.update_count == b.meta.update_count && a.meta.last_step == b.meta.last_step &&
         a.meta.last_update_s == b.meta.last_update_s && a.row.size() == b.row.size() &&
         (a.row.empty() ||
          std::memcmp(a.row.data(), b.row.data(), a.row.size() * sizeof(float)) == 0);
}

Status ReadAll(const std::string& path, bool fail_second, std::vector<Record>* out) {
  return internal::ReadRecordFile(path, [&](const Record& r) -> Status {
    Check(r.kind == Record::kSparseRow || r.kind == Record::kDenseChunk, "record of kind 0..2");
    Check(r.row.size() <= (1u << 24), "row over 2^24 floats");
    if (fail_second && out->size() == 1) return Status::Internal("callback stops");
    out->push_back(r);
    return Status::OK();
  });
}

}  // namespace
}  // namespace tessera

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  static fuzz::ScratchDir scratch("record_file");
  static const std::string path = scratch.path() + "/file";
  static const std::string copy = scratch.path() + "/copy";
  fuzz::FuzzInput in(data, size);
  const uint8_t flags = in.U8();
  const std::string_view body = in.Bytes(size);
  const std::string file = (flags & 1) ? fuzz::WithChecksum(body) : std::string(body);
  if (!fuzz::WriteScratchFile(path, file)) std::abort();

  std::vector<internal::Record> records;
  const bool fail_second = flags & 2;
  const Status s = ReadAll(path, fail_second, &records);
  if (!s.ok()) Check(!s.message().empty(), "an error without a message");
  if (s.ok() && !fail_second) {
    internal::RecordWriter w(copy);
    for (const auto& r : records) {
      w.Put(r.kind, r.table_id, r.key, r.meta, r.row.data(), static_cast<uint32_t>(r.row.size()));
    }
    Check(w.Finish().ok(), "re-writing the records failed");
    std::vector<internal::Record> again;
    Check(ReadAll(copy, false, &again).ok(), "re-written records do not read back");
    Check(again.size() == records.size(), "re-written file has another record count");
    for (size_t i = 0; i < again.size(); ++i) {
      Check(SameRecord(again[i], records[i]), "a re-written record differs");
    }
  }

  // The same bytes as a blob file (table specs, manifests, metadata records).
  Result<std::vector<std::string>> blobs = internal::ReadBlobs(path);
  if (blobs.ok()) {
    std::string all;
    for (const auto& b : *blobs) all += b;
    Check(all.size() <= file.size(), "blobs larger than their file");
    Check(internal::WriteBlobs(copy, *blobs).ok(), "re-writing the blobs failed");
    Result<std::vector<std::string>> again = internal::ReadBlobs(copy);
    Check(again.ok() && *again == *blobs, "re-written blobs do not read back the same");
  } else {
    Check(!blobs.status().message().empty(), "an error without a message");
  }
  return 0;
}
