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

/// The family of the deep part. Every family starts from the same vectors v_1..v_n (each
/// embedding_dim wide): the bottom MLP's output on the dense features (when there are dense
/// features) and the pooled embedding of every field; x0 = [v_1, ..., v_n] is their
/// concatenation (n * embedding_dim wide). With w(s) the wide part (the sum of the sample's
/// wide weights, when the wide part exists) and b the global bias, the logit is:
///  - kDlrm (DLRM): b + w(s) + top([v_1, dots v_i . v_j for i > j]); the v_1 in front only when
///    there are dense features.
///  - kDeepFm (DeepFM): b + w(s) (the first-order term) + FM(v) + top(x0), where
///    FM(v) = 1/2 sum_k [(sum_i v_ik)^2 - sum_i v_ik^2] = sum_{i<j} v_i . v_j.
///  - kDcn (DCN-v2, full-rank cross layers, stacked): x_{l+1} = x0 ⊙ (W_l x_l + b_l) + x_l for
///    l = 0 .. L-1 (W_l square, n*d x n*d), then b + w(s) + top(x_L).
/// top is the top MLP (ReLU hidden layers, a linear 1-unit output layer).
enum class ModelKind : uint8_t { kDlrm = 0, kDeepFm = 1, kDcn = 2 };

/// "dlrm", "deepfm" or "dcn" to its kind; InvalidArgument names an unknown name and the known
/// ones.
Result<ModelKind> ParseModelKind(std::string_view name);
/// The name ParseModelKind reads.
std::string_view ModelKindName(ModelKind kind);

/// The model. Deep part (`kind`, see ModelKind): an embedding bag per field, a bottom MLP on the
/// dense features whose output has embedding_dim units, an interaction of the bottom output and
/// the pooled embeddings (DLRM: pairwise dot products; DeepFM: a factorization machine beside
/// the top MLP; DCN-v2: cross layers before it), a top MLP ending in one logit. Wide part: one
/// weight per feature key summed into the logit (FTRL on the server). A global bias always.
struct ModelConfig {
  /// The family of the deep part. Default: DLRM.
  ModelKind kind = ModelKind::kDlrm;
  /// DCN-v2: cross layers (0..64; 0 gives a plain MLP on x0). Ignored by the other kinds.
  /// Default: 3.
  uint32_t num_cross_layers = 3;
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

/// Where every parameter lives: the flat dense vector (bias, then bottom layers, then the cross
/// layers of DCN-v2, then top layers) and the server tables. Immutable; thread-safe.
class ModelLayout {
 public:
  static Result<ModelLayout> Create(const ModelConfig& config);

  const ModelConfig& config() const { return config_; }
  const std::vector<LayerShape>& bottom() const { return bottom_; }
  const std::vector<LayerShape>& top() const { return top_; }
  /// DCN-v2's cross layers (in = out = n * embedding_dim, relu false; W_l then b_l, as every
  /// layer); empty for the other kinds.
  const std::vector<LayerShape>& cross() const { return cross_; }
  /// Offset of the global bias in the flat vector (always 0).
  uint64_t bias_offset() const { return 0; }
  /// Floats of the flat dense parameter vector.
  uint64_t num_params() const { return num_params_; }
  /// Vectors that interact: the bottom output (when there are dense features) and the fields.
  uint32_t num_vectors() const { return num_vectors_; }
  /// Width of the top MLP's input: DLRM the bottom output (with dense features) and the
  /// n (n - 1) / 2 dots; DeepFM and DCN-v2 n * embedding_dim.
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
  // The layers' shapes and places in the flat vector, from config_ (checked).
  Status PlaceLayers();
  // The server tables of the placed layers, the embeddings and the wide part.
  void AddTables();

  ModelConfig config_;
  std::vector<LayerShape> bottom_, top_, cross_;
  uint64_t num_params_ = 0;
  uint32_t num_vectors_ = 0;
  uint32_t top_input_ = 0;
  std::vector<DenseTable> dense_tables_;
  TableSpec embedding_table_, wide_table_;
};

}  // namespace tessera::worker
