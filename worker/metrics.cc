#include "worker/metrics.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <numeric>

namespace tessera::worker {

double Auc(std::span<const float> scores, std::span<const float> labels) {
  const size_t n = std::min(scores.size(), labels.size());
  std::vector<uint32_t> order(n);
  std::iota(order.begin(), order.end(), 0u);
  std::sort(order.begin(), order.end(),
            [&](uint32_t a, uint32_t b) { return scores[a] < scores[b]; });
  // Sum of positive ranks (1-based, ties get the mean rank): Mann-Whitney U.
  double rank_sum = 0;
  uint64_t pos = 0;
  size_t i = 0;
  while (i < n) {
    size_t j = i;
    while (j < n && scores[order[j]] == scores[order[i]]) ++j;
    const double mean_rank = (static_cast<double>(i) + 1 + static_cast<double>(j)) / 2;
    for (size_t t = i; t < j; ++t) {
      if (labels[order[t]] > 0.5f) {
        rank_sum += mean_rank;
        ++pos;
      }
    }
    i = j;
  }
  const uint64_t neg = n - pos;
  if (pos == 0 || neg == 0) return 0.5;
  const double p = static_cast<double>(pos);
  return (rank_sum - p * (p + 1) / 2) / (p * static_cast<double>(neg));
}

double LogLoss(std::span<const float> probs, std::span<const float> labels) {
  const size_t n = std::min(probs.size(), labels.size());
  if (n == 0) return 0;
  double sum = 0;
  for (size_t i = 0; i < n; ++i) {
    const double p = std::clamp<double>(probs[i], 1e-7, 1 - 1e-7);
    sum -= labels[i] > 0.5f ? std::log(p) : std::log(1 - p);
  }
  return sum / static_cast<double>(n);
}

void RunningMetrics::Add(std::span<const float> probs, std::span<const float> labels) {
  for (size_t i = 0; i < probs.size() && i < labels.size(); ++i) {
    if (probs_.size() < window_) {
      probs_.push_back(probs[i]);
      labels_.push_back(labels[i]);
    } else {
      probs_[next_] = probs[i];
      labels_[next_] = labels[i];
      next_ = (next_ + 1) % window_;
    }
  }
}

double RunningMetrics::Auc() const { return worker::Auc(probs_, labels_); }
double RunningMetrics::LogLoss() const { return worker::LogLoss(probs_, labels_); }

Result<std::unique_ptr<CurveFile>> CurveFile::Create(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) return Status::IOError("cannot create '" + path + "': " + std::strerror(errno));
  std::unique_ptr<CurveFile> c(new CurveFile(path, f));
  if (std::fputs("step,samples,train_loss,validation_auc,validation_logloss,samples_per_s\n", f) <
          0 ||
      std::fflush(f) != 0) {
    return Status::IOError("cannot write '" + path + "'");
  }
  return c;
}

CurveFile::~CurveFile() { std::fclose(f_); }

Status CurveFile::Append(const CurveRow& row) {
  std::string line = std::to_string(row.step) + "," + std::to_string(row.samples);
  for (double v : {row.train_loss, row.validation_auc, row.validation_logloss, row.samples_per_s}) {
    line += ",";
    if (std::isfinite(v)) {
      char buf[32];
      std::snprintf(buf, sizeof(buf), "%.6g", v);
      line += buf;
    }
  }
  line += "\n";
  if (std::fputs(line.c_str(), f_) < 0 || std::fflush(f_) != 0) {
    return Status::IOError("cannot write '" + path_ + "'");
  }
  return Status::OK();
}

}  // namespace tessera::worker
