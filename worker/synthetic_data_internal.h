// The pieces of the synthetic data generator (worker/synthetic_data.h) that its tests check one
// by one: the random draws, the Zipf sampler, the planted model's values and the fast
// generator's tables. Every function is a pure function of its arguments; the tables are
// immutable once built, so all of this is safe to use from any thread.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <numbers>
#include <vector>

#include "ps/routing.h"

namespace tessera::worker::internal {

/// splitmix64: the state advances by a constant; the draw is its Mix64.
inline uint64_t Next(uint64_t* s) {
  *s += 0x9e3779b97f4a7c15ULL;
  return Mix64(*s);
}
/// The top 53 bits of `h` as a double in (0, 1): (h / 2^11 + 0.5) / 2^53.
inline double Unit(uint64_t h) { return (static_cast<double>(h >> 11) + 0.5) * 0x1.0p-53; }
/// A standard normal from two draws (Box-Muller).
inline double Normal(uint64_t h1, uint64_t h2) {
  return std::sqrt(-2.0 * std::log(Unit(h1))) * std::cos(2.0 * std::numbers::pi * Unit(h2));
}
inline uint64_t Hash3(uint64_t a, uint64_t b, uint64_t c) {
  return Mix64(Mix64(a ^ 0x243f6a8885a308d3ULL) ^ Mix64(b + 0x13198a2e03707344ULL) ^
               (c * 0xa4093822299f31d0ULL + 0x082efa98ec4e6c89ULL));
}

/// Zipf(n, s) restricted to the ranks first..n: P(k) proportional to k^-s there. Drawn by
/// Hörmann and Derflinger's rejection-inversion (exact; about 1.1 tries per draw).
struct Zipf {
  uint64_t n = 1;
  double s = 1, h_x1 = 0, h_n = 0, s_param = 0;
  uint64_t first = 1;
};
/// Needs n >= first >= 1 and s > 0.
Zipf MakeZipf(uint64_t n, double s, uint64_t first);
uint64_t SampleZipf(const Zipf& z, uint64_t* rng);
/// The sum of k^-s over k = first..n (exact sum of up to 4096 terms, then Euler-Maclaurin to
/// four terms, whose error is below 1e-16 of the sum there).
double ZipfWeight(uint64_t first, uint64_t n, double s);

/// The key of the id of frequency rank `rank` of `field` (SyntheticReader::KeyOf).
uint64_t KeyOfRank(uint32_t field, uint64_t rank);

/// The planted model's values: what defines b(f, rank) and v(f, rank).
struct PlantedModel {
  uint64_t seed = 1;
  double tail_rank = 100;
  double sigma_b = 0, sigma_v = 0;
  uint32_t dim = 4;
};
/// b(field, rank) into *bias and v(field, rank) into vec[0..dim): hashed normals, scaled by
/// 1 / sqrt(1 + (rank - 1) / tail_rank) (the bias) and its square root (the vector).
void ComputePlanted(const PlantedModel& m, uint32_t field, uint64_t rank, double* bias,
                    double* vec);

/// The inverse of the standard normal CDF (Wichura's AS241, relative error about 1e-16), for
/// p in (0, 1).
double InverseNormalCdf(double p);
/// The dense feature log1p(exp(1.5 z)), z ~ N(0, 1), at quantile u in (0, 1), computed exactly.
double DenseQuantileExact(double u);

/// The dense feature of a random draw h, at quantile Unit(h): a cubic Hermite interpolation
/// over 4096 equal cells of u in the body (error below 3e-8 of the value, under half a float's
/// ulp), exact in the outer 2 x 16 cells (u < 2^-8 or u > 1 - 2^-8, where the quantile
/// function bends too fast for the table). 128 KiB.
class DenseQuantileTable {
 public:
  static constexpr int kCellBits = 12;
  static constexpr uint32_t kCells = 1u << kCellBits;
  static constexpr uint32_t kExactCells = 16;  // at each end
  DenseQuantileTable();
  double Quantile(uint64_t h) const {
    const uint64_t cell = h >> (64 - kCellBits);
    if (cell - kExactCells >= kCells - 2 * kExactCells) return DenseQuantileExact(Unit(h));
    // The bits of Unit(h) below the cell's: where in the cell u lies, in (0, 1).
    constexpr int kLow = 53 - kCellBits;
    const double t =
        (static_cast<double>((h >> 11) & ((uint64_t{1} << kLow) - 1)) + 0.5) * 0x1.0p-41;
    static_assert(kLow == 41);
    const std::array<double, 4>& c = cubic_[cell];
    return ((c[3] * t + c[2]) * t + c[1]) * t + c[0];
  }
  size_t bytes() const { return cubic_.size() * sizeof(cubic_[0]); }

