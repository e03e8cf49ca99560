// The CUDA backend's kernels: embedding bags, wide part, interactions (DLRM's dots, DeepFM's
// second-order term, DCN-v2's element-wise cross products), loss, and small helpers for the
// cuBLAS MLPs and cross layers. See cuda_kernels_internal.h for what each computes.
#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>

#include "worker/cuda_kernels_internal.h"

namespace tessera::worker::internal {
namespace {

constexpr unsigned kBlock = 256;

inline unsigned Blocks(size_t n, unsigned threads) {
  return static_cast<unsigned>((n + threads - 1) / threads);
}

__device__ __forceinline__ float WeightOf(const float* weights, uint32_t e) {
  return weights != nullptr ? weights[e] : 1.0f;
}

// Rows are read and gradients added V floats at a time: V = 4 (float4, one 16-byte access per
// lane) when the width is a multiple of 4 and every pointer 16-byte aligned, else V = 1.
template <int V>
struct VecOf {
  using T = float;
};
template <>
struct VecOf<4> {
  using T = float4;
};

__device__ __forceinline__ float4 operator*(float w, float4 v) {
  return make_float4(w * v.x, w * v.y, w * v.z, w * v.w);
}
__device__ __forceinline__ float4 operator*(float4 v, float w) { return w * v; }
__device__ __forceinline__ float4& operator+=(float4& a, float4 b) {
  a.x += b.x;
  a.y += b.y;
  a.z += b.z;
  a.w += b.w;
  return a;
}
template <typename T>
__device__ __forceinline__ T Zero();
template <>
__device__ __forceinline__ float Zero<float>() {
  return 0.0f;
}
template <>
__device__ __forceinline__ float4 Zero<float4>() {
  return make_float4(0.0f, 0.0f, 0.0f, 0.0f);
}

// grad += v, element by element (Hopper has a 16-byte float atomic; older chips add 4 floats).
__device__ __forceinline__ void AddTo(float* p, float v) { atomicAdd(p, v); }
__device__ __forceinline__ void AddTo(float4* p, float4 v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  atomicAdd(p, v);
#else
  float* f = reinterpret_cast<float*>(p);
  atomicAdd(f, v.x);
  atomicAdd(f + 1, v.y);
  atomicAdd(f + 2, v.z);
  atomicAdd(f + 3, v.w);
#endif
}

// Thread layout of the bag kernels: `lanes` consecutive threads per bag (a power of two <= 32,
// so a bag never straddles a warp); lane q handles vectors q, q + lanes, ... of the row, which
// is d = dim / V vectors of V floats. Four entries are loaded per iteration so that several row
// reads are in flight per lane. The sums run over the bag's entries in order, as on the CPU.
template <int V>
__global__ void EmbeddingBagForwardKernel(EmbeddingBagLaunch a, uint32_t lane_bits,
                                          const float* __restrict__ table_f,
                                          float* __restrict__ out_f) {
  using T = typename VecOf<V>::T;
  const uint32_t tid = blockIdx.x * blockDim.x + threadIdx.x;
  const uint32_t bag = tid >> lane_bits, lane = tid & ((1u << lane_bits) - 1);
  if (bag >= a.num_bags) return;
  const uint32_t lanes = 1u << lane_bits, d = a.dim / V;
  const T* __restrict__ table = reinterpret_cast<const T*>(table_f);
  const uint32_t b = a.offsets[bag], e = a.offsets[bag + 1];
  float inv = 1.0f;
  if (a.mean) {
    float wsum = 0.0f;
    for (uint32_t k = b; k < e; ++k) wsum += WeightOf(a.weights, k);
    if (wsum != 0.0f) inv = 1.0f / wsum;
  }
  if (lane == 0 && a.inv_denom != nullptr) a.inv_denom[bag] = inv;
  const uint32_t s = bag / a.num_fields, f = bag - s * a.num_fields;
  T* o = reinterpret_cast<T*>(out_f + (size_t(s) * a.num_vectors + a.vec0 + f) * a.dim);
  for (uint32_t q = lane; q < d; q += lanes) {
    T acc = Zero<T>();
    uint32_t k = b;
    for (; k + 4 <= e; k += 4) {
      const uint32_t r0 = a.rows[k], r1 = a.rows[k + 1], r2 = a.rows[k + 2], r3 = a.rows[k + 3];
      const T v0 = table[size_t(r0) * d + q], v1 = table[size_t(r1) * d + q];
      const T v2 = table[size_t(r2) * d + q], v3 = table[size_t(r3) * d + q];
      acc += WeightOf(a.weights, k) * v0;
      acc += WeightOf(a.weights, k + 1) * v1;
      acc += WeightOf(a.weights, k + 2) * v2;
      acc += WeightOf(a.weights, k + 3) * v3;
    }
    for (; k < e; ++k) acc += WeightOf(a.weights, k) * table[size_t(a.rows[k]) * d + q];
    o[q] = acc * inv;
  }
}

template <int V>
__global__ void EmbeddingBagBackwardKernel(EmbeddingBagLaunch a, uint32_t lane_bits,
                                           const float* __restrict__ d_out_f,
                                           float* __restrict__ grad_f) {
  using T = typename VecOf<V>::T;
  const uint32_t tid = blockIdx.x * blockDim.x + threadIdx.x;
  const uint32_t bag = tid >> lane_bits, lane = tid & ((1u << lane_bits) - 1);
  if (bag >= a.num_bags) return;
  const uint32_t lanes = 1u << lane_bits, d = a.dim / V;
  T* grad = reinterpret_cast<T*>(grad_f);
  const uint32_t b = a.offsets[bag], e = a.offsets[bag + 1];
  const float inv = a.inv_denom != nullptr ? a.inv_denom[bag] : 1.0f;
  const uint32_t s = bag / a.num_fields, f = bag - s * a.num_fields;
  const T* dp =
      reinterpret_cast<const T*>(d_out_f + (size_t(s) * a.num_vectors + a.vec0 + f) * a.dim);
  for (uint32_t q = lane; q < d; q += lanes) {
    const T g = dp[q] * inv;
    for (uint32_t k = b; k < e; ++k) {
      AddTo(&grad[size_t(a.rows[k]) * d + q], WeightOf(a.weights, k) * g);
    }
  }
}

__global__ void WideForwardKernel(const uint32_t* offsets, const uint32_t* rows,
                                  const float* weights, const float* wide, const float* bias,
                                  uint32_t batch, uint32_t nf, float* logit) {
  const uint32_t s = blockIdx.x * blockDim.x + threadIdx.x;
  if (s >= batch) return;
  float acc = 0.0f;
  if (wide != nullptr) {
    for (uint32_t k = offsets[size_t(s) * nf]; k < offsets[size_t(s + 1) * nf]; ++k) {
      acc += WeightOf(weights, k) * wide[rows[k]];
    }
  }
  logit[s] = *bias + acc;
}

__global__ void WideBackwardKernel(const uint32_t* offsets, const uint32_t* rows,
                                   const float* weights, const float* g, uint32_t batch,
                                   uint32_t nf, float* grad) {
  const uint32_t s = blockIdx.x * blockDim.x + threadIdx.x;
  if (s >= batch) return;
  for (uint32_t k = offsets[size_t(s) * nf]; k < offsets[size_t(s + 1) * nf]; ++k) {
    atomicAdd(&grad[rows[k]], WeightOf(weights, k) * g[s]);
  }
}

__global__ void BiasActKernel(float* y, const float* bias, uint32_t rows, uint32_t cols,
                              bool relu) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= size_t(rows) * cols) return;
  const float v = y[i] + bias[i % cols];
  y[i] = relu ? fmaxf(v, 0.0f) : v;
}

