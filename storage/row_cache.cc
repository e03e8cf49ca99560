#include <algorithm>
#include <bit>
#include <cstring>

#include "storage/row_cache_internal.h"

namespace tessera::internal {
namespace {
constexpr size_t kTargetBlockBytes = 64 * 1024;
}  // namespace

CachedRows::CachedRows(uint32_t floats)
    : floats_(floats),
      slot_bytes_((sizeof(Header) + size_t{floats} * sizeof(float) + 7) / 8 * 8),
      index_(0, SlotHash{this}, SlotEq{this}) {
  const size_t rows = std::max<size_t>(1, kTargetBlockBytes / slot_bytes_);
  block_shift_ = static_cast<uint32_t>(std::bit_width(std::bit_floor(rows)) - 1);
  block_mask_ = (uint32_t{1} << block_shift_) - 1;
}

uint32_t CachedRows::Insert(uint64_t key) {
  uint32_t slot;
  if (free_head_ != kNoSlot) {
    slot = free_head_;
    free_head_ = static_cast<uint32_t>(header(slot).key);
    --free_count_;
  } else {
    slot = next_slot_++;
    if ((slot >> block_shift_) >= blocks_.size()) {
      blocks_.emplace_back(new std::byte[(size_t{block_mask_} + 1) * slot_bytes_]);
      // Slots of a new block are not live until handed out.
      for (uint32_t i = 0; i <= block_mask_; ++i) {
        header((static_cast<uint32_t>(blocks_.size() - 1) << block_shift_) + i).flags = 0;
      }
    }
  }
  Header& h = header(slot);
  h.key = key;
  h.meta = RowMeta{};
  h.flags = kLive | kReferenced;
  index_.insert(slot);  // hashes the key just written
  return slot;
}

void CachedRows::Erase(uint32_t slot) {
  Header& h = header(slot);
  if ((h.flags & kLive) == 0) return;
  index_.erase(slot);  // while the key is still in the header
  if ((h.flags & kPinned) != 0) --pinned_;
  h.flags = 0;
  h.key = free_head_;
  free_head_ = slot;
  ++free_count_;
}

uint32_t CachedRows::NextVictim() {
  if (unpinned() == 0 || next_slot_ == 0) return kNoSlot;
  // Two turns of the hand clear every referenced bit once, so a victim is found within them.
  for (uint64_t n = 0; n < 2 * uint64_t{next_slot_} + 1; ++n) {
    if (hand_ >= next_slot_) hand_ = 0;
    const uint32_t s = hand_++;
    Header& h = header(s);
    if ((h.flags & kLive) == 0 || (h.flags & kPinned) != 0) continue;
    if ((h.flags & kReferenced) != 0) {
      h.flags &= ~kReferenced;
      continue;
    }
    return s;
  }
  return kNoSlot;
}

uint64_t CachedRows::MemoryBytes() const {
  const uint64_t arena = uint64_t{blocks_.size()} * (uint64_t{block_mask_} + 1) * slot_bytes_;
  // absl's SwissTable: one 4-byte slot and one control byte per bucket.
  const uint64_t index = index_.capacity() * (sizeof(uint32_t) + 1);
  return arena + index + blocks_.capacity() * sizeof(blocks_[0]) + sizeof(*this);
}

bool CachedRows::Compact() {
  if (free_count_ == 0 || free_count_ < next_slot_ / 4) return false;
  // Free slots, lowest first; live rows move from the top into them.
  std::vector<uint32_t> holes;
  holes.reserve(free_count_);
  for (uint32_t s = free_head_; s != kNoSlot; s = static_cast<uint32_t>(header(s).key)) {
    holes.push_back(s);
  }
  std::sort(holes.begin(), holes.end());
  size_t next_hole = 0;
  uint32_t top = next_slot_;
  while (top > 0) {
    const uint32_t s = top - 1;
    if ((header(s).flags & kLive) == 0) {
      --top;
      continue;
    }
    if (next_hole == holes.size() || holes[next_hole] >= s) break;
    const uint32_t dst = holes[next_hole++];
    index_.erase(s);
    std::memcpy(SlotPtr(dst), SlotPtr(s), slot_bytes_);
    index_.insert(dst);
    header(s).flags = 0;
    --top;
  }
  // Slots [0, top) are now all live.
  next_slot_ = top;
  free_head_ = kNoSlot;
  free_count_ = 0;
  hand_ = 0;
  const size_t keep_blocks = (size_t{top} + block_mask_) >> block_shift_;
  const bool released = keep_blocks < blocks_.size();
  blocks_.resize(keep_blocks);
  blocks_.shrink_to_fit();
  index_.rehash(0);
  return released;
}

}  // namespace tessera::internal
