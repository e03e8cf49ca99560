// The NCCL LocalReducer: one rank per GPU; host spans are staged through device buffers.
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <cstring>

#include "worker/local_reducer.h"

namespace tessera::worker {
namespace {

Status NcclError(ncclResult_t r, const char* what) {
  return Status::Internal(std::string(what) + ": " + ncclGetErrorString(r));
}
#define TESSERA_NCCL(expr)                              \
  do {                                                  \
    ncclResult_t _r = (expr);                           \
    if (_r != ncclSuccess) return NcclError(_r, #expr); \
  } while (0)
#define TESSERA_CUDA_RT(expr)                                                      \
  do {                                                                             \
    cudaError_t _e = (expr);                                                       \
    if (_e != cudaSuccess) {                                                       \
      return Status::Internal(std::string(#expr) + ": " + cudaGetErrorString(_e)); \
    }                                                                              \
  } while (0)

class NcclReducer final : public LocalReducer {
 public:
  NcclReducer(uint32_t rank, uint32_t size, int device)
      : rank_(rank), size_(size), device_(device) {}
  ~NcclReducer() override {
    if (comm_ != nullptr) ncclCommDestroy(comm_);
    if (buf_ != nullptr) cudaFree(buf_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  Status Init(const ncclUniqueId& id) {
    TESSERA_CUDA_RT(cudaSetDevice(device_));
    TESSERA_CUDA_RT(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    TESSERA_NCCL(ncclCommInitRank(&comm_, static_cast<int>(size_), id, static_cast<int>(rank_)));
    return Status::OK();
  }

  uint32_t rank() const override { return rank_; }
  uint32_t size() const override { return size_; }
  void Abort() override {
    aborted_ = true;
    if (comm_ != nullptr) ncclCommAbort(comm_);
    comm_ = nullptr;
  }

  Status AllGather(uint64_t value, std::vector<uint64_t>* out) override {
    TESSERA_RETURN_IF_ERROR(Ready());
    TESSERA_RETURN_IF_ERROR(Reserve((1 + size_) * sizeof(uint64_t)));
    auto* send = static_cast<uint64_t*>(buf_);
    TESSERA_CUDA_RT(cudaMemcpyAsync(send, &value, sizeof(value), cudaMemcpyHostToDevice, stream_));
    TESSERA_NCCL(ncclAllGather(send, send + 1, 1, ncclUint64, comm_, stream_));
    out->resize(size_);
    TESSERA_CUDA_RT(cudaMemcpyAsync(out->data(), send + 1, size_ * sizeof(uint64_t),
                                    cudaMemcpyDeviceToHost, stream_));
    TESSERA_CUDA_RT(cudaStreamSynchronize(stream_));
    return Status::OK();
  }

  Status UnionKeys(std::span<const uint64_t> keys, std::vector<uint64_t>* out) override {
    std::vector<uint64_t> counts;
    TESSERA_RETURN_IF_ERROR(AllGather(keys.size(), &counts));
    const uint64_t max = *std::max_element(counts.begin(), counts.end());
    // Pad every rank's keys to the longest list, gather, and unpad by the known counts.
    const size_t bytes = (max + size_t{size_} * max) * sizeof(uint64_t);
    TESSERA_RETURN_IF_ERROR(Reserve(std::max<size_t>(bytes, sizeof(uint64_t))));
    auto* send = static_cast<uint64_t*>(buf_);
    if (!keys.empty()) {
      TESSERA_CUDA_RT(cudaMemcpyAsync(send, keys.data(), keys.size() * sizeof(uint64_t),
                                      cudaMemcpyHostToDevice, stream_));
    }
    std::vector<uint64_t> all(size_t{size_} * max);
    if (max > 0) {
      TESSERA_NCCL(ncclAllGather(send, send + max, max, ncclUint64, comm_, stream_));
      TESSERA_CUDA_RT(cudaMemcpyAsync(all.data(), send + max, all.size() * sizeof(uint64_t),
                                      cudaMemcpyDeviceToHost, stream_));
    }
    TESSERA_CUDA_RT(cudaStreamSynchronize(stream_));
    out->clear();
    for (uint32_t r = 0; r < size_; ++r) {
      out->insert(out->end(), all.begin() + r * max, all.begin() + r * max + counts[r]);
    }
    std::sort(out->begin(), out->end());
    out->erase(std::unique(out->begin(), out->end()), out->end());
    return Status::OK();
  }

  Status ReduceSum(std::span<float> data) override {
    TESSERA_RETURN_IF_ERROR(SameLength(data.size(), "ReduceSum"));
    if (data.empty()) return Status::OK();
    TESSERA_RETURN_IF_ERROR(Reserve(data.size() * sizeof(float)));
    auto* d = static_cast<float*>(buf_);
    TESSERA_CUDA_RT(
        cudaMemcpyAsync(d, data.data(), data.size_bytes(), cudaMemcpyHostToDevice, stream_));
    TESSERA_NCCL(ncclReduce(d, d, data.size(), ncclFloat32, ncclSum, 0, comm_, stream_));
    if (leader()) {
      TESSERA_CUDA_RT(
          cudaMemcpyAsync(data.data(), d, data.size_bytes(), cudaMemcpyDeviceToHost, stream_));
    }
    TESSERA_CUDA_RT(cudaStreamSynchronize(stream_));
    return Status::OK();
  }

  Status Broadcast(std::span<float> data) override {
    TESSERA_RETURN_IF_ERROR(SameLength(data.size(), "Broadcast"));
    if (data.empty()) return Status::OK();
    TESSERA_RETURN_IF_ERROR(Reserve(data.size() * sizeof(float)));
    auto* d = static_cast<float*>(buf_);
    if (leader()) {
      TESSERA_CUDA_RT(
          cudaMemcpyAsync(d, data.data(), data.size_bytes(), cudaMemcpyHostToDevice, stream_));
    }
    TESSERA_NCCL(ncclBroadcast(d, d, data.size(), ncclFloat32, 0, comm_, stream_));
    TESSERA_CUDA_RT(
        cudaMemcpyAsync(data.data(), d, data.size_bytes(), cudaMemcpyDeviceToHost, stream_));
    TESSERA_CUDA_RT(cudaStreamSynchronize(stream_));
    return Status::OK();
  }

 private:
  Status Ready() const {
    if (aborted_) return Status::Cancelled("local reduction group aborted");
    return Status::OK();
  }
  // Every rank must pass the same length; checked with a gather so all ranks agree.
  Status SameLength(size_t n, const char* op) {
    std::vector<uint64_t> lens;
    TESSERA_RETURN_IF_ERROR(AllGather(n, &lens));
    for (uint32_t r = 1; r < size_; ++r) {
      if (lens[r] != lens[0]) {
        return Status::InvalidArgument(std::string(op) + ": rank " + std::to_string(r) + " has " +
                                       std::to_string(lens[r]) + " elements, rank 0 has " +
                                       std::to_string(lens[0]));
      }
    }
    return Status::OK();
  }
  Status Reserve(size_t bytes) {
    TESSERA_CUDA_RT(cudaSetDevice(device_));
    if (bytes <= cap_) return Status::OK();
    if (buf_ != nullptr) cudaFree(buf_);
    buf_ = nullptr;
    cap_ = 0;
    TESSERA_CUDA_RT(cudaMalloc(&buf_, bytes));
    cap_ = bytes;
    return Status::OK();
  }

  uint32_t rank_, size_;
  int device_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  void* buf_ = nullptr;
  size_t cap_ = 0;
  std::atomic<bool> aborted_{false};
};

}  // namespace

Result<std::vector<char>> NcclUniqueId() {
  ncclUniqueId id;
  TESSERA_NCCL(ncclGetUniqueId(&id));
  return std::vector<char>(id.internal, id.internal + sizeof(id.internal));
}

Result<std::unique_ptr<LocalReducer>> CreateNcclReducer(const NcclReducerOptions& o) {
  if (o.size == 0 || o.rank >= o.size) return Status::InvalidArgument("rank not in [0, size)");
  ncclUniqueId id;
  if (o.unique_id.size() != sizeof(id.internal)) {
    return Status::InvalidArgument("NCCL unique id must be " + std::to_string(sizeof(id.internal)) +
                                   " bytes");
  }
  std::memcpy(id.internal, o.unique_id.data(), sizeof(id.internal));
  auto r = std::make_unique<NcclReducer>(o.rank, o.size,
                                         o.device < 0 ? static_cast<int>(o.rank) : o.device);
  TESSERA_RETURN_IF_ERROR(r->Init(id));
  return std::unique_ptr<LocalReducer>(std::move(r));
}

}  // namespace tessera::worker
