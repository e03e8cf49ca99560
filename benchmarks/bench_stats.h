// Summary statistics and the alternating repetition order shared by the benchmark programs
// (benchmarks/bench_*.cc). Header-only; every function is a pure function of its arguments (or
// calls only what the caller passes), so all are safe to call from any thread.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <functional>
#include <optional>
#include <utility>
#include <vector>

namespace tessera::bench {

/// The median of `v`: the middle value of a sorted copy for an odd count, the mean of the two
/// middle values for an even count. 0 when `v` is empty (benchmarks print 0 for a cell that
/// measured nothing).
inline double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  const size_t n = v.size();
  const auto mid = v.begin() + static_cast<std::ptrdiff_t>(n / 2);
  std::nth_element(v.begin(), mid, v.end());
  if (n % 2 == 1) return *mid;
  // The lower middle value is the largest of the elements before `mid`.
  return 0.5 * (*std::max_element(v.begin(), mid) + *mid);
}

/// The median over `items` of figure(item): a pointer to a numeric data member, or any callable
/// taking an item and returning a number (e.g. one figure of every repetition's result).
template <typename T, typename Figure>
double MedianOver(const std::vector<T>& items, Figure&& figure) {
  std::vector<double> v;
  v.reserve(items.size());
  for (const T& item : items) v.push_back(static_cast<double>(std::invoke(figure, item)));
  return Median(std::move(v));
}

/// The p-th quantile of `v` (p in [0, 1]; 0.99 is the 99th percentile) by the nearest-rank
/// definition: the smallest value of a sorted copy such that at least a fraction p of the values
/// are at or below it, i.e. the value at 1-based rank ceil(p * n). Always one of the values
/// (never interpolated). p <= 0 gives the minimum, p >= 1 the maximum. 0 when `v` is empty.
/// Percentile(v, 0.5) is the lower middle value for an even count; Median() averages the two.
inline double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  const size_t n = v.size();
  // The small slack keeps p * n from rounding up past an exact integer (0.07 * 100 is
  // 7.000000000000001 in binary floating point).
  const double q = p > 0 ? std::min(p, 1.0) : 0.0;  // NaN counts as 0
  const double rank = std::ceil(q * static_cast<double>(n) - 1e-9);
  const size_t i = rank < 1 ? 0 : std::min(n - 1, static_cast<size_t>(rank) - 1);
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(i), v.end());
  return v[i];
}

/// Runs `rounds` rounds of `variants` variants, calling fn(variant, round) once per variant and
/// round: even rounds in the order 0, 1, ..., variants - 1 and odd rounds in the reverse order
/// (A B, B A, A B, ...), so that no variant always runs first or always right after the same
/// other one, and drift in the load of a shared machine hits every variant alike. fn returns
/// true to go on; false stops the run at once (an error the caller has recorded). Returns false
/// when fn stopped it, true when every call ran.
template <typename Fn>
bool ForEachAlternating(size_t variants, int rounds, Fn&& fn) {
  for (int round = 0; round < rounds; ++round) {
    for (size_t i = 0; i < variants; ++i) {
      const size_t variant = round % 2 == 0 ? i : variants - 1 - i;
      if (!fn(variant, round)) return false;
    }
  }
  return true;
}

/// Alternating repetitions that each give one number: measure(variant, round) in the order of
/// ForEachAlternating, returning a double, or a std::optional<double> where std::nullopt stops
/// the run (an error the caller has recorded). Returns samples[variant][round], every variant
/// with `rounds` samples in round order; std::nullopt when a measurement stopped the run.
template <typename Measure>
std::optional<std::vector<std::vector<double>>> AlternateRepetitions(size_t variants, int rounds,
                                                                     Measure&& measure) {
  std::vector<std::vector<double>> samples(variants);
  for (auto& s : samples) s.reserve(static_cast<size_t>(std::max(rounds, 0)));
  const bool complete = ForEachAlternating(variants, rounds, [&](size_t variant, int round) {
    const std::optional<double> x = measure(variant, round);
    if (!x.has_value()) return false;
    samples[variant].push_back(*x);
    return true;
  });
  if (!complete) return std::nullopt;
  return samples;
}

}  // namespace tessera::bench
