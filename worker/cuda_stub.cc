// The CUDA backend and the NCCL group in a build without CUDA: they report why they are absent.
#include "worker/backend.h"
#include "worker/embedding_bag.h"
#include "worker/local_reducer.h"

namespace tessera::worker {
namespace {

Status NoCuda(const std::string& what) {
  return Status::FailedPrecondition(what + ": this build has no CUDA (TESSERA_HAVE_CUDA was OFF)");
}

}  // namespace

Result<int> CudaDeviceCount() { return NoCuda("no usable GPU"); }

bool CudaBackendAvailable(std::string* why_not) {
  if (why_not != nullptr) *why_not = CudaDeviceCount().status().message();
  return false;
}

Result<std::unique_ptr<Backend>> CreateCudaBackend(const ModelLayout&, int) {
  return NoCuda("CUDA backend");
}

Result<std::shared_ptr<ReduceGroup>> CreateNcclReduceGroup(const NcclReduceGroupOptions&) {
  return NoCuda("NCCL reduction");
}

Status EmbeddingBagForward(const EmbeddingBagArgs&, void*) { return NoCuda("embedding bag"); }

Status EmbeddingBagBackward(const EmbeddingBagArgs&, const float*, float*, void*) {
  return NoCuda("embedding bag");
}

}  // namespace tessera::worker
