// The CUDA backend's embedding-bag kernels on device memory, callable alone so that bench_gpu
// can measure them against the device's memory bandwidth.
#pragma once

#include <cstdint>

#include "ps/status.h"

namespace tessera::worker {

/// One bag per output row: bag i pools table rows rows[e] for e in [offsets[i], offsets[i+1]),
/// weighted by weights[e] (nullptr: 1). All pointers are device memory of the current GPU.
struct EmbeddingBagArgs {
  const uint32_t* offsets = nullptr;  ///< num_bags + 1
  const uint32_t* rows = nullptr;     ///< offsets[num_bags] row indices into `table`
  const float* weights = nullptr;     ///< offsets[num_bags] weights, or nullptr
  const float* table = nullptr;       ///< rows x dim, row-major
  uint32_t num_bags = 0;
  uint32_t dim = 0;
  /// Mean pooling (divided by the weight sum when not 0) instead of the sum.
  bool mean = false;
  /// num_bags x dim outputs of the forward pass.
  float* out = nullptr;
  /// num_bags factors (1 / weight sum, or 1) written by the forward pass, read by the backward
  /// pass; nullptr for sum pooling.
  float* inv_denom = nullptr;
};

/// Enqueues the forward pass on `stream` (a cudaStream_t; nullptr: the default stream).
/// FailedPrecondition without CUDA; Internal when the launch fails.
Status EmbeddingBagForward(const EmbeddingBagArgs& args, void* stream);
/// Enqueues the backward pass: grad_table (rows x dim) += each entry's weighted share of
/// d_out (num_bags x dim), with atomic adds.
Status EmbeddingBagBackward(const EmbeddingBagArgs& args, const float* d_out, float* grad_table,
                            void* stream);

}  // namespace tessera::worker
