// The fast synthetic generator against its exact reference (worker/synthetic_data.h): the same
// planted model value for value, the same distribution within sampling noise (bounds derived
// from the sample sizes, at about 5 standard deviations or p = 1e-6), deterministic by index,
// safe to call from several threads.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <thread>
#include <unordered_map>
#include <vector>

#include "ps/feature_keys.h"
#include "worker/metrics.h"
#include "worker/synthetic_data.h"
#include "worker/synthetic_data_internal.h"

namespace tessera::worker {
namespace {

constexpr uint32_t kSamples = 200000;
constexpr double kSigmas = 5;

Batch Generate(const SyntheticOptions& o, uint32_t n) {
  auto r = SyntheticReader::Create(o);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  Batch b;
  b.Clear((*r)->schema());
  while (b.size < n && (*r)->Read(std::min<uint32_t>(4096, n - b.size), &b).value() > 0) {
  }
  EXPECT_TRUE(b.Validate().ok());
  return b;
}

SyntheticOptions Options(bool reference) {
  SyntheticOptions o;
  o.seed = 3;
  o.reference_generator = reference;
  return o;
}

// The 1 - 1e-6 quantile of chi-square with `df` degrees of freedom (Wilson-Hilferty).
double ChiSquareBound(double df) {
  const double z = 4.753, c = 2 / (9 * df);
  return df * std::pow(1 - c + z * std::sqrt(c), 3);
}

struct Moments {
  double n = 0, mean = 0, var = 0, m4 = 0;
};
Moments Of(const std::vector<double>& x) {
  Moments m;
  m.n = static_cast<double>(x.size());
  for (double v : x) m.mean += v / m.n;
  for (double v : x) {
    m.var += (v - m.mean) * (v - m.mean) / m.n;
    m.m4 += std::pow(v - m.mean, 4) / m.n;
  }
  return m;
}
// Means and variances of two samples agree within kSigmas standard errors.
void ExpectSameMeanAndVariance(const std::vector<double>& a, const std::vector<double>& b,
                               const std::string& what) {
  const Moments x = Of(a), y = Of(b);
  EXPECT_LE(std::abs(x.mean - y.mean), kSigmas * std::sqrt(x.var / x.n + y.var / y.n)) << what;
  const double se_var = std::sqrt((x.m4 - x.var * x.var) / x.n + (y.m4 - y.var * y.var) / y.n);
  EXPECT_LE(std::abs(x.var - y.var), kSigmas * se_var) << what << " variance";
}

// Field f's rank of every present field of every sample (0: missing).
std::vector<std::vector<uint32_t>> Ranks(const Batch& b, const SyntheticOptions& o) {
  std::unordered_map<uint64_t, uint32_t> rank_of;
  for (uint32_t f = 0; f < o.cardinalities.size(); ++f) {
    for (uint64_t r = 1; r <= o.cardinalities[f]; ++r) {
      rank_of[SyntheticReader::KeyOf(f, r)] = static_cast<uint32_t>(r);
    }
  }
  const uint32_t nf = b.schema.num_fields;
  std::vector<std::vector<uint32_t>> ranks(nf, std::vector<uint32_t>(b.size, 0));
  for (uint32_t s = 0; s < b.size; ++s) {
    for (uint32_t f = 0; f < nf; ++f) {
      const uint32_t at = b.offsets[s * nf + f];
      if (at == b.offsets[s * nf + f + 1]) continue;
      EXPECT_EQ(b.offsets[s * nf + f + 1], at + 1);
      auto it = rank_of.find(b.keys[at]);
      EXPECT_NE(it, rank_of.end()) << "a key of no rank in field " << f;
      if (it != rank_of.end()) ranks[f][s] = it->second;
    }
  }
  return ranks;
}

// 200k samples of each generator, of the same options, shared by the tests that compare them.
class FastVsReference : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    fast_ = new Batch(Generate(Options(false), kSamples));
    reference_ = new Batch(Generate(Options(true), kSamples));
  }
  static void TearDownTestSuite() {
    delete fast_;
    delete reference_;
  }
  static Batch* fast_;
  static Batch* reference_;
};
Batch* FastVsReference::fast_ = nullptr;
Batch* FastVsReference::reference_ = nullptr;

