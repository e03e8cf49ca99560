#include "worker/batch.h"

#include <algorithm>

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

void IndexBatch(const Batch& batch, IndexedBatch* out) {
  out->unique_keys = batch.keys;
  std::sort(out->unique_keys.begin(), out->unique_keys.end());
  out->unique_keys.erase(std::unique(out->unique_keys.begin(), out->unique_keys.end()),
                         out->unique_keys.end());
  IndexBatchOnto(batch, out->unique_keys, &out->rows).IgnoreError();  // Cannot fail here.
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
