// The memory tier of the RocksDB engine: one sparse table's hot rows in one lane, in a slot arena
// with a compact index and a CLOCK (second-chance) eviction order.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "ps/routing.h"
#include "storage/prefetch_internal.h"
#include "storage/slot_tag_index_internal.h"
#include "storage/storage.h"

namespace tessera::internal {

/// A batch's lookups (CachedRows::FindEach) load the index entries of the key this many keys
/// ahead and the slot (header and row) of the key kRowAhead ahead: a random key's probe and
/// slot are each a cache miss otherwise, one waiting for the other.
inline constexpr size_t kIndexAhead = 16;
inline constexpr size_t kRowAhead = 8;

/// Rows of one sparse table cached in memory. A slot holds a 24-byte header (key, RowMeta,
/// flags) followed by the row's floats (value, then optimizer state); slots live in blocks of
/// at most 8 KiB (a power of two of slots) allocated once and reused through an intrusive free
/// list. The index (SlotTagIndex) holds a 4-byte entry a row, slot number and hash tag, and
/// compares the key in the slot, so a row costs its slot plus 5.3-10.7 bytes of index (see
/// MemoryBytes()).
///
/// Freeze() shares every block with a Frozen view copy-on-write: the first change to a shared
/// block's keys, metas or floats copies that block, so the view keeps the rows as they were and
/// can be read on another thread. Flags are the owner's alone: a Frozen never reads them, so
/// flags() changes them in place. Not thread-safe otherwise.
class CachedRows {
 public:
  static constexpr uint32_t kNoSlot = 0xffffffffu;

  /// Flag bits of a slot; the bits above kGenShift hold the row's write-back generation.
  static constexpr uint32_t kLive = 1;        ///< The slot holds a row.
  static constexpr uint32_t kReferenced = 2;  ///< Used since the CLOCK hand last passed.
  static constexpr uint32_t kGenShift = 2;

  struct Header {
    uint64_t key;  // free slots: the next free slot
    RowMeta meta;
    uint32_t flags;
  };
  static_assert(sizeof(Header) == 24);

  /// Rows as they were at Freeze(). Reads only keys, metas and floats (never flags); safe on
  /// another thread while the owner goes on changing its rows.
  class Frozen {
   public:
    Frozen() = default;
    uint64_t key(uint32_t slot) const { return Slot(slot)->key; }
    const RowMeta& meta(uint32_t slot) const { return Slot(slot)->meta; }
    const float* row(uint32_t slot) const { return reinterpret_cast<const float*>(Slot(slot) + 1); }
    /// Visits `slots` (sorted here, each once) in arena order, fn(slot), and lets go of each
    /// block once past it (the owner then changes it in place, no copy), then of every block.
    template <typename Fn>
    void VisitAndRelease(std::vector<uint32_t>& slots, Fn&& fn) {
      std::sort(slots.begin(), slots.end());
      slots.erase(std::unique(slots.begin(), slots.end()), slots.end());
      for (size_t i = 0; i < slots.size(); ++i) {
        fn(slots[i]);
        const uint32_t b = slots[i] >> block_shift_;
        if (i + 1 == slots.size() || (slots[i + 1] >> block_shift_) != b) blocks_[b].reset();
      }
      blocks_.clear();
    }
    bool empty() const { return blocks_.empty(); }

   private:
    friend class CachedRows;
    const Header* Slot(uint32_t slot) const {
      return reinterpret_cast<const Header*>(blocks_[slot >> block_shift_].get() +
                                             size_t{slot & block_mask_} * slot_bytes_);
    }
    std::vector<std::shared_ptr<std::byte[]>> blocks_;
    size_t slot_bytes_ = 0;
    uint32_t block_shift_ = 0, block_mask_ = 0;
  };

  /// `floats` per row: value plus optimizer state. `index_seed`: the index's hash seed (tests
  /// choose keys that collide in it; by default another per table and process).
  explicit CachedRows(uint32_t floats);
  CachedRows(uint32_t floats, uint64_t index_seed);
  CachedRows(const CachedRows&) = delete;
  CachedRows& operator=(const CachedRows&) = delete;

