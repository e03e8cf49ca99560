#include "ps/optimizer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

namespace tessera {
namespace {

TEST(OptimizerTest, SgdClosedForm) {
  OptimizerSpec spec;
  spec.kind = OptimizerKind::kSgd;
  spec.learning_rate = 0.1f;
  auto opt = Optimizer::Make(spec);
  EXPECT_EQ(opt->StateFloats(8), 0u);
  std::vector<float> w = {1, 2, 3};
  const float g[] = {1, -2, 0.5};
  // With a constant gradient, w_t = w_0 - t*lr*g.
  for (int t = 1; t <= 10; ++t) opt->Apply(w.data(), nullptr, g, 3, 0, 3, t, 1.0f);
  EXPECT_NEAR(w[0], 1 - 10 * 0.1 * 1, 1e-5);
  EXPECT_NEAR(w[1], 2 + 10 * 0.1 * 2, 1e-5);
  EXPECT_NEAR(w[2], 3 - 10 * 0.1 * 0.5, 1e-5);
}

TEST(OptimizerTest, AdagradClosedForm) {
  OptimizerSpec spec;
  spec.kind = OptimizerKind::kAdagrad;
  spec.learning_rate = 0.5f;
  spec.epsilon = 0.0f;
  spec.initial_accumulator = 0.0f;
  auto opt = Optimizer::Make(spec);
  ASSERT_EQ(opt->StateFloats(2), 2u);
  std::vector<float> w = {0, 0}, a(2);
  opt->InitState(a.data(), 2);
  const float g[] = {2, -3};
  // Constant gradient g: a_t = t*g^2, step t moves by lr*g/(|g|*sqrt(t)) = lr*sign(g)/sqrt(t).
  double expect = 0;
  for (int t = 1; t <= 20; ++t) {
    opt->Apply(w.data(), a.data(), g, 2, 0, 2, t, 1.0f);
    expect += 0.5 / std::sqrt(double(t));
  }
  EXPECT_NEAR(w[0], -expect, 1e-4);
  EXPECT_NEAR(w[1], expect, 1e-4);
  EXPECT_NEAR(a[0], 20 * 4, 1e-3);
  EXPECT_NEAR(a[1], 20 * 9, 1e-3);
}

TEST(OptimizerTest, PartialRangeTouchesOnlyItsElements) {
  OptimizerSpec spec;
  spec.kind = OptimizerKind::kAdam;
  auto opt = Optimizer::Make(spec);
  std::vector<float> w = {1, 1, 1, 1}, s(opt->StateFloats(4), 0.0f);
  const float g[] = {1, 1};
  opt->Apply(w.data(), s.data(), g, 4, 1, 3, 1, 1.0f);
  EXPECT_EQ(w[0], 1.0f);
  EXPECT_LT(w[1], 1.0f);
  EXPECT_LT(w[2], 1.0f);
  EXPECT_EQ(w[3], 1.0f);
  // Adam's first step moves by lr exactly (bias correction), whatever the gradient scale.
  EXPECT_NEAR(w[1], 1.0f - spec.learning_rate, 1e-6);
}

// A push's learning-rate scale multiplies the step size of every optimizer but FTRL; a scale of
// 1 is the plain update bit for bit.
TEST(OptimizerTest, LearningRateScaleMultipliesTheStep) {
  for (OptimizerKind kind : {OptimizerKind::kSgd, OptimizerKind::kMomentum,
                             OptimizerKind::kAdagrad, OptimizerKind::kRowwiseAdagrad,
                             OptimizerKind::kAdam}) {
    OptimizerSpec spec;
    spec.kind = kind;
    spec.learning_rate = 0.1f;
    spec.initial_accumulator = 0.1f;
    auto opt = Optimizer::Make(spec);
    OptimizerSpec scaled_spec = spec;
    scaled_spec.learning_rate = 0.1f * 0.25f;
    auto reference = Optimizer::Make(scaled_spec);
    const float g[] = {0.5f, -1.5f, 2.0f};
    std::vector<float> w(3, 1.0f), s(opt->StateFloats(3)), w_ref = w, s_ref(s.size());
    opt->InitState(s.data(), 3);
    reference->InitState(s_ref.data(), 3);
    std::vector<float> w_one = w, s_one = s;
    for (uint64_t t = 1; t <= 5; ++t) {
      opt->Apply(w.data(), s.data(), g, 3, 0, 3, t, 0.25f);
      reference->Apply(w_ref.data(), s_ref.data(), g, 3, 0, 3, t, 1.0f);
    }
    for (int j = 0; j < 3; ++j) {
      EXPECT_NEAR(w[j], w_ref[j], 1e-6) << OptimizerKindName(kind) << " element " << j;
      EXPECT_NE(w[j], 1.0f) << OptimizerKindName(kind);
    }
    // Scale 0: the state moves (the gradient was seen), the value does not.
    opt->Apply(w_one.data(), s_one.data(), g, 3, 0, 3, 1, 0.0f);
    EXPECT_EQ(w_one, std::vector<float>(3, 1.0f)) << OptimizerKindName(kind);
  }
  // FTRL has per-coordinate rates of its own: the scale is ignored.
  OptimizerSpec ftrl;
  ftrl.kind = OptimizerKind::kFtrl;
  ftrl.learning_rate = 0.5f;
  auto opt = Optimizer::Make(ftrl);
  const float g[] = {1.0f, -2.0f};
  std::vector<float> a(2, 0.0f), sa(4, 0.0f), b = a, sb = sa;
  opt->Apply(a.data(), sa.data(), g, 2, 0, 2, 1, 1.0f);
  opt->Apply(b.data(), sb.data(), g, 2, 0, 2, 1, 0.1f);
  EXPECT_EQ(a, b);
  EXPECT_NE(a[0], 0.0f);
}

// L2 regularization adds l2 * w to the gradient of each updated element: with SGD and a zero
// gradient, w_t = w_0 (1 - lr l2)^t; with Adagrad, the accumulator sees the regularized gradient.
TEST(OptimizerTest, L2AddsDecayToTheUpdatedElements) {
  OptimizerSpec spec;
  spec.kind = OptimizerKind::kSgd;
  spec.learning_rate = 0.1f;
  spec.l2 = 0.5f;
  auto sgd = Optimizer::Make(spec);
  std::vector<float> w = {2.0f, -4.0f, 8.0f};
  const float zero[] = {0.0f, 0.0f};
  for (uint64_t t = 1; t <= 10; ++t) sgd->Apply(w.data(), nullptr, zero, 3, 0, 2, t, 1.0f);
  EXPECT_NEAR(w[0], 2.0 * std::pow(0.95, 10), 1e-5);
  EXPECT_NEAR(w[1], -4.0 * std::pow(0.95, 10), 1e-5);
  EXPECT_EQ(w[2], 8.0f);  // not in the range pushed: not decayed (lazy)

  spec.kind = OptimizerKind::kAdagrad;
  spec.learning_rate = 1.0f;
  spec.epsilon = 0.0f;
  spec.initial_accumulator = 0.0f;
  auto adagrad = Optimizer::Make(spec);
  std::vector<float> v = {2.0f}, acc = {0.0f};
  const float g[] = {1.0f};
  adagrad->Apply(v.data(), acc.data(), g, 1, 0, 1, 1, 1.0f);
  // g' = 1 + 0.5 * 2 = 2: a = 4, v = 2 - 2 / 2.
  EXPECT_NEAR(acc[0], 4.0f, 1e-6);
  EXPECT_NEAR(v[0], 1.0f, 1e-6);

  // l2 = 0 is the plain update.
  spec.l2 = 0.0f;
  auto plain = Optimizer::Make(spec);
  std::vector<float> p = {2.0f}, pa = {0.0f};
  plain->Apply(p.data(), pa.data(), g, 1, 0, 1, 1, 1.0f);
  EXPECT_NEAR(p[0], 1.0f, 1e-6);
  EXPECT_NEAR(pa[0], 1.0f, 1e-6);
}

// The element-wise optimizers' loops are compiled for AVX2 and for baseline x86-64, the CPU's
// clone chosen at load (ps/vector_clones_internal.h). Whichever runs here must match the plain
// scalar update bit for bit: no fused multiply-add, no reordering, at every length and offset
// (the vector body, its remainder, and unaligned starts).
TEST(OptimizerTest, VectorLoopsMatchTheScalarUpdateBitForBit) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> val(-3.0f, 3.0f);
  for (OptimizerKind kind : {OptimizerKind::kSgd, OptimizerKind::kMomentum,
                             OptimizerKind::kAdagrad, OptimizerKind::kAdam}) {
    OptimizerSpec spec;
    spec.kind = kind;
    spec.learning_rate = 0.037f;
    spec.l2 = 0.013f;
    spec.momentum = 0.9f;
    spec.initial_accumulator = 0.1f;
    auto opt = Optimizer::Make(spec);
    for (uint32_t dim : {1u, 7u, 8u, 9u, 16u, 31u, 64u, 67u, 1000u}) {
      for (uint32_t begin : {0u, 1u, 3u}) {
        if (begin >= dim) continue;
        const uint32_t end = dim - (dim > 8 ? 2 : 0);
        const uint32_t sf = opt->StateFloats(dim);
        std::vector<float> w(dim), st(sf), g(end - begin);
        for (float& x : w) x = val(rng);
        for (float& x : g) x = val(rng);
        opt->InitState(st.data(), dim);
        for (float& x : st) x += std::fabs(val(rng));  // non-negative for Adagrad and Adam's v
        std::vector<float> w_ref = w, st_ref = st;
        const float lr_scale = 0.75f;
        const uint64_t step = 3;
        opt->Apply(w.data(), st.data(), g.data(), dim, begin, end, step, lr_scale);
        const float lr = spec.learning_rate * lr_scale, l2 = spec.l2;
        for (uint32_t j = begin; j < end; ++j) {
          const float gj0 = g[j - begin];
          switch (kind) {
            case OptimizerKind::kSgd:
              w_ref[j] -= lr * (gj0 + l2 * w_ref[j]);
              break;
            case OptimizerKind::kMomentum:
              st_ref[j] = spec.momentum * st_ref[j] + gj0 + l2 * w_ref[j];
              w_ref[j] -= lr * st_ref[j];
              break;
            case OptimizerKind::kAdagrad: {
              const float gj = gj0 + l2 * w_ref[j];
              st_ref[j] += gj * gj;
              w_ref[j] -= lr * gj / (std::sqrt(st_ref[j]) + spec.epsilon);
              break;
            }
            default: {  // Adam
              const float b1 = spec.beta1, b2 = spec.beta2;
              const double t = static_cast<double>(step);
              const float lr_t = static_cast<float>(double{spec.learning_rate} * lr_scale *
                                                    std::sqrt(1.0 - std::pow(double{b2}, t)) /
                                                    (1.0 - std::pow(double{b1}, t)));
              float& m = st_ref[j];
              float& v = st_ref[dim + j];
              const float gj = gj0 + l2 * w_ref[j];
              m = b1 * m + (1 - b1) * gj;
              v = b2 * v + (1 - b2) * gj * gj;
              w_ref[j] -= lr_t * m / (std::sqrt(v) + spec.epsilon);
            }
          }
        }
        const std::string where = std::string(OptimizerKindName(kind)) + " dim " +
                                  std::to_string(dim) + " begin " + std::to_string(begin);
        EXPECT_EQ(std::memcmp(w.data(), w_ref.data(), dim * sizeof(float)), 0) << where;
        EXPECT_EQ(std::memcmp(st.data(), st_ref.data(), sf * sizeof(float)), 0) << where;
      }
    }
  }
}

// Every spec ValidateTableSpec accepts keeps a row finite through pushes with zero and
// non-zero gradient elements and a zero learning-rate scale (with epsilon 0 and no initial
// accumulator, Adagrad and Adam divided 0 by 0; FTRL divided by a zero learning rate).
TEST(OptimizerTest, EverySpecThatValidatesKeepsRowsFinite) {
  int accepted = 0, refused = 0;
  for (OptimizerKind kind :
       {OptimizerKind::kSgd, OptimizerKind::kMomentum, OptimizerKind::kAdagrad,
        OptimizerKind::kRowwiseAdagrad, OptimizerKind::kAdam, OptimizerKind::kFtrl}) {
    for (float lr : {0.0f, 0.01f}) {
      for (float eps : {0.0f, 1e-8f}) {
        for (float acc : {0.0f, 0.1f}) {
          for (float beta : {-1.0f, 0.0f, 1.0f}) {
            TableSpec t = TableSpec::Sparse("t", 4);
            t.optimizer.kind = kind;
            t.optimizer.learning_rate = lr;
            t.optimizer.epsilon = eps;
            t.optimizer.initial_accumulator = acc;
            t.optimizer.ftrl_beta = beta;
            if (!ValidateTableSpec(t).ok()) {
              ++refused;
              continue;
            }
            ++accepted;
            auto opt = Optimizer::Make(t.optimizer);
            std::vector<float> w(4, 0.5f), st(opt->StateFloats(4));
            opt->InitState(st.data(), 4);
            const std::vector<float> grads[] = {{0, 1, 0, -1}, {0, 0, 0, 0}, {2, 0, -2, 0}};
            uint64_t step = 0;
            for (const auto& g : grads) {
              for (float scale : {1.0f, 0.0f}) {
                opt->Apply(w.data(), st.data(), g.data(), 4, 0, 4, ++step, scale);
              }
            }
            for (float x : w) {
              ASSERT_TRUE(std::isfinite(x)) << "optimizer " << static_cast<int>(kind) << " lr "
                                            << lr << " eps " << eps << " acc " << acc
                                            << " beta " << beta;
            }
          }
        }
      }
    }
  }
  EXPECT_GT(accepted, 0);
  EXPECT_GT(refused, 0);
}

}  // namespace
}  // namespace tessera