__global__ void ReluBackwardKernel(float* dz, const float* a, size_t n) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n && a[i] <= 0.0f) dz[i] = 0.0f;
}

__global__ void FillKernel(float* p, size_t n, float value) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) p[i] = value;
}

// Pair p of the interaction is (i, j), i > j, p = i (i - 1) / 2 + j.
__device__ __forceinline__ void PairOf(uint32_t p, uint32_t* i, uint32_t* j) {
  uint32_t r = static_cast<uint32_t>((1.0f + sqrtf(1.0f + 8.0f * p)) / 2.0f);
  while (r * (r - 1) / 2 > p) --r;
  while ((r + 1) * r / 2 <= p) ++r;
  *i = r;
  *j = p - r * (r - 1) / 2;
}

// One block per sample.
__global__ void InteractionForwardKernel(const float* t, uint32_t nvec, uint32_t d, bool has_bottom,
                                         uint32_t top_in, float* x) {
  const uint32_t s = blockIdx.x;
  const float* ts = t + size_t(s) * nvec * d;
  float* xs = x + size_t(s) * top_in;
  const uint32_t dot0 = has_bottom ? d : 0;
  if (has_bottom) {
    for (uint32_t q = threadIdx.x; q < d; q += blockDim.x) xs[q] = ts[q];
  }
  const uint32_t pairs = nvec * (nvec - 1) / 2;
  for (uint32_t p = threadIdx.x; p < pairs; p += blockDim.x) {
    uint32_t i, j;
    PairOf(p, &i, &j);
    float acc = 0.0f;
    for (uint32_t q = 0; q < d; ++q) acc += ts[i * d + q] * ts[j * d + q];
    xs[dot0 + p] = acc;
  }
}

