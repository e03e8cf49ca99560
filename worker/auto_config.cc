#include "worker/auto_config.h"

#include <algorithm>
#include <cmath>
#include <unordered_set>

namespace tessera::worker {

double DataProfile::MeanDistinctKeys() const {
  double sum = 0;
  uint32_t fields = 0;
  for (uint64_t k : distinct_keys) {
    if (k == 0) continue;
    sum += static_cast<double>(k);
    ++fields;
  }
  return fields > 0 ? sum / fields : 0;
}

Result<DataProfile> ProfileData(DataReader* reader, uint64_t max_samples) {
  if (reader == nullptr) return Status::InvalidArgument("ProfileData: no reader");
  const Schema& schema = reader->schema();
  DataProfile profile;
  profile.num_dense = schema.num_dense;
  std::vector<std::unordered_set<uint64_t>> seen(schema.num_fields);
  Batch batch;
  while (profile.samples < max_samples) {
    batch.Clear(schema);
    const auto want = static_cast<uint32_t>(std::min<uint64_t>(max_samples - profile.samples, 4096));
    TESSERA_ASSIGN_OR_RETURN(const uint32_t got, reader->Read(want, &batch));
    if (got == 0) break;
    for (uint32_t s = 0; s < batch.size; ++s) {
      for (uint32_t f = 0; f < schema.num_fields; ++f) {
        const size_t bag = static_cast<size_t>(s) * schema.num_fields + f;
        for (uint32_t i = batch.offsets[bag]; i < batch.offsets[bag + 1]; ++i) {
          seen[f].insert(batch.keys[i]);
        }
      }
    }
    profile.samples += got;
  }
  profile.distinct_keys.reserve(seen.size());
  for (const auto& keys : seen) profile.distinct_keys.push_back(keys.size());
  return profile;
}

uint32_t DefaultEmbeddingDim(const DataProfile& profile) {
  const double k = profile.MeanDistinctKeys();
  const double width = std::pow(std::max(k, 1.0), 0.25);
  const auto rounded = static_cast<uint32_t>(4 * std::lround(width / 4));
  return std::clamp<uint32_t>(rounded, 4, 32);
}

std::string DefaultMlp(uint32_t embedding_dim) {
  return std::to_string(std::clamp<uint32_t>(8 * embedding_dim, 64, 256));
}

}  // namespace tessera::worker
