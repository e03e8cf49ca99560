// Writes the seed corpora of the fuzz targets (tests/fuzz/corpus/<target>/) with the real
// encoders: EncodeHeader for envelopes, RecordWriter and WriteBlobs for files, the export
// layout the server and Client::Export write. Deterministic: running it again rewrites the
// same files. Regression inputs (crashes found and fixed) live next to the seeds under names
// starting with "regress-" and are never written here.
//
// Usage: fuzz_make_seeds DIR   (DIR: tests/fuzz/corpus; see tests/fuzz/README.md)
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "ps/codec.h"
#include "ps/record_file_internal.h"
#include "ps/routing.h"
#include "tests/fuzz/fuzz_input.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

std::string Env(const Header& h) {
  std::string s;
  EncodeHeader(h, &s);
  return s;
}

template <typename T>
std::string Bytes(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

void Put(const fs::path& dir, const std::string& name, const std::string& bytes) {
  fs::create_directories(dir);
  std::ofstream out(dir / name, std::ios::binary | std::ios::trunc);
  out << bytes;
  if (!out) {
    std::fprintf(stderr, "cannot write %s\n", (dir / name).c_str());
    std::exit(1);
  }
}

// The tables the server target starts with (fuzz_server_request.cc StartTables).
TableSpec SparseS() {
  OptimizerSpec adagrad{.kind = OptimizerKind::kAdagrad, .learning_rate = 0.05f};
  return TableSpec::Sparse("s", 4, adagrad, {InitializerKind::kUniform, -0.1f, 0.1f, 7});
}
TableSpec DenseD() {
  return TableSpec::Dense("d", 40000, {OptimizerKind::kAdam},
                          {InitializerKind::kConstant, 0.5f, 0, 0});
}

// Keys that server 0 of 2 owns.
std::vector<uint64_t> OwnedKeys(size_t n) {
  std::vector<uint64_t> keys;
  const SlotMap map = SlotMap::Uniform(2);
  for (uint64_t k = 1; keys.size() < n; ++k) {
    if (map.ServerOfKey(k) == 0) keys.push_back(k);
  }
  return keys;
}

// A request as the client builds it, for every op (sparse and dense against the tables above).
struct Request {
  std::string name;
  std::vector<std::string> frames;
};

std::vector<Request> ClientRequests() {
  const TableSpec s = SparseS(), d = DenseD();
  const uint64_t sid = TableIdForName(s.name), did = TableIdForName(d.name);
  const std::vector<uint64_t> keys = OwnedKeys(3);
  const std::vector<float> grads(keys.size() * 4, 0.25f);
  const DenseRange mine = DenseRangeOfServer(did, d.length, 0, 2);
  auto base = [](Op op, uint64_t id) {
    Header h;
    h.op = op;
    h.request_id = id;
    h.worker_id = 1;
    h.clock = 2;
    h.staleness = 1;
    h.num_workers = 2;
    return h;
  };
  std::vector<Request> out;
  out.push_back({"ping", {Env(base(Op::kPing, 1))}});
  Header ct = base(Op::kCreateTable, 2);
  ct.spec = s;
  out.push_back({"create-sparse", {Env(ct)}});
  ct.spec = d;
  out.push_back({"create-dense", {Env(ct)}});
  Header gt = base(Op::kGetTable, 3);
  gt.name = "s";
  out.push_back({"get-table", {Env(gt)}});
  Header sp = base(Op::kSparsePull, 4);
  sp.table_id = sid;
  sp.elem_type = ElemType::kF32;
  sp.count = keys.size();
  sp.dim = 4;
  out.push_back({"sparse-pull", {Env(sp), Bytes(keys)}});
  sp.op = Op::kSparsePush;
  sp.request_id = 5;
  out.push_back({"sparse-push", {Env(sp), Bytes(keys), Bytes(grads)}});
  sp.op = Op::kSparsePushPull;
  sp.request_id = 6;
  out.push_back({"sparse-push-pull", {Env(sp), Bytes(keys), Bytes(grads)}});
  Header dp = base(Op::kDensePull, 7);
  dp.table_id = did;
  dp.offset = mine.begin;
  dp.count = std::min<uint64_t>(mine.end - mine.begin, 100);
  out.push_back({"dense-pull", {Env(dp)}});
  dp.op = Op::kDensePush;
  dp.request_id = 8;
  dp.elem_type = ElemType::kF32;
  out.push_back({"dense-push", {Env(dp), Bytes(std::vector<float>(dp.count, 0.5f))}});
  Header ck = base(Op::kClock, 9);
  ck.clock = 3;
  out.push_back({"clock", {Env(ck)}});
  Header ba = base(Op::kBarrier, 10);
  ba.name = "start";
  out.push_back({"barrier", {Env(ba)}});
  Header pm = base(Op::kPutMeta, 11);
  pm.name = "worker/1";
  pm.elem_type = ElemType::kBytes;
  pm.count = 1;
  out.push_back({"put-meta", {Env(pm), "position 12345"}});
  Header gm = base(Op::kGetMeta, 12);
  gm.name = "worker/1";
  out.push_back({"get-meta", {Env(gm)}});
  out.push_back({"stats", {Env(base(Op::kStats, 13))}});
  Header cp = base(Op::kCheckpoint, 14);
  cp.name = "ckpt";  // relative to the server's admin_root
  cp.clock = 1;
  out.push_back({"checkpoint", {Env(cp)}});
  cp.count = 1;
  cp.request_id = 15;
  out.push_back({"checkpoint-abort", {Env(cp)}});
  Header rs = base(Op::kRestore, 16);
  rs.name = "ckpt";
  out.push_back({"restore", {Env(rs)}});
  Header ex = base(Op::kExport, 17);
  ex.name = "exports/v1";
  out.push_back({"export", {Env(ex)}});
  ex.name = "exports/v2";
  ex.count = 1;
  ex.offset = 1;
  ex.request_id = 18;
  out.push_back({"export-delta", {Env(ex)}});
  return out;
}

// ---- envelope: frame 0 of requests and replies.
void EnvelopeSeeds(const fs::path& dir) {
  for (const Request& r : ClientRequests()) Put(dir, "request-" + r.name, r.frames[0]);
  Header err;
  err.request_id = 77;
  err.op = Op::kSparsePull;
  err.status = StatusCode::kInvalidArgument;
  err.message = "keys frame has 8 bytes, envelope implies 16";
  Put(dir, "reply-error", Env(err));
  Header invalid;
  invalid.status = StatusCode::kInvalidArgument;
  invalid.message = "envelope failed FlatBuffers verification (3 bytes)";
  Put(dir, "reply-invalid-op", Env(invalid));
  Header table;
  table.request_id = 3;
  table.op = Op::kGetTable;
  table.table_id = TableIdForName("s");
  table.spec = SparseS();
  Put(dir, "reply-get-table", Env(table));
  Header other;
  other.version = kProtocolVersion + 1;
  other.request_id = 9;
  other.op = Op::kPing;
  Put(dir, "request-other-version", Env(other));
}

// The bytes of a blob file (WriteBlobs writes files only).
std::string BlobBytes(const std::vector<std::string>& blobs) {
  const fs::path tmp = fs::temp_directory_path() / "tessera-fuzz-seeds-export";
  if (!internal::WriteBlobs(tmp.string(), blobs).ok()) std::exit(1);
  std::ifstream in(tmp, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  fs::remove(tmp);
  return ss.str();
}

// ---- record_file: a flag byte (bit 0: the target appends the checksum), then the file.
std::string WithoutChecksum(const std::string& file) { return file.substr(0, file.size() - 8); }

void RecordFileSeeds(const fs::path& dir) {
  using internal::Record;
  using internal::RecordWriter;
  auto put = [&](const std::string& name, const std::string& file, bool fail_second = false) {
    Put(dir, name,
        std::string(1, static_cast<char>(1 | (fail_second ? 2 : 0))) + WithoutChecksum(file));
  };
  std::string empty;
  {
    RecordWriter w(&empty);
    (void)w.Finish();
  }
  put("records-empty", empty);
  std::string rows;
  {
    RecordWriter w(&rows);
    const float row[4] = {0.5f, -1, 2, 0};
    for (uint64_t k = 1; k <= 3; ++k) {
      w.Put(Record::kSparseRow, TableIdForName("s"), k, {3, 7, 1700000000}, row, 4);
    }
    const std::vector<float> chunk(100, 0.25f);
    w.Put(Record::kDenseChunk, TableIdForName("d"), 0, {1, 1, 1}, chunk.data(), 100);
    (void)w.Finish();
  }
  put("records-rows-and-chunk", rows);
  put("records-callback-stops", rows, true);
  // The same file with its checksum, read as is (flag bit 0 clear).
  Put(dir, "records-with-checksum", std::string(1, '\0') + rows);
  // Blob files: table specs and a manifest.
  put("blobs-tables", BlobBytes({EncodeTableSpec(SparseS()), EncodeTableSpec(DenseD())}));
  put("blobs-manifest", BlobBytes({"0", "2", "1700000000", "2", "1700000001"}));
}

// ---- export_reader: a version byte, then entries (file index | 0x80 to add the checksum,
// chunk). File indexes as in fuzz_export_reader.cc kFiles.
class ExportSeed {
 public:
  explicit ExportSeed(uint8_t version) { out_.U8(version); }
  ExportSeed& Text(uint8_t file, const std::string& text) {
    out_.U8(file).Chunk(text);
    return *this;
  }
  ExportSeed& Checksummed(uint8_t file, const std::string& bytes) {
    out_.U8(file | 0x80).Chunk(WithoutChecksum(bytes));
    return *this;
  }
  const std::string& str() const { return out_.str(); }

 private:
  fuzz::FuzzOutput out_;
};

std::string LaneFile(uint64_t first_key, size_t rows, bool with_dense) {
  using internal::Record;
  std::string out;
  internal::RecordWriter w(&out);
  const float row[4] = {1, 2, 3, 4};
  for (size_t i = 0; i < rows; ++i) {
    w.Put(Record::kSparseRow, TableIdForName("s"), first_key + i, {1, 1, 1}, row, 4);
  }
  if (with_dense) {
    const std::vector<float> chunk(1000, 0.75f);
    w.Put(Record::kDenseChunk, TableIdForName("small"), 0, {1, 1, 1}, chunk.data(), 1000);
  }
  (void)w.Finish();
  return out;
}

void ExportSeeds(const fs::path& dir) {
  const std::string tables =
      BlobBytes({EncodeTableSpec(SparseS()), EncodeTableSpec(TableSpec::Dense("small", 1000))});
  auto manifest = [](int rank, int servers, int lanes) {
    return BlobBytes(
        {std::to_string(rank), std::to_string(servers), "0", std::to_string(lanes), "1700000000"});
  };
  auto marker = [](int version, const char* kind, int base, int servers) {
    return "tessera export\nversion " + std::to_string(version) + "\nkind " + kind + "\nbase " +
           std::to_string(base) + "\nservers " + std::to_string(servers) + "\n";
  };
  ExportSeed full(0);
  full.Text(0, "1\n")
      .Text(1, marker(1, "full", 0, 2))
      .Checksummed(2, tables)
      .Checksummed(3, manifest(0, 2, 2))
      .Checksummed(4, LaneFile(1, 3, true))
      .Checksummed(5, LaneFile(100, 2, false))
      .Checksummed(6, tables)
      .Checksummed(7, manifest(1, 2, 1))
      .Checksummed(8, LaneFile(200, 2, false));
  Put(dir, "export-full-two-servers", full.str());
  ExportSeed chain(0);
  chain.Text(0, "3\n")
      .Text(1, marker(1, "full", 0, 1))
      .Checksummed(2, tables)
      .Checksummed(3, manifest(0, 1, 1))
      .Checksummed(4, LaneFile(1, 2, true))
      .Text(9, marker(2, "delta", 1, 1))
      .Checksummed(10, tables)
      .Checksummed(11, manifest(0, 1, 1))
      .Checksummed(12, LaneFile(2, 2, false))
      .Text(13, marker(3, "delta", 2, 1))
      .Checksummed(14, tables)
      .Checksummed(15, manifest(0, 1, 1))
      .Checksummed(16, LaneFile(3, 1, false));
  Put(dir, "export-full-and-two-deltas", chain.str());
  ExportSeed v2(2);
  v2.Text(1, marker(1, "full", 0, 1))
      .Checksummed(2, tables)
      .Checksummed(3, manifest(0, 1, 1))
      .Checksummed(4, LaneFile(1, 1, true))
      .Text(9, marker(2, "delta", 1, 1))
      .Checksummed(10, tables)
      .Checksummed(11, manifest(0, 1, 1))
      .Checksummed(12, LaneFile(5, 1, false));
  Put(dir, "export-open-version-2", v2.str());
}

// ---- server_request: messages (tag byte < 0x80: raw frames as chunks; >= 0x80: structured).
void ServerSeeds(const fs::path& dir) {
  auto raw = [](fuzz::FuzzOutput& out, const std::vector<std::string>& frames) {
    out.U8(static_cast<uint8_t>(frames.size() - 1));
    for (const auto& f : frames) out.Chunk(f);
  };
  const std::vector<Request> requests = ClientRequests();
  for (const Request& r : requests) {
    fuzz::FuzzOutput out;
    raw(out, r.frames);
    Put(dir, "raw-" + r.name, out.str());
  }
  // A session: tables, pushes, pulls at clocks, a barrier of two, a checkpoint at a cut that
  // the clocks reach, a restore of it, an export and a delta.
  fuzz::FuzzOutput session;
  for (const Request& r : requests) raw(session, r.frames);
  Put(dir, "raw-session", session.str());
  // Structured: a tag, the op, then zeros (small defaults) or a few set fields.
  for (uint8_t op = 0; op <= kMaxOp + 1; ++op) {
    fuzz::FuzzOutput out;
    out.U8(0x80).U8(op).U32(op).U8(0).U8(1).U8(0).U8(3);
    Put(dir, "structured-op-" + std::to_string(op), out.str());
  }
}

// DataFrame kinds of fuzz_server_request.cc: keys the server owns / backs up (a u16 base
// follows), values, a raw chunk.
constexpr uint8_t kOwnedKeys = 1, kBackedKeys = 37, kValues = 2, kRawChunk = 4;

// ---- server_map (fuzz_server_request.cc with TESSERA_FUZZ_FOLLOW_MAP): structured messages
// with the fencing fields, and map changes (tag 0x7f).
void ServerMapSeeds(const fs::path& dir) {
  // A structured message on table "s" (count keys, no wide fields): mv 0 = the server's map
  // version, 1 = one behind, 2 = one ahead; from / origin = a server id + 1 (0: a client).
  auto message = [](fuzz::FuzzOutput& out, Op op, uint32_t id, uint8_t count, uint8_t mv,
                     uint8_t from, uint8_t origin, const std::string& name,
                     const std::vector<uint8_t>& frame_kinds) {
    out.U8(0x80).U8(static_cast<uint8_t>(op)).U32(id).U8(0).U8(1).U8(0).U8(count);
    out.U16(0).U8(0).U8(1).U8(0).U8(1).Chunk(name);
    if (op == Op::kCreateTable) out.U8(0);
    out.U8(mv).U8(from).U8(origin).U8(static_cast<uint8_t>(frame_kinds.size()));
    for (uint8_t kind : frame_kinds) {
      out.U8(kind);
      if (kind == kOwnedKeys || kind == kBackedKeys) out.U16(static_cast<uint16_t>(id * 97));
    }
  };
  // A map change: version step, one run of `len` slots from `start` given primary p, backup b,
  // importing source imp (3: none), dense backups kept.
  auto map_change = [](fuzz::FuzzOutput& out, uint8_t step, uint16_t start, uint16_t len,
                       uint8_t p, uint8_t b, uint8_t imp) {
    out.U8(0x7f).U8(step).U8(1).U16(start).U16(len).U8(p).U8(b).U8(imp).U8(0);
  };
  struct Seed {
    const char* name;
    Op op;
    uint8_t mv, from, origin;
    std::vector<uint8_t> frames;
    const char* admin_name;
  };
  const std::vector<Seed> seeds = {
      {"forwarded-push-from-server-0", Op::kSparsePush, 0, 1, 1, {kBackedKeys, kValues}, ""},
      {"forwarded-push-old-version", Op::kSparsePush, 1, 1, 1, {kBackedKeys, kValues}, ""},
      {"forwarded-push-future-version", Op::kSparsePush, 2, 1, 1, {kBackedKeys, kValues}, ""},
      {"push-to-own-slots", Op::kSparsePush, 0, 0, 0, {kOwnedKeys, kValues}, ""},
      {"push-rerouted-from-dead-server-2", Op::kSparsePush, 0, 0, 3, {kOwnedKeys, kValues}, ""},
      {"push-stale-version", Op::kSparsePush, 1, 0, 0, {kOwnedKeys, kValues}, ""},
      {"pull-future-version", Op::kSparsePull, 2, 0, 0, {kOwnedKeys}, ""},
      {"forwarded-dense-push", Op::kDensePush, 0, 1, 1, {kValues}, ""},
      {"slot-export", Op::kSlotExport, 0, 0, 0, {kValues}, ""},
      {"slot-import", Op::kSlotImport, 0, 0, 0, {kValues, kRawChunk}, ""},
      {"slot-drop", Op::kSlotDrop, 0, 0, 0, {kValues}, ""},
      {"checkpoint", Op::kCheckpoint, 0, 0, 0, {}, "cp1"},
  };
  uint32_t id = 1;
  fuzz::FuzzOutput session;
  for (const Seed& s : seeds) {
    fuzz::FuzzOutput out;
    message(out, s.op, id, 4, s.mv, s.from, s.origin, s.admin_name, s.frames);
    message(session, s.op, id, 4, s.mv, s.from, s.origin, s.admin_name, s.frames);
    ++id;
    Put(dir, s.name, out.str());
  }
  // Server 1's first slots move to server 2 with server 0 as the source, then back.
  map_change(session, 1, kNumSlots / 3, 512, 2, 0, 0);
  message(session, Op::kSparsePush, id++, 4, 0, 0, 0, "", {kOwnedKeys, kValues});
  message(session, Op::kSparsePush, id++, 4, 1, 1, 1, "", {kBackedKeys, kValues});
  map_change(session, 1, kNumSlots / 3, 512, 1, 3, 3);
  Put(dir, "session-with-map-changes", session.str());
  fuzz::FuzzOutput same;
  map_change(same, 0, 0, 4096, 1, 2, 0);  // version step 0: the server ignores it
  Put(dir, "map-change-same-version", same.str());
  fuzz::FuzzOutput promote;
  map_change(promote, 1, 0, 4096, 1, 3, 3);  // server 0's first slots promoted to server 1
  message(promote, Op::kSparsePush, 1, 4, 0, 0, 1, "", {kOwnedKeys, kValues});
  Put(dir, "promotion-then-rerouted-push", promote.str());
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR (tests/fuzz/corpus)\n", argv[0]);
    return 2;
  }
  const std::filesystem::path root = argv[1];
  tessera::EnvelopeSeeds(root / "envelope");
  tessera::RecordFileSeeds(root / "record_file");
  tessera::ExportSeeds(root / "export_reader");
  tessera::ServerSeeds(root / "server_request");
  tessera::ServerMapSeeds(root / "server_map");
  std::printf("seeds written under %s\n", argv[1]);
  return 0;
}
