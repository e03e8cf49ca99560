#include "worker/backend.h"

#include <string>

#include "worker/local_reducer.h"

namespace tessera::worker {

Status CheckModelInput(const ModelConfig& c, const ModelInput& in, bool need_labels) {
  if (in.batch_size == 0) return Status::OK();
  if (in.offsets == nullptr || in.rows == nullptr || in.params == nullptr) {
    return Status::InvalidArgument("model input lacks offsets, rows or params");
  }
  if (c.deep && c.num_dense > 0 && in.dense == nullptr) {
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

Status Backend::ForwardBackwardReduced(const ModelInput& in, float loss_scale, float* probs,
                                       ModelGrads* grads, LocalReducer* reducer) {
  TESSERA_RETURN_IF_ERROR(ForwardBackward(in, loss_scale, probs, grads));
  if (reducer == nullptr) return Status::OK();
  TESSERA_RETURN_IF_ERROR(reducer->ReduceSum(grads->embeddings));
  TESSERA_RETURN_IF_ERROR(reducer->ReduceSum(grads->wide));
  TESSERA_RETURN_IF_ERROR(reducer->ReduceSum(grads->params));
  float loss = static_cast<float>(grads->loss_sum);
  TESSERA_RETURN_IF_ERROR(reducer->ReduceSum(std::span<float>(&loss, 1)));
  if (reducer->leader()) grads->loss_sum = loss;
  return Status::OK();
}

}  // namespace tessera::worker
