// On-disk encoding of keys and rows in the RocksDB engine (documented in docs/storage.md).
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "ps/routing.h"
#include "ps/status.h"
#include "storage/storage.h"

namespace tessera::internal {

static_assert(std::endian::native == std::endian::little,
              "rows are stored as little-endian floats; big-endian hosts need a byte swap");

/// Sparse key: 2-byte big-endian slot, then the 8-byte big-endian key. Rows of one slot are
/// contiguous (a lane or a slot migration reads a key range) and in key order inside a slot.
inline constexpr size_t kSparseKeyBytes = 10;
/// Dense key: the 8-byte big-endian chunk number.
inline constexpr size_t kDenseKeyBytes = 8;
/// RowMeta on disk: update_count, last_step, last_update_s, little-endian uint32 each.
inline constexpr size_t kMetaBytes = 12;

inline void PutBigEndian64(uint64_t v, char* out) {
  for (int i = 7; i >= 0; --i) {
    out[i] = static_cast<char>(v & 0xff);
    v >>= 8;
  }
}
inline uint64_t GetBigEndian64(const char* in) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = (v << 8) | static_cast<uint8_t>(in[i]);
  return v;
}

struct SparseKey {
  char bytes[kSparseKeyBytes];
  std::string_view view() const { return {bytes, kSparseKeyBytes}; }
};
inline SparseKey EncodeSparseKey(uint64_t key) {
  SparseKey k;
  const uint32_t slot = SlotOfKey(key);
  k.bytes[0] = static_cast<char>(slot >> 8);
  k.bytes[1] = static_cast<char>(slot & 0xff);
  PutBigEndian64(key, k.bytes + 2);
  return k;
}
/// The first key of slot `slot` (a 2-byte prefix).
inline std::string SlotPrefix(uint32_t slot) {
  return std::string{static_cast<char>(slot >> 8), static_cast<char>(slot & 0xff)};
}
/// Decodes a stored sparse key; false if it is malformed (wrong size or slot).
inline bool DecodeSparseKey(std::string_view in, uint64_t* key) {
  if (in.size() != kSparseKeyBytes) return false;
  *key = GetBigEndian64(in.data() + 2);
  const uint32_t slot = (uint32_t{static_cast<uint8_t>(in[0])} << 8) | static_cast<uint8_t>(in[1]);
  return SlotOfKey(*key) == slot;
}

struct DenseKey {
  char bytes[kDenseKeyBytes];
  std::string_view view() const { return {bytes, kDenseKeyBytes}; }
};
inline DenseKey EncodeDenseKey(uint64_t chunk) {
  DenseKey k;
  PutBigEndian64(chunk, k.bytes);
  return k;
}

/// Bytes of a stored row of `floats` floats (value + state).
inline size_t RowBytes(uint32_t floats) { return size_t{floats} * sizeof(float) + kMetaBytes; }

/// Writes the row (floats, then meta) to out[0 .. RowBytes(floats)).
inline void EncodeRowTo(const float* row, uint32_t floats, const RowMeta& meta, char* out) {
  std::memcpy(out, row, size_t{floats} * sizeof(float));
  out += size_t{floats} * sizeof(float);
  std::memcpy(out, &meta.update_count, 4);
  std::memcpy(out + 4, &meta.last_step, 4);
  std::memcpy(out + 8, &meta.last_update_s, 4);
}

/// Replaces `out` with the encoded row.
inline void EncodeRow(const float* row, uint32_t floats, const RowMeta& meta, std::string* out) {
  out->resize(RowBytes(floats));
  EncodeRowTo(row, floats, meta, out->data());
}

/// Decodes a stored row; Corruption (naming `what`) unless it has exactly the expected size.
[[nodiscard]] inline Status DecodeRow(std::string_view in, uint32_t floats, float* row,
                                      RowMeta* meta, std::string_view what) {
  if (in.size() != RowBytes(floats)) {
    return Status::Corruption(std::string(what) + ": stored row has " + std::to_string(in.size()) +
                              " bytes, expected " + std::to_string(RowBytes(floats)));
  }
  const char* p = in.data();
  std::memcpy(row, p, size_t{floats} * sizeof(float));
  p += size_t{floats} * sizeof(float);
  std::memcpy(&meta->update_count, p, 4);
  std::memcpy(&meta->last_step, p + 4, 4);
  std::memcpy(&meta->last_update_s, p + 8, 4);
  return Status::OK();
}

}  // namespace tessera::internal
