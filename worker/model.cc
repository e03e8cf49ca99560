#include "worker/model.h"

#include <charconv>
#include <cmath>

#include "ps/feature_keys.h"

namespace tessera::worker {

OptimizerSpec ModelConfig::DefaultEmbeddingOptimizer() {
  OptimizerSpec o;
  o.kind = OptimizerKind::kAdagrad;
  o.learning_rate = 0.05f;
  // A non-zero start damps the first steps of rare rows (pure Adagrad moves them by lr).
  o.initial_accumulator = 0.01f;
  return o;
}

OptimizerSpec ModelConfig::DefaultDenseOptimizer() {
  OptimizerSpec o;
  o.kind = OptimizerKind::kAdam;
  o.learning_rate = 3e-3f;
  return o;
}

OptimizerSpec ModelConfig::DefaultWideOptimizer() {
  OptimizerSpec o;
  o.kind = OptimizerKind::kFtrl;
  o.learning_rate = 0.05f;
  o.ftrl_beta = 1.0f;
  o.l1 = 0.0f;
  o.l2 = 0.1f;
  return o;
}

Result<std::vector<uint32_t>> ParseLayerWidths(std::string_view text) {
  std::vector<uint32_t> out;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(',', start);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view item = text.substr(start, end - start);
    if (!item.empty()) {
      uint32_t w = 0;
      auto [p, ec] = std::from_chars(item.data(), item.data() + item.size(), w);
      if (ec != std::errc() || p != item.data() + item.size() || w == 0 || w > 65536) {
        return Status::InvalidArgument("layer widths '" + std::string(text) + "': '" +
                                       std::string(item) + "' is not a width in 1..65536");
      }
      out.push_back(w);
    }
    start = end + 1;
  }
  return out;
}

Result<ModelKind> ParseModelKind(std::string_view name) {
  for (ModelKind k : {ModelKind::kDlrm, ModelKind::kDeepFm, ModelKind::kDcn}) {
    if (name == ModelKindName(k)) return k;
  }
  return Status::InvalidArgument("unknown model '" + std::string(name) +
                                 "' (known: dlrm, deepfm, dcn)");
}

std::string_view ModelKindName(ModelKind kind) {
  switch (kind) {
    case ModelKind::kDlrm:
      return "dlrm";
    case ModelKind::kDeepFm:
      return "deepfm";
    case ModelKind::kDcn:
      return "dcn";
  }
  return "unknown";
}

namespace {

// What ModelLayout::Create refuses: field counts, empty parts, 0-wide layers, kinds without
// their deep part.
Status CheckModelConfig(const ModelConfig& c) {
  if (c.num_fields == 0 || c.num_fields > kMaxFields) {
    return Status::InvalidArgument("num_fields must be in [1, " + std::to_string(kMaxFields) + "]");
  }
  if (!c.deep && !c.wide) return Status::InvalidArgument("model has neither deep nor wide part");
  if (c.deep && c.embedding_dim == 0) return Status::InvalidArgument("embedding_dim is 0");
  for (uint32_t w : c.bottom_mlp) {
    if (w == 0) return Status::InvalidArgument("bottom_mlp has a 0-wide layer");
  }
  for (uint32_t w : c.top_mlp) {
    if (w == 0) return Status::InvalidArgument("top_mlp has a 0-wide layer");
  }
  if (c.kind != ModelKind::kDlrm && !c.deep) {
    return Status::InvalidArgument("model " + std::string(ModelKindName(c.kind)) +
                                   " needs the deep part (a wide-only model is --model=dlrm "
                                   "--deep=false)");
  }
  if (c.kind == ModelKind::kDcn && c.num_cross_layers > 64) {
    return Status::InvalidArgument("num_cross_layers " + std::to_string(c.num_cross_layers) +
                                   " is above 64");
  }
  return Status::OK();
}

}  // namespace

Result<ModelLayout> ModelLayout::Create(const ModelConfig& c) {
  TESSERA_RETURN_IF_ERROR(CheckModelConfig(c));
  ModelLayout l;
  l.config_ = c;
  TESSERA_RETURN_IF_ERROR(l.PlaceLayers());
  l.AddTables();
  return l;
}

Status ModelLayout::PlaceLayers() {
  const ModelConfig& c = config_;
  uint64_t offset = 1;  // the global bias
  auto add = [&](std::vector<LayerShape>* v, uint32_t in, uint32_t out, bool relu) {
    LayerShape s;
    s.in = in;
    s.out = out;
    s.offset = offset;
    s.relu = relu;
    offset += s.size();
    v->push_back(s);
  };
  if (c.deep) {
    const uint32_t d = c.embedding_dim;
    if (c.num_dense > 0) {
      uint32_t in = c.num_dense;
      for (uint32_t w : c.bottom_mlp) {
        add(&bottom_, in, w, true);
        in = w;
      }
      add(&bottom_, in, d, true);
    }
    num_vectors_ = c.num_fields + (c.num_dense > 0 ? 1 : 0);
    if (c.kind == ModelKind::kDlrm) {
      top_input_ = (c.num_dense > 0 ? d : 0) + num_vectors_ * (num_vectors_ - 1) / 2;
    } else {
      // DeepFM's DNN and DCN-v2's cross layers read the concatenated vectors x0.
      top_input_ = num_vectors_ * d;
    }
    if (top_input_ == 0) return Status::InvalidArgument("the top MLP would have no input");
    if (c.kind == ModelKind::kDcn) {
      for (uint32_t i = 0; i < c.num_cross_layers; ++i) {
        add(&cross_, top_input_, top_input_, false);
      }
    }
    uint32_t in = top_input_;
    for (uint32_t w : c.top_mlp) {
      add(&top_, in, w, true);
      in = w;
    }
    add(&top_, in, 1, false);
  }
  num_params_ = offset;
  return Status::OK();
}

void ModelLayout::AddTables() {
  const ModelConfig& c = config_;
  const std::string& p = c.table_prefix;
  InitializerSpec zeros;
  dense_tables_.push_back({TableSpec::Dense(p + "/bias", 1, c.dense_optimizer, zeros), 0});
  auto layer_tables = [&](const std::vector<LayerShape>& layers, const std::string& name) {
    for (size_t i = 0; i < layers.size(); ++i) {
      // PyTorch's nn.Linear default: W and b uniform in +-1/sqrt(fan_in).
      InitializerSpec init;
      init.kind = InitializerKind::kUniform;
      const float bound = 1.0f / std::sqrt(static_cast<float>(layers[i].in));
      init.a = -bound;
      init.b = bound;
      init.seed = c.init_seed + 101 * (i + 1) + (name == "top" ? 7919 : 0) +
                  (name == "cross" ? 15485863 : 0);
      dense_tables_.push_back({TableSpec::Dense(p + "/" + name + std::to_string(i),
                                                layers[i].size(), c.dense_optimizer, init),
                               layers[i].offset});
    }
  };
  layer_tables(bottom_, "bottom");
  layer_tables(cross_, "cross");
  layer_tables(top_, "top");
  if (c.deep) {
    InitializerSpec init;
    init.kind = InitializerKind::kUniform;
    init.a = -c.embedding_init_scale;
    init.b = c.embedding_init_scale;
    init.seed = c.init_seed;
    embedding_table_ =
        TableSpec::Sparse(p + "/emb", c.embedding_dim, c.embedding_optimizer, init);
  }
  if (c.wide) wide_table_ = TableSpec::Sparse(p + "/wide", 1, c.wide_optimizer, zeros);
}

}  // namespace tessera::worker
