// The request log's bytes on disk: record headers and checksums, the header of a reused segment,
// and finding records that verify (log_file_internal.h describes the format).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "ps/status.h"

namespace tessera::internal {

/// Steps `*state` and returns the next SplitMix64 value.
uint64_t SplitMix64(uint64_t* state);

/// Whether every byte of `data` is zero: the preallocated, never written tail of a segment.
bool AllZero(std::string_view data);

/// What a segment's first bytes say: a reused segment's header (u32 LogFile::kSegmentMagic, u32
/// version 2, u64 nonce, never 0) puts its records after it, with their stored checksums XOR'd
/// with the nonce, so the records the file held before (another nonce, or none: 0) never verify
/// in it. A segment without a header is version 1, nonce 0.
struct SegmentFormat {
  uint64_t nonce = 0;
  size_t start = 0;  // where its records start
};
/// Corruption (naming `path`) for a segment header of another version or a nonce of 0.
Result<SegmentFormat> ReadSegmentFormat(std::string_view data, const std::string& path);
void EncodeSegmentHeader(uint64_t nonce, char* h);

/// XORs `nonce` into the stored checksum of every record of `data` (whole records, headers
/// included, as Append and the relaxed mode's buffer hold them): they then verify in a segment of
/// that nonce. Nothing changes for nonce 0.
void SealRecords(char* data, size_t n, uint64_t nonce);

/// XXH3 of the payload seeded with seq and length: a record's checksum before the nonce.
uint64_t Checksum(uint64_t seq, std::string_view payload);
/// The same as Checksum() of the parts put together (`len`: their total size).
uint64_t Checksum(uint64_t seq, std::span<const std::string_view> parts, uint64_t len);
void EncodeHeader(uint64_t seq, uint32_t len, uint64_t sum, char* h);
/// A hole's header (magic LogFile::kHoleMagic, length 0) for a segment of `nonce`.
void EncodeHole(uint64_t seq, uint64_t nonce, char* h);

/// A record (or a hole) whose header and checksum verify.
struct VerifiedRecord {
  uint64_t seq = 0;
  uint64_t bytes = 0;  // header and payload
  bool hole = false;
  std::string_view payload;
};

/// The record that starts at `off` of `data` (a segment of `nonce`), when its header and checksum
/// verify; otherwise what is wrong in `*what` (when given).
std::optional<VerifiedRecord> VerifiedRecordAt(std::string_view data, size_t off, uint64_t nonce,
                                               std::string* what = nullptr);

/// The offset of the first record at or after `from` whose header and checksum verify in a
/// segment of `nonce` (a 64-bit checksum over the seq, length and payload: damage does not pass
/// for a record), or npos.
size_t NextVerifiedRecord(std::string_view data, size_t from, uint64_t nonce);

}  // namespace tessera::internal