TEST_F(FastVsReference, ClickRateTrueProbsAndOracleAucAgree) {
  const Batch& a = *fast_;
  const Batch& b = *reference_;
  ASSERT_EQ(a.size, kSamples);
  ASSERT_EQ(b.size, kSamples);
  ExpectSameMeanAndVariance(std::vector<double>(a.labels.begin(), a.labels.end()),
                            std::vector<double>(b.labels.begin(), b.labels.end()), "click rate");
  ExpectSameMeanAndVariance(std::vector<double>(a.true_probs.begin(), a.true_probs.end()),
                            std::vector<double>(b.true_probs.begin(), b.true_probs.end()),
                            "true_prob");
  // Hanley and McNeil's standard error of an AUC.
  auto auc_se = [](const Batch& x, double auc) {
    const double pos = std::accumulate(x.labels.begin(), x.labels.end(), 0.0);
    const double neg = x.size - pos;
    const double q1 = auc / (2 - auc), q2 = 2 * auc * auc / (1 + auc);
    return std::sqrt(
        (auc * (1 - auc) + (pos - 1) * (q1 - auc * auc) + (neg - 1) * (q2 - auc * auc)) /
        (pos * neg));
  };
  const double auc_a = Auc(a.true_probs, a.labels), auc_b = Auc(b.true_probs, b.labels);
  EXPECT_LE(std::abs(auc_a - auc_b), kSigmas * std::hypot(auc_se(a, auc_a), auc_se(b, auc_b)))
      << "oracle AUC fast " << auc_a << " reference " << auc_b;
}

TEST_F(FastVsReference, DenseFeaturesAgree) {
  const uint32_t nd = fast_->schema.num_dense;
  for (uint32_t j = 0; j < nd; ++j) {
    std::vector<double> a, b;
    for (uint32_t s = 0; s < kSamples; ++s) {
      a.push_back(fast_->dense[s * nd + j]);
      b.push_back(reference_->dense[s * nd + j]);
    }
    ExpectSameMeanAndVariance(a, b, "dense feature " + std::to_string(j));
  }
}

TEST_F(FastVsReference, MissingRatesAndTopRankFrequenciesAgree) {
  const SyntheticOptions o = Options(false);
  const auto ra = Ranks(*fast_, o), rb = Ranks(*reference_, o);
  for (uint32_t f = 0; f < o.cardinalities.size(); ++f) {
    std::vector<double> missing_a, missing_b;
    // The ranks 1..10 (fewer in a smaller field) and "any other" among present samples.
    const uint32_t top = static_cast<uint32_t>(std::min<uint64_t>(10, o.cardinalities[f]));
    std::vector<double> bins_a(top + 1, 0), bins_b(top + 1, 0);
    for (uint32_t s = 0; s < kSamples; ++s) {
      missing_a.push_back(ra[f][s] == 0);
      missing_b.push_back(rb[f][s] == 0);
      if (ra[f][s] != 0) ++bins_a[std::min(ra[f][s], top + 1) - 1];
      if (rb[f][s] != 0) ++bins_b[std::min(rb[f][s], top + 1) - 1];
    }
    ExpectSameMeanAndVariance(missing_a, missing_b, "missing rate of field " + std::to_string(f));
    // Chi-square test of homogeneity of the two samples' rank counts.
    const double na = std::accumulate(bins_a.begin(), bins_a.end(), 0.0);
    const double nb = std::accumulate(bins_b.begin(), bins_b.end(), 0.0);
    double chi2 = 0, df = -1;
    for (uint32_t i = 0; i <= top; ++i) {
      const double both = bins_a[i] + bins_b[i];
      if (both == 0) continue;
      const double ea = both * na / (na + nb), eb = both * nb / (na + nb);
      chi2 += (bins_a[i] - ea) * (bins_a[i] - ea) / ea + (bins_b[i] - eb) * (bins_b[i] - eb) / eb;
      ++df;
    }
    if (df >= 1) {
      EXPECT_LE(chi2, ChiSquareBound(df)) << "top ranks of field " << f;
    }
  }
}

