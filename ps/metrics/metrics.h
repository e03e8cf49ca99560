// Metrics in the Prometheus text format: counters, gauges and histograms that the hot path
// updates with one relaxed atomic operation, and a registry that writes them out on a scrape.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ps/mutex.h"

namespace tessera::metrics {

/// Label pairs of one series, e.g. {{"op", "sparse_push"}}.
using Labels = std::vector<std::pair<std::string, std::string>>;

/// A count that only grows. Thread-safe.
class Counter {
 public:
  void Inc(uint64_t n = 1) { v_.fetch_add(n, std::memory_order_relaxed); }
  uint64_t value() const { return v_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> v_{0};
};

/// A value that goes up and down. Thread-safe.
class Gauge {
 public:
  void Set(double v) { v_.store(v, std::memory_order_relaxed); }
  void Add(double d) { v_.fetch_add(d, std::memory_order_relaxed); }
  double value() const { return v_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> v_{0};
};

/// Observations counted into buckets with fixed upper bounds (Prometheus "le"), plus their count
/// and sum. Observe is a few relaxed atomic operations. Thread-safe.
class Histogram {
 public:
  /// `upper_bounds` ascending; the +Inf bucket is implied.
  explicit Histogram(std::vector<double> upper_bounds);
  void Observe(double v);
  const std::vector<double>& upper_bounds() const { return bounds_; }
  /// Per-bucket counts (not cumulative; the last is +Inf), and the sum of observations.
  std::vector<uint64_t> bucket_counts() const;
  double sum() const { return sum_.load(std::memory_order_relaxed); }

 private:
  std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> buckets_;
  std::atomic<double> sum_{0};
};

/// `count` bounds: start, start*factor, start*factor^2, ...
std::vector<double> ExponentialBuckets(double start, double factor, int count);

/// Series by name (a family: one HELP and TYPE line) and labels. Registration and Text() take
/// a mutex; updating a registered series does not. Series live as long as the registry.
/// Thread-safe.
class Registry {
 public:
  enum class Type { kCounter, kGauge, kHistogram };
  /// A value computed when the registry is scraped.
  struct Sample {
    Labels labels;
    double value;
  };
  using Collector = std::function<std::vector<Sample>()>;

  Registry();
  ~Registry();
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  /// The series `name` with `labels`, created on first use (later calls return the same one).
  /// A name must match [a-zA-Z_:][a-zA-Z0-9_:]* and keep one type: a misuse is a programming
  /// error and aborts with a message.
  Counter& AddCounter(const std::string& name, const std::string& help, const Labels& labels = {});
  Gauge& AddGauge(const std::string& name, const std::string& help, const Labels& labels = {});
  Histogram& AddHistogram(const std::string& name, const std::string& help, const Labels& labels,
                          const std::vector<double>& upper_bounds);
  /// Samples of family `name` (a counter or gauge) computed by `fn` at each scrape, until
  /// RemoveCollectors(owner). `fn` runs under the registry's mutex on the scraping thread.
  void AddCollector(const void* owner, const std::string& name, const std::string& help,
                    Type type, Collector fn);
  /// Removes `owner`'s collectors; returns after any scrape running them has finished.
  void RemoveCollectors(const void* owner);

  /// Every family in the Prometheus text exposition format 0.0.4.
  std::string Text() const;

 private:
  struct Family;
  Family& FamilyFor(const std::string& name, const std::string& help, Type type)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable Mutex mu_;
  std::vector<std::unique_ptr<Family>> families_ ABSL_GUARDED_BY(mu_);  // registration order
};

/// Escapes a label value for the text format (backslash, double quote, newline).
std::string EscapeLabelValue(const std::string& v);

}  // namespace tessera::metrics
