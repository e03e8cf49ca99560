// Evaluation metrics for click prediction.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace tessera::worker {

/// Exact area under the ROC curve of `scores` for binary `labels` (sorts; ties count half).
/// 0.5 when one class is absent.
double Auc(std::span<const float> scores, std::span<const float> labels);

/// Mean logistic loss of probabilities (clamped to [1e-7, 1 - 1e-7]).
double LogLoss(std::span<const float> probs, std::span<const float> labels);

/// AUC and loss over the most recent `window` predictions (a ring buffer). Not thread-safe.
class RunningMetrics {
 public:
  explicit RunningMetrics(size_t window = 100000) : window_(window) {}
  void Add(std::span<const float> probs, std::span<const float> labels);
  double Auc() const;
  double LogLoss() const;
  size_t count() const { return probs_.size(); }

 private:
  size_t window_;
  size_t next_ = 0;
  std::vector<float> probs_, labels_;
};

}  // namespace tessera::worker