// Every rank's frequency against the exact Zipf(n, s) probabilities (one-sample chi-square over
// the ranks of the table one by one and the rarer ranks in bins doubling in width), with a
// small table (64 ranks) so that the tail's own sampler gets many draws, and the default one.
TEST(SyntheticFast, RanksFollowZipfExactlyAcrossTheTablesEdge) {
  for (uint32_t table : {64u, 16384u}) {
    SyntheticOptions o;
    o.seed = 5;
    o.cardinalities = {20000, 1000, 65, 64, 3};
    o.table_ranks = table;
    const uint32_t n = 400000;
    const Batch b = Generate(o, n);
    const auto ranks = Ranks(b, o);
    for (uint32_t f = 0; f < o.cardinalities.size(); ++f) {
      const uint64_t card = o.cardinalities[f];
      std::vector<long double> p(card + 1, 0);
      long double total = 0;
      for (uint64_t k = card; k >= 1; --k) total += p[k] = std::pow((long double)k, -1.2L);
      // Bins: ranks 1..64 each, then [65, 128), [128, 256), ... up to card.
      std::vector<std::pair<uint64_t, uint64_t>> bins;
      for (uint64_t k = 1; k <= std::min<uint64_t>(card, 64); ++k) bins.push_back({k, k + 1});
      for (uint64_t lo = 65, hi = 128; lo <= card; lo = hi, hi *= 2) {
        bins.push_back({lo, std::min(hi, card + 1)});
      }
      std::vector<double> observed(bins.size(), 0);
      double present = 0;
      for (uint32_t r : ranks[f]) {
        if (r == 0) continue;
        ++present;
        for (size_t i = 0; i < bins.size(); ++i) {
          if (r >= bins[i].first && r < bins[i].second) ++observed[i];
        }
      }
      double chi2 = 0;
      for (size_t i = 0; i < bins.size(); ++i) {
        long double mass = 0;
        for (uint64_t k = bins[i].first; k < bins[i].second; ++k) mass += p[k];
        const double expected = static_cast<double>(mass / total) * present;
        chi2 += (observed[i] - expected) * (observed[i] - expected) / expected;
      }
      EXPECT_LE(chi2, ChiSquareBound(static_cast<double>(bins.size() - 1)))
          << "field " << f << " of " << card << " ids, table of " << table << " ranks";
    }
  }
}

// The dense features against their exact distribution, x = log1p(exp(1.5 z)) with z ~ N(0, 1):
// Kolmogorov-Smirnov over all features (P(X <= x) = Phi(log(expm1(x)) / 1.5)); and the
// quantile table against the exact quantile function, draw by draw.
TEST(SyntheticFast, DenseFeaturesFollowTheirExactDistribution) {
  const Batch b = Generate(Options(false), kSamples / 2);
  std::vector<double> x(b.dense.begin(), b.dense.end());
  std::sort(x.begin(), x.end());
  double d = 0;
  const double n = static_cast<double>(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double cdf = 0.5 * std::erfc(-std::log(std::expm1(x[i])) / 1.5 / std::sqrt(2.0));
    d = std::max({d, std::abs(cdf - i / n), std::abs(cdf - (i + 1) / n)});
  }
  EXPECT_LE(d, std::sqrt(-std::log(1e-6 / 2) / (2 * n))) << "KS distance";

  // The inverse normal CDF under both: Phi(InverseNormalCdf(p)) = p, in both tails (the upper
  // one compared as 1 - q, exact for q = 1 - p).
  for (double p = 1e-300; p < 0.5; p *= 1.7) {
    const double lower = internal::InverseNormalCdf(p);
    EXPECT_NEAR(0.5 * std::erfc(-lower / std::sqrt(2.0)), p, 1e-12 * p) << "p = " << p;
    if (p < 1e-15) continue;
    const double q = 1 - p, upper = internal::InverseNormalCdf(q);
    EXPECT_NEAR(0.5 * std::erfc(upper / std::sqrt(2.0)), 1 - q, 1e-12 * (1 - q)) << "1 - " << p;
  }
  const internal::DenseQuantileTable table;
  uint64_t rng = 9;
  double worst = 0;
  for (int i = 0; i < 1000000; ++i) {
    const uint64_t h = internal::Next(&rng);
    const double exact = internal::DenseQuantileExact(internal::Unit(h));
    worst = std::max(worst, std::abs(table.Quantile(h) - exact) / exact);
  }
  EXPECT_LT(worst, 5e-8) << "the table's relative error (documented: below 3e-8)";
}

