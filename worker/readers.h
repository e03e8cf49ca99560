// Readers of public recommendation data sets: Criteo TSV, libSVM/libFM/libFFM, MovieLens.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "ps/status.h"
#include "worker/data_reader.h"

namespace tessera::worker {

/// Criteo display-advertising TSV: label, 13 integer features, 26 hexadecimal categorical
/// features; empty fields are missing. Integer x becomes the dense feature log(1 + max(x, 0));
/// a categorical value becomes MakeKey(field, value). Missing categoricals are empty bags.
inline constexpr uint32_t kCriteoDense = 13;
inline constexpr uint32_t kCriteoFields = 26;
Result<std::unique_ptr<DataReader>> OpenCriteo(const std::string& path, const ShardOptions& shard);

/// Options of the libSVM reader.
struct LibsvmOptions {
  /// Number of categorical fields. 0: detect from the first line (its number of features, or
  /// 1 + the largest field id in libFFM lines). Default: 0.
  uint32_t num_fields = 0;
  /// Feature `idx:val` number i of a line goes to field min(i, num_fields - 1) (libFM exports
  /// of Frappe and Avazu have one feature per field in a fixed order). When false, every
  /// feature goes to field 0. libFFM triples `field:idx:val` always name their field.
  /// Default: true.
  bool field_by_position = true;
};

/// libSVM / libFM (`label idx:val ...`) and libFFM (`label field:idx:val ...`) text. The label
/// is 1 when > 0, else 0; a feature becomes key MakeKey(field, idx) with weight val.
Result<std::unique_ptr<DataReader>> OpenLibsvm(const std::string& path, const ShardOptions& shard,
                                               const LibsvmOptions& options = {});

/// Options of the MovieLens reader.
struct MovieLensOptions {
  /// Fraction of ratings, by time, that form the training part. Default: 0.9.
  double train_fraction = 0.9;
  /// Ratings >= this are clicks. Default: 4.
  double click_threshold = 4.0;
  /// Add a field with the movie's tags from tags.csv when present. Default: true.
  bool use_tags = true;
  /// Validation part, by time as the test split: the last validation_fraction of the training
  /// part's ratings (0: none, the training part is whole). Default: 0.
  double validation_fraction = 0;
  /// With a validation part, read it instead of the training part (a kTrain shard). Default:
  /// false.
  bool validation = false;
};

/// MovieLens (ratings.csv, movies.csv, optional tags.csv in `dir`) as click data: fields user,
/// movie, genres (bag), release year, tags (bag); no dense features. The split is by time: the
/// first train_fraction of ratings by timestamp train (of which the last validation_fraction,
/// by time, is the validation part when asked for), the rest test. ratings.csv is streamed
/// (a first pass only histograms timestamps); movies.csv and tags.csv are per-movie side tables.
inline constexpr uint32_t kMovieLensFields = 5;
Result<std::unique_ptr<DataReader>> OpenMovieLens(const std::string& dir, const ShardOptions& shard,
                                                  const MovieLensOptions& options = {});

}  // namespace tessera::worker
