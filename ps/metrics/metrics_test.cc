#include "ps/metrics/metrics.h"

#include <gtest/gtest.h>

#include <string>

namespace tessera::metrics {
namespace {

TEST(MetricsRegistry, WritesCountersGaugesAndCumulativeHistograms) {
  Registry r;
  r.AddCounter("t_requests_total", "Requests.", {{"op", "push"}}).Inc(3);
  r.AddCounter("t_requests_total", "Requests.", {{"op", "pull"}}).Inc();
  // The same name and labels are the same series.
  r.AddCounter("t_requests_total", "Requests.", {{"op", "push"}}).Inc(2);
  r.AddGauge("t_ready", "Ready.").Set(1);
  Histogram& h = r.AddHistogram("t_seconds", "Latency.", {{"op", "push"}}, {0.001, 0.01, 0.1});
  h.Observe(0.0005);
  h.Observe(0.001);  // le is inclusive
  h.Observe(0.05);
  h.Observe(3);
  const std::string t = r.Text();
  EXPECT_NE(t.find("# HELP t_requests_total Requests.\n# TYPE t_requests_total counter\n"),
            std::string::npos) << t;
  EXPECT_NE(t.find("t_requests_total{op=\"push\"} 5\n"), std::string::npos) << t;
  EXPECT_NE(t.find("t_requests_total{op=\"pull\"} 1\n"), std::string::npos) << t;
  EXPECT_NE(t.find("# TYPE t_ready gauge\nt_ready 1\n"), std::string::npos) << t;
  EXPECT_NE(t.find("t_seconds_bucket{op=\"push\",le=\"0.001\"} 2\n"), std::string::npos) << t;
  EXPECT_NE(t.find("t_seconds_bucket{op=\"push\",le=\"0.01\"} 2\n"), std::string::npos) << t;
  EXPECT_NE(t.find("t_seconds_bucket{op=\"push\",le=\"0.1\"} 3\n"), std::string::npos) << t;
  EXPECT_NE(t.find("t_seconds_bucket{op=\"push\",le=\"+Inf\"} 4\n"), std::string::npos) << t;
  EXPECT_NE(t.find("t_seconds_count{op=\"push\"} 4\n"), std::string::npos) << t;
  EXPECT_NE(t.find("t_seconds_sum{op=\"push\"} 3.0515\n"), std::string::npos) << t;
  // One HELP line per family.
  EXPECT_EQ(t.find("# HELP t_requests_total", t.find("# HELP t_requests_total") + 1),
            std::string::npos);
}

TEST(MetricsRegistry, EscapesLabelValuesAndRunsCollectorsUntilRemoved) {
  Registry r;
  int owner = 0;
  r.AddCollector(&owner, "t_rows", "Rows.", Registry::Type::kGauge, [] {
    return std::vector<Registry::Sample>{{{{"table", "a\"b\\c\nd"}}, 42}};
  });
  EXPECT_NE(r.Text().find("t_rows{table=\"a\\\"b\\\\c\\nd\"} 42\n"), std::string::npos)
      << r.Text();
  r.RemoveCollectors(&owner);
  EXPECT_EQ(r.Text().find("t_rows"), std::string::npos);
}

TEST(MetricsRegistryDeathTest, RefusesInvalidNamesAndTypeChanges) {
  Registry r;
  r.AddCounter("t_x", "X.");
  EXPECT_DEATH(r.AddGauge("t_x", "X."), "two types");
  EXPECT_DEATH(r.AddCounter("1bad", "X."), "invalid metric name");
}

}  // namespace
}  // namespace tessera::metrics
