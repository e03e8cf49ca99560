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
    TESSERA_RETURN_IF_ERROR(CheckModelInput(layout_.config(), in, false));
    model_.Run(Convert(in), 0.0f, probs, nullptr);
    return Status::OK();
  }

  Status ForwardBackward(const ModelInput& in, float loss_scale, float* probs,
                         ModelGrads* grads) override {
    TESSERA_RETURN_IF_ERROR(CheckModelInput(layout_.config(), in, true));
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
