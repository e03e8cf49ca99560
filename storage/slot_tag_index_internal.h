// The memory tier's index: key -> slot in 4 bytes an entry, the key itself left in the slot.
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
#include "storage/index_seed_internal.h"
#include "storage/prefetch_internal.h"

namespace tessera::internal {

/// A hash index from a 64-bit key to a 32-bit slot of an arena that holds the key (the memory
/// tier's CachedRows): open addressing with linear probing over 4-byte entries, each a slot
/// number in its low `slot_bits()` bits and a tag (more bits of the key's hash) in the rest. A
/// probe compares tags, not keys, so it reads only the index (16 entries a cache line) until a
/// tag matches; the key is then compared in the slot (`key_of(slot)`), the line a caller reads
/// next anyway. Candidate() is the probe without that compare, for a caller that prefetches
/// the slot and checks the key itself. The table doubles past 3/4 full (4 bytes an entry at
/// 3/8-3/4 load: 5.3-10.7 bytes a key); Erase shifts the entries after the erased one back (no
/// tombstones). Tags shrink as slot numbers grow (16 bits until slot 32,767, 9 at 4M slots, none
/// past 2^31), so a false tag match (one compare of a key that differs) stays rare but never
/// wrong. Positions come from the low bits of Mix64(key ^ seed), tags from its high bits; the
/// seed differs per index (see SlotIndex: one hash for all tables makes fills quadratic).
///
/// `KeyOf` is a callable uint64_t(uint32_t slot): the key stored in a live slot. Growth, Erase
/// and Renumber read the keys of the entries they move. Not thread-safe.
template <typename KeyOf>
class SlotTagIndex {
 public:
  static constexpr uint32_t kNoSlot = 0xffffffffu;


  /// With the given hash seed (0: positions from Mix64(key) alone, for tests).
  SlotTagIndex(KeyOf key_of, uint64_t seed) : key_of_(std::move(key_of)), seed_(seed) {
    entries_.assign(16, kEmpty);
    mask_ = 15;
  }
  explicit SlotTagIndex(KeyOf key_of) : SlotTagIndex(std::move(key_of), NewIndexSeed()) {}

  size_t size() const { return size_; }
  /// Entries allocated (4 bytes each).
  size_t capacity() const { return entries_.size(); }
  /// Bits of an entry that hold the slot number (the rest hold the tag).
  uint32_t slot_bits() const { return slot_bits_; }

