// DenseRuns (dense_runs_internal.h): a memory-only lane's dense chunks, grouped in runs.
#include <atomic>

#include "ps/initializer.h"
#include "storage/dense_runs_internal.h"
#include "storage/row_table_internal.h"

namespace tessera::internal {

DenseRuns::DenseRuns(const TableSpec& spec, const Optimizer* opt, uint64_t table_id, uint32_t lane,
                     uint32_t lanes)
    : spec_(spec),
      opt_(opt),
      chunks_((spec.length + kDenseChunkFloats - 1) / kDenseChunkFloats),
      lanes_(lanes == 0 ? 1 : lanes),
      residue_((lane % lanes_ + lanes_ - table_id % lanes_) % lanes_),
      run_slots_(RunSlots(lanes_)) {}

std::pair<DenseRuns::Run*, uint32_t> DenseRuns::Slot(uint64_t chunk, bool write,
                                                     std::shared_ptr<Run>** owner) {
  const bool mine = chunk % lanes_ == residue_;
  const uint64_t lane_index = chunk / lanes_;
  const uint64_t key = mine ? 2 * (lane_index / run_slots_) : 2 * chunk + 1;
  const uint32_t slot = mine ? static_cast<uint32_t>(lane_index % run_slots_) : 0;
  auto [it, inserted] = runs_.try_emplace(key);
  std::shared_ptr<Run>& run = it->second.run;
  if (inserted) {
    run = std::make_shared<Run>();
    run->first_chunk = mine ? (lane_index - slot) * lanes_ + residue_ : chunk;
    run->stride = mine ? lanes_ : 1;
    uint32_t n = mine ? run_slots_ : 1;
    while (n > 1 && run->chunk(n - 1) >= chunks_) --n;
    const uint64_t last = run->chunk(n - 1);
    run->values.resize(size_t{n - 1} * kDenseChunkFloats + DenseChunkLength(spec_.length, last));
    run->state.resize(n);
    run->meta.resize(n);
    for (uint32_t s = 0; s < n; ++s) {
      const uint64_t c = run->chunk(s);
      const uint32_t len = DenseChunkLength(spec_.length, c);
      InitializeValues(spec_.initializer, 0, c * kDenseChunkFloats, len,
                       run->values.data() + size_t{s} * kDenseChunkFloats);
      run->state[s].resize(opt_->StateFloats(len));
      opt_->InitState(run->state[s].data(), len);
    }
    it->second.present.assign(n, 0);
  }
  it->second.present[slot] = 1;
  if (write && run.use_count() > 1) {
    // A share or a frozen view holds the run: it keeps the old one.
    run = std::make_shared<Run>(*run);
  } else if (write) {
    // The last holder let go, perhaps on another thread (a release decrement): its reads
    // happen before the writes that follow.
    std::atomic_thread_fence(std::memory_order_acquire);
  }
  if (owner != nullptr) *owner = &run;
  return {run.get(), slot};
}

DenseRuns::Chunk DenseRuns::Get(uint64_t chunk) {
  auto [run, slot] = Slot(chunk, /*write=*/true, nullptr);
  return Chunk{run->values.data() + size_t{slot} * kDenseChunkFloats, run->state[slot].data(),
               &run->meta[slot], DenseChunkLength(spec_.length, chunk)};
}

const float* DenseRuns::Read(uint64_t chunk, uint32_t* len) {
  auto [run, slot] = Slot(chunk, /*write=*/false, nullptr);
  *len = DenseChunkLength(spec_.length, chunk);
  return run->values.data() + size_t{slot} * kDenseChunkFloats;
}

std::shared_ptr<const float> DenseRuns::Share(uint64_t chunk, uint32_t* len) {
  std::shared_ptr<Run>* owner = nullptr;
  auto [run, slot] = Slot(chunk, /*write=*/false, &owner);
  *len = DenseChunkLength(spec_.length, chunk);
  // Holds the run, points at the chunk's values.
  return std::shared_ptr<const float>(*owner,
                                      run->values.data() + size_t{slot} * kDenseChunkFloats);
}

uint64_t DenseRuns::MemoryBytes() const {
  uint64_t b = 0;
  for (const auto& [key, e] : runs_) {
    const Run* run = e.run.get();
    b += sizeof(Run) + run->values.capacity() * sizeof(float) +
         run->meta.capacity() * sizeof(RowMeta);
    for (const auto& s : run->state) b += s.capacity() * sizeof(float) + sizeof(s);
  }
  return b;
}

DenseRuns::Frozen DenseRuns::Freeze() const {
  Frozen f;
  f.reserve(runs_.size());
  for (const auto& [key, e] : runs_) f.emplace_back(e.run, e.present);
  return f;
}

}  // namespace tessera::internal