// b(f, rank) and v(f, rank) of the fast generator's tables, and of the ranks it computes beyond
// them, are the reference's to the bit.
TEST(SyntheticFast, PlantedValuesAreTheReferences) {
  for (uint32_t table : {64u, 16384u}) {
    SyntheticOptions o = Options(false);
    o.table_ranks = table;
    SyntheticOptions ro = o;
    ro.reference_generator = true;
    auto fast = SyntheticReader::Create(o);
    auto ref = SyntheticReader::Create(ro);
    ASSERT_TRUE(fast.ok() && ref.ok());
    EXPECT_EQ((*fast)->dense_weights(), (*ref)->dense_weights());
    uint64_t rng = 11;
    int compared = 0;
    for (uint32_t f = 0; f < o.cardinalities.size(); ++f) {
      std::vector<uint64_t> ranks;
      const uint64_t card = o.cardinalities[f];
      for (uint64_t r = 1; r <= std::min<uint64_t>(card, 300); ++r) ranks.push_back(r);
      for (int i = 0; i < 300; ++i) ranks.push_back(1 + internal::Next(&rng) % card);
      ranks.push_back(card);
      for (uint64_t r : ranks) {
        double bf, br, vf[8], vr[8];
        (*fast)->Planted(f, r, &bf, vf);
        (*ref)->Planted(f, r, &br, vr);
        ASSERT_EQ(bf, br) << "bias of field " << f << " rank " << r;
        for (uint32_t d = 0; d < o.planted_dim; ++d) {
          ASSERT_EQ(vf[d], vr[d]) << "vector of field " << f << " rank " << r << " [" << d << "]";
        }
        ++compared;
      }
    }
    EXPECT_GT(compared, 10000);
  }
}

// Each fast sample's true_prob is sigmoid of the planted model's logit, recomputed from its keys
// and dense features with the reference's planted values and every pairwise dot.
TEST(SyntheticFast, TrueProbIsThePlantedLogitOfTheSample) {
  for (uint32_t table : {64u, 16384u}) {
    SyntheticOptions o = Options(false);
    o.table_ranks = table;
    SyntheticOptions ro = o;
    ro.reference_generator = true;
    auto ref = SyntheticReader::Create(ro);
    ASSERT_TRUE(ref.ok());
    const Batch b = Generate(o, 20000);
    const auto ranks = Ranks(b, o);
    const uint32_t nf = b.schema.num_fields, nd = b.schema.num_dense, k = o.planted_dim;
    const std::vector<double>& w = (*ref)->dense_weights();
    double worst = 0;
    for (uint32_t s = 0; s < b.size; ++s) {
      double logit = o.offset;
      for (uint32_t j = 0; j < nd; ++j) logit += w[j] * (b.dense[s * nd + j] - 1.0);
      std::vector<std::vector<double>> vecs;
      for (uint32_t f = 0; f < nf; ++f) {
        if (ranks[f][s] == 0) continue;
        double bias;
        std::vector<double> v(8);
        (*ref)->Planted(f, ranks[f][s], &bias, v.data());
        logit += bias;
        vecs.push_back(v);
      }
      for (size_t f = 0; f < vecs.size(); ++f) {
        for (size_t g = f + 1; g < vecs.size(); ++g) {
          for (uint32_t d = 0; d < k; ++d) logit += vecs[f][d] * vecs[g][d];
        }
      }
      worst = std::max(worst, std::abs(1 / (1 + std::exp(-logit)) - b.true_probs[s]));
    }
    // The dense features are stored as floats (the logit used the doubles): 13 of them move
    // the probability by well under 1e-6.
    EXPECT_LT(worst, 1e-6) << "table of " << table << " ranks";
  }
}

