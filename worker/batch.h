// Training samples in columnar form: dense features, bags of categorical keys, labels.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "ps/status.h"

namespace tessera::worker {

/// The shape of a data set's samples.
struct Schema {
  /// Dense (real-valued) features per sample. Default: 0.
  uint32_t num_dense = 0;
  /// Categorical fields per sample; each holds a bag of zero or more keys. Default: 0.
  uint32_t num_fields = 0;
};

/// A batch of samples. Sample s, field f holds keys[offsets[s*F+f] .. offsets[s*F+f+1]) with
/// optional per-key weights (empty `weights` means every weight is 1). Not thread-safe.
struct Batch {
  Schema schema;
  uint32_t size = 0;
  /// size * num_dense features, row-major.
  std::vector<float> dense;
  /// size labels in {0, 1}.
  std::vector<float> labels;
  /// size * num_fields + 1 offsets into keys.
  std::vector<uint32_t> offsets{0};
  std::vector<uint64_t> keys;
  /// Empty, or one weight per key.
  std::vector<float> weights;
  /// The true click probability per sample where the data is generated; empty otherwise.
  std::vector<float> true_probs;

  /// Empties the batch and sets its schema.
  void Clear(const Schema& s);
  /// Appends `other`'s samples (same schema).
  void Append(const Batch& other);
  /// Appends sample `s` of `other` (same schema).
  void AppendSample(const Batch& other, uint32_t s);
  /// Checks sizes and offsets for consistency.
  Status Validate() const;
};

/// A batch with its keys deduplicated: rows[e] indexes unique_keys for key entry e.
struct IndexedBatch {
  std::vector<uint64_t> unique_keys;
  std::vector<uint32_t> rows;
};

/// Deduplicates the keys of `batch` (unique keys sorted ascending).
void IndexBatch(const Batch& batch, IndexedBatch* out);

/// Maps the keys of `batch` onto `sorted_keys` (which must contain all of them, ascending).
Status IndexBatchOnto(const Batch& batch, std::span<const uint64_t> sorted_keys,
                      std::vector<uint32_t>* rows);

}  // namespace tessera::worker
