// Defaults chosen from the data (docs/worker.md, "Defaults that fit the data"): what a first pass
// over the training data saw, and the documented rules that turn it into the embedding width
// and the MLP sizes where the user gave none.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ps/status.h"
#include "worker/data_reader.h"

namespace tessera::worker {

/// What a pass over (the start of) the training data saw. A value type.
struct DataProfile {
  /// Samples read.
  uint64_t samples = 0;
  /// Dense features per sample.
  uint32_t num_dense = 0;
  /// Distinct keys seen in each categorical field, in field order.
  std::vector<uint64_t> distinct_keys;
  /// The mean of distinct_keys over the fields that saw a key; 0 when none did.
  double MeanDistinctKeys() const;
};

/// Samples a profile reads at most: enough to tell 100 keys a field from 10,000, cheap next to
/// an epoch (50,000 generated samples take about 0.1 s of one core).
inline constexpr uint64_t kProfileSamples = 50000;

/// Reads up to `max_samples` samples of `reader` from where it stands and counts the distinct
/// keys of each field. Errors are the reader's.
Result<DataProfile> ProfileData(DataReader* reader, uint64_t max_samples = kProfileSamples);

/// The embedding width of data with this profile: k = MeanDistinctKeys(), width = k^0.25 (the
/// usual fourth-root rule) rounded to a multiple of 4, clamped to [4, 32]: 4 below about 1,300
/// keys a field, 8 below 10,000, 12 below 38,000, 16 below 105,000, ..., 32 from 810,000; 4
/// with no keys.
uint32_t DefaultEmbeddingDim(const DataProfile& profile);

/// The hidden widths of the top MLP (and of the bottom one, where there are dense features)
/// for embeddings `embedding_dim` wide: one layer of 8 * embedding_dim units clamped to
/// [64, 256], as text ParseLayerWidths reads ("64" for width 8 or less).
std::string DefaultMlp(uint32_t embedding_dim);

}  // namespace tessera::worker