void ExpectSameSample(const Batch& a, uint32_t i, const Batch& b, uint32_t j) {
  const uint32_t nd = a.schema.num_dense, nf = a.schema.num_fields;
  EXPECT_EQ(a.labels[i], b.labels[j]);
  EXPECT_EQ(a.true_probs[i], b.true_probs[j]);
  EXPECT_TRUE(std::equal(a.dense.begin() + i * nd, a.dense.begin() + (i + 1) * nd,
                         b.dense.begin() + j * nd));
  EXPECT_TRUE(
      std::equal(a.keys.begin() + a.offsets[i * nf], a.keys.begin() + a.offsets[(i + 1) * nf],
                 b.keys.begin() + b.offsets[j * nf], b.keys.begin() + b.offsets[(j + 1) * nf]));
}

TEST(SyntheticFast, DeterministicByIndexInAnyShardAndAfterSeek) {
  SyntheticOptions o = Options(false);
  o.num_samples = 3000;
  const Batch all = Generate(o, 3000);
  SyntheticOptions s = o;
  s.rank = 2;
  s.world = 3;
  auto shard = SyntheticReader::Create(s);
  ASSERT_TRUE(shard.ok());
  ASSERT_TRUE((*shard)->Seek(100).ok());
  Batch one;
  one.Clear((*shard)->schema());
  ASSERT_EQ((*shard)->Read(2, &one).value(), 2u);
  ExpectSameSample(one, 0, all, 302);  // shard 2 of 3, its 100th sample: global 302
  ExpectSameSample(one, 1, all, 305);
  Batch direct;
  direct.Clear((*shard)->schema());
  (*shard)->Generate(2999, &direct);
  ExpectSameSample(direct, 0, all, 2999);
}

TEST(SyntheticFast, GenerateFromFourThreadsGivesTheSamplesOfOne) {
  SyntheticOptions o = Options(false);
  o.seed = 77;  // tables built below, by four Creates at once
  std::vector<std::unique_ptr<SyntheticReader>> readers(4);
  {
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&, t] { readers[t] = std::move(SyntheticReader::Create(o).value()); });
    }
    for (auto& th : threads) th.join();
  }
  for (int t = 1; t < 4; ++t) EXPECT_TRUE(readers[0]->SharesTablesWith(*readers[t]));
  const SyntheticReader& reader = *readers[0];
  constexpr uint32_t kEach = 20000;
  Batch alone;
  alone.Clear(reader.schema());
  for (uint32_t i = 0; i < 4 * kEach; ++i) reader.Generate(i, &alone);
  std::vector<Batch> parts(4);
  std::vector<std::thread> threads;
  for (uint32_t t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      parts[t].Clear(reader.schema());
      for (uint32_t i = t; i < 4 * kEach; i += 4) reader.Generate(i, &parts[t]);
    });
  }
  for (auto& th : threads) th.join();
  for (uint32_t i = 0; i < 4 * kEach; ++i) ExpectSameSample(parts[i % 4], i / 4, alone, i);
}

TEST(SyntheticFast, TablesStayWithinTheirBoundAndOptionsAreChecked) {
  SyntheticOptions o;
  o.cardinalities.assign(kMaxFields, 10000000);
  o.planted_dim = 8;
  auto r = SyntheticReader::Create(o);
  ASSERT_TRUE(r.ok());
  EXPECT_LE((*r)->table_bytes(), kMaxSyntheticTableBytes);
  EXPECT_LT((*r)->tabulated_ranks(), o.table_ranks);
  Batch b;
  b.Clear((*r)->schema());
  ASSERT_EQ((*r)->Read(100, &b).value(), 100u);
  EXPECT_TRUE(b.Validate().ok());

  auto defaults = SyntheticReader::Create(SyntheticOptions{});
  ASSERT_TRUE(defaults.ok());
  EXPECT_EQ((*defaults)->tabulated_ranks(), 16384u);
  EXPECT_LE((*defaults)->table_bytes(), kMaxSyntheticTableBytes);
  SyntheticOptions ref;
  ref.reference_generator = true;
  EXPECT_EQ(SyntheticReader::Create(ref).value()->table_bytes(), 0u);

  SyntheticOptions bad;
  bad.table_ranks = 0;
  EXPECT_FALSE(SyntheticReader::Create(bad).ok());
  bad.table_ranks = (1u << 20) + 1;
  EXPECT_FALSE(SyntheticReader::Create(bad).ok());
}

}  // namespace
}  // namespace tessera::worker
