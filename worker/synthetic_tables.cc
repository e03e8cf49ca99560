// The synthetic generator's pieces (synthetic_data_internal.h): the Zipf sampler, the planted
// values, the dense quantile function and the fast generator's tables.
#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <numbers>

#include "ps/feature_keys.h"
#include "worker/synthetic_data_internal.h"

namespace tessera::worker::internal {
namespace {

// Hörmann and Derflinger's rejection-inversion: H is the integral of h(x) = x^-s.
double HelperLog(double x) { return std::abs(x) > 1e-8 ? std::log1p(x) / x : 1 - x / 2; }
double HelperExp(double x) { return std::abs(x) > 1e-8 ? std::expm1(x) / x : 1 + x / 2; }
double HIntegral(double x, double s) {
  const double lx = std::log(x);
  return HelperExp((1 - s) * lx) * lx;
}
double H(double x, double s) { return std::exp(-s * std::log(x)); }
double HIntegralInverse(double x, double s) {
  double t = x * (1 - s);
  if (t < -1) t = -1;
  return std::exp(HelperLog(t) * x);
}

// Guide bits of a field of `entries` entries: cells for eight times as many (so that few
// cells hold a boundary), up to 4096 (16 KiB).
uint32_t GuideBits(uint32_t entries) {
  uint32_t bits = 1;
  while (bits < 12 && (uint64_t{1} << bits) < 8 * uint64_t{entries}) ++bits;
  return bits;
}

}  // namespace

Zipf MakeZipf(uint64_t n, double s, uint64_t first) {
  Zipf z;
  z.n = n;
  z.s = s;
  z.first = first;
  // The whole range's lowest cell is rank 1's, of width h(1) = 1 below H(1.5); a tail's
  // lowest cell is rank first's, from H(first - 0.5).
  z.h_x1 = first == 1 ? HIntegral(1.5, s) - 1.0 : HIntegral(static_cast<double>(first) - 0.5, s);
  z.h_n = HIntegral(static_cast<double>(n) + 0.5, s);
  z.s_param = 2.0 - HIntegralInverse(HIntegral(2.5, s) - H(2.0, s), s);
  return z;
}

uint64_t SampleZipf(const Zipf& z, uint64_t* rng) {
  while (true) {
    const double u = z.h_n + Unit(Next(rng)) * (z.h_x1 - z.h_n);
    const double x = HIntegralInverse(u, z.s);
    uint64_t k = static_cast<uint64_t>(x + 0.5);
    k = std::clamp<uint64_t>(k, z.first, z.n);
    if (static_cast<double>(k) - x <= z.s_param ||
        u >= HIntegral(static_cast<double>(k) + 0.5, z.s) - H(static_cast<double>(k), z.s)) {
      return k;
    }
  }
}

double ZipfWeight(uint64_t first, uint64_t n, double s) {
  if (first > n) return 0;
  const uint64_t exact_end = std::min(n, first + 4095);
  double sum = 0;
  if (exact_end < n) {
    // Euler-Maclaurin from a = exact_end + 1 > 4096 to b = n: the next term is below
    // s..(s+4) / 30240 a^(-s-5), under 1e-16 of the sum.
    const double a = static_cast<double>(exact_end + 1), b = static_cast<double>(n);
    const double c3 = s * (s + 1) * (s + 2) / 720;
    sum = HIntegral(b, s) - HIntegral(a, s) + (H(a, s) + H(b, s)) / 2 +
          s / 12 * (H(a, s + 1) - H(b, s + 1)) - c3 * (H(a, s + 3) - H(b, s + 3));
  }
  for (uint64_t k = exact_end; k >= first; --k) sum += H(static_cast<double>(k), s);
  return sum;
}

uint64_t KeyOfRank(uint32_t field, uint64_t rank) {
  // The id a rank maps to is a fixed scramble, so frequent ids are not small numbers.
  return MakeKey(field, Mix64(rank * 0x9e3779b97f4a7c15ULL + field) & 0xffffffffffULL);
}

void ComputePlanted(const PlantedModel& m, uint32_t f, uint64_t rank, double* bias, double* vec) {
  const double decay =
      m.tail_rank > 0 ? 1.0 / std::sqrt(1.0 + static_cast<double>(rank - 1) / m.tail_rank) : 1.0;
  *bias = decay * m.sigma_b *
          Normal(Hash3(m.seed, f, rank * 64 + 62), Hash3(m.seed, f, rank * 64 + 63));
  for (uint32_t d = 0; d < m.dim; ++d) {
    vec[d] = std::sqrt(decay) * m.sigma_v *
             Normal(Hash3(m.seed, f, rank * 64 + 2 * d), Hash3(m.seed, f, rank * 64 + 2 * d + 1));
  }
}

double InverseNormalCdf(double p) {
  // Wichura, "Algorithm AS 241: The percentage points of the normal distribution" (PPND16):
  // ratios of degree-7 polynomials, coefficients from the highest power down.
  static constexpr double kCentralA[8] = {
      2509.0809287301226727, 33430.575583588128105, 67265.770927008700853, 45921.953931549871457,
      13731.693765509461125, 1971.5909503065514427, 133.14166789178437745, 3.387132872796366608};
  static constexpr double kCentralB[8] = {
      5226.495278852545925,  28729.085735721942674, 39307.89580009271061,  21213.794301586595867,
      5394.1960214247511077, 687.1870074920579083,  42.313330701600911252, 1.0};
  static constexpr double kNearA[8] = {7.7454501427834140764e-4, 0.0227238449892691845833,
                                       0.24178072517745061177,   1.27045825245236838258,
                                       3.64784832476320460504,   5.7694972214606914055,
                                       4.6303378461565452959,    1.42343711074968357734};
  static constexpr double kNearB[8] = {1.05075007164441684324e-9, 5.475938084995344946e-4,
                                       0.0151986665636164571966,  0.14810397642748007459,
                                       0.68976733498510000455,    1.6763848301838038494,
                                       2.05319162663775882187,    1.0};
  static constexpr double kFarA[8] = {2.01033439929228813265e-7, 2.71155556874348757815e-5,
                                      0.0012426609473880784386,  0.026532189526576123093,
                                      0.29656057182850489123,    1.7848265399172913358,
                                      5.4637849111641143699,     6.6579046435011037772};
  static constexpr double kFarB[8] = {2.04426310338993978564e-15, 1.4215117583164458887e-7,
                                      1.8463183175100546818e-5,   7.868691311456132591e-4,
                                      0.0148753612908506148525,   0.13692988092273580531,
                                      0.59983220655588793769,     1.0};
  auto ratio = [](const double(&a)[8], const double(&b)[8], double r) {
    double num = a[0], den = b[0];
    for (int i = 1; i < 8; ++i) {
      num = num * r + a[i];
      den = den * r + b[i];
    }
    return num / den;
  };
  const double q = p - 0.5;
  if (std::abs(q) <= 0.425) return q * ratio(kCentralA, kCentralB, 0.180625 - q * q);
  const double r = std::sqrt(-std::log(q < 0 ? p : 1 - p));
  const double v = r <= 5 ? ratio(kNearA, kNearB, r - 1.6) : ratio(kFarA, kFarB, r - 5);
  return q < 0 ? -v : v;
}

double DenseQuantileExact(double u) { return std::log1p(std::exp(1.5 * InverseNormalCdf(u))); }

DenseQuantileTable::DenseQuantileTable() : cubic_(kCells, {0, 0, 0, 0}) {
  // Per cell, the cubic through the end points' values and slopes (in cell units). The slope
  // of u -> x: dx/dz dz/du = 1.5 sigmoid(1.5 z) / phi(z).
  const double du = 1.0 / kCells;
  auto slope = [du](double u) {
    const double z = InverseNormalCdf(u);
    const double phi = std::exp(-0.5 * z * z) / std::sqrt(2 * std::numbers::pi);
    return du * 1.5 / (1 + std::exp(-1.5 * z)) / phi;
  };
  for (uint32_t i = kExactCells; i < kCells - kExactCells; ++i) {
    const double u0 = i * du, u1 = (i + 1) * du;
    const double g0 = DenseQuantileExact(u0), g1 = DenseQuantileExact(u1);
    const double d0 = slope(u0), d1 = slope(u1);
    cubic_[i] = {g0, d0, 3 * (g1 - g0) - 2 * d0 - d1, 2 * (g0 - g1) + d0 + d1};
  }
}

size_t SyntheticTables::Bytes(const std::vector<uint64_t>& cardinalities, uint32_t dim,
                              uint32_t head) {
  const size_t stride = std::max<uint32_t>(8, dim + 4);
  size_t bytes = sizeof(SyntheticTables) + size_t{DenseQuantileTable::kCells} * 32 + 64;
  for (uint64_t n : cardinalities) {
    const uint64_t h = std::min<uint64_t>(n, head);
    const uint32_t entries = static_cast<uint32_t>(h + (n > h ? 1 : 0));
    bytes += sizeof(Field) + ((size_t{1} << GuideBits(entries)) + 1) * 2 * sizeof(uint32_t) +
             h * stride * sizeof(uint64_t);
  }
  return bytes;
}

SyntheticTables SyntheticTables::Build(const PlantedModel& m,
                                       const std::vector<uint64_t>& cardinalities,
                                       double zipf_exponent, uint32_t head, size_t budget) {
  while (head > 1 && Bytes(cardinalities, m.dim, head) > budget) head /= 2;
  SyntheticTables t;
  t.dim = m.dim;
  t.head = head;
  t.stride = std::max<uint32_t>(8, m.dim + 4);
  t.bytes = Bytes(cardinalities, m.dim, head);
  const uint32_t nf = static_cast<uint32_t>(cardinalities.size());
  size_t guide = 0, records = 0;
  for (uint32_t f = 0; f < nf; ++f) {
    const uint64_t n = cardinalities[f];
    Field field;
    field.head = static_cast<uint32_t>(std::min<uint64_t>(n, head));
    field.entries = field.head + (n > field.head ? 1 : 0);
    field.guide_shift = 64 - GuideBits(field.entries);
    field.guide = guide;
    field.records = records;
    if (n > field.head) field.tail = MakeZipf(n, zipf_exponent, field.head + 1);
    guide += (size_t{1} << (64 - field.guide_shift)) + 1;
    records += size_t{field.head} * t.stride;
    t.fields.push_back(field);
  }
  t.guide.resize(guide);
  t.span.resize(guide);
  // 7 words of room to start the records on a 64-byte boundary. The vector's buffer moves with
  // the tables (never copied), so `first` stays valid.
  t.records.resize(records + 7);
  while (reinterpret_cast<uintptr_t>(&t.records[t.first]) % 64 != 0) ++t.first;
  std::vector<double> weights;
  std::vector<uint64_t> cdf;  // boundaries between entries: entry i is picked by [cdf[i-1], cdf[i])
  for (uint32_t f = 0; f < nf; ++f) {
    Field& field = t.fields[f];
    weights.assign(field.entries, 0);
    for (uint32_t i = 0; i < field.head; ++i) weights[i] = H(i + 1.0, zipf_exponent);
    if (field.entries > field.head) {
      weights[field.head] = ZipfWeight(field.head + 1, cardinalities[f], zipf_exponent);
    }
    double total = 0;
    for (size_t i = weights.size(); i-- > 0;) total += weights[i];  // small to large
    cdf.assign(field.entries - 1, 0);
    double cumulative = 0;
    for (uint32_t i = 0; i + 1 < field.entries; ++i) {
      cumulative += weights[i];
      const double x = std::ldexp(cumulative / total, 64);
      cdf[i] = x >= 0x1.0p64 ? std::numeric_limits<uint64_t>::max() : static_cast<uint64_t>(x);
    }
    uint32_t* g = &t.guide[field.guide];
    const uint64_t cells = uint64_t{1} << (64 - field.guide_shift);
    for (uint64_t cell = 0; cell < cells; ++cell) {
      g[cell] = static_cast<uint32_t>(
          std::upper_bound(cdf.begin(), cdf.end(), cell << field.guide_shift) - cdf.begin());
    }
    g[cells] = field.entries - 1;
    uint32_t* span = &t.span[field.guide];
    const int to16 = static_cast<int>(field.guide_shift) - 16;
    for (uint64_t cell = 0; cell < cells; ++cell) {
      if (g[cell] == g[cell + 1]) continue;
      const uint64_t start = cell << field.guide_shift;
      auto at = [&](uint32_t b) {  // a boundary's place in the cell (in (0, 1]), 16 bits
        return static_cast<uint32_t>(std::min<uint64_t>((cdf[b] - start) >> to16, 0xffff));
      };
      span[cell] = at(g[cell]) | at(g[cell + 1] - 1) << 16;
    }
    if (field.entries > field.head) field.tail_lo = cdf[field.head - 1];
    double planted[9];
    for (uint32_t i = 0; i < field.head; ++i) {
      uint64_t* r = &t.records[t.first + field.records + size_t{i} * t.stride];
      r[kKey] = KeyOfRank(f, i + 1);
      ComputePlanted(m, f, i + 1, &planted[0], &planted[1]);
      r[kBias] = std::bit_cast<uint64_t>(planted[0]);
      for (uint32_t d = 0; d < m.dim; ++d) r[kVector + d] = std::bit_cast<uint64_t>(planted[1 + d]);
      r[t.Lo()] = i == 0 ? 0 : cdf[i - 1];
      r[t.Hi()] = i + 1 < field.entries ? cdf[i] : std::numeric_limits<uint64_t>::max();
    }
  }
  return t;
}

}  // namespace tessera::worker::internal
