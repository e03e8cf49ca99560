// The client's key dedup: caller keys to unique indices, with a table reused across calls.
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "ps/routing.h"

namespace tessera::internal {

/// Whether `keys` are strictly increasing (so unique): one pass, stops at the first key not
/// above the one before it. Callers that already hold unique sorted keys skip the dedup.
inline bool StrictlyIncreasing(std::span<const uint64_t> keys) {
  for (size_t i = 1; i < keys.size(); ++i) {
    if (keys[i] <= keys[i - 1]) return false;
  }
  return true;
}

/// Dedupes the keys of a call: the unique keys in first-seen order, and for every caller key
/// the index of its unique key. An open-addressing (linear probing) table of 4-byte entries,
/// each a unique index + 1 (0: empty), compared through the unique keys it points to; sized
/// for the unique keys (the previous call's count gives the first guess; the table doubles
/// when half full), not for the caller's keys, and zeroed at the start of a call. For a Zipf
/// request of 100k keys (37% unique) that is 512 KiB instead of the 3 MiB a table of 2n
/// 16-byte (key, index, stamp) slots took, so most probes stay in the core's own caches
/// (benchmarks/bench_dedup.cc measures both). Not thread-safe (one per calling thread).
class KeyIndex {
 public:
  /// Replaces `unique_keys` with the distinct keys of `keys` in first-seen order and sets
  /// `unique_of[i]` to the index in it of keys[i] (`unique_of` holds keys.size() entries).
  void Dedupe(std::span<const uint64_t> keys, std::vector<uint64_t>* unique_keys,
              uint32_t* unique_of) {
    const size_t n = keys.size();
    unique_keys->clear();
    unique_keys->reserve(n);
    // A guess of the unique count: the last call's share of unique keys, at least 1/8.
    const size_t last = last_unique_ * n / std::max<size_t>(1, last_n_);
    const size_t guess = std::min(n, std::max(n / 8, last));
    Clear(std::bit_ceil(std::max<size_t>(16, 2 * guess + 2)));
    for (size_t i = 0; i < n; ++i) {
      const uint64_t key = keys[i];
      for (size_t h = Mix64(key) & mask_;; h = (h + 1) & mask_) {
        const uint32_t e = slots_[h];
        if (e == 0) {
          const uint32_t u = static_cast<uint32_t>(unique_keys->size());
          slots_[h] = u + 1;
          unique_keys->push_back(key);
          unique_of[i] = u;
          if (2 * (size_t{u} + 1) > mask_ + 1) Grow(*unique_keys);
          break;
        }
        if ((*unique_keys)[e - 1] == key) {
          unique_of[i] = e - 1;
          break;
        }
      }
    }
    last_n_ = n;
    last_unique_ = unique_keys->size();
  }

 private:
  // Empties the first `cap` (a power of two) entries and uses only those.
  void Clear(size_t cap) {
    if (cap > slots_.size()) slots_.resize(cap);
    std::memset(slots_.data(), 0, cap * sizeof(uint32_t));
    mask_ = cap - 1;
  }
  // Twice the entries, with every unique key so far entered again.
  void Grow(const std::vector<uint64_t>& unique_keys) {
    Clear(2 * (mask_ + 1));
    for (uint32_t u = 0; u < unique_keys.size(); ++u) {
      size_t h = Mix64(unique_keys[u]) & mask_;
      while (slots_[h] != 0) h = (h + 1) & mask_;
      slots_[h] = u + 1;
    }
  }

  std::vector<uint32_t> slots_;
  size_t mask_ = 0;
  size_t last_n_ = 0, last_unique_ = 0;
};

}  // namespace tessera::internal
