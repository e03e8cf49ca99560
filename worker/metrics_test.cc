#include "worker/metrics.h"

#include <gtest/gtest.h>

#include <cmath>

namespace tessera::worker {
namespace {

TEST(Metrics, AucCountsPairsAndTies) {
  std::vector<float> y = {0, 0, 1, 1};
  EXPECT_DOUBLE_EQ(Auc(std::vector<float>{0.1f, 0.2f, 0.3f, 0.4f}, y), 1.0);
  EXPECT_DOUBLE_EQ(Auc(std::vector<float>{0.4f, 0.3f, 0.2f, 0.1f}, y), 0.0);
  EXPECT_DOUBLE_EQ(Auc(std::vector<float>{0.5f, 0.5f, 0.5f, 0.5f}, y), 0.5);
  // Pairs (neg, pos): (0.1,0.3) ok, (0.1,0.2) ok, (0.35,0.3) bad, (0.35,0.2) bad -> 0.5
  EXPECT_DOUBLE_EQ(Auc(std::vector<float>{0.1f, 0.35f, 0.3f, 0.2f}, y), 0.5);
  EXPECT_DOUBLE_EQ(Auc(std::vector<float>{0.1f, 0.9f}, std::vector<float>{1, 1}), 0.5);
}

TEST(Metrics, LogLossAndRunningWindow) {
  EXPECT_NEAR(LogLoss(std::vector<float>{0.5f, 0.5f}, std::vector<float>{0, 1}), std::log(2.0),
              1e-9);
  EXPECT_LT(LogLoss(std::vector<float>{1.0f}, std::vector<float>{1}), 1e-6);
  RunningMetrics m(4);
  m.Add(std::vector<float>{0.9f, 0.1f}, std::vector<float>{0, 1});  // wrong, then evicted
  m.Add(std::vector<float>{0.2f, 0.8f, 0.1f, 0.7f}, std::vector<float>{0, 1, 0, 1});
  EXPECT_EQ(m.count(), 4u);
  EXPECT_DOUBLE_EQ(m.Auc(), 1.0);
}

}  // namespace
}  // namespace tessera::worker
