#include "worker/backend.h"

#include "worker/local_reducer.h"

namespace tessera::worker {

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
