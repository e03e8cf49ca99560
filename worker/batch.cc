#include "worker/batch.h"

#include <algorithm>
#include <cstdint>
#include <utility>

namespace tessera::worker {

void Batch::Clear(const Schema& s) {
  schema = s;
  size = 0;
  dense.clear();
  labels.clear();
  offsets.assign(1, 0);
  keys.clear();
  weights.clear();
  true_probs.clear();
}

void Batch::Append(const Batch& other) {
  for (uint32_t s = 0; s < other.size; ++s) AppendSample(other, s);
}

void Batch::AppendSample(const Batch& other, uint32_t s) {
  const uint32_t nd = schema.num_dense, nf = schema.num_fields;
  dense.insert(dense.end(), other.dense.begin() + size_t{s} * nd,
               other.dense.begin() + size_t{s + 1} * nd);
  labels.push_back(other.labels[s]);
  if (!other.true_probs.empty()) true_probs.push_back(other.true_probs[s]);
  const bool other_weighted = !other.weights.empty();
  if (other_weighted && weights.empty()) weights.assign(keys.size(), 1.0f);
  for (uint32_t f = 0; f < nf; ++f) {
    const uint32_t b = other.offsets[size_t{s} * nf + f], e = other.offsets[size_t{s} * nf + f + 1];
    for (uint32_t i = b; i < e; ++i) {
      keys.push_back(other.keys[i]);
      if (other_weighted) {
        weights.push_back(other.weights[i]);
      } else if (!weights.empty()) {
        weights.push_back(1.0f);
      }
    }
    offsets.push_back(static_cast<uint32_t>(keys.size()));
  }
  ++size;
}

Status Batch::Validate() const {
  const size_t nd = schema.num_dense, nf = schema.num_fields;
  if (dense.size() != size * nd) {
    return Status::Internal("batch: dense has " + std::to_string(dense.size()) + " values, want " +
                            std::to_string(size * nd));
  }
  if (labels.size() != size) return Status::Internal("batch: label count != size");
  if (offsets.size() != size * nf + 1 || offsets.front() != 0 || offsets.back() != keys.size()) {
    return Status::Internal("batch: offsets inconsistent with keys");
  }
  for (size_t i = 1; i < offsets.size(); ++i) {
    if (offsets[i] < offsets[i - 1]) return Status::Internal("batch: offsets not monotone");
  }
  if (!weights.empty() && weights.size() != keys.size()) {
    return Status::Internal("batch: weight count != key count");
  }
  if (!true_probs.empty() && true_probs.size() != size) {
    return Status::Internal("batch: true_probs count != size");
  }
  return Status::OK();
}

// One pass over the keys with an open-addressing hash table (key -> first-seen id), then a sort
// of the unique keys alone (with their ids) and a remap of the rows: about a tenth of the time
// of sorting a copy of every key and binary-searching each one (Criteo-shaped batches have
// several entries per unique key). The table and the id buffers are kept per thread.
void IndexBatch(const Batch& batch, IndexedBatch* out) {
  struct Scratch {
    std::vector<uint64_t> slot_keys;
    std::vector<uint32_t> slot_ids;   // kEmpty: free slot
    std::vector<std::pair<uint64_t, uint32_t>> uniques;  // (key, first-seen id)
    std::vector<uint32_t> sorted_row;  // first-seen id -> row in the sorted unique keys
  };
  static constexpr uint32_t kEmpty = UINT32_MAX;
  thread_local Scratch scratch;
  const size_t n = batch.keys.size();
  out->unique_keys.clear();
  out->rows.resize(n);
  if (n == 0) return;
  // A power of two at least twice the number of entries (an upper bound on the unique keys).
  int bits = 1;
  while ((size_t{1} << bits) < 2 * n) ++bits;
  const size_t capacity = size_t{1} << bits, mask = capacity - 1;
  scratch.slot_keys.resize(capacity);
  scratch.slot_ids.assign(capacity, kEmpty);
  scratch.uniques.clear();
  uint64_t* const slot_keys = scratch.slot_keys.data();
  uint32_t* const slot_ids = scratch.slot_ids.data();
  uint32_t* const rows = out->rows.data();
  for (size_t e = 0; e < n; ++e) {
    const uint64_t key = batch.keys[e];
    size_t slot = static_cast<size_t>((key * 0x9e3779b97f4a7c15ULL) >> (64 - bits));
    while (true) {
      const uint32_t id = slot_ids[slot];
      if (id == kEmpty) {
        const auto fresh = static_cast<uint32_t>(scratch.uniques.size());
        slot_ids[slot] = fresh;
        slot_keys[slot] = key;
        scratch.uniques.emplace_back(key, fresh);
        rows[e] = fresh;
        break;
      }
      if (slot_keys[slot] == key) {
        rows[e] = id;
        break;
      }
      slot = (slot + 1) & mask;
    }
  }
  std::sort(scratch.uniques.begin(), scratch.uniques.end());
  const size_t u = scratch.uniques.size();
  out->unique_keys.resize(u);
  scratch.sorted_row.resize(u);
  for (size_t r = 0; r < u; ++r) {
    out->unique_keys[r] = scratch.uniques[r].first;
    scratch.sorted_row[scratch.uniques[r].second] = static_cast<uint32_t>(r);
  }
  for (size_t e = 0; e < n; ++e) rows[e] = scratch.sorted_row[rows[e]];
}

Status IndexBatchOnto(const Batch& batch, std::span<const uint64_t> sorted_keys,
                      std::vector<uint32_t>* rows) {
  rows->resize(batch.keys.size());
  for (size_t i = 0; i < batch.keys.size(); ++i) {
    auto it = std::lower_bound(sorted_keys.begin(), sorted_keys.end(), batch.keys[i]);
    if (it == sorted_keys.end() || *it != batch.keys[i]) {
      return Status::Internal("IndexBatchOnto: key missing from the key set");
    }
    (*rows)[i] = static_cast<uint32_t>(it - sorted_keys.begin());
  }
  return Status::OK();
}

}  // namespace tessera::worker
