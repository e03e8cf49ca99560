#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

#include "ps/read_file_internal.h"
#include "ps/record_file_internal.h"

namespace tessera::internal {
namespace {

constexpr char kMagic[8] = {'T', 'S', 'S', 'N', 'A', 'P', '0', '1'};
constexpr uint32_t kMaxRowFloats = 1u << 24;

}  // namespace

// Buffered writer that hashes what it writes.
class Writer {
 public:
  explicit Writer(const std::string& path) : path_(path) {
    f_ = std::fopen(path.c_str(), "wb");
    XXH3_64bits_reset(state_.get());
  }
  // Writes into memory instead of a file.
  explicit Writer(std::string* sink) : path_("(memory)"), sink_(sink) {
    XXH3_64bits_reset(state_.get());
  }
  ~Writer() {
    if (f_) std::fclose(f_);
  }
  bool ok() const { return (f_ != nullptr || sink_ != nullptr) && ok_; }
  // Records are small: gather them and hash and write in large blocks.
  void Put(const void* p, size_t n) {
    if (!ok()) return;
    if (sink_ != nullptr) {  // hashed once, at Finish
      sink_->append(static_cast<const char*>(p), n);
      return;
    }
    buf_.append(static_cast<const char*>(p), n);
    if (buf_.size() >= kBlock) Drain();
  }
  void Drain() {
    if (buf_.empty() || !ok()) return;
    XXH3_64bits_update(state_.get(), buf_.data(), buf_.size());
    if (sink_ != nullptr) {
      sink_->append(buf_);
    } else {
      ok_ = std::fwrite(buf_.data(), 1, buf_.size(), f_) == buf_.size();
      unsynced_ += buf_.size();
      if (ok_ && unsynced_ >= kSyncEvery) StartWriteback();
    }
    buf_.clear();
  }
  // Starts writing the last kSyncEvery bytes to disk without waiting: a large file then never
  // piles up as dirty pages that the kernel writes all at once, throttling every other writer
  // of the machine (the server's request log) meanwhile. Finish() still fsyncs.
  void StartWriteback() {
    ok_ = std::fflush(f_) == 0;
    const off_t end = ftello(f_);
    if (ok_ && end > 0) {
      (void)sync_file_range(fileno(f_), end - static_cast<off_t>(unsynced_),
                            static_cast<off_t>(unsynced_), SYNC_FILE_RANGE_WRITE);
    }
    unsynced_ = 0;
  }
  template <typename T>
  void Put(const T& v) {
    Put(&v, sizeof(T));
  }
  Status Finish(uint64_t records) {
    const uint8_t end = Record::kEnd;
    Put(end);
    Put(records);
    Drain();
    if (sink_ != nullptr) XXH3_64bits_update(state_.get(), sink_->data(), sink_->size());
    uint64_t h = XXH3_64bits_digest(state_.get());
    if (sink_ != nullptr) {
      if (ok_) sink_->append(reinterpret_cast<const char*>(&h), sizeof(h));
      return ok_ ? Status::OK() : Status::Internal("record buffer error");
    }
    if (ok()) ok_ = std::fwrite(&h, 1, sizeof(h), f_) == sizeof(h);
    if (ok()) ok_ = std::fflush(f_) == 0 && fsync(fileno(f_)) == 0;
    if (f_ && std::fclose(f_) != 0) ok_ = false;
    f_ = nullptr;
    if (!ok_) {
      return Status::IOError("cannot write record file '" + path_ + "': " + std::strerror(errno));
    }
    return Status::OK();
  }

