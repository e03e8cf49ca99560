// libFuzzer target: the serving-export reader (ps/client/export_reader.h ExportReader::Open and
// its lookups) on an export directory built from the input.
//
// Input: a byte that picks the version to open (0: the one LATEST names, else 1..3), then
// entries until the input ends: a byte that picks the file (index % kFiles into kFiles below;
// bit 7 appends the XXH3 checksum, as the server writes record and blob files) and a chunk (u16
// length, bytes) with its contents. Files no entry names are absent. The tree is rebuilt for
// every input under a scratch directory.
//
// Checks beyond sanitizers: an export that opens answers Lookup, DenseRead and RowCount for
// each of its tables, and lookups of the same key agree.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "ps/client/export_reader.h"
#include "ps/codec.h"
#include "ps/record_file_internal.h"
#include "tests/fuzz/fuzz_input.h"

namespace tessera {
namespace {

// The files of an export root with versions 1 (full, 2 servers), 2 and 3 (deltas).
constexpr const char* kFiles[] = {
    "LATEST",
    "v1/EXPORT",
    "v1/server-0/tables",
    "v1/server-0/manifest",
    "v1/server-0/lane-0",
    "v1/server-0/lane-1",
    "v1/server-1/tables",
    "v1/server-1/manifest",
    "v1/server-1/lane-0",
    "v2/EXPORT",
    "v2/server-0/tables",
    "v2/server-0/manifest",
    "v2/server-0/lane-0",
    "v3/EXPORT",
    "v3/server-0/tables",
    "v3/server-0/manifest",
    "v3/server-0/lane-0",
};
constexpr size_t kFiles_ = std::size(kFiles);

// Dense tables are allocated whole when an export is opened (a valid spec may ask for 2^34
// floats). Inputs with a larger valid one are skipped so that the fuzzer's memory limit
// measures the reader, not the table size the input asked for; invalid specs are not skipped.
constexpr uint64_t kMaxDenseFloats = uint64_t{1} << 22;

void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz_export_reader: invariant failed: %s\n", what);
    std::abort();
  }
}

bool HasHugeDenseTable(const std::string& tables_file) {
  Result<std::vector<std::string>> blobs = internal::ReadBlobs(tables_file);
  if (!blobs.ok()) return false;
  for (const auto& b : *blobs) {
    Result<TableSpec> spec = DecodeTableSpec(b);
    if (spec.ok() && ValidateTableSpec(*spec).ok() && spec->kind == TableKind::kDense &&
        spec->length > kMaxDenseFloats) {
      return true;
    }
  }
  return false;
}

void Exercise(const ExportReader& r) {
  const uint64_t keys[] = {0, 1, 42, 1, ~uint64_t{0}};
  for (const std::string& name : r.tables()) {
    Result<TableSpec> spec = r.spec(name);
    Check(spec.ok(), "a listed table has no spec");
    Check(ValidateTableSpec(*spec).ok(), "an open export holds an invalid spec");
    if (spec->kind == TableKind::kSparse) {
      std::vector<float> out(std::size(keys) * spec->dim);
      Check(r.Lookup(name, keys, out.data()).ok(), "lookup in an open export failed");
      Check(std::memcmp(out.data() + spec->dim, out.data() + 3 * spec->dim,
                        spec->dim * sizeof(float)) == 0,
            "two lookups of one key differ");
      Check(r.RowCount(name).ok(), "row count of a sparse table failed");
    } else if (spec->kind == TableKind::kDense) {
      std::vector<float> out(spec->length);
      Check(r.DenseRead(name, 0, spec->length, out.data()).ok(), "dense read failed");
      Check(!r.DenseRead(name, spec->length, 1, out.data()).ok(), "read past the end succeeded");
    }
  }
  Check(!r.spec("no such table").ok(), "an unknown table has a spec");
}

}  // namespace
}  // namespace tessera

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  static fuzz::ScratchDir scratch("export_reader");
  static const std::string root = scratch.path() + "/export";
  static const bool made = [] {
    std::error_code ec;
    for (const char* d : {"v1/server-0", "v1/server-1", "v2/server-0", "v3/server-0"}) {
      std::filesystem::create_directories(root + "/" + d, ec);
    }
    return !ec;
  }();
  if (!made) std::abort();
  for (const char* f : kFiles) std::remove((root + "/" + f).c_str());

  fuzz::FuzzInput in(data, size);
  const uint64_t version = in.U8() % 4;
  bool written[kFiles_] = {};
  while (!in.empty()) {
    const uint8_t pick = in.U8();
    const size_t file = (pick & 0x7f) % kFiles_;
    const std::string_view body = in.Chunk();
    const std::string bytes = (pick & 0x80) ? fuzz::WithChecksum(body) : std::string(body);
    if (!fuzz::WriteScratchFile(root + "/" + kFiles[file], bytes)) std::abort();
    written[file] = true;
  }
  for (size_t f = 0; f < kFiles_; ++f) {
    if (written[f] && std::string_view(kFiles[f]).ends_with("/tables") &&
        HasHugeDenseTable(root + "/" + kFiles[f])) {
      return -1;  // not added to the corpus
    }
  }

  Result<std::unique_ptr<ExportReader>> r = ExportReader::Open(root, version);
  if (!r.ok()) {
    Check(!r.status().message().empty(), "an error without a message");
    return 0;
  }
  Check(version == 0 || (*r)->version() == version, "opened another version than asked");
  Exercise(**r);
  return 0;
}