// One block per sample; a thread per (vector i, element q): dt[i][q] = sum_j dx(i,j) t[j][q].
__global__ void InteractionBackwardKernel(const float* t, const float* dx, uint32_t nvec,
                                          uint32_t d, bool has_bottom, uint32_t top_in, float* dt) {
  const uint32_t s = blockIdx.x;
  const float* ts = t + size_t(s) * nvec * d;
  const float* dxs = dx + size_t(s) * top_in;
  float* dts = dt + size_t(s) * nvec * d;
  const uint32_t dot0 = has_bottom ? d : 0;
  for (uint32_t e = threadIdx.x; e < nvec * d; e += blockDim.x) {
    const uint32_t i = e / d, q = e % d;
    float acc = (has_bottom && i == 0) ? dxs[q] : 0.0f;
    for (uint32_t j = 0; j < nvec; ++j) {
      if (j == i) continue;
      const uint32_t hi = i > j ? i : j, lo = i > j ? j : i;
      acc += dxs[dot0 + hi * (hi - 1) / 2 + lo] * ts[j * d + q];
    }
    dts[e] = acc;
  }
}

// One thread per sample: the FM term over its num_vectors x dim values.
__global__ void FmForwardKernel(const float* t, uint32_t batch, uint32_t nvec, uint32_t d,
                                float* logit) {
  const uint32_t s = blockIdx.x * blockDim.x + threadIdx.x;
  if (s >= batch) return;
  const float* ts = t + size_t(s) * nvec * d;
  float fm = 0.0f;
  for (uint32_t q = 0; q < d; ++q) {
    float sum = 0.0f, sq = 0.0f;
    for (uint32_t i = 0; i < nvec; ++i) {
      const float v = ts[size_t(i) * d + q];
      sum += v;
      sq += v * v;
    }
    fm += sum * sum - sq;
  }
  logit[s] += 0.5f * fm;
}

// One thread per (sample, element q): the column sum over the vectors, then each vector's part.
__global__ void FmBackwardKernel(const float* t, const float* g, uint32_t batch, uint32_t nvec,
                                 uint32_t d, float* dt) {
  const size_t id = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (id >= size_t(batch) * d) return;
  const uint32_t s = static_cast<uint32_t>(id / d), q = static_cast<uint32_t>(id % d);
  const float* ts = t + size_t(s) * nvec * d + q;
  float* dts = dt + size_t(s) * nvec * d + q;
  float sum = 0.0f;
  for (uint32_t i = 0; i < nvec; ++i) sum += ts[size_t(i) * d];
  const float gs = g[s];
  for (uint32_t i = 0; i < nvec; ++i) dts[size_t(i) * d] += gs * (sum - ts[size_t(i) * d]);
}

__global__ void CrossCombineKernel(const float* x0, const float* z, const float* xl, size_t n,
                                   float* x_next) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) x_next[i] = x0[i] * z[i] + xl[i];
}

__global__ void CrossBackwardKernel(const float* dx, const float* x0, const float* z, size_t n,
                                    float* dz, float* dx0) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  dz[i] = dx[i] * x0[i];
  dx0[i] += dx[i] * z[i];
}

template <typename T>
__device__ __forceinline__ T WarpSum(T v) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
  return v;
}

