// Compute backends of the click model: forward and backward over pulled parameters.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ps/status.h"
#include "worker/model.h"

namespace tessera::worker {

class LocalReducer;

/// One batch and the parameters it needs, all borrowed (host memory). Key entry e of sample s,
/// field f (e in [offsets[s*F+f], offsets[s*F+f+1])) uses parameter row rows[e].
struct ModelInput {
  uint32_t batch_size = 0;
  /// batch_size x num_dense, row-major.
  const float* dense = nullptr;
  /// batch_size labels in {0, 1}; needed by ForwardBackward only.
  const float* labels = nullptr;
  /// batch_size * num_fields + 1 offsets.
  const uint32_t* offsets = nullptr;
  /// One row index per key entry.
  const uint32_t* rows = nullptr;
  /// One weight per key entry, or nullptr for all ones.
  const float* weights = nullptr;
  /// Rows of the pulled sparse parameters.
  uint32_t num_rows = 0;
  /// num_rows x embedding_dim (deep models).
  const float* embeddings = nullptr;
  /// num_rows wide weights (wide models).
  const float* wide = nullptr;
  /// The flat dense parameter vector (ModelLayout::num_params floats).
  const float* params = nullptr;
};

/// Gradients of one batch, aligned with ModelInput's rows and flat vector.
struct ModelGrads {
  std::vector<float> embeddings;  // num_rows x embedding_dim
  std::vector<float> wide;        // num_rows
  std::vector<float> params;      // num_params
  /// Sum of the per-sample logistic losses (unscaled).
  double loss_sum = 0;
};

/// Checks a batch before a backend reads it (every backend checks the same way): the pointers
/// it needs are set, and every row index is below num_rows. InvalidArgument otherwise.
Status CheckModelInput(const ModelConfig& config, const ModelInput& in, bool need_labels);

/// A compute backend. Implementations are not thread-safe: one thread calls a backend (use one
/// backend per local rank).
class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;
  /// Click probabilities of the batch into probs[0..batch_size).
  virtual Status Forward(const ModelInput& in, float* probs) = 0;
  /// Probabilities, the loss and the gradients of loss_scale * (sum of per-sample losses);
  /// use loss_scale = 1 / global batch size for the mean loss. Resizes and overwrites `grads`.
  virtual Status ForwardBackward(const ModelInput& in, float loss_scale, float* probs,
                                 ModelGrads* grads) = 0;
  /// ForwardBackward of one local rank, then the gradients and the loss summed over the ranks
  /// of `reducer` (every rank calls it in the same step, with the same num_rows: the union of
  /// the node's keys). On the leader `grads` holds the sums; on other ranks its vectors are
  /// unspecified (GPU backends leave them empty) and loss_sum is the rank's own. probs are the
  /// rank's own. The default computes on the host and calls ReduceSum per tensor; the CUDA
  /// backend with a reducer on its GPU (NCCL) reduces on the device and copies the sums to the
  /// host once, on the leader, with one wait per step.
  virtual Status ForwardBackwardReduced(const ModelInput& in, float loss_scale, float* probs,
                                        ModelGrads* grads, LocalReducer* reducer);
  /// Optional: starts moving a batch that a later call will compute to the device, so that
  /// the copy overlaps the computation of the calls before it (typically: Stage(next batch),
  /// then ForwardBackward(this batch)). Copies what `in` has: its batch (offsets, rows,
  /// weights, dense, labels when not null) and, when params and the sparse rows it needs are
  /// set, its parameters; a pointer left null is uploaded by the call that computes it. That
  /// call (Forward, ForwardBackward or ForwardBackwardReduced) uses what was staged when its
  /// input has the same batch_size and the same pointers (and num_rows for the parameters);
  /// the caller must not change that memory between the two calls (Stage reads it before it
  /// returns; the computing call only compares pointers). Only the first or second compute
  /// call after a Stage may use what it staged (Stage(k + 1), compute k, Stage(k + 2), compute
  /// k + 1); later calls drop it, and Stage of an empty batch (batch_size 0) drops everything
  /// staged: call it before reusing the memory of a batch staged but never computed. Two
  /// batches fit: a third Stage, or a call on another batch while two are staged, replaces the
  /// one staged first (its call then uploads it again). InvalidArgument when offsets, rows or
  /// (models with dense features) dense is missing.
  /// Default: does nothing (the CPU backend reads host memory where it is).
  virtual Status Stage(const ModelInput& in) {
    static_cast<void>(in);
    return Status::OK();
  }
};

/// Options of the CPU backend.
struct CpuBackendOptions {
  /// Threads a batch is split over (OpenMP). Default: 1.
  int threads = 1;
  /// Instruction set of the matrix products: "auto" (AVX2 with FMA where the build has those
  /// kernels, x86-64 with GCC or Clang, and the CPU runs them; else the compiler's default
  /// target), "generic" (the default target), "avx2" (refused where unavailable). The results
  /// differ by float rounding only. Default: "auto".
  std::string isa = "auto";
};

/// The CPU backend (Eigen).
Result<std::unique_ptr<Backend>> CreateCpuBackend(const ModelLayout& layout,
                                                  const CpuBackendOptions& options = {});

/// The instruction set CreateCpuBackend uses for `isa` ("generic" or "avx2"); empty when it
/// would refuse it.
std::string_view CpuBackendIsa(std::string_view isa = "auto");

/// A backend without a model, for measuring the feed (data, keys, pulls and pushes) alone:
/// probabilities 0.5, the loss of those (loss_sum = batch_size * log 2), and zero gradients of
/// the CPU backend's shapes (embeddings num_rows * embedding_dim on deep models, wide num_rows
/// on wide ones, params num_params; empty where the model has no such part). It checks its
/// input as every backend does (CheckModelInput) and reads nothing else. With a reducer it
/// keeps the default ForwardBackwardReduced (host sums of the zeros and of the losses).
/// --backend=null of tessera-worker.
Result<std::unique_ptr<Backend>> CreateNullBackend(const ModelLayout& layout);

/// Whether this build has the CUDA backend and a GPU is present.
bool CudaBackendAvailable(std::string* why_not = nullptr);

/// GPUs present (at least 1). FailedPrecondition, saying why, when the build has no CUDA or no
/// GPU can be used (no driver, no device).
Result<int> CudaDeviceCount();

/// The CUDA backend (cuBLAS and kernels) on GPU `device`. FailedPrecondition when the build has
/// no CUDA or no GPU is present; InvalidArgument for a device that does not exist.
///
/// Per call: the inputs are packed into pinned host memory and uploaded on a copy stream (one
/// copy, or only the part Stage did not upload) that the compute stream waits for through an
/// event; device buffers grow geometrically and are kept; every launch is checked; the loss and
/// the bias gradient are reduced on the device; results come back with one copy and the call
/// waits once, for the compute stream only (a batch staged meanwhile keeps uploading).
Result<std::unique_ptr<Backend>> CreateCudaBackend(const ModelLayout& layout, int device = 0);

}  // namespace tessera::worker
