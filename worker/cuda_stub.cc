// The CUDA backend and the NCCL reducer in a build without CUDA: they report why they are absent.
#include "worker/backend.h"
#include "worker/local_reducer.h"

namespace tessera::worker {

bool CudaBackendAvailable(std::string* why_not) {
  if (why_not != nullptr) *why_not = "this build has no CUDA (TESSERA_HAVE_CUDA was OFF)";
  return false;
}

Result<std::unique_ptr<Backend>> CreateCudaBackend(const ModelLayout&, int) {
  return Status::FailedPrecondition("this build has no CUDA backend");
}

Result<std::vector<char>> NcclUniqueId() {
  return Status::FailedPrecondition("this build has no NCCL");
}

Result<std::unique_ptr<LocalReducer>> CreateNcclReducer(const NcclReducerOptions&) {
  return Status::FailedPrecondition("this build has no NCCL");
}

}  // namespace tessera::worker