// kBlock threads per block; one atomic add of each block's loss and g sums.
__global__ void LossKernel(const float* logit, const float* top, const float* labels,
                           uint32_t batch, float scale, float* probs, float* g, double* loss_sum,
                           float* bias_grad) {
  const uint32_t s = blockIdx.x * blockDim.x + threadIdx.x;
  double loss = 0.0;
  float gs = 0.0f;
  if (s < batch) {
    const float l = logit[s] + (top != nullptr ? top[s] : 0.0f);
    const float p = 1.0f / (1.0f + expf(-l));
    probs[s] = p;
    if (labels != nullptr) {
      const float y = labels[s];
      loss = static_cast<double>(fmaxf(l, 0.0f) - y * l + log1pf(expf(-fabsf(l))));
      gs = (p - y) * scale;
      g[s] = gs;
    }
  }
  if (labels == nullptr) return;  // the same for every thread of the grid
  __shared__ double warp_loss[kBlock / 32];
  __shared__ float warp_g[kBlock / 32];
  const uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  loss = WarpSum(loss);
  gs = WarpSum(gs);
  if (lane == 0) {
    warp_loss[warp] = loss;
    warp_g[warp] = gs;
  }
  __syncthreads();
  if (warp != 0) return;
  const uint32_t warps = blockDim.x / 32;
  loss = lane < warps ? warp_loss[lane] : 0.0;
  gs = lane < warps ? warp_g[lane] : 0.0f;
  loss = WarpSum(loss);
  gs = WarpSum(gs);
  if (lane == 0) {
    atomicAdd(loss_sum, loss);
    atomicAdd(bias_grad, gs);
  }
}

}  // namespace

uint32_t EmbeddingBagVectorWidth(uint32_t dim, std::initializer_list<const void*> pointers) {
  if (dim % 4 != 0) return 1;
  for (const void* p : pointers) {
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return 1;
  }
  return 4;
}

uint32_t EmbeddingBagLanes(uint32_t dim, uint32_t width) {
  uint32_t lanes = 1;
  while (lanes < dim / width && lanes < 32) lanes <<= 1;
  return lanes;
}

static uint32_t LaneBits(uint32_t dim, uint32_t width) {
  uint32_t bits = 0;
  while ((1u << bits) < EmbeddingBagLanes(dim, width)) ++bits;
  return bits;
}

cudaError_t LaunchEmbeddingBagForward(const EmbeddingBagLaunch& a, const float* table, float* out,
                                      cudaStream_t stream) {
  if (a.num_bags == 0 || a.dim == 0) return cudaGetLastError();
  const uint32_t width = EmbeddingBagVectorWidth(a.dim, {table, out});
  const uint32_t bits = LaneBits(a.dim, width);
  const unsigned blocks = Blocks(size_t(a.num_bags) << bits, kBlock);
  if (width == 4) {
    EmbeddingBagForwardKernel<4><<<blocks, kBlock, 0, stream>>>(a, bits, table, out);
  } else {
    EmbeddingBagForwardKernel<1><<<blocks, kBlock, 0, stream>>>(a, bits, table, out);
  }
  return cudaGetLastError();
}

cudaError_t LaunchEmbeddingBagBackward(const EmbeddingBagLaunch& a, const float* d_out,
                                       float* grad_table, cudaStream_t stream) {
  if (a.num_bags == 0 || a.dim == 0) return cudaGetLastError();
  const uint32_t width = EmbeddingBagVectorWidth(a.dim, {d_out, grad_table});
  const uint32_t bits = LaneBits(a.dim, width);
  const unsigned blocks = Blocks(size_t(a.num_bags) << bits, kBlock);
  if (width == 4) {
    EmbeddingBagBackwardKernel<4><<<blocks, kBlock, 0, stream>>>(a, bits, d_out, grad_table);
  } else {
    EmbeddingBagBackwardKernel<1><<<blocks, kBlock, 0, stream>>>(a, bits, d_out, grad_table);
  }
  return cudaGetLastError();
}

cudaError_t LaunchWideForward(const uint32_t* offsets, const uint32_t* rows, const float* weights,
                              const float* wide, const float* bias, uint32_t batch,
                              uint32_t num_fields, float* logit, cudaStream_t stream) {
  if (batch == 0) return cudaGetLastError();
  WideForwardKernel<<<Blocks(batch, kBlock), kBlock, 0, stream>>>(offsets, rows, weights, wide,
                                                                  bias, batch, num_fields, logit);
  return cudaGetLastError();
}

