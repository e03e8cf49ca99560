// The CUDA backend: cuBLAS for the MLPs and DCN-v2's cross layers, kernels (cuda_kernels.cu) for
// the embedding bags, the interactions (DLRM's dots, DeepFM's second-order term, the element-wise
// part of the cross layers) and the loss. Inputs are host buffers (the trainer's pulled rows).
//
// One call: the inputs are packed into pinned host memory (the planning: cuda_plan_internal.h)
// and uploaded on a copy stream, one copy per part (batch, parameters) that Backend::Stage did
// not upload already; the compute stream waits for the upload through an event. Two upload
// slots, so that the next batch's upload (Stage) overlaps this batch's kernels. The outputs
// (loss, probabilities, gradients) live in one device block that comes back with one copy; the
// call waits once, for the compute stream. With an NCCL reducer on the same GPU the gradient
// block is reduced in place on the device before that copy, and only the leader copies it back.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "worker/backend.h"
#include "worker/cuda_kernels_internal.h"
#include "worker/cuda_plan_internal.h"
#include "worker/cuda_util_internal.h"
#include "worker/embedding_bag.h"
#include "worker/local_reducer.h"

namespace tessera::worker {
namespace {

using internal::DeviceBuffer;
using internal::PinnedBuffer;

#define TESSERA_CUBLAS(expr)                                                                       \
  do {                                                                                             \
    const cublasStatus_t tessera_blas_s_ = (expr);                                                 \
    if (tessera_blas_s_ != CUBLAS_STATUS_SUCCESS) {                                                \
      return Status::Internal(std::string(#expr) + ": " + cublasGetStatusString(tessera_blas_s_)); \
    }                                                                                              \
  } while (0)

// An upload slot: pinned staging and the device block the kernels read, for one batch. Two
// slots, so that a batch staged ahead uploads into one while the other is computed.
struct Slot {
  internal::PinnedBuffer<char> host;
  internal::DeviceBuffer<char> dev;
  // Recorded on the copy stream after the slot's last upload (the host staging is free again,
  // the device block is ready), and on the compute stream after the last computation that read
  // the device block.
  cudaEvent_t uploaded = nullptr, consumed = nullptr;
  internal::UploadPlan plan;
  // A staged batch waiting for its call, and when it was staged (the older one is replaced).
  bool staged = false;
  internal::StagedKey key;
  uint64_t stamp = 0;
};

class CudaBackend final : public Backend {
 public:
  CudaBackend(const ModelLayout& layout, int device) : layout_(layout), device_(device) {}
  ~CudaBackend() override {
    cudaSetDevice(device_);
    if (copy_stream_ != nullptr) cudaStreamSynchronize(copy_stream_);
    if (stream_ != nullptr) cudaStreamSynchronize(stream_);
    for (Slot& s : slots_) {
      if (s.uploaded != nullptr) cudaEventDestroy(s.uploaded);
      if (s.consumed != nullptr) cudaEventDestroy(s.consumed);
    }
    if (blas_ != nullptr) cublasDestroy(blas_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    if (copy_stream_ != nullptr) cudaStreamDestroy(copy_stream_);
  }

  Status Init() {
    TESSERA_CUDA(cudaSetDevice(device_));
    TESSERA_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    TESSERA_CUDA(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
    for (Slot& s : slots_) {
      TESSERA_CUDA(cudaEventCreateWithFlags(&s.uploaded, cudaEventDisableTiming));
      TESSERA_CUDA(cudaEventCreateWithFlags(&s.consumed, cudaEventDisableTiming));
    }
    TESSERA_CUBLAS(cublasCreate(&blas_));
    TESSERA_CUBLAS(cublasSetStream(blas_, stream_));
    // Comparable with the CPU: no TF32 for these small GEMMs.
    TESSERA_CUBLAS(cublasSetMathMode(blas_, CUBLAS_DEFAULT_MATH));
    return Status::OK();
  }

  std::string_view name() const override { return "cuda"; }

  Status Forward(const ModelInput& in, float* probs) override {
    TESSERA_RETURN_IF_ERROR(Enqueue(in, 0.0f, /*train=*/false));
    TESSERA_RETURN_IF_ERROR(Download(down_.probs, size_t{in.batch_size} * sizeof(float)));
    TESSERA_CUDA(cudaStreamSynchronize(stream_));
    in_flight_ = false;
    CopyOut(in, probs, nullptr);
    return Status::OK();
  }

  Status ForwardBackward(const ModelInput& in, float loss_scale, float* probs,
                         ModelGrads* grads) override {
    TESSERA_RETURN_IF_ERROR(Enqueue(in, loss_scale, /*train=*/true));
    TESSERA_RETURN_IF_ERROR(Download(0, down_.download_bytes));
    TESSERA_CUDA(cudaStreamSynchronize(stream_));
    in_flight_ = false;
    CopyOut(in, probs, grads);
    return Status::OK();
  }

  Status ForwardBackwardReduced(const ModelInput& in, float loss_scale, float* probs,
                                ModelGrads* grads, LocalReducer* reducer) override {
    if (reducer == nullptr || reducer->device() != device_) {
      return Backend::ForwardBackwardReduced(in, loss_scale, probs, grads, reducer);
    }
    // Every rank takes part in the reduction, also with an empty batch (Enqueue then only
    // zeroes the outputs).
    TESSERA_RETURN_IF_ERROR(Enqueue(in, loss_scale, /*train=*/true));
    char* out = out_.get();
    const DeviceSpan spans[] = {{out + down_.grads, down_.grad_floats, false},
                                {out + down_.loss, 1, true}};
    TESSERA_RETURN_IF_ERROR(reducer->ReduceSumOnDevice(spans, stream_));
    // Only the leader pushes: the others copy back their probabilities and loss alone.
    TESSERA_RETURN_IF_ERROR(Download(0, reducer->leader() ? down_.download_bytes : down_.grads));
    TESSERA_RETURN_IF_ERROR(reducer->WaitDevice(stream_));
    in_flight_ = false;
    if (reducer->leader()) {
      CopyOut(in, probs, grads);
    } else {
      CopyOut(in, probs, nullptr);
      grads->embeddings.clear();
      grads->wide.clear();
      grads->params.clear();
      std::memcpy(&grads->loss_sum, host_out_.get() + down_.loss, sizeof(double));
    }
    return Status::OK();
  }

  Status Stage(const ModelInput& in) override {
    const ModelConfig& c = layout_.config();
    if (in.batch_size == 0) {
      // An empty batch drops what was staged (a caller abandoning a staged batch).
      for (Slot& s : slots_) s.staged = false;
      return Status::OK();
    }
    if (in.offsets == nullptr || in.rows == nullptr ||
        (c.deep && c.num_dense > 0 && in.dense == nullptr)) {
      return Status::InvalidArgument("staged batch lacks offsets, rows or dense features");
    }
    TESSERA_RETURN_IF_ERROR(Begin());
    Slot* s = FreeOrOldestSlot();
    const bool with_params = internal::HasParams(layout_, in);
    TESSERA_RETURN_IF_ERROR(Upload(s, in, in.labels != nullptr, /*batch=*/true, with_params));
    s->staged = true;
    s->key = {in, in.labels != nullptr, with_params, calls_};
    s->stamp = ++stamps_;
    in_flight_ = false;
    return Status::OK();
  }

 private:
  // An empty upload slot, else the one staged first (a third staged batch replaces the older),
  // marked empty.
  Slot* FreeOrOldestSlot() {
    Slot* s = &slots_[0];
    for (Slot& t : slots_) {
      if (!t.staged) {
        s = &t;
        break;
      }
      if (t.stamp < s->stamp) s = &t;
    }
    s->staged = false;
    return s;
  }

  // Every public call starts here. A call that failed before its wait may have left copies and
  // kernels running on the staging memory: wait for them, and drop what was staged (its slot may
  // have been half rewritten).
  Status Begin() {
    TESSERA_CUDA(cudaSetDevice(device_));
    if (in_flight_) {
      TESSERA_CUDA(cudaStreamSynchronize(copy_stream_));
      TESSERA_CUDA(cudaStreamSynchronize(stream_));
      for (Slot& s : slots_) s.staged = false;
    }
    in_flight_ = true;
    return Status::OK();
  }

  // Packs the batch part and/or the parameter part of `in` into the slot's pinned memory and
  // copies them to its device block on the copy stream (one copy when both), then records
  // `uploaded`. The slot's plan becomes that of `in`; with `batch` false the batch part must
  // already be there, planned the same way (same batch and `with_labels`) and its buffers large
  // enough (the caller checks: growing would lose it).
  Status Upload(Slot* s, const ModelInput& in, bool with_labels, bool batch, bool params) {
    s->plan = internal::PlanUpload(layout_, in, with_labels);
    const internal::UploadPlan& p = s->plan;
    // The pinned staging may still be read by the slot's previous upload.
    TESSERA_CUDA(cudaEventSynchronize(s->uploaded));
    TESSERA_RETURN_IF_ERROR(s->host.Reserve(p.upload_bytes));
    TESSERA_RETURN_IF_ERROR(s->dev.Reserve(p.upload_bytes));
    if (batch) internal::PackBatch(layout_, in, p, s->host.get());
    if (params) internal::PackParams(layout_, in, p, s->host.get());
    const size_t from = batch ? 0 : p.batch_bytes;
    const size_t to = params ? p.upload_bytes : p.batch_bytes;
    if (to > from) {
      // The device block may still be read by the slot's previous computation.
      TESSERA_CUDA(cudaStreamWaitEvent(copy_stream_, s->consumed, 0));
      TESSERA_CUDA(cudaMemcpyAsync(s->dev.get() + from, s->host.get() + from, to - from,
                                   cudaMemcpyHostToDevice, copy_stream_));
    }
    TESSERA_CUDA(cudaEventRecord(s->uploaded, copy_stream_));
    return Status::OK();
  }

  // The slot holding `in` on the device, uploading what Stage did not: nothing when both parts
  // were staged, the parameters when only the batch was, everything otherwise (into an empty
  // slot, else the one staged earlier).
  Result<Slot*> Place(const ModelInput& in, bool train) {
    for (Slot& s : slots_) {
      if (!s.staged) continue;
      const internal::StageMatch m = internal::MatchStaged(s.key, in, train, calls_);
      if (!m.batch) continue;
      s.staged = false;
      if (m.params) return &s;
      const internal::UploadPlan p = internal::PlanUpload(layout_, in, s.key.with_labels);
      if (p.upload_bytes <= s.dev.capacity() && p.upload_bytes <= s.host.capacity()) {
        TESSERA_RETURN_IF_ERROR(Upload(&s, in, s.key.with_labels, /*batch=*/false, true));
        return &s;
      }
      // The parameters need larger buffers: growing them loses the batch, so upload it all.
      TESSERA_RETURN_IF_ERROR(Upload(&s, in, train, true, true));
      return &s;
    }
    Slot* s = FreeOrOldestSlot();
    TESSERA_RETURN_IF_ERROR(Upload(s, in, train, true, true));
    return s;
  }

  // Places the inputs on the device and enqueues the whole step behind their upload; waits for
  // nothing. The calling member waits for the compute stream once before it returns.
  Status Enqueue(const ModelInput& in, float scale, bool train) {
    ++calls_;
    for (Slot& s : slots_) {
      if (s.staged && internal::StagedExpired(s.key, calls_)) s.staged = false;
    }
    TESSERA_RETURN_IF_ERROR(CheckModelInput(layout_.config(), in, train));
    TESSERA_RETURN_IF_ERROR(Begin());
    down_ = internal::PlanDownload(layout_, in, train);
    TESSERA_RETURN_IF_ERROR(out_.Reserve(down_.download_bytes));
    TESSERA_RETURN_IF_ERROR(host_out_.Reserve(down_.download_bytes));
    TESSERA_CUDA(cudaMemsetAsync(out_.get(), 0, down_.download_bytes, stream_));
    if (in.batch_size == 0) return Status::OK();
    TESSERA_ASSIGN_OR_RETURN(cur_, Place(in, train));
    TESSERA_CUDA(cudaStreamWaitEvent(stream_, cur_->uploaded, 0));
    TESSERA_RETURN_IF_ERROR(Compute(in, scale, train));
    TESSERA_CUDA(cudaEventRecord(cur_->consumed, stream_));
    return Status::OK();
  }

  template <typename T>
  T* InPtr(size_t at) const {
    return reinterpret_cast<T*>(cur_->dev.get() + at);
  }
  template <typename T>
  T* OutPtr(size_t at) const {
    return reinterpret_cast<T*>(out_.get() + at);
  }

  // The embedding-bag launch of a batch of `b` samples: one bag per sample and field, written
  // after the bottom MLP's vector when there is one (`hb`).
  internal::EmbeddingBagLaunch Bags(const uint32_t* offsets, const uint32_t* rows,
                                    const float* weights, uint32_t b, bool hb) const {
    const ModelConfig& c = layout_.config();
    internal::EmbeddingBagLaunch bags;
    bags.offsets = offsets;
    bags.rows = rows;
    bags.weights = weights;
    bags.num_bags = b * c.num_fields;
    bags.num_fields = c.num_fields;
    bags.dim = c.embedding_dim;
    bags.vec0 = hb ? 1 : 0;
    bags.num_vectors = layout_.num_vectors();
    bags.mean = c.pooling == Pooling::kMean;
    return bags;
  }

  Status Compute(const ModelInput& in, float scale, bool train) {
    const ModelConfig& c = layout_.config();
    const uint32_t b = in.batch_size, nf = c.num_fields, nd = c.num_dense, d = c.embedding_dim;
    const uint32_t nvec = layout_.num_vectors();
    const bool hb = c.deep && nd > 0;
    const internal::UploadPlan& lay = cur_->plan;
    const auto* offsets = InPtr<const uint32_t>(lay.offsets);
    const auto* rows = InPtr<const uint32_t>(lay.rows);
    const float* weights = in.weights != nullptr ? InPtr<const float>(lay.weights) : nullptr;
    const float* params = InPtr<const float>(lay.params);
    const float* dense = InPtr<const float>(lay.dense);
    float* gparams = OutPtr<float>(down_.grads);
    float* gwide = gparams + layout_.num_params();
    float* gemb = gwide + (c.wide ? in.num_rows : 0);
    TESSERA_RETURN_IF_ERROR(logit_.Reserve(b));
    TESSERA_RETURN_IF_ERROR(g_.Reserve(b));
    TESSERA_RETURN_IF_ERROR(ones_.Reserve(b));
    if (ones_filled_ < ones_.capacity()) {
      TESSERA_CUDA(internal::LaunchFill(ones_.get(), ones_.capacity(), 1.0f, stream_));
      ones_filled_ = ones_.capacity();
    }
    TESSERA_CUDA(internal::LaunchWideForward(
        offsets, rows, weights, c.wide ? InPtr<const float>(lay.wide) : nullptr,
        params + layout_.bias_offset(), b, nf, logit_.get(), stream_));
    internal::EmbeddingBagLaunch bags = Bags(offsets, rows, weights, b, hb);
    const float* top_out = nullptr;
    if (c.deep) {
      TESSERA_RETURN_IF_ERROR(t_.Reserve(size_t{b} * nvec * d));
      TESSERA_RETURN_IF_ERROR(inv_denom_.Reserve(size_t{b} * nf));
      bags.inv_denom = inv_denom_.get();
      if (hb) {
        TESSERA_RETURN_IF_ERROR(Mlp(layout_.bottom(), params, b, dense, &bottom_));
        // The bottom output is vector 0 of every sample.
        TESSERA_CUDA(cudaMemcpy2DAsync(t_.get(), size_t{nvec} * d * sizeof(float),
                                       bottom_.back().get(), d * sizeof(float), d * sizeof(float),
                                       b, cudaMemcpyDeviceToDevice, stream_));
      }
      TESSERA_CUDA(internal::LaunchEmbeddingBagForward(bags, InPtr<const float>(lay.emb), t_.get(),
                                                       stream_));
      const float* top_in = nullptr;
      TESSERA_RETURN_IF_ERROR(InteractionForward(params, b, &top_in));
      TESSERA_RETURN_IF_ERROR(Mlp(layout_.top(), params, b, top_in, &top_));
      top_out = top_.back().get();
    }
    TESSERA_CUDA(internal::LaunchLoss(
        logit_.get(), top_out, train ? InPtr<const float>(lay.labels) : nullptr, b, scale,
        OutPtr<float>(down_.probs), g_.get(), OutPtr<double>(down_.loss),
        train ? gparams + layout_.bias_offset() : nullptr, stream_));
    if (!train) return Status::OK();

    if (c.wide) {
      TESSERA_CUDA(
          internal::LaunchWideBackward(offsets, rows, weights, g_.get(), b, nf, gwide, stream_));
    }
    if (!c.deep) return Status::OK();
    // g (b x 1) is d(top output); the top MLP's output layer is linear, so g stays intact (the
    // FM term's gradient reads it next).
    TESSERA_RETURN_IF_ERROR(dx_.Reserve(size_t{b} * layout_.top_input()));
    TESSERA_RETURN_IF_ERROR(
        MlpBackward(layout_.top(), params, b, TopInput(), &top_, gparams, g_.get(), dx_.get()));
    TESSERA_RETURN_IF_ERROR(dt_.Reserve(size_t{b} * nvec * d));
    TESSERA_RETURN_IF_ERROR(InteractionBackward(params, gparams, b));
    if (hb) {
      TESSERA_RETURN_IF_ERROR(dbottom_.Reserve(size_t{b} * d));
      TESSERA_CUDA(cudaMemcpy2DAsync(dbottom_.get(), d * sizeof(float), dt_.get(),
                                     size_t{nvec} * d * sizeof(float), d * sizeof(float), b,
                                     cudaMemcpyDeviceToDevice, stream_));
      TESSERA_RETURN_IF_ERROR(MlpBackward(layout_.bottom(), params, b, dense, &bottom_, gparams,
                                          dbottom_.get(), nullptr));
    }
    TESSERA_CUDA(internal::LaunchEmbeddingBagBackward(bags, dt_.get(), gemb, stream_));
    return Status::OK();
  }

  // The top MLP's input of the model's kind from t_ (b x nvec x d, every vector of a sample):
  // DLRM [bottom output, dots] in x_; DeepFM t_ itself, its FM term added to logit_; DCN-v2
  // x_L of the cross layers (t_ when there are none).
  Status InteractionForward(const float* params, uint32_t b, const float** top_in) {
    const ModelConfig& c = layout_.config();
    const uint32_t nvec = layout_.num_vectors(), d = c.embedding_dim, width = nvec * d;
    switch (c.kind) {
      case ModelKind::kDlrm:
        TESSERA_RETURN_IF_ERROR(x_.Reserve(size_t{b} * layout_.top_input()));
        TESSERA_CUDA(internal::LaunchInteractionForward(t_.get(), b, nvec, d, c.num_dense > 0,
                                                        layout_.top_input(), x_.get(), stream_));
        break;
      case ModelKind::kDeepFm:
        TESSERA_CUDA(internal::LaunchFmForward(t_.get(), b, nvec, d, logit_.get(), stream_));
        break;
      case ModelKind::kDcn: {
        const std::vector<LayerShape>& cross = layout_.cross();
        cross_x_.resize(cross.size());
        cross_z_.resize(cross.size());
        for (size_t l = 0; l < cross.size(); ++l) {
          const LayerShape& w = cross[l];
          TESSERA_RETURN_IF_ERROR(cross_z_[l].Reserve(size_t{b} * width));
          TESSERA_RETURN_IF_ERROR(cross_x_[l].Reserve(size_t{b} * width));
          const float* xl = l == 0 ? t_.get() : cross_x_[l - 1].get();
          float* z = cross_z_[l].get();
          TESSERA_RETURN_IF_ERROR(Gemm(xl, params + w.offset, z, b, width, width));
          TESSERA_CUDA(internal::LaunchBiasAct(z, params + w.offset + uint64_t{width} * width, b,
                                               width, false, stream_));
          TESSERA_CUDA(internal::LaunchCrossCombine(t_.get(), z, xl, size_t{b} * width,
                                                    cross_x_[l].get(), stream_));
        }
        break;
      }
    }
    *top_in = TopInput();
    return Status::OK();
  }

  // The input InteractionForward gave the top MLP.
  const float* TopInput() const {
    switch (layout_.config().kind) {
      case ModelKind::kDlrm:
        return x_.get();
      case ModelKind::kDeepFm:
        return t_.get();
      case ModelKind::kDcn:
        return cross_x_.empty() ? t_.get() : cross_x_.back().get();
    }
    return nullptr;
  }

  // dt_ (b x nvec x d) = d(loss)/d(t_) from dx_ = d(loss)/d(top input) and g_ = d(loss)/d(logit).
  Status InteractionBackward(const float* params, float* gparams, uint32_t b) {
    const ModelConfig& c = layout_.config();
    const uint32_t nvec = layout_.num_vectors(), d = c.embedding_dim, width = nvec * d;
    const size_t n = size_t{b} * width;
    switch (c.kind) {
      case ModelKind::kDlrm:
        TESSERA_CUDA(internal::LaunchInteractionBackward(t_.get(), dx_.get(), b, nvec, d,
                                                         c.num_dense > 0, layout_.top_input(),
                                                         dt_.get(), stream_));
        break;
      case ModelKind::kDeepFm:
        TESSERA_CUDA(cudaMemcpyAsync(dt_.get(), dx_.get(), n * sizeof(float),
                                     cudaMemcpyDeviceToDevice, stream_));
        TESSERA_CUDA(
            internal::LaunchFmBackward(t_.get(), g_.get(), b, nvec, d, dt_.get(), stream_));
        break;
      case ModelKind::kDcn:
        TESSERA_RETURN_IF_ERROR(CrossBackward(params, gparams, b));
        break;
    }
    return Status::OK();
  }

  // DCN-v2 backward. dx_ holds d(x_L) and becomes d(x_l) layer by layer; with dx = d(x_{l+1}):
  // dz = dx * x0, d(x0) += dx * z_l (kernel), dW_l += dz^T x_l, db_l += dz^T 1, d(x_l) = dx + dz
  // W_l (cuBLAS); dt_ = the direct parts + d(x_0).
  Status CrossBackward(const float* params, float* gparams, uint32_t b) {
    const std::vector<LayerShape>& cross = layout_.cross();
    const uint32_t width = layout_.top_input();
    const size_t n = size_t{b} * width;
    const float one = 1.0f;
    TESSERA_CUDA(cudaMemsetAsync(dt_.get(), 0, n * sizeof(float), stream_));
    TESSERA_RETURN_IF_ERROR(cross_dz_.Reserve(n));
    float* dx = dx_.get();
    float* dz = cross_dz_.get();
    for (size_t l = cross.size(); l-- > 0;) {
      const LayerShape& w = cross[l];
      const float* xl = l == 0 ? t_.get() : cross_x_[l - 1].get();
      TESSERA_CUDA(internal::LaunchCrossBackward(dx, t_.get(), cross_z_[l].get(), n, dz, dt_.get(),
                                                 stream_));
      // dW^T (in x out, column-major) += X^T dZ, as in MlpBackward.
      TESSERA_CUBLAS(cublasSgemm(blas_, CUBLAS_OP_N, CUBLAS_OP_T, width, width, b, &one, xl, width,
                                 dz, width, &one, gparams + w.offset, width));
      TESSERA_CUBLAS(cublasSgemv(blas_, CUBLAS_OP_N, width, b, &one, dz, width, ones_.get(), 1,
                                 &one, gparams + w.offset + uint64_t{width} * width, 1));
      // dX (b x in) += dZ W.
      TESSERA_CUBLAS(cublasSgemm(blas_, CUBLAS_OP_N, CUBLAS_OP_N, width, b, width, &one,
                                 params + w.offset, width, dz, width, &one, dx, width));
    }
    TESSERA_CUBLAS(cublasSaxpy(blas_, static_cast<int>(n), &one, dx, 1, dt_.get(), 1));
    return Status::OK();
  }

  // y (b x out) = x (b x in) W^T, all row-major; W is out x in row-major at w.
  Status Gemm(const float* x, const float* w, float* y, uint32_t b, uint32_t in, uint32_t out) {
    const float one = 1.0f, zero = 0.0f;
    TESSERA_CUBLAS(cublasSgemm(blas_, CUBLAS_OP_T, CUBLAS_OP_N, out, b, in, &one, w, in, x, in,
                               &zero, y, out));
    return Status::OK();
  }

  // acts[i] receives layer i's output (b x out); x is the input of layer 0.
  Status Mlp(const std::vector<LayerShape>& layers, const float* params, uint32_t b, const float* x,
             std::vector<DeviceBuffer<float>>* acts) {
    acts->resize(layers.size());
    for (size_t i = 0; i < layers.size(); ++i) {
      const LayerShape& l = layers[i];
      TESSERA_RETURN_IF_ERROR((*acts)[i].Reserve(size_t{b} * l.out));
      float* y = (*acts)[i].get();
      TESSERA_RETURN_IF_ERROR(
          Gemm(i == 0 ? x : (*acts)[i - 1].get(), params + l.offset, y, b, l.in, l.out));
      TESSERA_CUDA(internal::LaunchBiasAct(y, params + l.offset + uint64_t{l.out} * l.in, b, l.out,
                                           l.relu, stream_));
    }
    return Status::OK();
  }

  // d holds d(last output) (b x last.out) and is overwritten; d_input (when not null) receives
  // d(x) (b x first.in). Weight and bias gradients are added at their offsets of grad_params.
  Status MlpBackward(const std::vector<LayerShape>& layers, const float* params, uint32_t b,
                     const float* x, std::vector<DeviceBuffer<float>>* acts, float* grad_params,
                     float* d, float* d_input) {
    const float one = 1.0f, zero = 0.0f;
    uint32_t widest = 0;
    for (const LayerShape& l : layers) widest = std::max(widest, l.in);
    TESSERA_RETURN_IF_ERROR(ping_.Reserve(size_t{b} * widest));
    TESSERA_RETURN_IF_ERROR(pong_.Reserve(size_t{b} * widest));
    float* cur = d;
    for (size_t i = layers.size(); i-- > 0;) {
      const LayerShape& l = layers[i];
      const float* input = i == 0 ? x : (*acts)[i - 1].get();
      if (l.relu) {
        TESSERA_CUDA(
            internal::LaunchReluBackward(cur, (*acts)[i].get(), size_t{b} * l.out, stream_));
      }
      // dW^T (in x out, column-major) += X^T dZ.
      TESSERA_CUBLAS(cublasSgemm(blas_, CUBLAS_OP_N, CUBLAS_OP_T, l.in, l.out, b, &one, input, l.in,
                                 cur, l.out, &one, grad_params + l.offset, l.in));
      // db += dZ^T 1: the column sums, on the device.
      TESSERA_CUBLAS(cublasSgemv(blas_, CUBLAS_OP_N, l.out, b, &one, cur, l.out, ones_.get(), 1,
                                 &one, grad_params + l.offset + uint64_t{l.out} * l.in, 1));
      if (i == 0 && d_input == nullptr) break;
      float* target = i == 0 ? d_input : (cur == ping_.get() ? pong_.get() : ping_.get());
      // dX (b x in) = dZ W.
      TESSERA_CUBLAS(cublasSgemm(blas_, CUBLAS_OP_N, CUBLAS_OP_N, l.in, b, l.out, &one,
                                 params + l.offset, l.in, cur, l.out, &zero, target, l.in));
      cur = target;
    }
    return Status::OK();
  }

  Status Download(size_t from, size_t bytes) {
    if (bytes == 0) return Status::OK();
    TESSERA_CUDA(cudaMemcpyAsync(host_out_.get() + from, out_.get() + from, bytes,
                                 cudaMemcpyDeviceToHost, stream_));
    return Status::OK();
  }

  // After the wait: probabilities and, when grads is not null, the gradients and the loss.
  void CopyOut(const ModelInput& in, float* probs, ModelGrads* grads) {
    const ModelConfig& c = layout_.config();
    const char* h = host_out_.get();
    if (in.batch_size > 0) {
      std::memcpy(probs, h + down_.probs, size_t{in.batch_size} * sizeof(float));
    }
    if (grads == nullptr) return;
    const float* g = reinterpret_cast<const float*>(h + down_.grads);
    const size_t p = layout_.num_params(), r = in.num_rows;
    grads->params.assign(g, g + p);
    grads->wide.assign(g + p, g + p + (c.wide ? r : 0));
    const float* ge = g + p + (c.wide ? r : 0);
    grads->embeddings.assign(ge, ge + (c.deep ? r * c.embedding_dim : 0));
    std::memcpy(&grads->loss_sum, h + down_.loss, sizeof(double));
  }

  ModelLayout layout_;
  int device_;
  // Kernels, cuBLAS and the download run on stream_; uploads on copy_stream_.
  cudaStream_t stream_ = nullptr, copy_stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  Slot slots_[2];
  Slot* cur_ = nullptr;  // the slot of the step being enqueued
  uint64_t stamps_ = 0;
  uint64_t calls_ = 0;  // compute calls so far, this one included (StagedKey::calls)
  internal::DownloadPlan down_;
  PinnedBuffer<char> host_out_;
  DeviceBuffer<char> out_;
  DeviceBuffer<float> logit_, g_, ones_, t_, inv_denom_, x_, dx_, dt_, dbottom_, ping_, pong_;
  // DCN-v2: x_1 .. x_L, z_0 .. z_{L-1} (z_l = x_l W_l^T + b_l), and dz of one layer.
  std::vector<DeviceBuffer<float>> cross_x_, cross_z_;
  DeviceBuffer<float> cross_dz_;
  size_t ones_filled_ = 0;
  bool in_flight_ = false;  // work enqueued that no wait has covered yet
  std::vector<DeviceBuffer<float>> bottom_, top_;
};

}  // namespace

Result<int> CudaDeviceCount() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    return Status::FailedPrecondition(std::string("no usable GPU (cudaGetDeviceCount: ") +
                                      cudaGetErrorString(e) + ")");
  }
  if (n == 0) return Status::FailedPrecondition("no GPU present");
  return n;
}

bool CudaBackendAvailable(std::string* why_not) {
  auto n = CudaDeviceCount();
  if (!n.ok() && why_not != nullptr) *why_not = n.status().message();
  return n.ok();
}

Result<std::unique_ptr<Backend>> CreateCudaBackend(const ModelLayout& layout, int device) {
  TESSERA_ASSIGN_OR_RETURN(int n, CudaDeviceCount());
  if (device < 0 || device >= n) {
    return Status::InvalidArgument("GPU " + std::to_string(device) + " does not exist (" +
                                   std::to_string(n) + " present)");
  }
  auto b = std::make_unique<CudaBackend>(layout, device);
  TESSERA_RETURN_IF_ERROR(b->Init().WithContext("GPU " + std::to_string(device)));
  return std::unique_ptr<Backend>(std::move(b));
}

namespace {
// The kernels' view of one table's bags (one field).
internal::EmbeddingBagLaunch LaunchOf(const EmbeddingBagArgs& a) {
  internal::EmbeddingBagLaunch l;
  l.offsets = a.offsets;
  l.rows = a.rows;
  l.weights = a.weights;
  l.num_bags = a.num_bags;
  l.num_fields = 1;
  l.dim = a.dim;
  l.mean = a.mean;
  l.inv_denom = a.inv_denom;
  return l;
}
}  // namespace

Status EmbeddingBagForward(const EmbeddingBagArgs& a, void* stream) {
  const internal::EmbeddingBagLaunch l = LaunchOf(a);
  TESSERA_CUDA(
      internal::LaunchEmbeddingBagForward(l, a.table, a.out, static_cast<cudaStream_t>(stream)));
  return Status::OK();
}

Status EmbeddingBagBackward(const EmbeddingBagArgs& a, const float* d_out, float* grad_table,
                            void* stream) {
  const internal::EmbeddingBagLaunch l = LaunchOf(a);
  TESSERA_CUDA(internal::LaunchEmbeddingBagBackward(l, d_out, grad_table,
                                                    static_cast<cudaStream_t>(stream)));
  return Status::OK();
}

}  // namespace tessera::worker
