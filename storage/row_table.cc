#include <cstring>

#include "storage/row_table_internal.h"

namespace tessera::internal {

SparseRows::SparseRows(const TableSpec& spec, const Optimizer* opt)
    : spec_(spec), opt_(opt), dim_(spec.dim), stride_(spec.dim + opt->StateFloats(spec.dim)) {}

uint32_t SparseRows::Allocate() {
  if (!free_.empty()) {
    uint32_t s = free_.back();
    free_.pop_back();
    return s;
  }
  uint32_t s = next_slot_++;
  if (s / kRowsPerBlock >= blocks_.size()) {
    blocks_.emplace_back(new float[size_t{kRowsPerBlock} * stride_]);
    metas_.resize(blocks_.size() * kRowsPerBlock);
  }
  return s;
}

float* SparseRows::FindOrCreate(uint64_t key, bool* created) {
  auto [it, inserted] = index_.try_emplace(key, 0);
  if (!inserted) {
    *created = false;
    return RowAt(it->second);
  }
  uint32_t slot = Allocate();
  it->second = slot;
  float* row = RowAt(slot);
  InitializeValues(spec_.initializer, key, 0, dim_, row);
  opt_->InitState(row + dim_, dim_);
  metas_[slot] = RowMeta{};
  *created = true;
  return row;
}

float* SparseRows::FindOrCreate(uint64_t key, bool* created, RowMeta** meta) {
  auto [it, inserted] = index_.try_emplace(key, 0);
  *created = inserted;
  if (inserted) {
    const uint32_t slot = Allocate();
    it->second = slot;
    float* row = RowAt(slot);
    InitializeValues(spec_.initializer, key, 0, dim_, row);
    opt_->InitState(row + dim_, dim_);
    metas_[slot] = RowMeta{};
  }
  *meta = &metas_[it->second];
  return RowAt(it->second);
}

RowMeta& SparseRows::MetaOf(uint64_t key) { return metas_[index_.at(key)]; }

void SparseRows::Put(uint64_t key, const float* row, const RowMeta& meta) {
  auto [it, inserted] = index_.try_emplace(key, 0);
  if (inserted) it->second = Allocate();
  std::memcpy(RowAt(it->second), row, sizeof(float) * stride_);
  metas_[it->second] = meta;
}

bool SparseRows::Erase(uint64_t key) {
  auto it = index_.find(key);
  if (it == index_.end()) return false;
  free_.push_back(it->second);
  index_.erase(it);
  return true;
}

uint64_t SparseRows::MemoryBytes() const {
  const uint64_t arena = uint64_t{blocks_.size()} * kRowsPerBlock * stride_ * sizeof(float);
  const uint64_t metas = metas_.capacity() * sizeof(RowMeta);
  const uint64_t map = index_.capacity() * (sizeof(std::pair<uint64_t, uint32_t>) + 1);
  return arena + metas + map + free_.capacity() * sizeof(uint32_t);
}

float* DenseChunks::Get(uint64_t chunk, uint32_t* len) {
  *len = DenseChunkLength(spec_.length, chunk);
  auto [it, inserted] = chunks_.try_emplace(chunk);
  if (inserted) {
    const uint32_t n = *len;
    it->second.data.resize(size_t{n} + opt_->StateFloats(n));
    InitializeValues(spec_.initializer, 0, chunk * kDenseChunkFloats, n, it->second.data.data());
    opt_->InitState(it->second.data.data() + n, n);
  }
  return it->second.data.data();
}

uint64_t DenseChunks::MemoryBytes() const {
  uint64_t b = 0;
  for (auto& [c, ch] : chunks_) b += ch.data.capacity() * sizeof(float) + sizeof(Chunk);
  return b;
}

bool Admitted(const AdmissionSpec& spec, uint64_t key, uint32_t count) {
  if (count < spec.min_count) return false;
  if (spec.probability >= 1.0f) return true;
  // A deterministic coin per (key, count): replays decide the same way.
  const uint64_t h = Mix64(key ^ (uint64_t{count} * 0x9e3779b97f4a7c15ULL));
  return static_cast<double>(h) < spec.probability * 18446744073709551616.0;
}

}  // namespace tessera::internal
