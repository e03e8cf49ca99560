// The request log's record and segment formats (log_record_internal.h).
#include "storage/log_record_internal.h"

#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack
#include <xxhash.h>

#include <cstring>

#include "storage/log_file_internal.h"

namespace tessera::internal {
namespace {

uint64_t Seed(uint64_t seq, uint64_t len) { return seq ^ (len << 32); }

}  // namespace

uint64_t SplitMix64(uint64_t* state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Whether every byte of `data` is zero: the preallocated, never written tail of a segment.
bool AllZero(std::string_view data) {
  return data.empty() ||
         (data[0] == 0 && std::memcmp(data.data(), data.data() + 1, data.size() - 1) == 0);
}

Result<SegmentFormat> ReadSegmentFormat(std::string_view data, const std::string& path) {
  uint32_t magic = 0, version = 0;
  if (data.size() >= 4) std::memcpy(&magic, data.data(), 4);
  if (magic != LogFile::kSegmentMagic) return SegmentFormat{};
  SegmentFormat f{0, LogFile::kSegmentHeaderBytes};
  if (data.size() >= LogFile::kSegmentHeaderBytes) {
    std::memcpy(&version, data.data() + 4, 4);
    std::memcpy(&f.nonce, data.data() + 8, 8);
  }
  if (version != 2 || f.nonce == 0) {
    return Status::Corruption("request log " + path + ": a segment header of version " +
                              std::to_string(version) + " and nonce " + std::to_string(f.nonce) +
                              " (this build reads version 2)");
  }
  return f;
}

void EncodeSegmentHeader(uint64_t nonce, char* h) {
  const uint32_t magic = LogFile::kSegmentMagic, version = 2;
  std::memcpy(h, &magic, 4);
  std::memcpy(h + 4, &version, 4);
  std::memcpy(h + 8, &nonce, 8);
}

// XORs `nonce` into the stored checksum of every record of `data` (whole records, headers
// included): they then verify in a segment of that nonce.
void SealRecords(char* data, size_t n, uint64_t nonce) {
  for (size_t off = 0; nonce != 0 && off + LogFile::kHeaderBytes <= n;) {
    uint32_t len;
    uint64_t sum;
    std::memcpy(&len, data + off + 4, 4);
    std::memcpy(&sum, data + off + 16, 8);
    sum ^= nonce;
    std::memcpy(data + off + 16, &sum, 8);
    off += LogFile::kHeaderBytes + len;
  }
}

uint64_t Checksum(uint64_t seq, std::string_view payload) {
  return XXH3_64bits_withSeed(payload.data(), payload.size(), Seed(seq, payload.size()));
}

// The same as Checksum() of the parts put together.
uint64_t Checksum(uint64_t seq, std::span<const std::string_view> parts, uint64_t len) {
  XXH3_state_t state;
  XXH3_64bits_reset_withSeed(&state, Seed(seq, len));
  for (std::string_view p : parts) XXH3_64bits_update(&state, p.data(), p.size());
  return XXH3_64bits_digest(&state);
}

void EncodeHeader(uint64_t seq, uint32_t len, uint64_t sum, char* h) {
  const uint32_t magic = LogFile::kMagic;
  std::memcpy(h, &magic, 4);
  std::memcpy(h + 4, &len, 4);
  std::memcpy(h + 8, &seq, 8);
  std::memcpy(h + 16, &sum, 8);
}

// The record that starts at `off` of `data`, when its header and checksum verify; otherwise
// what is wrong in `*what` (when given).
std::optional<VerifiedRecord> VerifiedRecordAt(std::string_view data, size_t off, uint64_t nonce,
                                               std::string* what) {
  auto bad = [&](const char* why) -> std::optional<VerifiedRecord> {
    if (what != nullptr) *what = why;
    return std::nullopt;
  };
  if (data.size() - off < LogFile::kHeaderBytes) return bad("a header cut short");
  uint32_t magic, len;
  uint64_t seq, sum;
  std::memcpy(&magic, data.data() + off, 4);
  std::memcpy(&len, data.data() + off + 4, 4);
  std::memcpy(&seq, data.data() + off + 8, 8);
  std::memcpy(&sum, data.data() + off + 16, 8);
  const bool hole = magic == LogFile::kHoleMagic;
  if ((magic != LogFile::kMagic && !hole) || (hole && len != 0)) {
    return bad("not a record header");
  }
  if (len > data.size() - off - LogFile::kHeaderBytes) return bad("a record cut short");
  const std::string_view payload(data.data() + off + LogFile::kHeaderBytes, len);
  if ((Checksum(seq, payload) ^ nonce) != sum) return bad("checksum mismatch");
  return VerifiedRecord{seq, LogFile::kHeaderBytes + len, hole, payload};
}

// The offset of the first record at or after `from` whose header and checksum verify (a
// 64-bit checksum over the seq, length and payload: damage does not pass for a record), or
// npos.
size_t NextVerifiedRecord(std::string_view data, size_t from, uint64_t nonce) {
  // Both magics start with these bytes (little-endian "TSL").
  constexpr std::string_view kPrefix("TSL", 3);
  for (size_t at = data.find(kPrefix, from); at != std::string_view::npos;
       at = data.find(kPrefix, at + 1)) {
    if (VerifiedRecordAt(data, at, nonce)) return at;
  }
  return std::string_view::npos;
}

void EncodeHole(uint64_t seq, uint64_t nonce, char* h) {
  EncodeHeader(seq, 0, Checksum(seq, std::string_view()) ^ nonce, h);
  const uint32_t magic = LogFile::kHoleMagic;
  std::memcpy(h, &magic, 4);
}

}  // namespace tessera::internal
