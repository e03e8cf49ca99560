// The DLRM-style click model: its configuration, parameter layout and server tables.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ps/status.h"
#include "ps/table_spec.h"

namespace tessera::worker {

/// How an embedding bag pools its rows.
enum class Pooling : uint8_t { kSum = 0, kMean = 1 };

/// The model. Deep part: an embedding bag per field, a bottom MLP on the dense features whose
/// output has embedding_dim units, the pairwise dot products of the bottom output and the
/// pooled embeddings, a top MLP on [bottom output, dots] ending in one logit. Wide part: one
/// weight per feature key summed into the logit (FTRL on the server). A global bias always.
struct ModelConfig {
  /// Dense features per sample. Default: 13.
  uint32_t num_dense = 13;
  /// Categorical fields per sample. Default: 26.
  uint32_t num_fields = 26;
  /// Embedding width (also the bottom MLP's output). Default: 16.
  uint32_t embedding_dim = 16;
  /// Embedding-bag pooling. Default: sum.
  Pooling pooling = Pooling::kSum;
  /// Hidden layer widths of the bottom MLP (ReLU; the output layer, also ReLU, is added).
  /// Default: {64}.
  std::vector<uint32_t> bottom_mlp = {64};
  /// Hidden layer widths of the top MLP (ReLU; a linear 1-unit output layer is added).
  /// Default: {64}.
  std::vector<uint32_t> top_mlp = {64};
  /// Whether the deep part exists (false: a wide-only logistic regression). Default: true.
  bool deep = true;
  /// Whether the wide part exists. Default: true.
  bool wide = true;
  /// Prefix of the server table names, e.g. "ctr" gives "ctr/emb". Default: "ctr".
  std::string table_prefix = "ctr";
  /// Initial embedding values are uniform in [-s, s]. Default: 0.05.
  float embedding_init_scale = 0.05f;
  /// Seed of the server-side initializers. Default: 7.
  uint64_t init_seed = 7;
  /// Server optimizers. Defaults: Adagrad 0.05 (initial accumulator 0.01) for embeddings,
  /// Adam 3e-3 for the MLPs and the bias, FTRL (alpha 0.05, beta 1, L1 0, L2 0.1) for the wide
  /// weights.
  OptimizerSpec embedding_optimizer = DefaultEmbeddingOptimizer();
  OptimizerSpec dense_optimizer = DefaultDenseOptimizer();
  OptimizerSpec wide_optimizer = DefaultWideOptimizer();

  static OptimizerSpec DefaultEmbeddingOptimizer();
  static OptimizerSpec DefaultDenseOptimizer();
  static OptimizerSpec DefaultWideOptimizer();
};

/// Parses hidden-layer widths such as "256,64" (empty: no hidden layer). InvalidArgument names
/// an item that is not a width in 1..65536.
Result<std::vector<uint32_t>> ParseLayerWidths(std::string_view text);

/// One fully connected layer: y = x W^T + b, W is out x in row-major, stored at `offset` of the
/// flat parameter vector followed by b.
struct LayerShape {
  uint32_t in = 0;
  uint32_t out = 0;
  uint64_t offset = 0;
  bool relu = true;
  uint64_t size() const { return uint64_t{in} * out + out; }
};

/// Where every parameter lives: the flat dense vector (bias, then bottom layers, then top
/// layers) and the server tables. Immutable; thread-safe.
class ModelLayout {
 public:
  static Result<ModelLayout> Create(const ModelConfig& config);

  const ModelConfig& config() const { return config_; }
  const std::vector<LayerShape>& bottom() const { return bottom_; }
  const std::vector<LayerShape>& top() const { return top_; }
  /// Offset of the global bias in the flat vector (always 0).
  uint64_t bias_offset() const { return 0; }
  /// Floats of the flat dense parameter vector.
  uint64_t num_params() const { return num_params_; }
  /// Vectors that interact: the bottom output (when there are dense features) and the fields.
  uint32_t num_vectors() const { return num_vectors_; }
  /// Width of the top MLP's input.
  uint32_t top_input() const { return top_input_; }

  /// Server tables: the dense ones in flat-vector order, each with its offset and length.
  struct DenseTable {
    TableSpec spec;
    uint64_t offset = 0;
  };
  const std::vector<DenseTable>& dense_tables() const { return dense_tables_; }
  /// The embedding table (deep only) and the wide table (wide only).
  const TableSpec& embedding_table() const { return embedding_table_; }
  const TableSpec& wide_table() const { return wide_table_; }

 private:
  ModelConfig config_;
  std::vector<LayerShape> bottom_, top_;
  uint64_t num_params_ = 0;
  uint32_t num_vectors_ = 0;
  uint32_t top_input_ = 0;
  std::vector<DenseTable> dense_tables_;
  TableSpec embedding_table_, wide_table_;
};

}  // namespace tessera::worker
