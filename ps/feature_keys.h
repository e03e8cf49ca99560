// Feature keys: categorical values as unbounded 64-bit keys with the field in the key. The hash
// that training (worker/) and online serving (examples/lookup_service) share: a key made here
// at serving time is the key the job trained. Header-only; part of the ps core (no link
// dependency).
#pragma once

#include <cstdint>
#include <string_view>

#include "ps/routing.h"

namespace tessera {

/// Bits of a key that hold the field id (the top bits). Fields are 0..kMaxFields-1.
inline constexpr uint32_t kFieldBits = 8;
inline constexpr uint32_t kMaxFields = 1u << kFieldBits;
inline constexpr uint64_t kValueMask = (uint64_t{1} << (64 - kFieldBits)) - 1;

/// The key of `value` in `field`: the field in the top 8 bits, a 56-bit hash of the value
/// below (no vocabulary, no modulo). `field` must be < kMaxFields. Pure function.
constexpr uint64_t MakeKey(uint32_t field, uint64_t value) {
  return (uint64_t{field} << (64 - kFieldBits)) |
         (Mix64(value ^ (uint64_t{field} * 0x9e3779b97f4a7c15ULL)) & kValueMask);
}

/// The field of a key made by MakeKey.
constexpr uint32_t FieldOfKey(uint64_t key) {
  return static_cast<uint32_t>(key >> (64 - kFieldBits));
}

/// A 64-bit hash of a byte string (FNV-1a followed by Mix64). Pure function.
constexpr uint64_t HashBytes(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (char c : s) {
    h ^= static_cast<uint8_t>(c);
    h *= 0x100000001b3ULL;
  }
  return Mix64(h);
}

/// The key of a string value of `field`.
constexpr uint64_t MakeStringKey(uint32_t field, std::string_view value) {
  return MakeKey(field, HashBytes(value));
}

}  // namespace tessera
