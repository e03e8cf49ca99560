// Opens a training job's data from a spec such as "synthetic" or "criteo:/data/train.txt".
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "ps/status.h"
#include "worker/csv_reader.h"
#include "worker/data_reader.h"
#include "worker/readers.h"
#include "worker/synthetic_data.h"

namespace tessera::worker {

/// Where a job's samples come from and how they are split.
struct DataSourceOptions {
  /// "synthetic", "criteo:PATH", "libsvm:PATH", "csv:PATH" (with `schema`) or "movielens:DIR".
  /// Default: "synthetic".
  std::string spec = "synthetic";
  /// This reader's shard of the training part. Defaults: 0 of 1.
  uint32_t rank = 0;
  uint32_t world = 1;
  /// Passes over the training part. Default: 1.
  uint32_t epochs = 1;
  /// Shuffle buffer in samples (0: file order). Default: 0.
  uint32_t shuffle_buffer = 0;
  /// Seed of the shuffle buffer. Default: 1.
  uint64_t shuffle_seed = 1;
  /// Criteo, libSVM and CSV: line i is held out for testing iff
  /// i % holdout_mod == holdout_mod - 1. Default: 10 (a tenth). MovieLens splits by time instead.
  uint32_t holdout_mod = 10;
  /// Synthetic: the generator (its rank, world, stream and num_samples are set from here).
  SyntheticOptions synthetic;
  /// Synthetic: training samples (all shards) and test samples. Defaults: 2500000, 100000.
  uint64_t train_samples = 2500000;
  uint64_t test_samples = 100000;
  /// libSVM reader options.
  LibsvmOptions libsvm;
  /// CSV: the column schema (ParseCsvSchema's syntax, docs/worker.md "CSV input"); required for
  /// "csv:PATH". Default: empty.
  std::string schema;
  /// CSV: skip malformed lines (CsvOptions::skip_bad_lines) instead of failing. Default: false.
  bool skip_bad_lines = false;
  /// CSV: where skipped lines are counted; may be null. Borrowed: must outlive every reader
  /// opened from these options (copies share it). Default: null.
  SkippedLines* skipped_lines = nullptr;
  /// Validation part. Files: sample g of the training part (g counted over the whole part in
  /// file order, before it is dealt to ranks) is a validation sample iff
  /// g % validation_mod == validation_mod - 1, and no rank trains on it; 0: none, every
  /// training sample trains. Synthetic: the validation part is a stream of its own (stream 2,
  /// as the test part is stream 1) of validation_samples samples; the training part is whole.
  /// MovieLens, split by time: the latest 1/validation_mod of the training part's ratings (as
  /// the test part is the latest tenth of all). Default: 10.
  uint32_t validation_mod = 10;
  /// Validation samples read by OpenValidationData's caller (the first of the part); synthetic:
  /// the size of the validation stream. Default: 20000.
  uint64_t validation_samples = 20000;
};

/// This shard's training reader (with epochs and shuffling applied).
Result<std::unique_ptr<DataReader>> OpenTrainData(const DataSourceOptions& options);
/// The whole held-out part (not sharded).
Result<std::unique_ptr<DataReader>> OpenTestData(const DataSourceOptions& options);
/// The validation part (not sharded, no epochs or shuffle; see validation_mod).
Result<std::unique_ptr<DataReader>> OpenValidationData(const DataSourceOptions& options);
/// Samples in one epoch of the smallest training shard of `options.world` ranks (validation
/// samples excluded). Synthetic: computed; files: one pass over the training part.
Result<uint64_t> SmallestTrainShard(const DataSourceOptions& options);
/// Whether the source knows every sample's true click probability.
bool HasOracle(const DataSourceOptions& options);

}  // namespace tessera::worker
