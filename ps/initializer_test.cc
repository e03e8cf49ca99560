#include "ps/initializer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace tessera {
namespace {

TEST(InitializerTest, DeterministicByKeyAndSeed) {
  InitializerSpec s{InitializerKind::kUniform, -0.5f, 0.5f, 42};
  std::vector<float> a(16), b(16), c(16), d(16);
  InitializeValues(s, 7, 0, 16, a.data());
  InitializeValues(s, 7, 0, 16, b.data());
  InitializeValues(s, 8, 0, 16, c.data());
  s.seed = 43;
  InitializeValues(s, 7, 0, 16, d.data());
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  EXPECT_NE(a, d);
  // A sub-range equals the same elements of the full row (dense chunks rely on it).
  std::vector<float> part(4);
  s.seed = 42;
  InitializeValues(s, 7, 5, 4, part.data());
  for (int i = 0; i < 4; ++i) EXPECT_EQ(part[i], a[5 + i]);
}

TEST(InitializerTest, Distributions) {
  const int n = 200000;
  std::vector<float> v(n);
  InitializeValues({InitializerKind::kUniform, -1.0f, 3.0f, 1}, 99, 0, n, v.data());
  double sum = 0;
  for (float x : v) {
    ASSERT_GE(x, -1.0f);
    ASSERT_LE(x, 3.0f);
    sum += x;
  }
  EXPECT_NEAR(sum / n, 1.0, 0.02);
  InitializeValues({InitializerKind::kNormal, 0.5f, 2.0f, 1}, 99, 0, n, v.data());
  double m = 0, sq = 0;
  for (float x : v) m += x;
  m /= n;
  for (float x : v) sq += (x - m) * (x - m);
  EXPECT_NEAR(m, 0.5, 0.03);
  EXPECT_NEAR(std::sqrt(sq / n), 2.0, 0.03);
  InitializeValues({InitializerKind::kConstant, 0.25f, 0, 0}, 1, 0, 8, v.data());
  for (int i = 0; i < 8; ++i) EXPECT_EQ(v[i], 0.25f);
  InitializeValues({InitializerKind::kZeros, 0, 0, 0}, 1, 0, 8, v.data());
  for (int i = 0; i < 8; ++i) EXPECT_EQ(v[i], 0.0f);
}

}  // namespace
}  // namespace tessera
