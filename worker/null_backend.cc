#include <algorithm>
#include <cmath>
#include <memory>
#include <string>

#include "worker/backend.h"

namespace tessera::worker {
namespace {

class NullBackend final : public Backend {
 public:
  explicit NullBackend(const ModelLayout& layout) : layout_(layout) {}
  std::string_view name() const override { return "null"; }

  Status Forward(const ModelInput& in, float* probs) override {
    TESSERA_RETURN_IF_ERROR(CheckModelInput(layout_.config(), in, false));
    std::fill(probs, probs + in.batch_size, 0.5f);
    return Status::OK();
  }

  Status ForwardBackward(const ModelInput& in, float /*loss_scale*/, float* probs,
                         ModelGrads* grads) override {
    TESSERA_RETURN_IF_ERROR(CheckModelInput(layout_.config(), in, true));
    const ModelConfig& c = layout_.config();
    std::fill(probs, probs + in.batch_size, 0.5f);
    // assign keeps the vectors' capacity: no allocation once the batches' sizes have been seen.
    grads->embeddings.assign(c.deep ? size_t{in.num_rows} * c.embedding_dim : 0, 0.0f);
    grads->wide.assign(c.wide ? in.num_rows : 0, 0.0f);
    grads->params.assign(layout_.num_params(), 0.0f);
    // -log(0.5) per sample, whatever its label.
    grads->loss_sum = static_cast<double>(in.batch_size) * std::log(2.0);
    return Status::OK();
  }

 private:
  ModelLayout layout_;
};

}  // namespace

Result<std::unique_ptr<Backend>> CreateNullBackend(const ModelLayout& layout) {
  return std::unique_ptr<Backend>(new NullBackend(layout));
}

}  // namespace tessera::worker
