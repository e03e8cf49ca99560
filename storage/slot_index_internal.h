// The index of the memory tier's sparse rows: key -> slot in the row arena.
#pragma once

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "ps/routing.h"
#include "storage/huge_pages_internal.h"
#include "storage/index_seed_internal.h"
#include "storage/prefetch_internal.h"

namespace tessera::internal {

/// A hash map from a 64-bit key to a 32-bit slot: open addressing with linear probing over
/// 16-byte entries (key, slot, used), four to a cache line, so a lookup
/// costs one line in the common case where absl::flat_hash_map costs two (its control bytes
/// and its slot). The table doubles past 3/4 full; Erase shifts the entries after the erased one
/// back (no tombstones), so probes stay short after many deletions. Positions come from the low
/// bits of Mix64(key ^ seed): the slot and lane of a key use the top bits of Mix64(key), so the
/// keys one lane holds still spread over the whole table. Each table has its own seed: with one
/// hash for all, keys inserted in another table's order (a slot move or a restore filling a
/// table from a scan of another) arrive sorted by their home entry, pile up in one run that
/// every later insert walks, and filling takes quadratic time (600k rows: 2.2 s instead of
/// 0.11 s). Not thread-safe.
class SlotIndex {
 public:
  SlotIndex() : SlotIndex(NewIndexSeed()) {}
  /// With the given hash seed (0: positions from Mix64(key) alone).
  explicit SlotIndex(uint64_t seed) : seed_(seed) { Rehash(16); }

  size_t size() const { return size_; }
  /// Entries allocated (for memory accounting).
  size_t capacity() const { return entries_.size(); }

  /// The slot of `key`, or nullptr.
  const uint32_t* Find(uint64_t key) const {
    for (size_t h = Home(key);; h = (h + 1) & mask_) {
      const Entry& e = entries_[h];
      if (e.used == 0) return nullptr;
      if (e.key == key) return &e.slot;
    }
  }
  /// The slot of `key`, inserting `slot` when absent; second: whether it was inserted. The
  /// pointer is valid until the next insertion or erasure.
  std::pair<uint32_t*, bool> TryEmplace(uint64_t key, uint32_t slot) {
    if (4 * (size_ + 1) > 3 * entries_.size()) Rehash(2 * entries_.size());
    for (size_t h = Home(key);; h = (h + 1) & mask_) {
      Entry& e = entries_[h];
      if (e.used == 0) {
        e = Entry{key, slot, 1};
        ++size_;
        return {&e.slot, true};
      }
      if (e.key == key) return {&e.slot, false};
    }
  }
  /// Removes `key`; returns whether it was there.
  bool Erase(uint64_t key) {
    size_t h = Home(key);
    for (;; h = (h + 1) & mask_) {
      if (entries_[h].used == 0) return false;
      if (entries_[h].key == key) break;
    }
    // Backward shift: move each later entry of the run into the hole when the hole lies on its
    // probe path (between its home and where it sits), until an empty entry ends the run.
    size_t hole = h;
    for (size_t j = (h + 1) & mask_; entries_[j].used != 0; j = (j + 1) & mask_) {
      const size_t home = Home(entries_[j].key);
      if (((j - home) & mask_) >= ((j - hole) & mask_)) {
        entries_[hole] = entries_[j];
        hole = j;
      }
    }
    entries_[hole] = Entry{};
    --size_;
    return true;
  }
  /// The longest distance of an entry from its home entry: the most entries a probe reads,
  /// less one (tests, diagnostics).
  size_t MaxDisplacement() const {
    size_t most = 0;
    for (size_t j = 0; j < entries_.size(); ++j) {
      if (entries_[j].used != 0) most = std::max(most, (j - Home(entries_[j].key)) & mask_);
    }
    return most;
  }
  /// Starts loading the line where `key`'s probe begins.
  void Prefetch(uint64_t key) const { PrefetchLine(&entries_[Home(key)]); }
  /// fn(key, slot) for every entry, in table order; false from fn stops.
  template <typename Fn>
  void ForEach(Fn&& fn) const {
    for (const Entry& e : entries_) {
      if (e.used != 0 && !fn(e.key, e.slot)) return;
    }
  }

 private:
  struct Entry {
    uint64_t key = 0;
    uint32_t slot = 0;
    uint32_t used = 0;  // 0: empty
  };
  static_assert(sizeof(Entry) == 16);
  size_t Home(uint64_t key) const { return Mix64(key ^ seed_) & mask_; }
  void Rehash(size_t cap) {
    std::vector<Entry, HugePageAllocator<Entry>> old = std::move(entries_);
    entries_.assign(cap, Entry{});
    mask_ = cap - 1;
    for (const Entry& e : old) {
      if (e.used == 0) continue;
      size_t h = Home(e.key);
      while (entries_[h].used != 0) h = (h + 1) & mask_;
      entries_[h] = e;
    }
  }

  uint64_t seed_;
  std::vector<Entry, HugePageAllocator<Entry>> entries_;
  size_t mask_ = 0;
  size_t size_ = 0;
};

}  // namespace tessera::internal
