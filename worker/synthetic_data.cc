#include "worker/synthetic_data.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "ps/feature_keys.h"
#include "ps/routing.h"

namespace tessera::worker {
namespace {

// splitmix64: a small, fast generator; the state advances by a constant.
inline uint64_t Next(uint64_t* s) {
  *s += 0x9e3779b97f4a7c15ULL;
  return Mix64(*s);
}
inline double Unit(uint64_t h) { return (static_cast<double>(h >> 11) + 0.5) * 0x1.0p-53; }
inline double Normal(uint64_t h1, uint64_t h2) {
  return std::sqrt(-2.0 * std::log(Unit(h1))) * std::cos(2.0 * std::numbers::pi * Unit(h2));
}
inline uint64_t Hash3(uint64_t a, uint64_t b, uint64_t c) {
  return Mix64(Mix64(a ^ 0x243f6a8885a308d3ULL) ^ Mix64(b + 0x13198a2e03707344ULL) ^
               (c * 0xa4093822299f31d0ULL + 0x082efa98ec4e6c89ULL));
}

// Hörmann and Derflinger's rejection-inversion sampler for Zipf(n, s) on {1..n}.
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

// Criteo's Kaggle cardinalities.
constexpr uint64_t kCriteoCard[26] = {
    1460, 583,   10131227, 2202608, 305,  24,   12517, 633,     3,  93145, 5683,   8351593, 3194,
    27,   14992, 5461306,  10,      5652, 2173, 4,     7046547, 18, 15,    286181, 105,     142572};
// Fraction of missing values per field (Criteo has fields missing up to ~45% of the time).
constexpr double kCriteoMissing[26] = {0.0,  0.0,  0.03, 0.03, 0.0, 0.1,  0.0,  0.0, 0.0,
                                       0.03, 0.0,  0.03, 0.0,  0.0, 0.0,  0.03, 0.0, 0.0,
                                       0.44, 0.44, 0.03, 0.0,  0.0, 0.03, 0.44, 0.03};

}  // namespace

std::vector<uint64_t> CriteoLikeCardinalities(uint64_t cap) {
  std::vector<uint64_t> c(std::begin(kCriteoCard), std::end(kCriteoCard));
  for (auto& x : c) x = std::min(x, std::max<uint64_t>(cap, 1));
  return c;
}

Result<std::unique_ptr<SyntheticReader>> SyntheticReader::Create(const SyntheticOptions& o) {
  if (o.world == 0 || o.rank >= o.world) return Status::InvalidArgument("rank not in [0, world)");
  if (o.cardinalities.empty() || o.cardinalities.size() > kMaxFields) {
    return Status::InvalidArgument("cardinalities: need 1.." + std::to_string(kMaxFields));
  }
  for (uint64_t c : o.cardinalities) {
    if (c == 0) return Status::InvalidArgument("cardinality 0");
  }
  if (!(o.zipf_exponent > 0) || o.planted_dim == 0 || o.planted_dim > 8) {
    return Status::InvalidArgument("zipf_exponent must be > 0 and planted_dim in [1, 8]");
  }
  return std::unique_ptr<SyntheticReader>(new SyntheticReader(o));
}

SyntheticReader::SyntheticReader(const SyntheticOptions& o) : options_(o) {
  const uint32_t nf = static_cast<uint32_t>(o.cardinalities.size());
  schema_.num_dense = o.num_dense;
  schema_.num_fields = nf;
  const double s = o.zipf_exponent;
  for (uint32_t f = 0; f < nf; ++f) {
    Zipf z;
    z.n = o.cardinalities[f];
    z.s = s;
    z.h_x1 = HIntegral(1.5, s) - 1.0;
    z.h_n = HIntegral(static_cast<double>(z.n) + 0.5, s);
    z.s_param = 2.0 - HIntegralInverse(HIntegral(2.5, s) - H(2.0, s), s);
    zipf_.push_back(z);
    missing_.push_back(f < 26 ? kCriteoMissing[f] : 0.0);
  }
  // Interactions: P pairs of k-wide dots of N(0, sigma_v^2) entries have variance P k sigma_v^4.
  const double pairs = nf * (nf - 1) / 2.0;
  sigma_v_ = pairs > 0
                 ? std::pow(o.interaction_std * o.interaction_std / (pairs * o.planted_dim), 0.25)
                 : 0.0;
  sigma_b_ = o.bias_std / std::sqrt(static_cast<double>(nf));
  for (uint32_t j = 0; j < o.num_dense; ++j) {
    dense_w_.push_back(Normal(Hash3(o.seed, 1000 + j, 1), Hash3(o.seed, 1000 + j, 2)) *
                       o.dense_std / std::sqrt(static_cast<double>(o.num_dense)));
  }
}

uint64_t SyntheticReader::SampleZipf(const Zipf& z, uint64_t* rng) const {
  while (true) {
    const double u = z.h_n + Unit(Next(rng)) * (z.h_x1 - z.h_n);
    const double x = HIntegralInverse(u, z.s);
    uint64_t k = static_cast<uint64_t>(x + 0.5);
    k = std::clamp<uint64_t>(k, 1, z.n);
    if (static_cast<double>(k) - x <= z.s_param ||
        u >= HIntegral(static_cast<double>(k) + 0.5, z.s) - H(static_cast<double>(k), z.s)) {
      return k;
    }
  }
}

Status SyntheticReader::Seek(uint64_t position) {
  if (options_.num_samples != 0) {
    const uint64_t mine =
        (options_.num_samples + options_.world - 1 - options_.rank) / options_.world;
    if (position > mine) return Status::InvalidArgument("seek past the end of the stream");
  }
  position_ = position;
  return Status::OK();
}

void SyntheticReader::Generate(uint64_t index, Batch* batch) const {
  const SyntheticOptions& o = options_;
  const uint32_t nf = schema_.num_fields, k = o.planted_dim;
  uint64_t rng = Hash3(o.seed, o.stream + 0x51ed270b, index);
  double logit = o.offset;
  for (uint32_t j = 0; j < o.num_dense; ++j) {
    // Heavy-tailed non-negative features, like log(1 + count).
    const double x = std::log1p(std::exp(1.5 * Normal(Next(&rng), Next(&rng))));
    batch->dense.push_back(static_cast<float>(x));
    logit += dense_w_[j] * (x - 1.0);
  }
  // Planted vectors of the chosen ids; absent fields have none.
  double vecs[kMaxFields][8];
  bool present[kMaxFields];
  const uint32_t kk = std::min<uint32_t>(k, 8);
  for (uint32_t f = 0; f < nf; ++f) {
    present[f] = Unit(Next(&rng)) >= missing_[f];
    const uint64_t rank = SampleZipf(zipf_[f], &rng);
    if (present[f]) {
      // The id a rank maps to is a fixed scramble, so frequent ids are not small numbers.
      const uint64_t id = Mix64(rank * 0x9e3779b97f4a7c15ULL + f) & 0xffffffffffULL;
      batch->keys.push_back(MakeKey(f, id));
      if (!batch->weights.empty()) batch->weights.push_back(1.0f);
      const double decay = o.tail_rank > 0
                               ? 1.0 / std::sqrt(1.0 + static_cast<double>(rank - 1) / o.tail_rank)
                               : 1.0;
      logit += decay * sigma_b_ *
               Normal(Hash3(o.seed, f, rank * 64 + 62), Hash3(o.seed, f, rank * 64 + 63));
      for (uint32_t d = 0; d < kk; ++d) {
        vecs[f][d] =
            std::sqrt(decay) * sigma_v_ *
            Normal(Hash3(o.seed, f, rank * 64 + 2 * d), Hash3(o.seed, f, rank * 64 + 2 * d + 1));
      }
    }
    batch->offsets.push_back(static_cast<uint32_t>(batch->keys.size()));
  }
  for (uint32_t f = 0; f < nf; ++f) {
    if (!present[f]) continue;
    for (uint32_t g = f + 1; g < nf; ++g) {
      if (!present[g]) continue;
      double dot = 0;
      for (uint32_t d = 0; d < kk; ++d) dot += vecs[f][d] * vecs[g][d];
      logit += dot;
    }
  }
  const double p = 1.0 / (1.0 + std::exp(-logit));
  batch->labels.push_back(Unit(Next(&rng)) < p ? 1.0f : 0.0f);
  batch->true_probs.push_back(static_cast<float>(p));
  ++batch->size;
}

Result<uint32_t> SyntheticReader::Read(uint32_t max_samples, Batch* batch) {
  const SyntheticOptions& o = options_;
  if (batch->size > 0 && batch->true_probs.size() != batch->size) {
    return Status::InvalidArgument("batch mixes generated and read samples");
  }
  uint32_t n = 0;
  while (n < max_samples) {
    const uint64_t index = o.rank + position_ * o.world;
    if (o.num_samples != 0 && index >= o.num_samples) break;
    Generate(index, batch);
    ++position_;
    ++n;
  }
  return n;
}

}  // namespace tessera::worker