 private:
  std::vector<std::array<double, 4>> cubic_;  // per cell: c0 + c1 t + c2 t^2 + c3 t^3
};

/// The fast generator's tables of one planted model: per field, a record per rank 1..head (its
/// key, planted bias and vector, and its interval of 64-bit draws), one more entry for all
/// rarer ranks together (if any), and a guide table from draws to entries; the dense quantile
/// table. A draw reads the guide and then only the drawn rank's record (one 64-byte line for
/// planted_dim <= 4), so the frequent ranks' few lines stay hot; an alias table would read a
/// uniformly random entry of the whole table per draw, a binary search several cold lines.
/// Immutable once built.
struct SyntheticTables {
  struct Field {
    uint32_t head = 0;         // ranks 1..head tabulated: entries 0..head - 1
    uint32_t entries = 0;      // head, plus one (entry head) for the tail if there is one
    uint32_t guide_shift = 0;  // 64 - guide bits
    size_t guide = 0;          // the field's first entry in `guide`
    size_t records = 0;        // the field's first word in `records`, from `first`
    uint64_t tail_lo = 0;      // the tail entry's lowest draw
    Zipf tail;                 // ranks head+1..n, if entries > head
  };
  /// Words of a record: the key (SyntheticReader::KeyOf), the bits of the planted bias and of
  /// the vector's dim values (std::bit_cast<double>), then the lowest draw that picks the rank
  /// and the lowest that picks a later one: the rank's probability is (hi - lo) / 2^64.
  static constexpr uint32_t kKey = 0, kBias = 1, kVector = 2;
  uint32_t Lo() const { return kVector + dim; }
  uint32_t Hi() const { return kVector + dim + 1; }

  uint32_t dim = 0;
  uint32_t head = 0;    // table_ranks after the memory bound
  uint32_t stride = 0;  // words per record: dim + 4, at least 8 (a 64-byte line)
  std::vector<Field> fields;
  /// Per field, 2^(64 - guide_shift) + 1 entries: guide[g] is the number of rank boundaries
  /// <= g 2^guide_shift, so a draw r of cell g = r >> guide_shift picks an entry in
  /// [guide[g], guide[g + 1]].
  std::vector<uint32_t> guide;
  /// Per guide cell with boundaries in it: where the first (low 16 bits) and the last (high
  /// 16 bits) lie in the cell, in 2^-16 of it. Read for the rarer ranks only.
  std::vector<uint32_t> span;
  std::vector<uint64_t> records;  // from index `first`, which is 64-byte aligned
  size_t first = 0;
  DenseQuantileTable dense;
  size_t bytes = 0;

  const uint64_t* Record(const Field& f, uint32_t i) const {
    return &records[first + f.records + size_t{i} * stride];
  }
  /// Where a draw's entry lies: in [lo, hi], probably at `guess`.
  struct Guess {
    uint32_t lo, hi, guess;
  };
  /// The first step of Pick: reads only the guide (warm), so that a caller can prefetch the
  /// guessed record of every field of a sample before it resolves any.
  Guess Locate(const Field& f, uint64_t r) const {
    const size_t cell = f.guide + (r >> f.guide_shift);
    const uint32_t lo = guide[cell], hi = guide[cell + 1];
    if (lo == hi) return {lo, hi, lo};  // the cell lies within one entry: the frequent ranks
    // A rarer rank: the cell's boundaries are close to evenly spaced (the CDF is smooth), so
    // where r lies between the first and the last of them guesses the entry.
    const uint32_t x = static_cast<uint32_t>((r << (64 - f.guide_shift)) >> 32);
    const uint32_t first = (span[cell] & 0xffff) << 16, last = (span[cell] >> 16) << 16;
    if (x < first) return {lo, hi, lo};
    const double between =
        static_cast<double>(x - first) / (static_cast<double>(last - first) + 0x1p16);
    return {lo, hi, std::min(hi, lo + 1 + static_cast<uint32_t>(between * (hi - lo - 1)))};
  }
  /// The second step: from the guess, the records' intervals say which way to step until r
  /// lies in the entry's.
  uint32_t Resolve(const Field& f, uint64_t r, Guess g) const {
    uint32_t i = g.guess;
    while (true) {
      if (i > g.lo && r < (i < f.head ? Record(f, i)[Lo()] : f.tail_lo)) {
        --i;
      } else if (i < g.hi && r >= Record(f, i)[Hi()]) {  // i < hi: i is a rank, not the tail
        ++i;
      } else {
        return i;
      }
    }
  }
  /// The entry (0..entries - 1) of field `f` that a 64-bit draw r picks: entry i < head is
  /// rank i + 1 with probability (hi - lo) / 2^64 of its record; entry head the tail.
  uint32_t Pick(const Field& f, uint64_t r) const { return Resolve(f, r, Locate(f, r)); }

  /// The table bytes for `head` ranks per field.
  static size_t Bytes(const std::vector<uint64_t>& cardinalities, uint32_t dim, uint32_t head);
  /// Builds them: ranks 1..min(n, head) of each field, head halved until Bytes fits `budget`.
  static SyntheticTables Build(const PlantedModel& m, const std::vector<uint64_t>& cardinalities,
                               double zipf_exponent, uint32_t head, size_t budget);
};

}  // namespace tessera::worker::internal