  /// The slot of `key`, or kNoSlot.
  uint32_t Find(uint64_t key) const {
    const uint64_t h = Hash(key);
    const uint32_t tag = Tag(h);
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      const uint32_t e = entries_[i];
      if (e == kEmpty) return kNoSlot;
      if ((e & ~slot_mask_) == tag && key_of_(e & slot_mask_) == key) return e & slot_mask_;
    }
  }
  /// The first slot on `key`'s probe whose tag matches, without reading any slot: key's slot
  /// when present (unless a slot of another key with the same tag comes first: check the key,
  /// then Find), kNoSlot when the key is surely absent.
  uint32_t Candidate(uint64_t key) const {
    const uint64_t h = Hash(key);
    const uint32_t tag = Tag(h);
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      const uint32_t e = entries_[i];
      if (e == kEmpty) return kNoSlot;
      if ((e & ~slot_mask_) == tag) return e & slot_mask_;
    }
  }
  /// Starts loading the entries where `key`'s probe begins (its line and the next one's start).
  void Prefetch(uint64_t key) const {
    const size_t i = Hash(key) & mask_;
    PrefetchLine(&entries_[i]);
    PrefetchLine(&entries_[std::min(i + 4, mask_)]);
  }

  /// Adds `key` (absent: the caller checked) in `slot` (< kNoSlot).
  void Insert(uint64_t key, uint32_t slot) {
    if (slot >= slot_mask_) WidenSlots(slot);
    if (4 * (size_ + 1) > 3 * entries_.size()) Rehash(2 * entries_.size());
    const uint64_t h = Hash(key);
    Place(h & mask_, Tag(h) | slot);
    ++size_;
  }
  /// Removes `key` from `slot` (where the arena still holds it); false when it is not there.
  bool Erase(uint64_t key, uint32_t slot) {
    size_t i = Position(key, slot);
    if (i == kNoPosition) return false;
    // Backward shift: move each later entry of the run into the hole when the hole lies on its
    // probe path (between its home and where it sits), until an empty entry ends the run.
    for (size_t j = (i + 1) & mask_; entries_[j] != kEmpty; j = (j + 1) & mask_) {
      const size_t home = Hash(key_of_(entries_[j] & slot_mask_)) & mask_;
      if (((j - home) & mask_) >= ((j - i) & mask_)) {
        entries_[i] = entries_[j];
        i = j;
      }
    }
    entries_[i] = kEmpty;
    --size_;
    return true;
  }
  /// `key`, in slot `from` (read there), moves to slot `to`: its entry changes in place, before
  /// the arena moves the key. False when `key` is not in `from`.
  bool Renumber(uint64_t key, uint32_t from, uint32_t to) {
    const size_t i = Position(key, from);
    if (i == kNoPosition) return false;
    if (to >= slot_mask_) WidenSlots(to);
    entries_[i] = (entries_[i] & ~slot_mask_) | to;
    return true;
  }
  /// Shrinks the table to the smallest that holds its keys (after many erasures).
  void ShrinkToFit() {
    size_t cap = 16;
    while (4 * size_ > 3 * cap) cap *= 2;
    if (cap < entries_.size()) Rehash(cap);
  }
  /// The longest distance of an entry from its home entry (tests, diagnostics).
  size_t MaxDisplacement() const {
    size_t most = 0;
    for (size_t j = 0; j < entries_.size(); ++j) {
      if (entries_[j] == kEmpty) continue;
      most = std::max(most, (j - (Hash(key_of_(entries_[j] & slot_mask_)) & mask_)) & mask_);
    }
    return most;
  }

 private:
  // A live entry's slot bits are never all ones (slots < slot_mask_), so it never equals kEmpty.
  static constexpr uint32_t kEmpty = 0xffffffffu;
  static constexpr size_t kNoPosition = ~size_t{0};

  uint64_t Hash(uint64_t key) const { return Mix64(key ^ seed_); }
  // Bits 32 + slot_bits_ .. 63 of the hash, in place: positions use bits from 0 up.
  uint32_t Tag(uint64_t h) const { return static_cast<uint32_t>(h >> 32) & ~slot_mask_; }
  // Where the entry of `key` in `slot` sits, found by slot number (only `slot` is read).
  size_t Position(uint64_t key, uint32_t slot) const {
    if (slot >= slot_mask_ || key_of_(slot) != key) return kNoPosition;
    const uint64_t h = Hash(key);
    const uint32_t want = Tag(h) | slot;
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      if (entries_[i] == kEmpty) return kNoPosition;
      if (entries_[i] == want) return i;
    }
  }
  void Place(size_t i, uint32_t entry) {
    while (entries_[i] != kEmpty) i = (i + 1) & mask_;
    entries_[i] = entry;
  }
  // Makes room for slot numbers up to `slot` (a little beyond, so that this is rare): the
  // tags lose their low bits, which no position depends on.
  void WidenSlots(uint32_t slot) {
    const uint32_t bits = std::min<uint32_t>(32, std::bit_width(slot) + 1);
    const uint32_t old_mask = slot_mask_;
    slot_bits_ = bits;
    slot_mask_ = bits == 32 ? 0xffffffffu : (uint32_t{1} << bits) - 1;
    for (uint32_t& e : entries_) {
      if (e != kEmpty) e = (e & ~slot_mask_) | (e & old_mask);
    }
  }
  void Rehash(size_t cap) {
    std::vector<uint32_t> old = std::move(entries_);
    entries_.assign(cap, kEmpty);
    mask_ = cap - 1;
    for (uint32_t e : old) {
      if (e != kEmpty) Place(Hash(key_of_(e & slot_mask_)) & mask_, e);
    }
  }
  KeyOf key_of_;
  uint64_t seed_;
  std::vector<uint32_t> entries_;
  size_t mask_ = 0;
  size_t size_ = 0;
  uint32_t slot_bits_ = 16;
  uint32_t slot_mask_ = 0xffff;
};

}  // namespace tessera::internal