  uint32_t floats() const { return floats_; }
  size_t size() const { return index_.size(); }
  /// Bytes one row costs in the arena (header + floats, 8-byte aligned).
  size_t slot_bytes() const { return slot_bytes_; }

  /// The slot of `key`, or kNoSlot.
  uint32_t Find(uint64_t key) const { return index_.Find(key); }
  /// fn(i, Find(keys[i])) for each key in order, pipelined: the index entries of key i +
  /// kIndexAhead are loaded first (and ahead(key) is called for that key, to load the caller's
  /// own lines), then the slot of key i + kRowAhead is found from the index alone (its tag) and
  /// its header and row loaded, then key i's key is checked in its slot. `fn` may change flags,
  /// metas and floats but must not insert or erase.
  template <typename Ahead, typename Fn>
  void FindEach(std::span<const uint64_t> keys, Ahead&& ahead, Fn&& fn) const {
    const size_t n = keys.size();
    uint32_t candidate[kRowAhead];
    for (size_t i = 0; i < std::min(n, kIndexAhead); ++i) {
      index_.Prefetch(keys[i]);
      ahead(keys[i]);
    }
    for (size_t i = 0; i < std::min(n, kRowAhead); ++i) candidate[i] = PrefetchSlot(keys[i]);
    for (size_t i = 0; i < n; ++i) {
      if (i + kIndexAhead < n) {
        index_.Prefetch(keys[i + kIndexAhead]);
        ahead(keys[i + kIndexAhead]);
      }
      uint32_t slot = candidate[i % kRowAhead];
      if (i + kRowAhead < n) candidate[i % kRowAhead] = PrefetchSlot(keys[i + kRowAhead]);
      // No candidate: absent. A candidate of another key (same tag): probe again.
      if (slot != kNoSlot && header(slot).key != keys[i]) slot = index_.Find(keys[i]);
      fn(i, slot);
    }
  }
  /// A new slot for `key`, which must be absent. The header is reset (meta zero, flags kLive |
  /// kReferenced); the floats are uninitialized.
  uint32_t Insert(uint64_t key);
  /// Removes the row in `slot`.
  void Erase(uint32_t slot);

  const Header& header(uint32_t slot) const {
    return *reinterpret_cast<const Header*>(SlotPtr(slot));
  }
  const float* row(uint32_t slot) const {
    return reinterpret_cast<const float*>(SlotPtr(slot) + sizeof(Header));
  }
  /// The flag bits of `slot`, changed in place (never copies a frozen block).
  uint32_t& flags(uint32_t slot) { return reinterpret_cast<Header*>(SlotPtr(slot))->flags; }
  /// The row's metadata and floats, to change: copies the block first while a Frozen shares it.
  RowMeta& mutable_meta(uint32_t slot) {
    return reinterpret_cast<Header*>(OwnedSlotPtr(slot))->meta;
  }
  float* mutable_row(uint32_t slot) {
    return reinterpret_cast<float*>(OwnedSlotPtr(slot) + sizeof(Header));
  }

  /// Shares every block with the returned view (a pointer copy per block).
  Frozen Freeze();

  /// CLOCK: the next unpinned row that was not referenced since the hand last passed it
  /// (clearing the referenced bits it passes), or kNoSlot when every row is pinned.
  uint32_t NextVictim();

  /// Write-back state, by generation (so that a hand-off to the writer and its end cost O(1),
  /// not a pass over the rows): a row is dirty when changed since the last BeginFlight(), in
  /// flight when it was dirty then and has not changed since, until EndFlight(). Dirty and in
  /// flight rows are pinned: not durable yet, never a victim.
  /// Marks the row dirty; true when it was not dirty before (the caller lists it).
  bool MarkDirty(uint32_t slot) {
    uint32_t& f = flags(slot);
    const uint32_t g = f >> kGenShift;
    if (g == dirty_gen_) return false;
    if (flight_gen_ != 0 && g == flight_gen_) --flight_rows_;
    f = (f & ((1u << kGenShift) - 1)) | (dirty_gen_ << kGenShift);
    ++dirty_rows_;
    return true;
  }
  bool dirty(uint32_t slot) const { return (header(slot).flags >> kGenShift) == dirty_gen_; }
  bool pinned(uint32_t slot) const { return PinnedFlags(header(slot).flags); }
  /// The dirty rows go in flight; none is dirty. At most one flight at a time.
  void BeginFlight();
  /// The rows in flight are durable: no longer pinned. (After a failed flight, MarkDirty() its
  /// rows again first.)
  void EndFlight() {
    flight_gen_ = 0;
    flight_rows_ = 0;
  }
  size_t dirty_rows() const { return dirty_rows_; }
  /// Number of rows that are not pinned (evictable).
  size_t unpinned() const { return index_.size() - dirty_rows_ - flight_rows_; }

