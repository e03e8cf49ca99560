// The CUDA backend: cuBLAS for the MLPs, kernels for the embedding bags, the interaction and
// the loss. Inputs are host buffers (the trainer's pulled rows); they are staged to the GPU.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <string>
#include <vector>

#include "worker/backend.h"

namespace tessera::worker {
namespace {

Status CudaError(cudaError_t e, const char* what) {
  return Status::Internal(std::string(what) + ": " + cudaGetErrorString(e));
}
#define TESSERA_CUDA(expr)                                      \
  do {                                                          \
    cudaError_t _e = (expr);                                    \
    if (_e != cudaSuccess) return CudaError(_e, #expr);         \
  } while (0)
#define TESSERA_CUBLAS(expr)                                                              \
  do {                                                                                    \
    cublasStatus_t _s = (expr);                                                           \
    if (_s != CUBLAS_STATUS_SUCCESS) {                                                    \
      return Status::Internal(std::string(#expr) + ": cuBLAS status " + std::to_string(_s)); \
    }                                                                                     \
  } while (0)

// A device buffer that grows and keeps its capacity.
template <typename T>
class DeviceBuffer {
 public:
  ~DeviceBuffer() {
    if (p_ != nullptr) cudaFree(p_);
  }
  Status Reserve(size_t n) {
    if (n <= cap_) return Status::OK();
    if (p_ != nullptr) cudaFree(p_);
    p_ = nullptr;
    cap_ = 0;
    TESSERA_CUDA(cudaMalloc(&p_, std::max<size_t>(n, 1) * sizeof(T)));
    cap_ = n;
    return Status::OK();
  }
  Status Upload(const T* host, size_t n, cudaStream_t s) {
    TESSERA_RETURN_IF_ERROR(Reserve(n));
    if (n > 0) TESSERA_CUDA(cudaMemcpyAsync(p_, host, n * sizeof(T), cudaMemcpyHostToDevice, s));
    return Status::OK();
  }
  T* get() const { return p_; }

 private:
  T* p_ = nullptr;
  size_t cap_ = 0;
};

// One block per (sample, field) bag; threads over the embedding width.
__global__ void EmbeddingBagForward(const uint32_t* offsets, const uint32_t* rows,
                                    const float* weights, const float* emb, uint32_t nf,
                                    uint32_t d, uint32_t vec0, uint32_t nvec, bool mean,
                                    float* t, float* denom) {
  const uint32_t bag = blockIdx.x;
  const uint32_t s = bag / nf, f = bag % nf;
  const uint32_t b = offsets[bag], e = offsets[bag + 1];
  float wsum = 0;
  for (uint32_t k = b; k < e; ++k) wsum += weights ? weights[k] : 1.0f;
  const float inv = (mean && wsum != 0.0f) ? 1.0f / wsum : 1.0f;
  if (threadIdx.x == 0) denom[bag] = inv;
  for (uint32_t q = threadIdx.x; q < d; q += blockDim.x) {
    float acc = 0;
    for (uint32_t k = b; k < e; ++k) acc += (weights ? weights[k] : 1.0f) * emb[size_t(rows[k]) * d + q];
    t[(size_t(s) * nvec + vec0 + f) * d + q] = acc * inv;
  }
}

__global__ void EmbeddingBagBackward(const uint32_t* offsets, const uint32_t* rows,
                                     const float* weights, const float* denom, uint32_t nf,
                                     uint32_t d, uint32_t vec0, uint32_t nvec, const float* dt,
                                     float* grad) {
  const uint32_t bag = blockIdx.x;
  const uint32_t s = bag / nf, f = bag % nf;
  const uint32_t b = offsets[bag], e = offsets[bag + 1];
  const float inv = denom[bag];
  for (uint32_t q = threadIdx.x; q < d; q += blockDim.x) {
    const float g = dt[(size_t(s) * nvec + vec0 + f) * d + q] * inv;
    for (uint32_t k = b; k < e; ++k) {
      atomicAdd(&grad[size_t(rows[k]) * d + q], (weights ? weights[k] : 1.0f) * g);
    }
  }
}

// logit[s] = bias + sum of the sample's wide weights.
__global__ void WideForward(const uint32_t* offsets, const uint32_t* rows, const float* weights,
                            const float* wide, const float* params, uint32_t b, uint32_t nf,
                            float* logit) {
  const uint32_t s = blockIdx.x * blockDim.x + threadIdx.x;
  if (s >= b) return;
  float acc = params[0];
  if (wide != nullptr) {
    for (uint32_t k = offsets[size_t(s) * nf]; k < offsets[size_t(s + 1) * nf]; ++k) {
      acc += (weights ? weights[k] : 1.0f) * wide[rows[k]];
    }
  }
  logit[s] = acc;
}

__global__ void WideBackward(const uint32_t* offsets, const uint32_t* rows, const float* weights,
                             const float* g, uint32_t b, uint32_t nf, float* grad) {
  const uint32_t s = blockIdx.x * blockDim.x + threadIdx.x;
  if (s >= b) return;
  for (uint32_t k = offsets[size_t(s) * nf]; k < offsets[size_t(s + 1) * nf]; ++k) {
    atomicAdd(&grad[rows[k]], (weights ? weights[k] : 1.0f) * g[s]);
  }
}

// y (b x out, row-major) += bias; optional ReLU.
__global__ void BiasAct(float* y, const float* bias, uint32_t b, uint32_t out, bool relu) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= size_t(b) * out) return;
  float v = y[i] + bias[i % out];
  y[i] = relu ? fmaxf(v, 0.0f) : v;
}

// dz *= (a > 0).
__global__ void ReluBackward(float* dz, const float* a, size_t n) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n && a[i] <= 0.0f) dz[i] = 0.0f;
}

// Column sums of dz (b x out) added to db.
__global__ void ColumnSum(const float* dz, uint32_t b, uint32_t out, float* db) {
  const uint32_t j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= out) return;
  float acc = 0;
  for (uint32_t s = 0; s < b; ++s) acc += dz[size_t(s) * out + j];
  db[j] += acc;
}

