// The client's key dedup table: caller keys to unique indices, reused across calls.
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "ps/routing.h"

namespace tessera::internal {

/// An open-addressing (linear probing) map from key to a uint32 index, emptied in O(1) between
/// calls: an entry counts only while its stamp is the current call's. Debian's Abseil frees a
/// flat_hash_map's table on clear() above 127 slots, so the map this replaces was allocated and
/// page-faulted anew for every large request. Not thread-safe (one per calling thread).
class KeyIndex {
 public:
  /// Empties the map for a call of at most `n` keys: the table in use has at least 2n slots.
  void Reset(size_t n) {
    const size_t cap = std::bit_ceil(std::max<size_t>(16, 2 * n));
    if (cap > slots_.size()) {
      slots_.assign(cap, Slot{});
      stamp_ = 0;
    }
    mask_ = cap - 1;  // the first cap slots only: a small call stays in few cache lines
    if (++stamp_ == 0) {  // after 2^32 calls: forget every old stamp
      std::fill(slots_.begin(), slots_.end(), Slot{});
      stamp_ = 1;
    }
  }
  /// The index of `key`, inserting `next` when absent; second: whether it was inserted. At most
  /// the `n` of Reset() distinct keys.
  std::pair<uint32_t, bool> Insert(uint64_t key, uint32_t next) {
    for (size_t h = Mix64(key) & mask_;; h = (h + 1) & mask_) {
      Slot& s = slots_[h];
      if (s.stamp != stamp_) {
        s = Slot{key, next, stamp_};
        return {next, true};
      }
      if (s.key == key) return {s.index, false};
    }
  }

 private:
  struct Slot {
    uint64_t key = 0;
    uint32_t index = 0;
    uint32_t stamp = 0;  // 0: never used
  };
  std::vector<Slot> slots_;
  size_t mask_ = 0;
  uint32_t stamp_ = 0;
};

}  // namespace tessera::internal
