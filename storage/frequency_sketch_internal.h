// How often keys were seen lately, for the memory tier's admission (TinyLFU, Einziger, Friedman
// and Manes 2017): a count-min sketch of 4-bit counters that halves itself every so many
// additions, so that it follows a changing hot set.
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "storage/prefetch_internal.h"

namespace tessera::internal {

/// Approximate access counts of up to about `capacity` keys of interest (the rows a memory tier
/// holds). A key is a 64-bit hash (well mixed: Mix64 of the key); it owns four 4-bit counters in
/// one 64-byte block, so an Add or Estimate touches one cache line. Estimate is the smallest of
/// the four (never below the true count of the last period, at most 15; collisions only raise
/// it). After 10 x capacity additions every counter is halved (aging). 8 bytes per capacity key.
/// Not thread-safe: one lane uses it.
class FrequencySketch {
 public:
  explicit FrequencySketch(size_t capacity)
      : words_(std::bit_ceil(std::max<size_t>(capacity, 512)), 0),
        block_mask_(words_.size() / kBlockWords - 1),
        period_(10 * std::max<size_t>(capacity, 512)) {}

  /// Counts one access of `hash`.
  void Add(uint64_t hash) {
    uint64_t* block = &words_[(hash & block_mask_) * kBlockWords];
    bool changed = false;
    for (int i = 0; i < 4; ++i) {
      uint64_t& w = block[Word(hash, i)];
      const int shift = Shift(hash, i);
      if (((w >> shift) & 0xf) != 0xf) {
        w += uint64_t{1} << shift;
        changed = true;
      }
    }
    if (changed && ++adds_ >= period_) Age();
  }

  /// Starts loading the counters of `hash` (an Add of it soon after finds them in cache).
  void Prefetch(uint64_t hash) const {
    PrefetchLine(&words_[(hash & block_mask_) * kBlockWords]);
  }

  /// The key's count in the current period (halved once per period), 0..15.
  uint32_t Estimate(uint64_t hash) const {
    const uint64_t* block = &words_[(hash & block_mask_) * kBlockWords];
    uint32_t m = 15;
    for (int i = 0; i < 4; ++i) {
      m = std::min(m, static_cast<uint32_t>((block[Word(hash, i)] >> Shift(hash, i)) & 0xf));
    }
    return m;
  }

  size_t MemoryBytes() const { return words_.size() * sizeof(uint64_t) + sizeof(*this); }

 private:
  static constexpr size_t kBlockWords = 8;  // 64 bytes
  // Counter i of a key: one of the block's 8 words, one of that word's 16 nibbles (hash bits
  // above those that chose the block).
  // Blocks take the low bits (at most 2^29 of them), so these bits are the block's own.
  static size_t Word(uint64_t hash, int i) { return (hash >> (32 + 3 * i)) & 7; }
  static int Shift(uint64_t hash, int i) {
    return static_cast<int>((hash >> (44 + 4 * i)) & 0xf) * 4;
  }

  void Age() {
    for (uint64_t& w : words_) w = (w >> 1) & 0x7777777777777777ULL;
    adds_ /= 2;
  }

  std::vector<uint64_t> words_;
  size_t block_mask_;
  size_t period_;
  size_t adds_ = 0;
};

}  // namespace tessera::internal
