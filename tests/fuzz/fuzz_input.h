// The byte formats the fuzz targets read, shared by the targets (FuzzInput) and the seed
// generator (FuzzOutput), and the file helpers the file-reading targets use.
//
// A fuzz input is read front to back as little-endian fields; a read past the end yields zeros
// (an empty view for bytes), so every input is a valid one. A "chunk" is a u16 length followed
// by that many bytes: the unit the targets use for a frame or a file.
#pragma once

#include <unistd.h>
#include <xxhash.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>

namespace tessera::fuzz {

/// Reads fields from the fuzzer's bytes. Not thread-safe; borrows the bytes.
class FuzzInput {
 public:
  FuzzInput(const uint8_t* data, size_t size) : p_(data), left_(size) {}
  bool empty() const { return left_ == 0; }
  uint8_t U8() { return static_cast<uint8_t>(Int(1)); }
  uint16_t U16() { return static_cast<uint16_t>(Int(2)); }
  uint32_t U32() { return static_cast<uint32_t>(Int(4)); }
  uint64_t U64() { return Int(8); }
  /// Up to `n` bytes (fewer at the end of the input).
  std::string_view Bytes(size_t n) {
    n = n < left_ ? n : left_;
    std::string_view v(reinterpret_cast<const char*>(p_), n);
    p_ += n;
    left_ -= n;
    return v;
  }
  /// A u16 length, then up to that many bytes.
  std::string_view Chunk() { return Bytes(U16()); }

 private:
  uint64_t Int(size_t n) {
    uint64_t v = 0;
    for (size_t i = 0; i < n && left_ > 0; ++i, ++p_, --left_) v |= uint64_t{*p_} << (8 * i);
    return v;
  }
  const uint8_t* p_;
  size_t left_;
};

/// Writes what FuzzInput reads (for seed inputs).
class FuzzOutput {
 public:
  FuzzOutput& U8(uint8_t v) { return Int(v, 1); }
  FuzzOutput& U16(uint16_t v) { return Int(v, 2); }
  FuzzOutput& U32(uint32_t v) { return Int(v, 4); }
  FuzzOutput& U64(uint64_t v) { return Int(v, 8); }
  FuzzOutput& Bytes(std::string_view b) {
    out_.append(b);
    return *this;
  }
  /// Chunks hold at most 65535 bytes; longer data is cut.
  FuzzOutput& Chunk(std::string_view b) {
    b = b.substr(0, 0xffff);
    U16(static_cast<uint16_t>(b.size()));
    return Bytes(b);
  }
  const std::string& str() const { return out_; }

 private:
  FuzzOutput& Int(uint64_t v, size_t n) {
    for (size_t i = 0; i < n; ++i) out_.push_back(static_cast<char>(v >> (8 * i)));
    return *this;
  }
  std::string out_;
};

/// `body` followed by its XXH3-64, as record and blob files end (ps/record_file.cc): the
/// targets add it so that mutated files get past the checksum to the parser.
inline std::string WithChecksum(std::string_view body) {
  std::string out(body);
  const uint64_t h = XXH3_64bits(body.data(), body.size());
  out.append(reinterpret_cast<const char*>(&h), sizeof(h));
  return out;
}

/// Replaces `path` with `data` (no fsync: scratch files). False on failure.
inline bool WriteScratchFile(const std::string& path, std::string_view data) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return false;
  const bool ok = std::fwrite(data.data(), 1, data.size(), f) == data.size();
  return (std::fclose(f) == 0) && ok;
}

/// A directory for one process's scratch files, on tmpfs when there is one, named after the
/// target and the process id (parallel fuzzing jobs do not share it); removed with the object
/// (a static one goes when the fuzzer exits normally). Not thread-safe.
class ScratchDir {
 public:
  explicit ScratchDir(const char* target) {
    std::error_code ec;
    std::filesystem::path base = "/dev/shm";
    if (!std::filesystem::is_directory(base, ec)) base = std::filesystem::temp_directory_path(ec);
    path_ =
        (base / ("tessera-fuzz-" + std::string(target) + "-" + std::to_string(getpid()))).string();
    std::filesystem::create_directories(path_, ec);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace tessera::fuzz