cudaError_t LaunchWideBackward(const uint32_t* offsets, const uint32_t* rows, const float* weights,
                               const float* g, uint32_t batch, uint32_t num_fields, float* grad,
                               cudaStream_t stream) {
  if (batch == 0) return cudaGetLastError();
  WideBackwardKernel<<<Blocks(batch, kBlock), kBlock, 0, stream>>>(offsets, rows, weights, g, batch,
                                                                   num_fields, grad);
  return cudaGetLastError();
}

cudaError_t LaunchBiasAct(float* y, const float* bias, uint32_t rows, uint32_t cols, bool relu,
                          cudaStream_t stream) {
  const size_t n = size_t(rows) * cols;
  if (n == 0) return cudaGetLastError();
  BiasActKernel<<<Blocks(n, kBlock), kBlock, 0, stream>>>(y, bias, rows, cols, relu);
  return cudaGetLastError();
}

cudaError_t LaunchReluBackward(float* dz, const float* a, size_t n, cudaStream_t stream) {
  if (n == 0) return cudaGetLastError();
  ReluBackwardKernel<<<Blocks(n, kBlock), kBlock, 0, stream>>>(dz, a, n);
  return cudaGetLastError();
}

cudaError_t LaunchFill(float* p, size_t n, float value, cudaStream_t stream) {
  if (n == 0) return cudaGetLastError();
  FillKernel<<<Blocks(n, kBlock), kBlock, 0, stream>>>(p, n, value);
  return cudaGetLastError();
}

cudaError_t LaunchInteractionForward(const float* t, uint32_t batch, uint32_t num_vectors,
                                     uint32_t dim, bool has_bottom, uint32_t top_in, float* x,
                                     cudaStream_t stream) {
  if (batch == 0) return cudaGetLastError();
  InteractionForwardKernel<<<batch, 128, 0, stream>>>(t, num_vectors, dim, has_bottom, top_in, x);
  return cudaGetLastError();
}

cudaError_t LaunchInteractionBackward(const float* t, const float* dx, uint32_t batch,
                                      uint32_t num_vectors, uint32_t dim, bool has_bottom,
                                      uint32_t top_in, float* dt, cudaStream_t stream) {
  if (batch == 0) return cudaGetLastError();
  InteractionBackwardKernel<<<batch, 128, 0, stream>>>(t, dx, num_vectors, dim, has_bottom, top_in,
                                                       dt);
  return cudaGetLastError();
}

cudaError_t LaunchFmForward(const float* t, uint32_t batch, uint32_t num_vectors, uint32_t dim,
                            float* logit, cudaStream_t stream) {
  if (batch == 0) return cudaGetLastError();
  FmForwardKernel<<<Blocks(batch, kBlock), kBlock, 0, stream>>>(t, batch, num_vectors, dim, logit);
  return cudaGetLastError();
}

cudaError_t LaunchFmBackward(const float* t, const float* g, uint32_t batch, uint32_t num_vectors,
                             uint32_t dim, float* dt, cudaStream_t stream) {
  const size_t n = size_t(batch) * dim;
  if (n == 0) return cudaGetLastError();
  FmBackwardKernel<<<Blocks(n, kBlock), kBlock, 0, stream>>>(t, g, batch, num_vectors, dim, dt);
  return cudaGetLastError();
}

cudaError_t LaunchCrossCombine(const float* x0, const float* z, const float* xl, size_t n,
                               float* x_next, cudaStream_t stream) {
  if (n == 0) return cudaGetLastError();
  CrossCombineKernel<<<Blocks(n, kBlock), kBlock, 0, stream>>>(x0, z, xl, n, x_next);
  return cudaGetLastError();
}

cudaError_t LaunchCrossBackward(const float* dx, const float* x0, const float* z, size_t n,
                                float* dz, float* dx0, cudaStream_t stream) {
  if (n == 0) return cudaGetLastError();
  CrossBackwardKernel<<<Blocks(n, kBlock), kBlock, 0, stream>>>(dx, x0, z, n, dz, dx0);
  return cudaGetLastError();
}

cudaError_t LaunchLoss(const float* logit, const float* top, const float* labels, uint32_t batch,
                       float scale, float* probs, float* g, double* loss_sum, float* bias_grad,
                       cudaStream_t stream) {
  if (batch == 0) return cudaGetLastError();
  LossKernel<<<Blocks(batch, kBlock), kBlock, 0, stream>>>(logit, top, labels, batch, scale, probs,
                                                           g, loss_sum, bias_grad);
  return cudaGetLastError();
}

}  // namespace tessera::worker::internal
