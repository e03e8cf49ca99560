// Criteo-shaped generated data with a planted model, so every sample's click probability is known.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "ps/status.h"
#include "worker/data_reader.h"

namespace tessera::worker {
namespace internal {
struct Zipf;
struct PlantedModel;
struct SyntheticTables;  // the fast generator's tables (synthetic_data_internal.h)
}  // namespace internal

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
  /// false: the fast generator (tables of the frequent ranks' planted values and probabilities,
  /// an inverse-CDF table of the dense features; docs/worker.md, "Synthetic data"). true: the
  /// slow exact reference it is checked against (Box-Muller, Hörmann-Derflinger's sampler for
  /// every field, every planted value hashed and every pairwise dot summed per sample; about
  /// 10x the CPU, see bench_generator). Both draw the same distribution from the same planted
  /// model, but different sample streams; the reference's is that of Tessera before the fast
  /// generator. Default: false.
  bool reference_generator = false;
  /// Fast generator: the frequency ranks 1..table_ranks of each field whose planted values and
  /// probabilities are tabulated; rarer ranks are computed per sample. Lowered by halving until
  /// the tables of all fields fit kMaxSyntheticTableBytes. 1..2^20. Default: 16384.
  uint32_t table_ranks = 16384;
};

/// The most memory the fast generator's tables of one planted model take: 16 MiB. Readers of
/// the same planted model (equal seed, cardinalities, zipf_exponent, planted_dim,
/// interaction_std, bias_std, tail_rank and table_ranks) share one copy.
inline constexpr size_t kMaxSyntheticTableBytes = size_t{16} << 20;

/// Streams generated samples (with true_probs). Deterministic by (options, sample index): any
/// shard and position can be regenerated, so Seek is O(1). Read, Rewind and Seek are not
/// thread-safe; Generate and the other const functions are (several threads may call them at
/// once on one reader, also while another thread reads).
class SyntheticReader final : public DataReader {
 public:
  /// InvalidArgument for options out of range. The fast generator's tables are built (60-110
  /// ms for the defaults on a 2-core machine) or found among those of live readers of the same
  /// planted model;
  /// the last tables built stay cached after their readers are gone (so at most one set of
  /// kMaxSyntheticTableBytes is held beyond what live readers use). Thread-safe.
  static Result<std::unique_ptr<SyntheticReader>> Create(const SyntheticOptions& options);
  ~SyntheticReader() override;
  const Schema& schema() const override { return schema_; }
  Result<uint32_t> Read(uint32_t max_samples, Batch* batch) override;
  Status Rewind() override {
    position_ = 0;
    return Status::OK();
  }
  uint64_t position() const override { return position_; }
  Status Seek(uint64_t position) override;

  /// Appends global sample `index` of the stream to `batch`. Thread-safe (const).
  void Generate(uint64_t index, Batch* batch) const;

  /// The planted bias of the id of frequency rank `rank` (1..cardinality) of `field`, and its
  /// planted vector into vec[0..planted_dim). The same values in both generators.
  void Planted(uint32_t field, uint64_t rank, double* bias, double* vec) const;
  /// The key of the id of frequency rank `rank` of `field` in the samples (ids are a fixed
  /// scramble of ranks, so frequent ids are not small numbers).
  static uint64_t KeyOf(uint32_t field, uint64_t rank);
  /// The dense features' weights w_j of the logit.
  const std::vector<double>& dense_weights() const { return dense_w_; }
  /// Fast generator: ranks per field tabulated (table_ranks after the memory bound), and the
  /// bytes of the tables (shared with readers of the same planted model). 0 for the reference.
  uint32_t tabulated_ranks() const;
  size_t table_bytes() const;
  /// Whether this reader and `other` use one copy of the tables.
  bool SharesTablesWith(const SyntheticReader& other) const {
    return tables_ != nullptr && tables_ == other.tables_;
  }

 private:
  explicit SyntheticReader(const SyntheticOptions& options);
  void GenerateReference(uint64_t index, Batch* batch) const;
  void GenerateFast(uint64_t index, Batch* batch) const;
  internal::PlantedModel Model() const;

  SyntheticOptions options_;
  Schema schema_;
  std::vector<internal::Zipf> zipf_;  // the reference generator's, per field
  std::vector<double> missing_;
  std::vector<double> dense_w_;
  double sigma_v_ = 0, sigma_b_ = 0;
  std::shared_ptr<const internal::SyntheticTables> tables_;  // null for the reference generator
  uint64_t position_ = 0;
};

}  // namespace tessera::worker
