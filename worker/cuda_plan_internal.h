// The CUDA backend's host-side planning, in plain C++ so that it is unit-tested without a GPU
// (cuda_plan_test.cc): where each input and output sits in the blocks a step copies, how the
// backend's buffers grow, and whether a batch staged ahead (Backend::Stage) is the one a call
// computes. Internal; compiled in every build.
#pragma once

#include <cstddef>
#include <cstdint>

#include "worker/backend.h"
#include "worker/model.h"

namespace tessera::worker::internal {

/// Byte offsets of the inputs in one upload block; each section starts on a 256-byte boundary.
/// The block is [batch part: offsets | rows | weights | dense | labels][parameter part: params |
/// wide | embeddings], so that the batch part can be copied before the parameters are pulled,
/// and its offsets do not depend on num_rows.
struct UploadPlan {
  size_t offsets = 0, rows = 0, weights = 0, dense = 0, labels = 0;
  /// End of the batch part, start of the parameter part.
  size_t batch_bytes = 0;
  size_t params = 0, wide = 0, emb = 0;
  size_t upload_bytes = 0;
  /// Key entries of the batch (offsets[batch_size * num_fields]).
  size_t entries = 0;
  /// Whether the labels section is there.
  bool with_labels = false;
};

/// Byte offsets of the outputs in the download block: [loss (a double) | probs | gradients:
/// params, wide, embeddings (contiguous floats)].
struct DownloadPlan {
  size_t loss = 0, probs = 0, grads = 0;
  size_t grad_floats = 0;
  size_t download_bytes = 0;
};

/// The upload block of `in` (labels included when `with_labels`). Reads in.offsets (the entry
/// count) when batch_size > 0.
UploadPlan PlanUpload(const ModelLayout& layout, const ModelInput& in, bool with_labels);
/// The download block of a call on `in` (gradients when `train`).
DownloadPlan PlanDownload(const ModelLayout& layout, const ModelInput& in, bool train);

/// Copies the batch part of `in` into dst[0, plan.batch_bytes) at the plan's offsets.
void PackBatch(const ModelLayout& layout, const ModelInput& in, const UploadPlan& plan, char* dst);
/// Copies the parameter part of `in` into dst[plan.batch_bytes, plan.upload_bytes).
void PackParams(const ModelLayout& layout, const ModelInput& in, const UploadPlan& plan, char* dst);

/// Whether `in` has what the parameter part needs (params, and the sparse rows the model uses
/// when num_rows > 0). Stage uploads the parameter part only then.
bool HasParams(const ModelLayout& layout, const ModelInput& in);

/// The capacity a buffer of `capacity` elements grows to for `n`: unchanged when n fits, else
/// at least n, 1.5x the old capacity and 64, so that a batch that grows slowly reallocates
/// O(log n) times.
size_t GrownCapacity(size_t capacity, size_t n);

/// What a staged batch was: the pointers and sizes it was staged from (its contents are the
/// caller's promise: unchanged until the call that computes it), and when.
struct StagedKey {
  ModelInput in;
  bool with_labels = false;
  bool with_params = false;
  /// The backend's count of compute calls (Forward, ForwardBackward, ...) when it was staged.
  uint64_t calls = 0;
};

/// A staged batch may be used by the first or the second compute call after its Stage (a
/// trainer stages step k + 1, computes step k, stages k + 2, computes k + 1); a later call drops
/// it, so that memory reused for another batch after a staged one was abandoned is not taken
/// for it.
inline constexpr uint64_t kStagedLifetimeCalls = 2;

/// Whether a batch staged as `staged` is too old for compute call number `calls` (counted as
/// StagedKey::calls, this call included).
bool StagedExpired(const StagedKey& staged, uint64_t calls);

/// What of a staged batch compute call number `calls` on `in` may use: the batch part (not
/// expired, same batch, and labels staged when `need_labels`) and, with it, the parameter part
/// (same rows and parameter pointers).
struct StageMatch {
  bool batch = false;
  bool params = false;
};
StageMatch MatchStaged(const StagedKey& staged, const ModelInput& in, bool need_labels,
                       uint64_t calls);

}  // namespace tessera::worker::internal
