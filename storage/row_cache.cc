#include <algorithm>
#include <bit>
#include <cstring>

#include "storage/row_cache_internal.h"

#include "storage/copy_on_write_internal.h"

namespace tessera::internal {
namespace {
// Small blocks: after Freeze(), a changed row copies its whole block (a uniform push of 500 rows
// to a lane then copies 500 blocks: 2.5 MiB at 8 KiB, 32 MiB at 64 KiB).
constexpr size_t kTargetBlockBytes = 4 * 1024;
}  // namespace

CachedRows::CachedRows(uint32_t floats) : CachedRows(floats, NewIndexSeed()) {}

CachedRows::CachedRows(uint32_t floats, uint64_t index_seed)
    : floats_(floats),
      slot_bytes_((sizeof(Header) + size_t{floats} * sizeof(float) + 7) / 8 * 8),
      index_(SlotKey{this}, index_seed) {
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
      blocks_.emplace_back(new std::byte[BlockBytes()]);
      frozen_.push_back(0);
      // Slots of a new block are not live until handed out.
      for (uint32_t i = 0; i <= block_mask_; ++i) {
        flags((static_cast<uint32_t>(blocks_.size() - 1) << block_shift_) + i) = 0;
      }
    }
  }
  Header& h = *reinterpret_cast<Header*>(OwnedSlotPtr(slot));
  h.key = key;
  h.meta = RowMeta{};
  h.flags = kLive | kReferenced;
  index_.Insert(key, slot);
  return slot;
}

void CachedRows::Erase(uint32_t slot) {
  if ((header(slot).flags & kLive) == 0) return;
  // The key becomes a free-list link: a Frozen that still holds the row keeps its key.
  Header& h = *reinterpret_cast<Header*>(OwnedSlotPtr(slot));
  index_.Erase(h.key, slot);  // while the key is still in the header
  if (PinnedFlags(h.flags)) {
    if ((h.flags >> kGenShift) == dirty_gen_) {
      --dirty_rows_;
    } else {
      --flight_rows_;
    }
  }
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
    uint32_t& f = flags(s);
    if ((f & kLive) == 0 || PinnedFlags(f)) continue;
    if ((f & kReferenced) != 0) {
      f &= ~kReferenced;
      continue;
    }
    return s;
  }
  return kNoSlot;
}

uint64_t CachedRows::MemoryBytes() const {
  // A block: its bytes and the shared_ptr's control block (about 32 bytes with malloc's header).
  const uint64_t arena = uint64_t{blocks_.size()} * (BlockBytes() + 32);
  return arena + IndexBytes() + blocks_.capacity() * (sizeof(blocks_[0]) + 1) + sizeof(*this);
}

void CachedRows::BeginFlight() {
  flight_gen_ = dirty_gen_;
  flight_rows_ = dirty_rows_;
  dirty_rows_ = 0;
  if (dirty_gen_ + 1 < (uint32_t{1} << (32 - kGenShift))) {
    ++dirty_gen_;
    return;
  }
  // Generations ran out (after a billion hand-offs): renumber, flight 1, dirty (none) 2.
  for (uint32_t s = 0; s < next_slot_; ++s) {
    uint32_t& f = flags(s);
    const uint32_t g = (f >> kGenShift) == flight_gen_ ? 1 : 0;
    f = (f & ((1u << kGenShift) - 1)) | (g << kGenShift);
  }
  flight_gen_ = 1;
  dirty_gen_ = 2;
}

CachedRows::Frozen CachedRows::Freeze() {
  Frozen f;
  f.blocks_ = blocks_;
  f.slot_bytes_ = slot_bytes_;
  f.block_shift_ = block_shift_;
  f.block_mask_ = block_mask_;
  std::fill(frozen_.begin(), frozen_.end(), uint8_t{1});
  return f;
}

void CachedRows::Unshare(uint32_t b) {
  const bool copied = UnshareBlock(blocks_[b], &frozen_[b], [&](const auto& old) {
    std::shared_ptr<std::byte[]> copy(new std::byte[BlockBytes()]);
    std::memcpy(copy.get(), old.get(), BlockBytes());
    return copy;
  });
  if (copied) ++copied_blocks_;
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
    index_.Renumber(header(s).key, s, dst);
    std::memcpy(OwnedSlotPtr(dst), SlotPtr(s), slot_bytes_);
    flags(s) = 0;
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
  frozen_.resize(keep_blocks);
  frozen_.shrink_to_fit();
  index_.ShrinkToFit();
  return released;
}

}  // namespace tessera::internal
