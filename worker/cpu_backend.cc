#include <memory>

#include "worker/backend.h"
#include "worker/cpu_model_internal.h"

namespace tessera::worker {
namespace {

class CpuBackend final : public Backend {
 public:
  CpuBackend(const ModelLayout& layout, const CpuBackendOptions& options)
      : layout_(layout), model_(layout_, options.threads) {}
  std::string_view name() const override { return "cpu"; }

  Status Forward(const ModelInput& in, float* probs) override {
    TESSERA_RETURN_IF_ERROR(Check(in, false));
    model_.Run(Convert(in), 0.0f, probs, nullptr);
    return Status::OK();
  }

  Status ForwardBackward(const ModelInput& in, float loss_scale, float* probs,
                         ModelGrads* grads) override {
    TESSERA_RETURN_IF_ERROR(Check(in, true));
    model_.Run(Convert(in), loss_scale, probs, &scratch_);
    grads->embeddings.swap(scratch_.embeddings);
    grads->wide.swap(scratch_.wide);
    grads->params.swap(scratch_.params);
    grads->loss_sum = scratch_.loss_sum;
    return Status::OK();
  }

 private:
  static internal::InputT<float> Convert(const ModelInput& in) {
    internal::InputT<float> t;
    t.batch_size = in.batch_size;
    t.dense = in.dense;
    t.labels = in.labels;
    t.offsets = in.offsets;
    t.rows = in.rows;
    t.weights = in.weights;
    t.num_rows = in.num_rows;
    t.embeddings = in.embeddings;
    t.wide = in.wide;
    t.params = in.params;
    return t;
  }

  Status Check(const ModelInput& in, bool need_labels) const {
    const ModelConfig& c = layout_.config();
    if (in.batch_size == 0) return Status::OK();
    if (in.offsets == nullptr || in.params == nullptr) {
      return Status::InvalidArgument("model input lacks offsets or params");
    }
    if (c.num_dense > 0 && c.deep && in.dense == nullptr) {
      return Status::InvalidArgument("model input lacks dense features");
    }
    if (need_labels && in.labels == nullptr) return Status::InvalidArgument("no labels");
    if ((c.deep && in.embeddings == nullptr && in.num_rows > 0) ||
        (c.wide && in.wide == nullptr && in.num_rows > 0)) {
      return Status::InvalidArgument("model input lacks sparse rows");
    }
    const uint32_t entries = in.offsets[size_t{in.batch_size} * c.num_fields];
    for (uint32_t e = 0; e < entries; ++e) {
      if (in.rows[e] >= in.num_rows) {
        return Status::InvalidArgument("row index " + std::to_string(in.rows[e]) + " >= num_rows " +
                                       std::to_string(in.num_rows));
      }
    }
    return Status::OK();
  }

  ModelLayout layout_;
  internal::CpuModel<float> model_;
  internal::GradsT<float> scratch_;
};

}  // namespace

Result<std::unique_ptr<Backend>> CreateCpuBackend(const ModelLayout& layout,
                                                  const CpuBackendOptions& options) {
  if (options.threads < 1) return Status::InvalidArgument("threads must be >= 1");
  return std::unique_ptr<Backend>(new CpuBackend(layout, options));
}

}  // namespace tessera::worker
