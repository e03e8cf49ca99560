// Key generators shared by the benchmark programs (benchmarks/bench_*.cc): a small seeded
// generator, Zipf-distributed ranks, and batches of uniform or Zipf keys. Header-only; every
// object is cheap to copy and used by one thread at a time.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <unordered_set>
#include <vector>

namespace tessera::bench {

// SplitMix64: a small, fast generator, good enough for benchmark keys.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : s_(seed) {}
  uint64_t Next() {
    uint64_t z = (s_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  // Uniform in [0, 1) with 53 random bits.
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }

 private:
  uint64_t s_;
};

// Zipf over ranks 1..n with P(k) ~ k^-s, by rejection-inversion (Hormann and Derflinger 1996,
// as in Apache Commons RNG): O(1) per sample with no table, about 1.1 uniforms per sample.
class ZipfSampler {
 public:
  ZipfSampler(uint64_t n, double s) : n_(n), s_(s) {
    h_integral_x1_ = HIntegral(1.5) - 1.0;
    h_integral_n_ = HIntegral(static_cast<double>(n) + 0.5);
    cut_ = 2.0 - HIntegralInverse(HIntegral(2.5) - H(2.0));
  }

  uint64_t operator()(SplitMix64& rng) const {
    for (;;) {
      const double u = h_integral_n_ + rng.Uniform() * (h_integral_x1_ - h_integral_n_);
      const double x = HIntegralInverse(u);
      double k = std::floor(x + 0.5);
      k = std::clamp(k, 1.0, static_cast<double>(n_));
      if (k - x <= cut_ || u >= HIntegral(k + 0.5) - H(k)) return static_cast<uint64_t>(k);
    }
  }

 private:
  double H(double x) const { return std::exp(-s_ * std::log(x)); }
  double HIntegral(double x) const {
    const double lx = std::log(x);
    return Helper2((1.0 - s_) * lx) * lx;
  }
  double HIntegralInverse(double x) const {
    double t = x * (1.0 - s_);
    if (t < -1.0) t = -1.0;  // numerical safety at the far end
    return std::exp(Helper1(t) * x);
  }
  // log1p(x)/x and expm1(x)/x, stable near 0.
  static double Helper1(double x) {
    return std::abs(x) > 1e-8 ? std::log1p(x) / x : 1.0 - x * (0.5 - x * (1.0 / 3.0 - 0.25 * x));
  }
  static double Helper2(double x) {
    return std::abs(x) > 1e-8 ? std::expm1(x) / x
                              : 1.0 + x * 0.5 * (1.0 + x * (1.0 / 3.0) * (1.0 + 0.25 * x));
  }

  uint64_t n_;
  double s_;
  double h_integral_x1_, h_integral_n_, cut_;
};

// The id of Zipf rank `rank`, through an odd multiplier (a bijection): hot ids are spread over
// the key space like hashed feature ids, not packed at the bottom, so they land on every lane
// and in every part of a sorted store.
inline uint64_t SpreadId(uint64_t rank) { return rank * 0x9e3779b97f4a7c15ULL; }

// `count` batches of `n` keys drawn uniformly from [0, key_space).
inline std::vector<std::vector<uint64_t>> UniformBatches(size_t count, size_t n, uint64_t key_space,
                                                         uint64_t seed) {
  SplitMix64 rng(seed);
  std::vector<std::vector<uint64_t>> out(count, std::vector<uint64_t>(n));
  for (auto& batch : out) {
    for (auto& k : batch) k = rng.Next() % key_space;
  }
  return out;
}

// `count` batches of `n` keys whose ranks follow Zipf(s) over 1..key_space, as ids SpreadId
// gives (duplicates within a batch kept: the caller's keys, as a trainer sends them).
inline std::vector<std::vector<uint64_t>> ZipfBatches(size_t count, size_t n, uint64_t key_space,
                                                      double s, uint64_t seed) {
  const ZipfSampler zipf(key_space, s);
  SplitMix64 rng(seed);
  std::vector<std::vector<uint64_t>> out(count, std::vector<uint64_t>(n));
  for (auto& batch : out) {
    for (auto& k : batch) k = SpreadId(zipf(rng));
  }
  return out;
}

// The fraction of `keys` that are distinct (what a client's dedup leaves of a request).
inline double UniqueFraction(const std::vector<uint64_t>& keys) {
  if (keys.empty()) return 0;
  const std::unordered_set<uint64_t> distinct(keys.begin(), keys.end());
  return static_cast<double>(distinct.size()) / static_cast<double>(keys.size());
}

}  // namespace tessera::bench
