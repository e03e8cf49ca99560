// The memory tier of the RocksDB engine: one sparse table's hot rows in one lane, in a slot arena
// with a compact index and a CLOCK (second-chance) eviction order.
#pragma once

#include <absl/container/flat_hash_set.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "ps/routing.h"
#include "storage/storage.h"

namespace tessera::internal {

/// Rows of one sparse table cached in memory. A slot holds a 24-byte header (key, RowMeta,
/// flags) followed by the row's floats (value, then optimizer state); slots live in blocks of
/// about 64 KiB allocated once and reused through an intrusive free list. The index is a hash
/// set of 4-byte slot numbers whose hash and equality read the key from the slot, so a row costs
/// its slot plus about 5-11 bytes of index (see MemoryBytes()). Not thread-safe.
class CachedRows {
 public:
  static constexpr uint32_t kNoSlot = 0xffffffffu;

  /// Flag bits of a slot.
  static constexpr uint32_t kLive = 1;        ///< The slot holds a row.
  static constexpr uint32_t kReferenced = 2;  ///< Used since the CLOCK hand last passed.
  static constexpr uint32_t kPinned = 4;      ///< Not yet durable in RocksDB: not evictable.
  static constexpr uint32_t kDirty = 8;       ///< Changed since its last hand-off to the writer.

  struct Header {
    uint64_t key;  // free slots: the next free slot
    RowMeta meta;
    uint32_t flags;
  };
  static_assert(sizeof(Header) == 24);

  /// `floats` per row: value plus optimizer state.
  explicit CachedRows(uint32_t floats);
  CachedRows(const CachedRows&) = delete;
  CachedRows& operator=(const CachedRows&) = delete;

  uint32_t floats() const { return floats_; }
  size_t size() const { return index_.size(); }
  /// Bytes one row costs in the arena (header + floats, 8-byte aligned).
  size_t slot_bytes() const { return slot_bytes_; }

  /// The slot of `key`, or kNoSlot.
  uint32_t Find(uint64_t key) const {
    auto it = index_.find(KeyRef{key});
    return it == index_.end() ? kNoSlot : *it;
  }
  /// A new slot for `key`, which must be absent. The header is reset (meta zero, flags kLive |
  /// kReferenced); the floats are uninitialized.
  uint32_t Insert(uint64_t key);
  /// Removes the row in `slot`.
  void Erase(uint32_t slot);

  Header& header(uint32_t slot) { return *reinterpret_cast<Header*>(SlotPtr(slot)); }
  const Header& header(uint32_t slot) const {
    return *reinterpret_cast<const Header*>(SlotPtr(slot));
  }
  float* row(uint32_t slot) { return reinterpret_cast<float*>(SlotPtr(slot) + sizeof(Header)); }

  /// CLOCK: the next unpinned row that was not referenced since the hand last passed it
  /// (clearing the referenced bits it passes), or kNoSlot when every row is pinned.
  uint32_t NextVictim();

  /// Number of rows that are not pinned (evictable).
  size_t unpinned() const { return index_.size() - pinned_; }
  void Pin(uint32_t slot) {
    Header& h = header(slot);
    if ((h.flags & kPinned) == 0) {
      h.flags |= kPinned;
      ++pinned_;
    }
  }
  void Unpin(uint32_t slot) {
    Header& h = header(slot);
    if ((h.flags & kPinned) != 0) {
      h.flags &= ~kPinned;
      --pinned_;
    }
  }

  /// Visits every live slot (fn(slot) -> bool; false stops). `fn` must not insert or erase.
  template <typename Fn>
  void ForEachSlot(Fn&& fn) {
    for (uint32_t s = 0; s < next_slot_; ++s) {
      if ((header(s).flags & kLive) != 0 && !fn(s)) return;
    }
  }

  /// Bytes allocated: blocks, index, block table.
  uint64_t MemoryBytes() const;

  /// Moves rows down into free slots and releases the blocks that become empty, when at least a
  /// quarter of the slots are free. Slot numbers change: no row may be pinned. Returns whether
  /// anything was released.
  bool Compact();

 private:
  struct KeyRef {
    uint64_t key;
  };
  struct SlotHash {
    using is_transparent = void;
    const CachedRows* rows;
    size_t operator()(uint32_t slot) const { return Mix64(rows->header(slot).key); }
    size_t operator()(KeyRef k) const { return Mix64(k.key); }
  };
  struct SlotEq {
    using is_transparent = void;
    const CachedRows* rows;
    bool operator()(uint32_t a, uint32_t b) const { return a == b; }
    bool operator()(uint32_t a, KeyRef b) const { return rows->header(a).key == b.key; }
    bool operator()(KeyRef a, uint32_t b) const { return rows->header(b).key == a.key; }
  };

  std::byte* SlotPtr(uint32_t slot) const {
    return blocks_[slot >> block_shift_].get() + size_t{slot & block_mask_} * slot_bytes_;
  }

  uint32_t floats_;
  size_t slot_bytes_;
  uint32_t block_shift_;
  uint32_t block_mask_;
  std::vector<std::unique_ptr<std::byte[]>> blocks_;
  absl::flat_hash_set<uint32_t, SlotHash, SlotEq> index_;
  uint32_t next_slot_ = 0;  // slots [0, next_slot_) have been handed out
  uint32_t free_head_ = kNoSlot;
  uint32_t free_count_ = 0;
  uint32_t hand_ = 0;
  size_t pinned_ = 0;
};

}  // namespace tessera::internal
