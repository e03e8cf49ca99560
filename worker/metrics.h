// Evaluation metrics for click prediction.
#pragma once

#include <cstdint>
#include <cstdio>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ps/status.h"

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

/// One row of a training curve; NaN fields are written empty.
struct CurveRow {
  uint64_t step = 0;     ///< Steps done (every worker's step count is the same at a row).
  uint64_t samples = 0;  ///< Training samples of the job up to `step`.
  double train_loss = std::numeric_limits<double>::quiet_NaN();
  double validation_auc = std::numeric_limits<double>::quiet_NaN();
  double validation_logloss = std::numeric_limits<double>::quiet_NaN();
  double samples_per_s = std::numeric_limits<double>::quiet_NaN();
};

/// The training curve as a CSV file with a header line: step, samples, train_loss,
/// validation_auc, validation_logloss, samples_per_s. Each row is flushed when appended (the
/// file can be watched during training). Not thread-safe.
class CurveFile {
 public:
  /// Creates (truncates) `path`, writing the header.
  static Result<std::unique_ptr<CurveFile>> Create(const std::string& path);
  ~CurveFile();
  Status Append(const CurveRow& row);
  const std::string& path() const { return path_; }

 private:
  CurveFile(std::string path, std::FILE* f) : path_(std::move(path)), f_(f) {}
  std::string path_;
  std::FILE* f_;
};

}  // namespace tessera::worker
