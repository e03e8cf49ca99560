// report.html: the curves drawn follow metrics.csv, and odd curves (empty columns, one point,
// no validation column) still make a page.
#include "worker/report.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

namespace tessera::worker {
namespace {

struct Point {
  double x, y;
};

// The points of the polyline drawn for `column`; empty when there is none.
std::vector<Point> Polyline(const std::string& html, const std::string& column) {
  std::smatch m;
  const std::regex re("<polyline data-series=\"" + column + "\"[^>]* points=\"([^\"]*)\"");
  if (!std::regex_search(html, m, re)) return {};
  std::vector<Point> points;
  std::istringstream in(m[1].str());
  for (std::string xy; in >> xy;) {
    const size_t comma = xy.find(',');
    points.push_back({std::stod(xy.substr(0, comma)), std::stod(xy.substr(comma + 1))});
  }
  return points;
}

// The points are an affine image of (steps, values): x grows with the step, y falls as the
// value grows (SVG's y points down), each within rounding (0.05 px) of the map that the first
// and last points define.
void ExpectFollows(const std::vector<Point>& points, const std::vector<double>& steps,
                   const std::vector<double>& values, const std::string& what) {
  ASSERT_EQ(points.size(), values.size()) << what;
  ASSERT_GE(points.size(), 2u) << what;
  const size_t n = points.size() - 1;
  const double sx = (points[n].x - points[0].x) / (steps[n] - steps[0]);
  const double sy = (points[n].y - points[0].y) / (values[n] - values[0]);
  EXPECT_GT(sx, 0) << what;
  EXPECT_LT(sy, 0) << what;
  for (size_t i = 0; i <= n; ++i) {
    EXPECT_NEAR(points[i].x, points[0].x + sx * (steps[i] - steps[0]), 0.1) << what << " " << i;
    EXPECT_NEAR(points[i].y, points[0].y + sy * (values[i] - values[0]), 0.1) << what << " " << i;
  }
}

// Whether a NaN or infinity was printed anywhere in the page.
bool HasNonFinite(const std::string& html) {
  return std::regex_search(html, std::regex(R"(\b(nan|inf|NaN|Inf)\b)"));
}

class TempDir {
 public:
  TempDir() {
    std::string t = (std::filesystem::temp_directory_path() / "worker_report_test_XXXXXX").string();
    path_ = mkdtemp(t.data());
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// A curve as tessera-worker writes it: progress rows (no validation) and validation rows.
TEST(Report, PolylinesFollowTheCsvValues) {
  TempDir dir;
  const std::string csv = dir.path() + "/metrics.csv";
  {
    auto curve = CurveFile::Create(csv);
    ASSERT_TRUE(curve.ok()) << curve.status().ToString();
    const double loss[] = {0.69, 0.52, 0.55, 0.47, 0.46, 0.451};
    for (int i = 0; i < 6; ++i) {
      CurveRow r;
      r.step = 10 * (i + 1);
      r.samples = r.step * 512;
      r.train_loss = loss[i];
      r.samples_per_s = 40000 + 1000 * i * (i % 2 ? -1 : 1);
      if (i % 2 == 1) {  // a validation round after every second row
        r.validation_auc = 0.6 + 0.03 * i - 0.004 * i * i;
        r.validation_logloss = 0.6 - 0.02 * i;
      }
      ASSERT_TRUE((*curve)->Append(r).ok());
    }
  }
  auto rows = ReadCurveCsv(csv);
  ASSERT_TRUE(rows.ok()) << rows.status().ToString();
  ASSERT_EQ(rows->size(), 6u);
  EXPECT_TRUE(std::isnan((*rows)[0].validation_auc));
  EXPECT_DOUBLE_EQ((*rows)[1].validation_logloss, 0.58);

  ReportSummary summary;
  summary.data = "csv:/data/<avazu>&.csv";
  summary.steps = 60;
  summary.test_auc = 0.7123;
  summary.test_logloss = 0.4321;
  summary.best_validation_step = 40;
  summary.best_validation_auc = 0.656;
  summary.best_validation_logloss = 0.5432;
  summary.tested_step = 40;
  const std::string html_path = dir.path() + "/report.html";
  ASSERT_TRUE(WriteReport(csv, summary, html_path).ok());
  const std::string html = Slurp(html_path);

  std::vector<double> steps, loss, rate, vsteps, auc, logloss;
  for (const CurveRow& r : *rows) {
    steps.push_back(static_cast<double>(r.step));
    loss.push_back(r.train_loss);
    rate.push_back(r.samples_per_s);
    if (!std::isnan(r.validation_auc)) {
      vsteps.push_back(static_cast<double>(r.step));
      auc.push_back(r.validation_auc);
      logloss.push_back(r.validation_logloss);
    }
  }
  ExpectFollows(Polyline(html, "train_loss"), steps, loss, "train_loss");
  ExpectFollows(Polyline(html, "samples_per_s"), steps, rate, "samples_per_s");
  ExpectFollows(Polyline(html, "validation_auc"), vsteps, auc, "validation_auc");
  ExpectFollows(Polyline(html, "validation_logloss"), vsteps, logloss, "validation_logloss");
  // Every chart shares the step axis: the same step is at the same x.
  EXPECT_DOUBLE_EQ(Polyline(html, "train_loss")[1].x, Polyline(html, "validation_auc")[0].x);

  // The header's figures, the best step marked, the data spec escaped, nothing fetched.
  EXPECT_NE(html.find("0.7123"), std::string::npos);
  EXPECT_NE(html.find("0.4321"), std::string::npos);
  EXPECT_NE(html.find("best: step 40"), std::string::npos);
  EXPECT_NE(html.find("AUC 0.6560, logloss 0.5432; tested step 40"), std::string::npos);
  EXPECT_NE(html.find("csv:/data/&lt;avazu&gt;&amp;.csv"), std::string::npos);
  EXPECT_EQ(html.find("oracle AUC"), std::string::npos);  // unknown: not shown
  for (const char* remote : {"<script", "http://", "https://", "@import", "<link", "url("}) {
    EXPECT_EQ(html.find(remote), std::string::npos) << remote;
  }
}

TEST(Report, EmptyColumnsOnePointAndNoValidationColumn) {
  // No validation rounds: the columns are there but empty, and there is one row.
  CurveRow one;
  one.step = 7;
  one.samples = 700;
  one.train_loss = 0.5;
  const std::vector<CurveRow> rows = {one};
  const std::string html = RenderReport(rows, ReportSummary{});
  const std::vector<Point> p = Polyline(html, "train_loss");
  ASSERT_EQ(p.size(), 1u);
  EXPECT_TRUE(std::isfinite(p[0].x) && std::isfinite(p[0].y));
  EXPECT_NE(html.find("<circle"), std::string::npos);  // a lone point is drawn as a dot
  EXPECT_TRUE(Polyline(html, "validation_auc").empty());
  EXPECT_NE(html.find("no validation_auc values in metrics.csv"), std::string::npos);
  EXPECT_NE(html.find("no samples_per_s values in metrics.csv"), std::string::npos);
  EXPECT_FALSE(HasNonFinite(html));

  // No rows at all.
  const std::string empty = RenderReport({}, ReportSummary{});
  EXPECT_NE(empty.find("no train_loss values in metrics.csv"), std::string::npos);
  EXPECT_FALSE(HasNonFinite(empty));

  // A file without validation columns at all, a constant loss, a flat line in the middle.
  TempDir dir;
  const std::string csv = dir.path() + "/old.csv";
  std::ofstream(csv) << "step,samples,train_loss\n1,10,0.3\n2,20,0.3\n3,30,\n";
  auto read = ReadCurveCsv(csv);
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  ASSERT_EQ(read->size(), 3u);
  EXPECT_TRUE(std::isnan((*read)[2].train_loss));
  EXPECT_TRUE(std::isnan((*read)[0].validation_auc));
  const std::vector<Point> flat = Polyline(RenderReport(*read, ReportSummary{}), "train_loss");
  ASSERT_EQ(flat.size(), 2u);
  EXPECT_EQ(flat[0].y, flat[1].y);
  EXPECT_LT(flat[0].x, flat[1].x);

  // A broken file names its line.
  std::ofstream(csv) << "step,samples,train_loss\n1,10,0.3\nx,20,0.3\n";
  auto bad = ReadCurveCsv(csv);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kCorruption);
  EXPECT_NE(bad.status().message().find(":3:"), std::string::npos) << bad.status().ToString();
  EXPECT_EQ(ReadCurveCsv(dir.path() + "/none.csv").status().code(), StatusCode::kNotFound);
}

// A search's trials: one table row each, in order, the winner marked, text escaped, an
// untested trial's test AUC shown as "-"; no table without trials.
TEST(Report, TrialsTableHasARowPerTrial) {
  ReportSummary summary;
  summary.trials = {
      {"r0t0", "dlrm d=8 <b>", 10, 0.71, 0.48, NAN, false},
      {"r0t1", "dcn d=4 & more", 10, 0.69, 0.49, NAN, false},
      {"r1t0", "dlrm d=8 <b>", 30, 0.72, 0.47, 0.705, true},
  };
  const std::string html = RenderReport({}, summary);
  const std::regex row("<tr( class=\"winner\")?><td>([^<]*)</td><td>([^<]*)</td><td>(\\d+)</td>"
                       "<td>([^<]*)</td><td>([^<]*)</td><td>([^<]*)</td></tr>");
  std::vector<std::smatch> rows;
  for (auto it = std::sregex_iterator(html.begin(), html.end(), row); it != std::sregex_iterator();
       ++it) {
    rows.push_back(*it);
  }
  ASSERT_EQ(rows.size(), 3u) << html;
  EXPECT_EQ(rows[0][2].str(), "r0t0");
  EXPECT_EQ(rows[0][3].str(), "dlrm d=8 &lt;b&gt;");
  EXPECT_EQ(rows[0][7].str(), "-");
  EXPECT_FALSE(rows[0][1].matched);
  EXPECT_EQ(rows[1][3].str(), "dcn d=4 &amp; more");
  EXPECT_EQ(rows[1][5].str(), "0.6900");
  EXPECT_EQ(rows[2][2].str(), "r1t0 (winner)");
  EXPECT_TRUE(rows[2][1].matched);
  EXPECT_EQ(rows[2][4].str(), "30");
  EXPECT_EQ(rows[2][7].str(), "0.7050");
  EXPECT_EQ(RenderReport({}, ReportSummary{}).find("Search trials"), std::string::npos);
}

}  // namespace
}  // namespace tessera::worker