// One block per sample: x[s] = [z0 (if has_bottom), dots of vectors i > j].
__global__ void InteractionForward(const float* t, uint32_t nvec, uint32_t d, bool has_bottom,
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
    // Pair p is (i, j) with i > j and p = i (i - 1) / 2 + j.
    uint32_t i = static_cast<uint32_t>((1.0f + sqrtf(1.0f + 8.0f * p)) / 2.0f);
    while (i * (i - 1) / 2 > p) --i;
    while ((i + 1) * i / 2 <= p) ++i;
    const uint32_t j = p - i * (i - 1) / 2;
    float acc = 0;
    for (uint32_t q = 0; q < d; ++q) acc += ts[i * d + q] * ts[j * d + q];
    xs[dot0 + p] = acc;
  }
}

// One block per sample; thread per (vector, element): dt[i][q] = sum_j ddot(i,j) t[j][q].
__global__ void InteractionBackward(const float* t, const float* dx, uint32_t nvec, uint32_t d,
                                    bool has_bottom, uint32_t top_in, float* dt) {
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

// probs, loss terms and g = (p - y) * scale.
__global__ void Loss(const float* logit, const float* labels, uint32_t b, float scale,
                     float* probs, float* loss, float* g) {
  const uint32_t s = blockIdx.x * blockDim.x + threadIdx.x;
  if (s >= b) return;
  const float l = logit[s];
  const float p = 1.0f / (1.0f + expf(-l));
  probs[s] = p;
  if (labels != nullptr) {
    const float y = labels[s];
    loss[s] = fmaxf(l, 0.0f) - y * l + log1pf(expf(-fabsf(l)));
    g[s] = (p - y) * scale;
  }
}

// Adds column 0 of top (b x 1) to logit.
__global__ void AddInto(float* logit, const float* top, uint32_t b) {
  const uint32_t s = blockIdx.x * blockDim.x + threadIdx.x;
  if (s < b) logit[s] += top[s];
}

inline unsigned Blocks(size_t n, unsigned threads) {
  return static_cast<unsigned>((n + threads - 1) / threads);
}

class CudaBackend final : public Backend {
 public:
  CudaBackend(const ModelLayout& layout, int device) : layout_(layout), device_(device) {}
  ~CudaBackend() override {
    if (blas_ != nullptr) cublasDestroy(blas_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  Status Init() {
    TESSERA_CUDA(cudaSetDevice(device_));
    TESSERA_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    TESSERA_CUBLAS(cublasCreate(&blas_));
    TESSERA_CUBLAS(cublasSetStream(blas_, stream_));
    // Deterministic-enough and comparable with the CPU: no TF32 for these small GEMMs.
    TESSERA_CUBLAS(cublasSetMathMode(blas_, CUBLAS_DEFAULT_MATH));
    return Status::OK();
  }

  std::string_view name() const override { return "cuda"; }

  Status Forward(const ModelInput& in, float* probs) override {
    return Run(in, 0.0f, probs, nullptr);
  }
  Status ForwardBackward(const ModelInput& in, float loss_scale, float* probs,
                         ModelGrads* grads) override {
    if (in.labels == nullptr) return Status::InvalidArgument("no labels");
    return Run(in, loss_scale, probs, grads);
  }

 private:
  // y (b x out) = x (b x in) W^T, all row-major; W is out x in row-major at w.
  Status Gemm(const float* x, const float* w, float* y, uint32_t b, uint32_t in, uint32_t out) {
    const float one = 1.0f, zero = 0.0f;
    TESSERA_CUBLAS(cublasSgemm(blas_, CUBLAS_OP_T, CUBLAS_OP_N, out, b, in, &one, w, in, x, in,
                               &zero, y, out));
    return Status::OK();
  }

  Status Mlp(const std::vector<LayerShape>& layers, const float* params, uint32_t b,
             std::vector<DeviceBuffer<float>>* acts) {
    for (size_t i = 0; i < layers.size(); ++i) {
      const LayerShape& l = layers[i];
      TESSERA_RETURN_IF_ERROR((*acts)[i + 1].Reserve(size_t(b) * l.out));
      float* y = (*acts)[i + 1].get();
      TESSERA_RETURN_IF_ERROR(Gemm((*acts)[i].get(), params + l.offset, y, b, l.in, l.out));
      BiasAct<<<Blocks(size_t(b) * l.out, 256), 256, 0, stream_>>>(
          y, params + l.offset + size_t(l.out) * l.in, b, l.out, l.relu);
    }
    return Status::OK();
  }

  // d holds d(last activation) (b x last.out) and is consumed; d_input receives d(acts[0]).
  Status MlpBackward(const std::vector<LayerShape>& layers, const float* params, uint32_t b,
                     std::vector<DeviceBuffer<float>>* acts, float* grad_params,
                     DeviceBuffer<float>* d, DeviceBuffer<float>* d_input) {
    const float one = 1.0f, zero = 0.0f;
    DeviceBuffer<float>* cur = d;
    for (size_t i = layers.size(); i-- > 0;) {
      const LayerShape& l = layers[i];
      if (l.relu) {
        ReluBackward<<<Blocks(size_t(b) * l.out, 256), 256, 0, stream_>>>(
            cur->get(), (*acts)[i + 1].get(), size_t(b) * l.out);
      }
      // dW^T (in x out, col-major) += X^T dZ.
      TESSERA_CUBLAS(cublasSgemm(blas_, CUBLAS_OP_N, CUBLAS_OP_T, l.in, l.out, b, &one,
                                 (*acts)[i].get(), l.in, cur->get(), l.out, &one,
                                 grad_params + l.offset, l.in));
      ColumnSum<<<Blocks(l.out, 128), 128, 0, stream_>>>(
          cur->get(), b, l.out, grad_params + l.offset + size_t(l.out) * l.in);
      if (i == 0 && d_input == nullptr) break;
      // Ping-pong between two scratch buffers that are neither d nor d_input.
      DeviceBuffer<float>* target = i == 0 ? d_input : (cur == &ping_ ? &pong_ : &ping_);
      TESSERA_RETURN_IF_ERROR(target->Reserve(size_t(b) * l.in));
      // dX (b x in) = dZ W.
      TESSERA_CUBLAS(cublasSgemm(blas_, CUBLAS_OP_N, CUBLAS_OP_N, l.in, b, l.out, &one,
                                 params + l.offset, l.in, cur->get(), l.out, &zero,
                                 target->get(), l.in));
      cur = target;
    }
    return Status::OK();
  }

  Status Run(const ModelInput& in, float scale, float* probs, ModelGrads* grads) {
    const ModelConfig& c = layout_.config();
    const uint32_t b = in.batch_size, nf = c.num_fields, nd = c.num_dense;
    if (grads != nullptr) {
      grads->embeddings.assign(c.deep ? size_t(in.num_rows) * c.embedding_dim : 0, 0.0f);
      grads->wide.assign(c.wide ? in.num_rows : 0, 0.0f);
      grads->params.assign(layout_.num_params(), 0.0f);
      grads->loss_sum = 0;
    }
    if (b == 0) return Status::OK();
    TESSERA_CUDA(cudaSetDevice(device_));
    const size_t entries = in.offsets[size_t(b) * nf];
    for (size_t e = 0; e < entries; ++e) {
      if (in.rows[e] >= in.num_rows) return Status::InvalidArgument("row index out of range");
    }
    const uint32_t d = c.embedding_dim, nvec = layout_.num_vectors();
    const bool hb = c.deep && nd > 0;
    TESSERA_RETURN_IF_ERROR(offsets_.Upload(in.offsets, size_t(b) * nf + 1, stream_));
    TESSERA_RETURN_IF_ERROR(rows_.Upload(in.rows, entries, stream_));
    const float* weights = nullptr;
    if (in.weights != nullptr) {
      TESSERA_RETURN_IF_ERROR(weights_.Upload(in.weights, entries, stream_));
      weights = weights_.get();
    }
    TESSERA_RETURN_IF_ERROR(params_.Upload(in.params, layout_.num_params(), stream_));
    TESSERA_RETURN_IF_ERROR(logit_.Reserve(b));
    const float* wide = nullptr;
    if (c.wide) {
      TESSERA_RETURN_IF_ERROR(wide_.Upload(in.wide, in.num_rows, stream_));
      wide = wide_.get();
    }
    WideForward<<<Blocks(b, 256), 256, 0, stream_>>>(offsets_.get(), rows_.get(), weights, wide,
                                                     params_.get(), b, nf, logit_.get());
    std::vector<DeviceBuffer<float>>& bottom = bottom_acts_;
    std::vector<DeviceBuffer<float>>& top = top_acts_;
    if (c.deep) {
      bottom.resize(layout_.bottom().size() + 1);
      top.resize(layout_.top().size() + 1);
      TESSERA_RETURN_IF_ERROR(emb_.Upload(in.embeddings, size_t(in.num_rows) * d, stream_));
      TESSERA_RETURN_IF_ERROR(t_.Reserve(size_t(b) * nvec * d));
      TESSERA_RETURN_IF_ERROR(denom_.Reserve(size_t(b) * nf));
      if (hb) {
        TESSERA_RETURN_IF_ERROR(bottom[0].Upload(in.dense, size_t(b) * nd, stream_));
        TESSERA_RETURN_IF_ERROR(Mlp(layout_.bottom(), params_.get(), b, &bottom));
        // The bottom output is vector 0 of every sample.
        TESSERA_CUDA(cudaMemcpy2DAsync(t_.get(), size_t(nvec) * d * sizeof(float),
                                       bottom.back().get(), d * sizeof(float), d * sizeof(float),
                                       b, cudaMemcpyDeviceToDevice, stream_));
      }
      EmbeddingBagForward<<<b * nf, 32, 0, stream_>>>(
          offsets_.get(), rows_.get(), weights, emb_.get(), nf, d, hb ? 1 : 0, nvec,
          c.pooling == Pooling::kMean, t_.get(), denom_.get());
      TESSERA_RETURN_IF_ERROR(top[0].Reserve(size_t(b) * layout_.top_input()));
      InteractionForward<<<b, 128, 0, stream_>>>(t_.get(), nvec, d, hb, layout_.top_input(),
                                                 top[0].get());
      TESSERA_RETURN_IF_ERROR(Mlp(layout_.top(), params_.get(), b, &top));
      AddInto<<<Blocks(b, 256), 256, 0, stream_>>>(logit_.get(), top.back().get(), b);
    }
    const float* labels = nullptr;
    if (grads != nullptr) {
      TESSERA_RETURN_IF_ERROR(labels_.Upload(in.labels, b, stream_));
      labels = labels_.get();
    }
    TESSERA_RETURN_IF_ERROR(probs_.Reserve(b));
    TESSERA_RETURN_IF_ERROR(loss_.Reserve(b));
    TESSERA_RETURN_IF_ERROR(g_.Reserve(b));
    Loss<<<Blocks(b, 256), 256, 0, stream_>>>(logit_.get(), labels, b, scale, probs_.get(),
                                              loss_.get(), g_.get());
    TESSERA_CUDA(cudaMemcpyAsync(probs, probs_.get(), b * sizeof(float), cudaMemcpyDeviceToHost,
                                 stream_));
    if (grads == nullptr) {
      TESSERA_CUDA(cudaStreamSynchronize(stream_));
      return TESSERA_CUDA_CHECK_LAST();
    }

    TESSERA_RETURN_IF_ERROR(gparams_.Reserve(layout_.num_params()));
    TESSERA_CUDA(cudaMemsetAsync(gparams_.get(), 0, layout_.num_params() * sizeof(float), stream_));
    if (c.wide) {
      TESSERA_RETURN_IF_ERROR(gwide_.Reserve(in.num_rows));
      TESSERA_CUDA(cudaMemsetAsync(gwide_.get(), 0, in.num_rows * sizeof(float), stream_));
      WideBackward<<<Blocks(b, 256), 256, 0, stream_>>>(offsets_.get(), rows_.get(), weights,
                                                        g_.get(), b, nf, gwide_.get());
    }
    if (c.deep) {
      TESSERA_RETURN_IF_ERROR(dtop_.Reserve(b));
      TESSERA_CUDA(cudaMemcpyAsync(dtop_.get(), g_.get(), b * sizeof(float),
                                   cudaMemcpyDeviceToDevice, stream_));
      TESSERA_RETURN_IF_ERROR(MlpBackward(layout_.top(), params_.get(), b, &top, gparams_.get(),
                                          &dtop_, &dx_));
      TESSERA_RETURN_IF_ERROR(dt_.Reserve(size_t(b) * nvec * d));
      InteractionBackward<<<b, 128, 0, stream_>>>(t_.get(), dx_.get(), nvec, d, hb,
                                                  layout_.top_input(), dt_.get());
      if (hb) {
        TESSERA_RETURN_IF_ERROR(dbottom_.Reserve(size_t(b) * d));
        TESSERA_CUDA(cudaMemcpy2DAsync(dbottom_.get(), d * sizeof(float), dt_.get(),
                                       size_t(nvec) * d * sizeof(float), d * sizeof(float), b,
                                       cudaMemcpyDeviceToDevice, stream_));
        TESSERA_RETURN_IF_ERROR(MlpBackward(layout_.bottom(), params_.get(), b, &bottom,
                                            gparams_.get(), &dbottom_, nullptr));
      }
      TESSERA_RETURN_IF_ERROR(gemb_.Reserve(size_t(in.num_rows) * d));
      TESSERA_CUDA(cudaMemsetAsync(gemb_.get(), 0, size_t(in.num_rows) * d * sizeof(float),
                                   stream_));
      EmbeddingBagBackward<<<b * nf, 32, 0, stream_>>>(offsets_.get(), rows_.get(), weights,
                                                       denom_.get(), nf, d, hb ? 1 : 0, nvec,
                                                       dt_.get(), gemb_.get());
      TESSERA_CUDA(cudaMemcpyAsync(grads->embeddings.data(), gemb_.get(),
                                   grads->embeddings.size() * sizeof(float),
                                   cudaMemcpyDeviceToHost, stream_));
    }
    if (c.wide) {
      TESSERA_CUDA(cudaMemcpyAsync(grads->wide.data(), gwide_.get(), in.num_rows * sizeof(float),
                                   cudaMemcpyDeviceToHost, stream_));
    }
    TESSERA_CUDA(cudaMemcpyAsync(grads->params.data(), gparams_.get(),
                                 layout_.num_params() * sizeof(float), cudaMemcpyDeviceToHost,
                                 stream_));
    host_loss_.resize(b);
    host_g_.resize(b);
    TESSERA_CUDA(cudaMemcpyAsync(host_loss_.data(), loss_.get(), b * sizeof(float),
                                 cudaMemcpyDeviceToHost, stream_));
    TESSERA_CUDA(cudaMemcpyAsync(host_g_.data(), g_.get(), b * sizeof(float),
                                 cudaMemcpyDeviceToHost, stream_));
    TESSERA_CUDA(cudaStreamSynchronize(stream_));
    TESSERA_RETURN_IF_ERROR(TESSERA_CUDA_CHECK_LAST());
    double loss = 0, gsum = 0;
    for (uint32_t s = 0; s < b; ++s) {
      loss += host_loss_[s];
      gsum += host_g_[s];
    }
    grads->loss_sum = loss;
    grads->params[layout_.bias_offset()] += static_cast<float>(gsum);
    return Status::OK();
  }

  static Status TESSERA_CUDA_CHECK_LAST() {
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return CudaError(e, "kernel launch");
    return Status::OK();
  }

  ModelLayout layout_;
  int device_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  DeviceBuffer<uint32_t> offsets_, rows_;
  DeviceBuffer<float> weights_, params_, wide_, emb_, labels_, logit_, t_, denom_, probs_, loss_,
      g_, gparams_, gwide_, gemb_, dtop_, dx_, dt_, dbottom_, ping_, pong_;
  std::vector<DeviceBuffer<float>> bottom_acts_, top_acts_;
  std::vector<float> host_loss_, host_g_;
};

}  // namespace

bool CudaBackendAvailable(std::string* why_not) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    if (why_not != nullptr) *why_not = std::string("cudaGetDeviceCount: ") + cudaGetErrorString(e);
    return false;
  }
  if (n == 0) {
    if (why_not != nullptr) *why_not = "no CUDA device present";
    return false;
  }
  return true;
}

Result<std::unique_ptr<Backend>> CreateCudaBackend(const ModelLayout& layout, int device) {
  std::string why;
  if (!CudaBackendAvailable(&why)) return Status::FailedPrecondition(why);
  auto b = std::make_unique<CudaBackend>(layout, device);
  TESSERA_RETURN_IF_ERROR(b->Init());
  return std::unique_ptr<Backend>(std::move(b));
}

}  // namespace tessera::worker