 private:
  static constexpr size_t kBlock = 1 << 20;
  static constexpr size_t kSyncEvery = size_t{8} << 20;
  std::string path_;
  std::string* sink_ = nullptr;
  FILE* f_ = nullptr;
  bool ok_ = true;
  size_t unsynced_ = 0;  // bytes written since the last StartWriteback
  std::string buf_;
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> state_{XXH3_createState(),
                                                                  &XXH3_freeState};
};

RecordWriter::RecordWriter(const std::string& path) : w_(std::make_unique<Writer>(path)) {
  if (w_->ok()) w_->Put(kMagic, sizeof(kMagic));
}
RecordWriter::RecordWriter(std::string* sink) : w_(std::make_unique<Writer>(sink)) {
  w_->Put(kMagic, sizeof(kMagic));
}

Status WriteFileDurably(const std::string& path, std::string_view data) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return Status::IOError("cannot create '" + path + "': " + std::strerror(errno));
  bool ok = std::fwrite(data.data(), 1, data.size(), f) == data.size();
  ok = ok && std::fflush(f) == 0 && fsync(fileno(f)) == 0;
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) return Status::IOError("cannot write '" + path + "': " + std::strerror(errno));
  return Status::OK();
}
RecordWriter::~RecordWriter() = default;
bool RecordWriter::ok() const { return w_->ok(); }

void RecordWriter::Put(Record::Kind kind, uint64_t table, uint64_t key, const RecordMeta& meta,
                       const float* row, uint32_t n) {
  // One append for the fixed part: kind, table, key, n, update_count, last_step, last_update_s.
  char head[1 + 8 + 8 + 4 + 4 + 4 + 4];
  char* p = head;
  *p++ = static_cast<char>(kind);
  for (auto [src, len] : {std::pair<const void*, size_t>{&table, 8},
                          {&key, 8},
                          {&n, 4},
                          {&meta.update_count, 4},
                          {&meta.last_step, 4},
                          {&meta.last_update_s, 4}}) {
    std::memcpy(p, src, len);
    p += len;
  }
  w_->Put(head, sizeof(head));
  w_->Put(row, sizeof(float) * n);
  ++records_;
}

Status RecordWriter::Finish() { return w_->Finish(records_); }

namespace {

// Pass 1 of ReadRecordFile: the checksum over the whole file, before anything is applied.
// Returns the file's size.
// Opens a record file to read, never blocking (read_file_internal.h).
Result<FILE*> OpenRecordFile(const std::string& path, const std::string& inside) {
  TESSERA_ASSIGN_OR_RETURN(auto file, OpenRegularFile(path, ReadFileOptions{.inside = inside}));
  FILE* f = ::fdopen(file->fd(), "rb");
  if (!f) return Status::IOError("cannot open record file '" + path + "': " + std::strerror(errno));
  file->Release();
  return f;
}

Result<uint64_t> VerifyRecordFile(const std::string& path, const std::string& inside) {
  TESSERA_ASSIGN_OR_RETURN(FILE* f, OpenRecordFile(path, inside));
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> st(XXH3_createState(), &XXH3_freeState);
  XXH3_64bits_reset(st.get());
  // 64 KiB: a 1 MiB buffer cost a fresh zero-filled MiB per file, most of them small
  // (manifests, specs) and read a hundred times a second under fuzzing.
  std::vector<char> buf(1 << 16);
  std::string tail;  // the last 8 bytes are the checksum itself
  size_t n;
  uint64_t total = 0;
  while ((n = std::fread(buf.data(), 1, buf.size(), f)) > 0) {
    tail.append(buf.data(), n);
    total += n;
    if (tail.size() > 8) {
      XXH3_64bits_update(st.get(), tail.data(), tail.size() - 8);
      tail.erase(0, tail.size() - 8);
    }
  }
  std::fclose(f);
  if (total < sizeof(kMagic) + 1 + 8 + 8 || tail.size() != 8) {
    return Status::Corruption("record file '" + path + "' is truncated");
  }
  uint64_t want;
  std::memcpy(&want, tail.data(), 8);
  if (XXH3_64bits_digest(st.get()) != want) {
    return Status::Corruption("record file '" + path + "' fails its checksum");
  }
  return total;
}

}  // namespace

