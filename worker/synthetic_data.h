// Criteo-shaped generated data with a planted model, so every sample's click probability is known.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "ps/status.h"
#include "worker/data_reader.h"

namespace tessera::worker {

/// The 26 categorical cardinalities of the Criteo Kaggle data set, each capped at `cap`.
std::vector<uint64_t> CriteoLikeCardinalities(uint64_t cap);

/// The generator and its planted model. Labels are Bernoulli(sigmoid(logit)) with
///   logit = offset + sum_j w_j (x_j - 1) + sum_f b(f, id_f) + sum_{f<g} <v(f, id_f), v(g, id_g)>
/// where x are the dense features, and b and v (planted_dim wide) are pseudo-random functions of
/// (seed, field, id), scaled down for rare ids (tail_rank). Ids are Zipf-distributed per field;
/// some fields are missing at Criteo-like rates (a missing field contributes nothing).
struct SyntheticOptions {
  /// Seed of the planted model and of the sample stream. Default: 1.
  uint64_t seed = 1;
  /// Independent sample streams of the same planted model (e.g. 0 for training, 1 for test).
  /// Default: 0.
  uint64_t stream = 0;
  /// This reader's shard: it returns global samples rank, rank + world, ... Defaults: 0 of 1.
  uint32_t rank = 0;
  uint32_t world = 1;
  /// Samples of the whole stream (all shards together); 0: endless. Default: 0.
  uint64_t num_samples = 0;
  /// Dense features. Default: 13.
  uint32_t num_dense = 13;
  /// Ids per categorical field. Default: Criteo's, capped at 20000.
  std::vector<uint64_t> cardinalities = CriteoLikeCardinalities(20000);
  /// Zipf exponent of id frequencies. Default: 1.2.
  double zipf_exponent = 1.2;
  /// Width of the planted field embeddings, 1..8. Default: 4.
  uint32_t planted_dim = 4;
  /// Standard deviations of the logit's parts: interactions, per-id biases, dense. Defaults:
  /// 0.15, 1.0, 0.5. (Interactions of 0.5 over the 325 field pairs leave a DLRM of the default
  /// one-minute run 0.02-0.03 AUC short of the oracle; see docs/worker.md, "Measured".)
  double interaction_std = 0.15;
  double bias_std = 1.0;
  double dense_std = 0.5;
  /// The planted bias and vector of the id of frequency rank r are scaled by
  /// 1 / sqrt(1 + r / tail_rank): rare ids carry less signal, as in real logs (0: no decay).
  /// Default: 100.
  double tail_rank = 100;
  /// Constant of the logit (sets the click rate). Default: -1.2.
  double offset = -1.2;
};

/// Streams generated samples (with true_probs). Deterministic by (options, sample index): any
/// shard and position can be regenerated, so Seek is O(1). Not thread-safe.
class SyntheticReader final : public DataReader {
 public:
  static Result<std::unique_ptr<SyntheticReader>> Create(const SyntheticOptions& options);
  const Schema& schema() const override { return schema_; }
  Result<uint32_t> Read(uint32_t max_samples, Batch* batch) override;
  Status Rewind() override {
    position_ = 0;
    return Status::OK();
  }
  uint64_t position() const override { return position_; }
  Status Seek(uint64_t position) override;

  /// Appends global sample `index` of the stream to `batch`.
  void Generate(uint64_t index, Batch* batch) const;

 private:
  struct Zipf {
    uint64_t n;
    double s, h_x1, h_n, s_param;
  };
  explicit SyntheticReader(const SyntheticOptions& options);
  uint64_t SampleZipf(const Zipf& z, uint64_t* rng) const;

  SyntheticOptions options_;
  Schema schema_;
  std::vector<Zipf> zipf_;
  std::vector<double> missing_;
  std::vector<double> dense_w_;
  double sigma_v_ = 0, sigma_b_ = 0;
  uint64_t position_ = 0;
};

}  // namespace tessera::worker