  /// Visits every live slot (fn(slot) -> bool; false stops). `fn` must not insert or erase.
  template <typename Fn>
  void ForEachSlot(Fn&& fn) {
    for (uint32_t s = 0; s < next_slot_; ++s) {
      if ((header(s).flags & kLive) != 0 && !fn(s)) return;
    }
  }

  /// Bytes allocated: blocks, index, block table.
  uint64_t MemoryBytes() const;
  /// Bytes of index (part of MemoryBytes()).
  uint64_t IndexBytes() const { return index_.capacity() * sizeof(uint32_t); }
  /// Blocks copied because a Frozen shared them (since construction).
  uint64_t copied_blocks() const { return copied_blocks_; }

  /// Moves rows down into free slots and releases the blocks that become empty, when at least a
  /// quarter of the slots are free. Slot numbers change: no row may be pinned. Returns whether
  /// anything was released.
  bool Compact();

 private:
  struct SlotKey {
    const CachedRows* rows;
    uint64_t operator()(uint32_t slot) const { return rows->header(slot).key; }
  };

  // The candidate slot of `key` (SlotTagIndex::Candidate), its header and row lines loading.
  uint32_t PrefetchSlot(uint64_t key) const {
    const uint32_t slot = index_.Candidate(key);
    if (slot != kNoSlot) {
      // Header and floats: every line the slot touches.
      const std::byte* p = SlotPtr(slot);
      for (size_t off = 0; off < slot_bytes_; off += 64) PrefetchLine(p + off);
      PrefetchLine(p + slot_bytes_ - 1);
    }
    return slot;
  }

  std::byte* SlotPtr(uint32_t slot) const {
    return blocks_[slot >> block_shift_].get() + size_t{slot & block_mask_} * slot_bytes_;
  }
  std::byte* OwnedSlotPtr(uint32_t slot) {
    if (frozen_[slot >> block_shift_] != 0) Unshare(slot >> block_shift_);
    return SlotPtr(slot);
  }
  // Gives block `b` back to this arena alone: copies it while a Frozen still holds it.
  void Unshare(uint32_t b);
  bool PinnedFlags(uint32_t f) const {
    const uint32_t g = f >> kGenShift;
    return (f & kLive) != 0 && (g == dirty_gen_ || (flight_gen_ != 0 && g == flight_gen_));
  }
  size_t BlockBytes() const { return (size_t{block_mask_} + 1) * slot_bytes_; }

  uint32_t floats_;
  size_t slot_bytes_;
  uint32_t block_shift_;
  uint32_t block_mask_;
  std::vector<std::shared_ptr<std::byte[]>> blocks_;
  // Per block: 1 while a Frozen taken since its last Unshare may hold it.
  std::vector<uint8_t> frozen_;
  uint64_t copied_blocks_ = 0;
  SlotTagIndex<SlotKey> index_;
  uint32_t next_slot_ = 0;  // slots [0, next_slot_) have been handed out
  uint32_t free_head_ = kNoSlot;
  uint32_t free_count_ = 0;
  uint32_t hand_ = 0;
  // Write-back generations (never 0; a new row has generation 0) and their row counts.
  uint32_t dirty_gen_ = 1;
  uint32_t flight_gen_ = 0;  // 0: nothing in flight
  size_t dirty_rows_ = 0;
  size_t flight_rows_ = 0;
};

}  // namespace tessera::internal