Status ReadRecordFile(const std::string& path, const std::function<Status(const Record&)>& fn,
                      const std::string& inside) {
  TESSERA_ASSIGN_OR_RETURN(const uint64_t file_size, VerifyRecordFile(path, inside));
  // Pass 2: parse.
  TESSERA_ASSIGN_OR_RETURN(FILE* f, OpenRecordFile(path, inside));
  std::unique_ptr<FILE, decltype(&std::fclose)> closer(f, &std::fclose);
  uint64_t pos = 0;
  auto read = [&](void* p, size_t n) {
    const bool ok = std::fread(p, 1, n, f) == n;
    pos += n;
    return ok;
  };
  char magic[8];
  if (!read(magic, 8) || std::memcmp(magic, kMagic, 8) != 0) {
    return Status::Corruption("'" + path + "' is not a Tessera record file");
  }
  Record r;
  uint64_t records = 0;
  for (;;) {
    uint8_t kind;
    if (!read(&kind, 1)) return Status::Corruption("record file '" + path + "' is truncated");
    if (kind == Record::kEnd) {
      uint64_t count;
      if (!read(&count, 8) || count != records) {
        return Status::Corruption("record file '" + path + "' record count mismatch");
      }
      return Status::OK();
    }
    if (kind != Record::kSparseRow && kind != Record::kDenseChunk) {
      return Status::Corruption("record file '" + path + "' has a record of unknown kind");
    }
    uint32_t n;
    r.kind = static_cast<Record::Kind>(kind);
    if (!read(&r.table_id, 8) || !read(&r.key, 8) || !read(&n, 4) ||
        !read(&r.meta.update_count, 4) || !read(&r.meta.last_step, 4) ||
        !read(&r.meta.last_update_s, 4) || n > kMaxRowFloats) {
      return Status::Corruption("record file '" + path + "' has a malformed record");
    }
    // A row cannot be longer than what is left before the end record and checksum (no
    // allocation sized by a corrupt length).
    if (pos + uint64_t{n} * sizeof(float) + 1 + 8 + 8 > file_size) {
      return Status::Corruption("record file '" + path + "' has a row of " + std::to_string(n) +
                                " floats that runs past the end of the file");
    }
    r.row.resize(n);
    if (!read(r.row.data(), sizeof(float) * n)) {
      return Status::Corruption("record file '" + path + "' is truncated");
    }
    ++records;
    TESSERA_RETURN_IF_ERROR(fn(r));
  }
}

Status WriteBlobs(const std::string& path, const std::vector<std::string>& blobs) {
  Writer w(path);
  if (!w.ok()) return Status::IOError("cannot create '" + path + "': " + std::strerror(errno));
  w.Put(kMagic, sizeof(kMagic));
  for (const auto& b : blobs) {
    // Reuse the record layout: kind 1, no table, key = blob index.
    const uint32_t n = static_cast<uint32_t>(b.size());
    w.Put(uint8_t{1});
    w.Put(n);
    w.Put(b.data(), b.size());
  }
  return w.Finish(blobs.size());
}

Result<std::vector<std::string>> ReadBlobs(const std::string& path, const std::string& inside) {
  TESSERA_ASSIGN_OR_RETURN(
      const std::string all,
      ReadRegularFile(path, ReadFileOptions{.inside = inside, .max_bytes = kMaxBlobFileBytes}));
  if (all.size() < 8 + 1 + 8 + 8 || std::memcmp(all.data(), kMagic, 8) != 0) {
    return Status::Corruption("'" + path + "' is not a Tessera blob file");
  }
  uint64_t want;
  std::memcpy(&want, all.data() + all.size() - 8, 8);
  if (XXH3_64bits(all.data(), all.size() - 8) != want) {
    return Status::Corruption("'" + path + "' fails its checksum");
  }
  std::vector<std::string> out;
  size_t pos = 8;
  const size_t end = all.size() - 8;
  while (pos < end) {
    uint8_t kind = static_cast<uint8_t>(all[pos++]);
    if (kind == 0) return out;
    uint32_t len;
    if (pos + 4 > end) break;
    std::memcpy(&len, all.data() + pos, 4);
    pos += 4;
    if (pos + len > end) break;
    out.emplace_back(all.data() + pos, len);
    pos += len;
  }
  return Status::Corruption("'" + path + "' is malformed");
}

}  // namespace tessera::internal
