#include <algorithm>
#include <cstring>

#include "storage/copy_on_write_internal.h"
#include "storage/row_table_internal.h"

namespace tessera::internal {

namespace {

// The first slab of a pool holds this many pieces; each next one twice the last, up to a huge
// page (a table of a few rows costs a few blocks' memory, not a huge page).
constexpr size_t kFirstSlabPieces = 16;

}  // namespace

BlockPool::BlockPool(size_t bytes) : piece_((bytes + 63) / 64 * 64) {}

BlockPool::~BlockPool() {
  MutexLock l(mu_);
  for (std::byte* s : slabs_) FreeHugePageable(s);
}

std::byte* BlockPool::Allocate() {
  MutexLock l(mu_);
  if (!free_.empty()) {
    std::byte* p = free_.back();
    free_.pop_back();
    return p;
  }
  if (next_ == end_) {
    // Slabs double from kFirstSlabPieces pieces up to a huge page (or one piece, if larger).
    size_t bytes = last_slab_bytes_ == 0 ? kFirstSlabPieces * piece_ : 2 * last_slab_bytes_;
    if (bytes >= kHugePageBytes) bytes = std::max(kHugePageBytes, piece_);
    std::byte* slab = static_cast<std::byte*>(AllocateHugePageable(bytes));
    slabs_.push_back(slab);
    slab_bytes_ += bytes;
    last_slab_bytes_ = bytes;
    next_ = slab;
    end_ = slab + bytes / piece_ * piece_;
  }
  std::byte* p = next_;
  next_ += piece_;
  return p;
}

void BlockPool::Free(std::byte* p) {
  MutexLock l(mu_);
  free_.push_back(p);
}

uint64_t BlockPool::SlabBytes() const {
  MutexLock l(mu_);
  return slab_bytes_;
}

SparseRows::SparseRows(const TableSpec& spec, const Optimizer* opt)
    : spec_(spec), opt_(opt), dim_(spec.dim), stride_(spec.dim + opt->StateFloats(spec.dim)) {
  rows_offset_ = sizeof(uint64_t) * kRowsPerBlock;
  metas_offset_ = rows_offset_ + sizeof(float) * kRowsPerBlock * stride_;
  pool_ = std::make_shared<BlockPool>(metas_offset_ + sizeof(RowMeta) * kRowsPerBlock +
                                      kRowsPerBlock);
}

SparseRows::Block SparseRows::NewBlock() const {
  static_assert(alignof(RowMeta) <= alignof(float));
  const size_t metas = sizeof(RowMeta) * kRowsPerBlock;
  Block b;
  b.bytes = metas_offset_ + metas + kRowsPerBlock;
  // Line-aligned: rows of 16 floats (dim 16 under SGD, dim 8 under Adagrad) then take one cache
  // line each, not two, and rows of 32 (dim 16 under Adagrad) two, not three.
  b.mem = std::unique_ptr<std::byte[], PoolDelete>(pool_->Allocate(), PoolDelete{pool_});
  b.keys = reinterpret_cast<uint64_t*>(b.mem.get());
  b.rows = reinterpret_cast<float*>(b.mem.get() + rows_offset_);
  b.metas = reinterpret_cast<RowMeta*>(b.mem.get() + metas_offset_);
  b.live = reinterpret_cast<uint8_t*>(b.mem.get() + metas_offset_ + metas);
  std::memset(b.live, 0, kRowsPerBlock);
  return b;
}

SparseRows::Block& SparseRows::Own(uint32_t slot) {
  const uint32_t bi = slot / kRowsPerBlock;
  std::shared_ptr<Block>& b = blocks_[bi];
  // Only blocks frozen since their last Own() can be shared: the others cost no look at the
  // count (a cache miss per row pushed).
  if (frozen_[bi] != 0) {
    UnshareBlock(b, &frozen_[bi], [&](const auto& old) {
      auto copy = std::make_shared<Block>(NewBlock());
      std::memcpy(copy->mem.get(), old->mem.get(), old->bytes);
      return copy;
    });
    mem_[bi] = b->mem.get();
  }
  return *b;
}

uint32_t SparseRows::Allocate() {
  if (!free_.empty()) {
    uint32_t s = free_.back();
    free_.pop_back();
    return s;
  }
  uint32_t s = next_slot_++;
  if (s / kRowsPerBlock >= blocks_.size()) {
    blocks_.push_back(std::make_shared<Block>(NewBlock()));
    mem_.push_back(blocks_.back()->mem.get());
    frozen_.push_back(0);
  }
  return s;
}

uint32_t SparseRows::Create(uint64_t key) {
  const uint32_t slot = Allocate();
  Block& b = Own(slot);
  const uint32_t i = slot % kRowsPerBlock;
  float* row = b.rows + size_t{i} * stride_;
  InitializeValues(spec_.initializer, key, 0, dim_, row);
  opt_->InitState(row + dim_, dim_);
  b.metas[i] = RowMeta{};
  b.keys[i] = key;
  b.live[i] = 1;
  return slot;
}

float* SparseRows::FindOrCreate(uint64_t key, bool* created) {
  RowMeta* meta;
  return FindOrCreate(key, created, &meta);
}

float* SparseRows::FindOrCreate(uint64_t key, bool* created, RowMeta** meta) {
  // Create() before the insertion: the slot it allocates is the value (an entry pointer would
  // not survive a rehash).
  const uint32_t* found = index_.Find(key);
  *created = found == nullptr;
  const uint32_t slot = found != nullptr ? *found : *index_.TryEmplace(key, Create(key)).first;
  // Through mem_: the block's shared_ptr and Block would be two more dependent loads.
  if (frozen_[slot / kRowsPerBlock] != 0) Own(slot);
  std::byte* mem = mem_[slot / kRowsPerBlock];
  const uint32_t i = slot % kRowsPerBlock;
  *meta = reinterpret_cast<RowMeta*>(mem + metas_offset_) + i;
  return reinterpret_cast<float*>(mem + rows_offset_) + size_t{i} * stride_;
}

const RowMeta& SparseRows::MetaOf(uint64_t key) const {
  const uint32_t slot = *index_.Find(key);
  return blocks_[slot / kRowsPerBlock]->metas[slot % kRowsPerBlock];
}

void SparseRows::Put(uint64_t key, const float* row, const RowMeta& meta) {
  const uint32_t* found = index_.Find(key);
  const uint32_t slot = found != nullptr ? *found : *index_.TryEmplace(key, Allocate()).first;
  Block& b = Own(slot);
  const uint32_t i = slot % kRowsPerBlock;
  std::memcpy(b.rows + size_t{i} * stride_, row, sizeof(float) * stride_);
  b.metas[i] = meta;
  b.keys[i] = key;
  b.live[i] = 1;
}

bool SparseRows::Erase(uint64_t key) {
  const uint32_t* found = index_.Find(key);
  if (found == nullptr) return false;
  const uint32_t slot = *found;
  Own(slot).live[slot % kRowsPerBlock] = 0;
  free_.push_back(slot);
  index_.Erase(key);
  return true;
}

uint64_t SparseRows::MemoryBytes() const {
  const uint64_t per_slot = stride_ * sizeof(float) + sizeof(RowMeta) + sizeof(uint64_t) + 1;
  const uint64_t arena = uint64_t{blocks_.size()} * kRowsPerBlock * per_slot;
  const uint64_t map = index_.capacity() * 16;  // SlotIndex entries
  return arena + map + free_.capacity() * sizeof(uint32_t);
}

SparseRows::Frozen SparseRows::Freeze() const {
  Frozen f;
  f.blocks.assign(blocks_.begin(), blocks_.end());
  std::fill(frozen_.begin(), frozen_.end(), uint8_t{1});
  f.slots = next_slot_;
  f.dim = dim_;
  f.stride = stride_;
  return f;
}

std::shared_ptr<DenseChunks::Chunk>& DenseChunks::Slot(uint64_t chunk, uint32_t* len) {
  *len = DenseChunkLength(spec_.length, chunk);
  auto [it, inserted] = chunks_.try_emplace(chunk);
  if (inserted) {
    const uint32_t n = *len;
    it->second = std::make_shared<Chunk>();
    it->second->data.resize(size_t{n} + opt_->StateFloats(n));
    InitializeValues(spec_.initializer, 0, chunk * kDenseChunkFloats, n, it->second->data.data());
    opt_->InitState(it->second->data.data() + n, n);
  }
  return it->second;
}

float* DenseChunks::Get(uint64_t chunk, uint32_t* len, RowMeta** meta) {
  std::shared_ptr<Chunk>& c = Slot(chunk, len);
  if (c.use_count() > 1) {
    // A frozen view or a pull reply still being sent holds it (Share): it keeps the old state.
    c = std::make_shared<Chunk>(*c);
  } else {
    // The last holder let go, perhaps on another thread (a release decrement): its reads
    // happen before the writes that follow.
    std::atomic_thread_fence(std::memory_order_acquire);
  }
  if (meta != nullptr) *meta = &c->meta;
  return c->data.data();
}

std::shared_ptr<const float> DenseChunks::Share(uint64_t chunk, uint32_t* len) {
  const std::shared_ptr<Chunk>& c = Slot(chunk, len);
  return std::shared_ptr<const float>(c, c->data.data());  // holds the chunk, points at its row
}

const float* DenseChunks::Read(uint64_t chunk, uint32_t* len) {
  return Slot(chunk, len)->data.data();
}

uint64_t DenseChunks::MemoryBytes() const {
  uint64_t b = 0;
  for (auto& [c, ch] : chunks_) b += ch->data.capacity() * sizeof(float) + sizeof(Chunk);
  return b;
}

DenseChunks::Frozen DenseChunks::Freeze() const {
  Frozen f;
  f.reserve(chunks_.size());
  for (auto& [c, ch] : chunks_) f.emplace_back(c, ch);
  return f;
}

bool Admitted(const AdmissionSpec& spec, uint64_t key, uint32_t count) {
  if (count < spec.min_count) return false;
  if (spec.probability >= 1.0f) return true;
  // A deterministic coin per (key, count): replays decide the same way.
  const uint64_t h = Mix64(key ^ (uint64_t{count} * 0x9e3779b97f4a7c15ULL));
  return static_cast<double>(h) < spec.probability * 18446744073709551616.0;
}

}  // namespace tessera::internal
