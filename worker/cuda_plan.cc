#include <algorithm>
#include <cstring>

#include "worker/cuda_plan_internal.h"

namespace tessera::worker::internal {
namespace {

// Byte offsets of the sections of one block; each starts on a 256-byte boundary.
class Sections {
 public:
  explicit Sections(size_t start = 0) : size_(start) {}
  size_t Add(size_t bytes) {
    const size_t at = size_;
    size_ += (bytes + 255) / 256 * 256;
    return at;
  }
  size_t size() const { return size_; }

 private:
  size_t size_ = 0;
};

bool HasBottom(const ModelConfig& c) { return c.deep && c.num_dense > 0; }

void Put(char* dst, size_t at, const void* src, size_t bytes) {
  if (bytes > 0) std::memcpy(dst + at, src, bytes);
}

}  // namespace

UploadPlan PlanUpload(const ModelLayout& layout, const ModelInput& in, bool with_labels) {
  const ModelConfig& c = layout.config();
  const size_t b = in.batch_size, r = in.num_rows;
  UploadPlan p;
  p.entries = b == 0 ? 0 : in.offsets[b * c.num_fields];
  p.with_labels = with_labels;
  Sections up;
  p.offsets = up.Add(b == 0 ? 0 : (b * c.num_fields + 1) * sizeof(uint32_t));
  p.rows = up.Add(p.entries * sizeof(uint32_t));
  p.weights = up.Add(in.weights != nullptr ? p.entries * sizeof(float) : 0);
  p.dense = up.Add(HasBottom(c) ? b * c.num_dense * sizeof(float) : 0);
  p.labels = up.Add(with_labels ? b * sizeof(float) : 0);
  p.batch_bytes = up.size();
  p.params = up.Add(layout.num_params() * sizeof(float));
  p.wide = up.Add(c.wide ? r * sizeof(float) : 0);
  p.emb = up.Add(c.deep ? r * c.embedding_dim * sizeof(float) : 0);
  p.upload_bytes = up.size();
  return p;
}

DownloadPlan PlanDownload(const ModelLayout& layout, const ModelInput& in, bool train) {
  const ModelConfig& c = layout.config();
  const size_t r = in.num_rows;
  DownloadPlan p;
  Sections down;
  p.loss = down.Add(sizeof(double));
  p.probs = down.Add(size_t{in.batch_size} * sizeof(float));
  p.grads = down.Add(0);
  p.grad_floats =
      train ? layout.num_params() + (c.wide ? r : 0) + (c.deep ? r * c.embedding_dim : 0) : 0;
  p.download_bytes = p.grads + p.grad_floats * sizeof(float);
  return p;
}

void PackBatch(const ModelLayout& layout, const ModelInput& in, const UploadPlan& p, char* dst) {
  const ModelConfig& c = layout.config();
  const size_t b = in.batch_size;
  if (b == 0) return;
  Put(dst, p.offsets, in.offsets, (b * c.num_fields + 1) * sizeof(uint32_t));
  Put(dst, p.rows, in.rows, p.entries * sizeof(uint32_t));
  if (in.weights != nullptr) Put(dst, p.weights, in.weights, p.entries * sizeof(float));
  if (HasBottom(c)) Put(dst, p.dense, in.dense, b * c.num_dense * sizeof(float));
  if (p.with_labels) Put(dst, p.labels, in.labels, b * sizeof(float));
}

void PackParams(const ModelLayout& layout, const ModelInput& in, const UploadPlan& p, char* dst) {
  const ModelConfig& c = layout.config();
  const size_t r = in.num_rows;
  Put(dst, p.params, in.params, layout.num_params() * sizeof(float));
  if (c.wide) Put(dst, p.wide, in.wide, r * sizeof(float));
  if (c.deep) Put(dst, p.emb, in.embeddings, r * c.embedding_dim * sizeof(float));
}

bool HasParams(const ModelLayout& layout, const ModelInput& in) {
  const ModelConfig& c = layout.config();
  if (in.params == nullptr) return false;
  if (in.num_rows == 0) return true;
  return (!c.deep || in.embeddings != nullptr) && (!c.wide || in.wide != nullptr);
}

size_t GrownCapacity(size_t capacity, size_t n) {
  if (n <= capacity) return capacity;
  return std::max<size_t>({n, capacity + capacity / 2, 64});
}

bool StagedExpired(const StagedKey& staged, uint64_t calls) {
  return calls - staged.calls > kStagedLifetimeCalls;
}

StageMatch MatchStaged(const StagedKey& staged, const ModelInput& in, bool need_labels,
                       uint64_t calls) {
  StageMatch m;
  const ModelInput& s = staged.in;
  if (StagedExpired(staged, calls)) return m;
  if (in.batch_size == 0 || s.batch_size != in.batch_size) return m;
  if (s.offsets != in.offsets || s.rows != in.rows || s.weights != in.weights ||
      s.dense != in.dense) {
    return m;
  }
  if (need_labels && (!staged.with_labels || s.labels != in.labels)) return m;
  m.batch = true;
  m.params = staged.with_params && s.num_rows == in.num_rows && s.params == in.params &&
             s.wide == in.wide && s.embeddings == in.embeddings;
  return m;
}

}  // namespace tessera::worker::internal
