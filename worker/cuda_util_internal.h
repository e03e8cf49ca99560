// CUDA helpers shared by the CUDA backend and the NCCL reducer: errors as Status, and owning
// buffers of device and pinned host memory. Internal; CUDA builds only.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <string>
#include <utility>

#include "ps/status.h"
#include "worker/cuda_plan_internal.h"

namespace tessera::worker::internal {

inline Status CudaError(cudaError_t e, const char* what) {
  return Status::Internal(std::string(what) + ": " + cudaGetErrorString(e));
}

#define TESSERA_CUDA(expr)                                                   \
  do {                                                                       \
    const cudaError_t tessera_cuda_e_ = (expr);                              \
    if (tessera_cuda_e_ != cudaSuccess) {                                    \
      return ::tessera::worker::internal::CudaError(tessera_cuda_e_, #expr); \
    }                                                                        \
  } while (0)

/// Memory from `Alloc`/`Free` (device or pinned host) that grows geometrically and keeps its
/// capacity: a batch that grows slowly reallocates O(log n) times, not at each new maximum.
/// Contents are not kept across growth. Move-only. Not thread-safe.
template <typename T, cudaError_t (*Alloc)(void**, size_t), cudaError_t (*Free)(void*)>
class CudaMemory {
 public:
  CudaMemory() = default;
  ~CudaMemory() { Release(); }
  CudaMemory(const CudaMemory&) = delete;
  CudaMemory& operator=(const CudaMemory&) = delete;
  CudaMemory(CudaMemory&& o) noexcept
      : p_(std::exchange(o.p_, nullptr)), cap_(std::exchange(o.cap_, 0)) {}
  CudaMemory& operator=(CudaMemory&& o) noexcept {
    if (this != &o) {
      Release();
      p_ = std::exchange(o.p_, nullptr);
      cap_ = std::exchange(o.cap_, 0);
    }
    return *this;
  }

  /// Room for at least n elements: at least 1.5 times the old capacity when it grows.
  Status Reserve(size_t n) {
    if (n <= cap_) return Status::OK();
    const size_t want = GrownCapacity(cap_, n);
    Release();
    void* p = nullptr;
    const cudaError_t e = Alloc(&p, want * sizeof(T));
    if (e != cudaSuccess) {
      return Status::ResourceExhausted("allocating " + std::to_string(want * sizeof(T)) +
                                       " bytes: " + cudaGetErrorString(e));
    }
    p_ = static_cast<T*>(p);
    cap_ = want;
    return Status::OK();
  }
  T* get() const { return p_; }
  size_t capacity() const { return cap_; }

 private:
  void Release() {
    if (p_ != nullptr) static_cast<void>(Free(p_));  // nothing to do about a failed free
    p_ = nullptr;
    cap_ = 0;
  }

  T* p_ = nullptr;
  size_t cap_ = 0;
};

inline cudaError_t DeviceAlloc(void** p, size_t bytes) { return cudaMalloc(p, bytes); }
inline cudaError_t PinnedAlloc(void** p, size_t bytes) {
  return cudaHostAlloc(p, bytes, cudaHostAllocDefault);
}

/// A device buffer (cudaMalloc). Freeing waits for the device (cudaFree), which growth
/// being geometric makes rare.
template <typename T>
using DeviceBuffer = CudaMemory<T, DeviceAlloc, cudaFree>;
/// Pinned host memory (cudaHostAlloc): copies from and to it run asynchronously on a stream.
template <typename T>
using PinnedBuffer = CudaMemory<T, PinnedAlloc, cudaFreeHost>;

}  // namespace tessera::worker::internal
