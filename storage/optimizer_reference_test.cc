// Every optimizer, applied through a LaneStore for many steps, against a straightforward scalar
// reference written from the papers' formulas in double precision. The RocksDB engine runs with
// a memory tier of a few rows, so the optimizer state also makes the round trip through disk.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "ps/routing.h"
#include "storage/storage.h"
#include "storage/test_util_internal.h"

namespace tessera {
namespace {

using internal::TempDir;

constexpr uint32_t kDim = 6;
constexpr int kSteps = 300;
constexpr int kKeys = 40;

// Reference state of one row: the value and the optimizer's variables, per element.
struct RefRow {
  std::vector<double> w, a, b;  // a, b: the optimizer's state (m/v, z/n, accumulators)
  double row_acc = 0;           // row-wise Adagrad
  uint64_t t = 0;               // updates so far
};

// One update of elements [begin, end) with gradient g (g[k] is element begin + k).
void ReferenceStep(const OptimizerSpec& o, RefRow& r, const std::vector<float>& g, uint32_t begin,
                   uint32_t end) {
  ++r.t;
  switch (o.kind) {
    case OptimizerKind::kSgd:
      for (uint32_t j = begin; j < end; ++j) r.w[j] -= o.learning_rate * g[j - begin];
      return;
    case OptimizerKind::kMomentum:
      for (uint32_t j = begin; j < end; ++j) {
        r.a[j] = o.momentum * r.a[j] + g[j - begin];
        r.w[j] -= o.learning_rate * r.a[j];
      }
      return;
    case OptimizerKind::kAdagrad:
      for (uint32_t j = begin; j < end; ++j) {
        r.a[j] += double{g[j - begin]} * g[j - begin];
        r.w[j] -= o.learning_rate * g[j - begin] / (std::sqrt(r.a[j]) + o.epsilon);
      }
      return;
    case OptimizerKind::kRowwiseAdagrad: {
      double sq = 0;
      for (uint32_t j = begin; j < end; ++j) sq += double{g[j - begin]} * g[j - begin];
      r.row_acc += sq / (end - begin);
      for (uint32_t j = begin; j < end; ++j) {
        r.w[j] -= o.learning_rate * g[j - begin] / (std::sqrt(r.row_acc) + o.epsilon);
      }
      return;
    }
    case OptimizerKind::kAdam: {
      // Kingma & Ba 2015, Section 2's efficient form (as TensorFlow's Adam): the bias
      // corrections folded into the step size, epsilon ("epsilon hat") added to sqrt(v). The
      // step count is the row's own.
      const double t = static_cast<double>(r.t);
      const double lr_t = o.learning_rate * std::sqrt(1 - std::pow(double{o.beta2}, t)) /
                          (1 - std::pow(double{o.beta1}, t));
      for (uint32_t j = begin; j < end; ++j) {
        const double gj = g[j - begin];
        r.a[j] = o.beta1 * r.a[j] + (1 - o.beta1) * gj;
        r.b[j] = o.beta2 * r.b[j] + (1 - o.beta2) * gj * gj;
        r.w[j] -= lr_t * r.a[j] / (std::sqrt(r.b[j]) + o.epsilon);
      }
      return;
    }
    case OptimizerKind::kFtrl: {
      // McMahan et al. 2013, Algorithm 1 (per-coordinate FTRL-Proximal): a = z, b = n.
      const double alpha = o.learning_rate, beta = o.ftrl_beta, l1 = o.l1, l2 = o.l2;
      for (uint32_t j = begin; j < end; ++j) {
        const double gj = g[j - begin];
        const double sigma = (std::sqrt(r.b[j] + gj * gj) - std::sqrt(r.b[j])) / alpha;
        r.a[j] += gj - sigma * r.w[j];
        r.b[j] += gj * gj;
        r.w[j] = std::fabs(r.a[j]) <= l1 ? 0.0
                                         : -(r.a[j] - (r.a[j] > 0 ? l1 : -l1)) /
                                               ((beta + std::sqrt(r.b[j])) / alpha + l2);
      }
      return;
    }
  }
}

struct Case {
  std::string name;
  OptimizerSpec spec;
};

std::vector<Case> Cases() {
  OptimizerSpec sgd{OptimizerKind::kSgd, 0.05f};
  OptimizerSpec momentum{OptimizerKind::kMomentum, 0.02f};
  momentum.momentum = 0.8f;
  OptimizerSpec adagrad{OptimizerKind::kAdagrad, 0.1f};
  adagrad.initial_accumulator = 0.1f;
  OptimizerSpec rowwise{OptimizerKind::kRowwiseAdagrad, 0.1f};
  rowwise.initial_accumulator = 0.1f;
  OptimizerSpec adam{OptimizerKind::kAdam, 0.01f};
  adam.beta1 = 0.85f;
  adam.beta2 = 0.99f;
  adam.epsilon = 1e-6f;
  OptimizerSpec ftrl{OptimizerKind::kFtrl, 0.1f};
  ftrl.ftrl_beta = 1.0f;
  ftrl.l1 = 0.3f;
  ftrl.l2 = 0.1f;
  return {{"Sgd", sgd},   {"Momentum", momentum}, {"Adagrad", adagrad}, {"RowwiseAdagrad", rowwise},
          {"Adam", adam}, {"Ftrl", ftrl}};
}

// Initial reference row: the engine's initializer (zeros) and the optimizer's initial state.
RefRow NewRefRow(const OptimizerSpec& o, uint32_t n) {
  RefRow r;
  r.w.assign(n, 0.0);
  r.a.assign(n, o.kind == OptimizerKind::kAdagrad ? o.initial_accumulator : 0.0);
  r.b.assign(n, 0.0);
  r.row_acc = o.initial_accumulator;
  return r;
}

float GradOf(std::mt19937_64& rng) {
  // Mostly moderate gradients, sometimes tiny or large, both signs.
  const double u = (rng() >> 11) * 0x1.0p-53;
  const double scale = (rng() % 10 == 0) ? 5.0 : ((rng() % 10 == 0) ? 1e-3 : 1.0);
  return static_cast<float>((2 * u - 1) * scale);
}

void ExpectClose(double want, float got, const std::string& what) {
  EXPECT_NEAR(got, want, 2e-4 + 2e-4 * std::fabs(want)) << what;
}

// A sparse row the lane scanned (key number k) against its reference: update count, value and
// the optimizer's state.
void ExpectRowMatches(const Case& c, int k, const RefRow& r, const float* v, const float* state,
                      const RowMeta& meta) {
  EXPECT_EQ(meta.update_count, r.t);
  for (uint32_t j = 0; j < kDim; ++j) {
    ExpectClose(r.w[j], v[j],
                c.name + " key " + std::to_string(k) + " w[" + std::to_string(j) + "]");
  }
  switch (c.spec.kind) {
    case OptimizerKind::kMomentum:
    case OptimizerKind::kAdagrad:
      for (uint32_t j = 0; j < kDim; ++j) ExpectClose(r.a[j], state[j], c.name + " state");
      break;
    case OptimizerKind::kRowwiseAdagrad:
      ExpectClose(r.row_acc, state[0], c.name + " accumulator");
      break;
    case OptimizerKind::kAdam:
    case OptimizerKind::kFtrl:
      for (uint32_t j = 0; j < kDim; ++j) {
        ExpectClose(r.a[j], state[j], c.name + " state plane 0");
        ExpectClose(r.b[j], state[kDim + j], c.name + " state plane 1");
      }
      break;
    case OptimizerKind::kSgd:
      break;
  }
}

class OptimizerReferenceTest : public ::testing::TestWithParam<std::tuple<Case, bool>> {};

TEST_P(OptimizerReferenceTest, SparseRowsMatchTheReferenceOverManySteps) {
  const auto& [c, on_disk] = GetParam();
  TempDir dir;
  std::unique_ptr<StorageEngine> engine;
  if (on_disk) {
    StorageOptions o;
    o.memory_budget_bytes = 512;  // a handful of rows: nearly every step reads rows from disk
    engine = internal::MustOpen(dir.Sub("db"), o);
  } else {
    engine = NewMemoryStorageEngine();
  }
  ASSERT_NE(engine, nullptr);
  auto lane = internal::MustLane(engine.get());
  const auto spec = TableSpec::Sparse("t", kDim, c.spec);
  const uint64_t id = TableIdForName("t");
  ASSERT_TRUE(lane->AddTable(id, spec).ok());

  std::vector<RefRow> ref(kKeys, NewRefRow(c.spec, kDim));
  std::mt19937_64 rng(7);
  for (int step = 1; step <= kSteps; ++step) {
    // A random subset of keys, some twice in one push.
    std::vector<uint64_t> keys;
    std::vector<std::vector<float>> grads;
    for (int i = 0; i < 12; ++i) {
      const uint64_t k = rng() % kKeys;
      keys.push_back(Mix64(k + 1));
      std::vector<float> g(kDim);
      for (auto& x : g) x = GradOf(rng);
      ReferenceStep(c.spec, ref[k], g, 0, kDim);
      grads.push_back(std::move(g));
    }
    std::vector<const float*> gp;
    for (auto& g : grads) gp.push_back(g.data());
    ASSERT_TRUE(lane->Apply(id, keys, gp, {static_cast<uint64_t>(step), 1}).ok());
    if (step % 3 == 0) {
      ASSERT_TRUE(lane->Commit().ok());
    }
  }
  ASSERT_TRUE(lane->Commit().ok());
  int checked = 0;
  ASSERT_TRUE(
      lane->Scan(id,
                 [&](uint64_t key, const float* v, const float* state, const RowMeta& meta) {
                   int k = 0;
                   while (k < kKeys && Mix64(k + 1) != key) ++k;
                   EXPECT_LT(k, kKeys);
                   if (k == kKeys) return false;
                   ExpectRowMatches(c, k, ref[k], v, state, meta);
                   ++checked;
                   return true;
                 })
          .ok());
  int touched = 0;
  for (const RefRow& r : ref) touched += r.t > 0;
  EXPECT_EQ(checked, touched);
  if (c.spec.kind == OptimizerKind::kFtrl) {
    // L1 makes some weights exactly zero: the sparsity FTRL is used for.
    int zeros = 0;
    for (const RefRow& r : ref) {
      for (double w : r.w) zeros += w == 0.0;
    }
    EXPECT_GT(zeros, 0);
  }
}

TEST_P(OptimizerReferenceTest, DenseChunksMatchTheReferenceWithPartialRanges) {
  const auto& [c, on_disk] = GetParam();
  TempDir dir;
  std::unique_ptr<StorageEngine> engine =
      on_disk ? internal::MustOpen(dir.Sub("db")) : NewMemoryStorageEngine();
  ASSERT_NE(engine, nullptr);
  auto lane = internal::MustLane(engine.get());
  constexpr uint32_t kLen = 40;
  const uint64_t id = TableIdForName("d");
  ASSERT_TRUE(lane->AddTable(id, TableSpec::Dense("d", kLen, c.spec)).ok());
  RefRow ref = NewRefRow(c.spec, kLen);
  std::mt19937_64 rng(3);
  for (int step = 1; step <= 100; ++step) {
    const uint32_t begin = static_cast<uint32_t>(rng() % kLen);
    const uint32_t end = begin + 1 + static_cast<uint32_t>(rng() % (kLen - begin));
    std::vector<float> g(end - begin);
    for (auto& x : g) x = GradOf(rng);
    ReferenceStep(c.spec, ref, g, begin, end);
    ASSERT_TRUE(lane->DenseApply(id, 0, begin, end, g.data(), {1, 1}).ok());
    if (step % 7 == 0) {
      // Reopening the engine reloads the chunk, state included, from disk.
      ASSERT_TRUE(lane->Commit().ok());
      if (on_disk) {
        lane.reset();
        engine.reset();
        engine = internal::MustOpen(dir.Sub("db"));
        lane = internal::MustLane(engine.get());
        ASSERT_TRUE(lane->AddTable(id, TableSpec::Dense("d", kLen, c.spec)).ok());
      }
    }
  }
  std::vector<float> w(kLen);
  ASSERT_TRUE(lane->DenseRead(id, 0, 0, kLen, w.data()).ok());
  for (uint32_t j = 0; j < kLen; ++j) {
    ExpectClose(ref.w[j], w[j], c.name + " dense w[" + std::to_string(j) + "]");
  }
}

INSTANTIATE_TEST_SUITE_P(All, OptimizerReferenceTest,
                         ::testing::Combine(::testing::ValuesIn(Cases()), ::testing::Bool()),
                         [](const ::testing::TestParamInfo<std::tuple<Case, bool>>& info) {
                           return std::get<0>(info.param).name +
                                  (std::get<1>(info.param) ? "OnDisk" : "InMemory");
                         });

}  // namespace
}  // namespace tessera
