#include "ps/optimizer.h"

#include <gtest/gtest.h>

#include <cmath>
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
  for (int t = 1; t <= 10; ++t) opt->Apply(w.data(), nullptr, g, 3, 0, 3, t);
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
    opt->Apply(w.data(), a.data(), g, 2, 0, 2, t);
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
  opt->Apply(w.data(), s.data(), g, 4, 1, 3, 1);
  EXPECT_EQ(w[0], 1.0f);
  EXPECT_LT(w[1], 1.0f);
  EXPECT_LT(w[2], 1.0f);
  EXPECT_EQ(w[3], 1.0f);
  // Adam's first step moves by lr exactly (bias correction), whatever the gradient scale.
  EXPECT_NEAR(w[1], 1.0f - spec.learning_rate, 1e-6);
}

}  // namespace
}  // namespace tessera
