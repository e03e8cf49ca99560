// Sort and dedupe of 64-bit keys on the device (CUB), for the NCCL group's union of keys: the
// ranks' keys gathered on the GPU are made unique there, and only the union comes back. Its own
// file so that the CUB instantiations compile once, not with every change of the kernels.
#include <algorithm>
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_select.cuh>

#include "worker/cuda_kernels_internal.h"

namespace tessera::worker::internal {

cudaError_t SortUniqueKeysScratch(size_t n, size_t* bytes) {
  size_t sort = 0, unique = 0;
  const auto count = static_cast<int64_t>(n);
  cudaError_t e = cub::DeviceRadixSort::SortKeys(
      nullptr, sort, static_cast<const uint64_t*>(nullptr), static_cast<uint64_t*>(nullptr), count);
  if (e != cudaSuccess) return e;
  e = cub::DeviceSelect::Unique(nullptr, unique, static_cast<const uint64_t*>(nullptr),
                                static_cast<uint64_t*>(nullptr), static_cast<uint64_t*>(nullptr),
                                count);
  *bytes = std::max(sort, unique);
  return e;
}

cudaError_t LaunchSortUniqueKeys(const uint64_t* keys, size_t n, uint64_t* sorted, uint64_t* out,
                                 uint64_t* count, void* scratch, size_t scratch_bytes,
                                 cudaStream_t stream) {
  const auto items = static_cast<int64_t>(n);
  size_t bytes = scratch_bytes;
  cudaError_t e =
      cub::DeviceRadixSort::SortKeys(scratch, bytes, keys, sorted, items, 0, 64, stream);
  if (e != cudaSuccess) return e;
  bytes = scratch_bytes;
  e = cub::DeviceSelect::Unique(scratch, bytes, static_cast<const uint64_t*>(sorted), out, count,
                                items, stream);
  if (e != cudaSuccess) return e;
  return cudaGetLastError();
}

}  // namespace tessera::worker::internal
