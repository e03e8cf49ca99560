// The CUDA backend's kernels (cuda_kernels.cu), behind host launchers. Each launcher enqueues
// on `stream` and returns the launch's error (cudaGetLastError), so that the caller checks every
// launch where it happens. All pointers are device memory. Internal: C++17 (nvcc) and C++20
// (the backend) both include it, so it uses no Tessera header.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>

namespace tessera::worker::internal {

/// One embedding bag per (sample, field): bag = s * num_fields + f, its key entries
/// offsets[bag] .. offsets[bag + 1] use table rows rows[e], weighted by weights[e] (nullptr: 1).
/// The pooled vector of bag (s, f) is out[((s * num_vectors) + vec0 + f) * dim ...].
struct EmbeddingBagLaunch {
  const uint32_t* offsets = nullptr;
  const uint32_t* rows = nullptr;
  const float* weights = nullptr;
  uint32_t num_bags = 0;
  uint32_t num_fields = 1;
  uint32_t dim = 0;
  uint32_t vec0 = 0;
  uint32_t num_vectors = 1;
  /// Mean pooling: divided by the bag's weight sum (when not 0).
  bool mean = false;
  /// num_bags factors the forward pass applied (1 / weight sum, or 1); written by the forward
  /// pass when not null, read by the backward pass (null there: 1).
  float* inv_denom = nullptr;
};

/// Floats per access of the bag kernels: 4 (float4) when dim is a multiple of 4 and every
/// pointer is 16-byte aligned, else 1.
uint32_t EmbeddingBagVectorWidth(uint32_t dim, std::initializer_list<const void*> pointers);

/// Lanes (threads) per bag: the power of two >= dim / width, at most 32, so that a warp holds
/// 32 / lanes bags and no lane idles at small widths.
uint32_t EmbeddingBagLanes(uint32_t dim, uint32_t width);

/// out (as in EmbeddingBagLaunch) = pooled rows of `table` (rows x dim).
cudaError_t LaunchEmbeddingBagForward(const EmbeddingBagLaunch& a, const float* table, float* out,
                                      cudaStream_t stream);
/// grad_table[rows[e]] += weights[e] * inv_denom[bag] * d_out[bag's vector] (atomic adds).
cudaError_t LaunchEmbeddingBagBackward(const EmbeddingBagLaunch& a, const float* d_out,
                                       float* grad_table, cudaStream_t stream);

/// logit[s] = *bias + sum over the sample's entries of weight * wide[rows[e]] (wide may be null).
cudaError_t LaunchWideForward(const uint32_t* offsets, const uint32_t* rows, const float* weights,
                              const float* wide, const float* bias, uint32_t batch,
                              uint32_t num_fields, float* logit, cudaStream_t stream);
/// grad[rows[e]] += weight * g[s] for every entry of every sample (atomic adds).
cudaError_t LaunchWideBackward(const uint32_t* offsets, const uint32_t* rows, const float* weights,
                               const float* g, uint32_t batch, uint32_t num_fields, float* grad,
                               cudaStream_t stream);

/// y (rows x cols, row-major) += bias (cols); ReLU when `relu`.
cudaError_t LaunchBiasAct(float* y, const float* bias, uint32_t rows, uint32_t cols, bool relu,
                          cudaStream_t stream);
/// dz[i] = 0 where a[i] <= 0 (a: the layer's ReLU output).
cudaError_t LaunchReluBackward(float* dz, const float* a, size_t n, cudaStream_t stream);
/// p[0..n) = value.
cudaError_t LaunchFill(float* p, size_t n, float value, cudaStream_t stream);

/// x[s] = [t[s][0] (when has_bottom), dots of vectors i > j of t[s] in order (1,0), (2,0),
/// (2,1), ...]; t is batch x num_vectors x dim, x is batch x top_in.
cudaError_t LaunchInteractionForward(const float* t, uint32_t batch, uint32_t num_vectors,
                                     uint32_t dim, bool has_bottom, uint32_t top_in, float* x,
                                     cudaStream_t stream);
/// dt = d(x)/d(t) applied to dx (the inverse of LaunchInteractionForward).
cudaError_t LaunchInteractionBackward(const float* t, const float* dx, uint32_t batch,
                                      uint32_t num_vectors, uint32_t dim, bool has_bottom,
                                      uint32_t top_in, float* dt, cudaStream_t stream);

/// DeepFM's second-order term: logit[s] += 1/2 sum_q [(sum_i t[s][i][q])^2 - sum_i t[s][i][q]^2]
/// (t is batch x num_vectors x dim).
cudaError_t LaunchFmForward(const float* t, uint32_t batch, uint32_t num_vectors, uint32_t dim,
                            float* logit, cudaStream_t stream);
/// Its gradient: dt[s][i][q] += g[s] * (sum_j t[s][j][q] - t[s][i][q]).
cudaError_t LaunchFmBackward(const float* t, const float* g, uint32_t batch, uint32_t num_vectors,
                             uint32_t dim, float* dt, cudaStream_t stream);

/// DCN-v2, element-wise over n values: x_next = x0 * z + xl (z = xl W^T + b).
cudaError_t LaunchCrossCombine(const float* x0, const float* z, const float* xl, size_t n,
                               float* x_next, cudaStream_t stream);
/// Its backward, dx = d(x_next): dz = dx * x0 and dx0 += dx * z (d(xl) = dx + dz W is cuBLAS').
cudaError_t LaunchCrossBackward(const float* dx, const float* x0, const float* z, size_t n,
                                float* dz, float* dx0, cudaStream_t stream);

/// Per sample: l = logit[s] + top[s] (top may be null), probs[s] = sigmoid(l). With labels:
/// g[s] = (probs[s] - y) * scale, and on the device *loss_sum += the sum of the logistic losses
/// (double) and *bias_grad += the sum of g (one atomic add per block).
cudaError_t LaunchLoss(const float* logit, const float* top, const float* labels, uint32_t batch,
                       float scale, float* probs, float* g, double* loss_sum, float* bias_grad,
                       cudaStream_t stream);

/// Scratch bytes LaunchSortUniqueKeys needs for n keys (cuda_keys.cu).
cudaError_t SortUniqueKeysScratch(size_t n, size_t* bytes);
/// The distinct values of keys[0..n) in ascending order into out[0 .. *count) (count: one
/// device uint64); `sorted` holds n keys of scratch, `scratch` the bytes SortUniqueKeysScratch
/// gave for n. keys, sorted and out must not overlap.
cudaError_t LaunchSortUniqueKeys(const uint64_t* keys, size_t n, uint64_t* sorted, uint64_t* out,
                                 uint64_t* count, void* scratch, size_t scratch_bytes,
                                 cudaStream_t stream);

}  // namespace tessera::worker::internal
