#include "worker/report.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string_view>

#include "worker/line_reader_internal.h"

namespace tessera::worker {
namespace {

using internal::ParseNumber;
using internal::Split;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

std::string Escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string Printf(const char* fmt, double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), fmt, v);
  return buf;
}

// A figure for people: 4 decimals below 10, then fewer, thousands as k and M.
std::string Figure(double v) {
  const double a = std::fabs(v);
  if (a >= 1e6) return Printf("%.2fM", v / 1e6);
  if (a >= 1e4) return Printf("%.1fk", v / 1e3);
  if (a >= 100) return Printf("%.0f", v);
  if (a >= 10) return Printf("%.2f", v);
  return Printf("%.4f", v);
}

// A tick label: as many decimals as the tick spacing needs; k and M for large values.
std::string TickLabel(double v, double step) {
  if (std::fabs(v) < step * 1e-9) return "0";
  const double a = std::max(std::fabs(v), step);
  if (a >= 1e6) {
    const int d = std::max(0, -static_cast<int>(std::floor(std::log10(step / 1e6) + 1e-9)));
    return Printf(("%." + std::to_string(d) + "fM").c_str(), v / 1e6);
  }
  if (a >= 1e4) {
    const int d = std::max(0, -static_cast<int>(std::floor(std::log10(step / 1e3) + 1e-9)));
    return Printf(("%." + std::to_string(d) + "fk").c_str(), v / 1e3);
  }
  const int d = std::max(0, -static_cast<int>(std::floor(std::log10(step) + 1e-9)));
  return Printf(("%." + std::to_string(d) + "f").c_str(), v);
}

// A spacing of about (hi - lo) / target: 1, 2 or 5 times a power of ten.
double NiceStep(double lo, double hi, int target) {
  const double raw = (hi - lo) / target;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double norm = raw / mag;
  return (norm < 1.5 ? 1 : norm < 3 ? 2 : norm < 7 ? 5 : 10) * mag;
}

// One axis: the value range, widened to whole ticks.
struct Axis {
  double lo = 0, hi = 1, step = 0.2;
};

// The y axis of `values` (not empty): their range with a margin, or around the one value;
// `from_zero` starts at 0 when all values are positive.
Axis ValueAxis(const std::vector<double>& values, bool from_zero) {
  double lo = *std::min_element(values.begin(), values.end());
  double hi = *std::max_element(values.begin(), values.end());
  if (hi - lo <= 1e-12 * std::max(1.0, std::fabs(hi))) {
    const double pad = std::max(std::fabs(hi) * 0.05, 1e-3);
    lo -= pad;
    hi += pad;
  } else {
    const double pad = (hi - lo) * 0.08;
    lo -= pad;
    hi += pad;
  }
  if (from_zero && *std::min_element(values.begin(), values.end()) >= 0) lo = 0;
  Axis a;
  a.step = NiceStep(lo, hi, 5);
  a.lo = std::floor(lo / a.step) * a.step;
  a.hi = std::ceil(hi / a.step) * a.step;
  return a;
}

// The step axis shared by every chart: 0 to the last step.
Axis StepAxis(double max_step) {
  Axis a;
  a.lo = 0;
  a.hi = std::max(max_step, 1.0);
  a.step = std::max(1.0, NiceStep(0, a.hi, 6));
  a.hi = std::ceil(a.hi / a.step) * a.step;
  return a;
}

struct Series {
  std::vector<double> step, value;
  std::vector<uint64_t> samples;
};

Series SeriesOf(std::span<const CurveRow> rows, double CurveRow::*column) {
  Series s;
  for (const CurveRow& r : rows) {
    const double v = r.*column;
    if (!std::isfinite(v)) continue;
    s.step.push_back(static_cast<double>(r.step));
    s.value.push_back(v);
    s.samples.push_back(r.samples);
  }
  return s;
}

// Geometry of one chart (pixels of its viewBox).
constexpr double kWidth = 560, kHeight = 290;
constexpr double kLeft = 64, kRight = 18, kTop = 14, kBottom = 44;
constexpr double kPlotW = kWidth - kLeft - kRight, kPlotH = kHeight - kTop - kBottom;

std::string Px(double v) { return Printf("%.1f", v); }

struct ChartSpec {
  const char* title = "";
  const char* column = "";  // metrics.csv column
  const char* color = "";
  bool from_zero = false;
  std::optional<uint64_t> marker = std::nullopt;  // a step to mark ("best")
};

std::string Chart(const ChartSpec& spec, const Series& s, const Axis& x) {
  std::ostringstream o;
  o << "<figure class=\"chart\"><figcaption><span class=\"name\">" << spec.title << "</span>";
  if (!s.value.empty()) {
    o << "<span class=\"last\">last " << Figure(s.value.back()) << " at step "
      << static_cast<uint64_t>(s.step.back()) << "</span>";
  }
  o << "</figcaption>\n<svg viewBox=\"0 0 " << kWidth << " " << kHeight
    << "\" role=\"img\" aria-label=\"" << spec.title << " against step\" data-column=\""
    << spec.column << "\">\n";
  o << "<rect class=\"plot\" x=\"" << kLeft << "\" y=\"" << kTop << "\" width=\"" << kPlotW
    << "\" height=\"" << kPlotH << "\"/>\n";
  auto px = [&](double step) { return kLeft + (step - x.lo) / (x.hi - x.lo) * kPlotW; };
  // Step ticks.
  for (double t = x.lo; t <= x.hi + x.step * 1e-6; t += x.step) {
    const double p = px(t);
    o << "<line class=\"grid\" x1=\"" << Px(p) << "\" y1=\"" << kTop << "\" x2=\"" << Px(p)
      << "\" y2=\"" << kTop + kPlotH << "\"/>"
      << "<text class=\"tick\" x=\"" << Px(p) << "\" y=\"" << kTop + kPlotH + 16
      << "\" text-anchor=\"middle\">" << TickLabel(t, x.step) << "</text>\n";
  }
  o << "<text class=\"axis\" x=\"" << kLeft + kPlotW / 2 << "\" y=\"" << kHeight - 6
    << "\" text-anchor=\"middle\">step</text>\n";
  if (s.value.empty()) {
    o << "<text class=\"empty\" x=\"" << kLeft + kPlotW / 2 << "\" y=\"" << kTop + kPlotH / 2
      << "\" text-anchor=\"middle\">no " << spec.column << " values in metrics.csv</text>\n"
      << "</svg></figure>\n";
    return o.str();
  }
  const Axis y = ValueAxis(s.value, spec.from_zero);
  auto py = [&](double v) { return kTop + (y.hi - v) / (y.hi - y.lo) * kPlotH; };
  for (double t = y.lo; t <= y.hi + y.step * 1e-6; t += y.step) {
    const double p = py(t);
    o << "<line class=\"grid\" x1=\"" << kLeft << "\" y1=\"" << Px(p) << "\" x2=\""
      << kLeft + kPlotW << "\" y2=\"" << Px(p) << "\"/>"
      << "<text class=\"tick\" x=\"" << kLeft - 6 << "\" y=\"" << Px(p + 4)
      << "\" text-anchor=\"end\">" << TickLabel(t, y.step) << "</text>\n";
  }
  if (spec.marker && static_cast<double>(*spec.marker) <= x.hi) {
    const double p = px(static_cast<double>(*spec.marker));
    // The label goes left of the line in the right half, so that it stays inside the plot.
    const bool left = p > kLeft + kPlotW / 2;
    o << "<line class=\"marker\" x1=\"" << Px(p) << "\" y1=\"" << kTop << "\" x2=\"" << Px(p)
      << "\" y2=\"" << kTop + kPlotH << "\"/>"
      << "<text class=\"marker-label\" x=\"" << Px(left ? p - 4 : p + 4) << "\" y=\"" << kTop + 12
      << "\" text-anchor=\"" << (left ? "end" : "start") << "\">best: step " << *spec.marker
      << "</text>\n";
  }
  o << "<polyline data-series=\"" << spec.column << "\" fill=\"none\" stroke=\"" << spec.color
    << "\" stroke-width=\"2\" stroke-linejoin=\"round\" points=\"";
  for (size_t i = 0; i < s.value.size(); ++i) {
    o << (i ? " " : "") << Px(px(s.step[i])) << "," << Px(py(s.value[i]));
  }
  o << "\"/>\n";
  // Points with their figures as tooltips, while they are few enough to tell apart.
  const bool dots = s.value.size() <= 120;
  for (size_t i = 0; i < s.value.size(); ++i) {
    const bool last = i + 1 == s.value.size();
    if (!dots && !last) continue;
    o << "<circle cx=\"" << Px(px(s.step[i])) << "\" cy=\"" << Px(py(s.value[i])) << "\" r=\""
      << (last || s.value.size() == 1 ? 4 : 2.5) << "\" fill=\"" << spec.color << "\"><title>step "
      << static_cast<uint64_t>(s.step[i]) << ", " << s.samples[i] << " samples: " << spec.column
      << " " << Printf("%.6g", s.value[i]) << "</title></circle>\n";
  }
  o << "</svg></figure>\n";
  return o.str();
}

// One figure of the header; nothing when `value` is empty.
void Card(std::ostringstream& o, const char* label, const std::string& value,
          const std::string& note = "") {
  if (value.empty()) return;
  o << "<div class=\"card\"><div class=\"label\">" << label << "</div><div class=\"value\">"
    << value << "</div>";
  if (!note.empty()) o << "<div class=\"note\">" << note << "</div>";
  o << "</div>\n";
}

std::string Known(double v, const char* fmt = "%.4f") {
  return std::isfinite(v) ? Printf(fmt, v) : std::string();
}

constexpr const char* kStyle = R"css(
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif;
       margin: 24px 32px; color: #1d2733; background: #f6f7f9; }
h1 { font-size: 22px; margin: 0 0 4px; }
h2 { font-size: 17px; margin: 18px 0 6px; }
table.trials { border-collapse: collapse; background: #fff; font-size: 13px; }
table.trials td, table.trials th { border: 1px solid #dde1e6; padding: 3px 8px; text-align: left; }
table.trials tr.winner { background: #e8f5e9; font-weight: 600; }
.sub { color: #5a6675; font-size: 13px; margin-bottom: 16px; word-break: break-all; }
.cards { display: flex; flex-wrap: wrap; gap: 10px; margin-bottom: 18px; }
.card { background: #fff; border: 1px solid #dde1e6; border-radius: 6px; padding: 8px 14px;
        min-width: 120px; }
.card .label { font-size: 11px; text-transform: uppercase; letter-spacing: .04em; color: #5a6675; }
.card .value { font-size: 21px; font-weight: 600; font-variant-numeric: tabular-nums; }
.card .note { font-size: 12px; color: #5a6675; }
.badge { display: inline-block; background: #fff4d6; border: 1px solid #e8c25a; color: #6b4e00;
         border-radius: 4px; padding: 1px 6px; font-size: 12px; margin-left: 8px;
         vertical-align: middle; }
.charts { display: grid; grid-template-columns: repeat(auto-fit, minmax(480px, 1fr)); gap: 14px; }
.chart { background: #fff; border: 1px solid #dde1e6; border-radius: 6px; margin: 0;
         padding: 10px 12px 4px; }
.chart figcaption { display: flex; justify-content: space-between; font-size: 14px;
                    margin-bottom: 4px; }
.chart .name { font-weight: 600; }
.chart .last { color: #5a6675; font-variant-numeric: tabular-nums; }
.chart svg { width: 100%; height: auto; display: block; }
.plot { fill: #fff; stroke: #c4cad1; }
.grid { stroke: #eceef1; }
.tick { font-size: 11px; fill: #5a6675; font-variant-numeric: tabular-nums; }
.axis { font-size: 12px; fill: #3b4654; }
.empty { font-size: 13px; fill: #8a94a0; }
.marker { stroke: #2e7d32; stroke-dasharray: 4 3; stroke-width: 1.5; }
.marker-label { font-size: 11px; fill: #2e7d32; }
footer { margin-top: 16px; font-size: 12px; color: #5a6675; }
)css";

}  // namespace

Result<std::vector<CurveRow>> ReadCurveCsv(const std::string& path) {
  std::ifstream in(path, std::ios::in | std::ios::binary);
  if (!in) return Status::NotFound("cannot open " + path);
  std::string line;
  uint64_t line_no = 1;
  if (!std::getline(in, line)) return Status::Corruption(path + ": no header line");
  if (!line.empty() && line.back() == '\r') line.pop_back();
  std::vector<std::string_view> names;
  Split(line, ',', &names);
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < names.size(); ++i) index.emplace(std::string(names[i]), i);
  if (!index.count("step")) return Status::Corruption(path + ":1: no step column");
  auto col = [&](const char* name) {
    auto it = index.find(name);
    return it == index.end() ? names.size() : it->second;  // names.size(): missing
  };
  const size_t step_col = col("step"), samples_col = col("samples");
  const std::pair<size_t, double CurveRow::*> values[] = {
      {col("train_loss"), &CurveRow::train_loss},
      {col("validation_auc"), &CurveRow::validation_auc},
      {col("validation_logloss"), &CurveRow::validation_logloss},
      {col("samples_per_s"), &CurveRow::samples_per_s}};
  std::vector<CurveRow> rows;
  std::vector<std::string_view> cols;
  while (std::getline(in, line)) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    Split(line, ',', &cols);
    auto bad = [&](const std::string& what) {
      return Status::Corruption(path + ":" + std::to_string(line_no) + ": " + what);
    };
    if (cols.size() > names.size()) return bad("more columns than the header");
    auto at = [&](size_t i) { return i < cols.size() ? cols[i] : std::string_view(); };
    CurveRow r;
    if (!ParseNumber(at(step_col), &r.step)) return bad("step is not a number");
    if (!at(samples_col).empty() && !ParseNumber(at(samples_col), &r.samples)) {
      return bad("samples is not a number");
    }
    for (const auto& [i, member] : values) {
      const std::string_view v = at(i);
      double x = kNaN;
      if (!v.empty() && !ParseNumber(v, &x)) {
        return bad("'" + std::string(names[i]) + "' value '" + std::string(v) +
                   "' is not a number");
      }
      r.*member = x;
    }
    rows.push_back(r);
  }
  return rows;
}

std::string RenderReport(std::span<const CurveRow> rows, const ReportSummary& summary) {
  double max_step = 0;
  for (const CurveRow& r : rows) max_step = std::max(max_step, static_cast<double>(r.step));
  const Axis x = StepAxis(max_step);

  std::ostringstream o;
  o << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
    << "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
    << "<title>Tessera training report" << (summary.data.empty() ? "" : ": ")
    << Escape(summary.data) << "</title>\n<style>" << kStyle << "</style></head>\n<body>\n";
  o << "<h1>Tessera training report";
  if (summary.early_stopped) o << "<span class=\"badge\">early stop</span>";
  o << "</h1>\n<div class=\"sub\">data " << Escape(summary.data.empty() ? "?" : summary.data)
    << " &middot; " << rows.size() << " rows of metrics.csv</div>\n<div class=\"cards\">\n";
  Card(o, "test AUC", Known(summary.test_auc),
       summary.test_samples ? std::to_string(summary.test_samples) + " test samples" : "");
  Card(o, "test logloss", Known(summary.test_logloss));
  Card(o, "oracle AUC", Known(summary.oracle_auc),
       std::isfinite(summary.oracle_auc) && std::isfinite(summary.test_auc)
           ? "gap " + Printf("%.4f", summary.oracle_auc - summary.test_auc)
           : "");
  Card(o, "steps", std::to_string(summary.steps), summary.early_stopped ? "stopped early" : "");
  if (summary.best_validation_step) {
    std::string note;
    if (std::isfinite(summary.best_validation_auc)) {
      note += "AUC " + Printf("%.4f", summary.best_validation_auc);
    }
    if (std::isfinite(summary.best_validation_logloss)) {
      note += (note.empty() ? "" : ", ") + std::string("logloss ") +
              Printf("%.4f", summary.best_validation_logloss);
    }
    if (summary.tested_step) {
      note += (note.empty() ? "" : "; ") + std::string("tested step ") +
              std::to_string(*summary.tested_step);
    }
    Card(o, "best validation step", std::to_string(*summary.best_validation_step), note);
  }
  Card(o, "train loss, worker 0", Known(summary.train_loss),
       std::isfinite(summary.train_seconds) ? Printf("%.1f s of training", summary.train_seconds)
                                            : "");
  o << "</div>\n<div class=\"charts\">\n";
  o << Chart({.title = "Training loss", .column = "train_loss", .color = "#1f6fd1"},
             SeriesOf(rows, &CurveRow::train_loss), x);
  o << Chart({.title = "Validation AUC",
              .column = "validation_auc",
              .color = "#2e7d32",
              .marker = summary.best_validation_step},
             SeriesOf(rows, &CurveRow::validation_auc), x);
  o << Chart({.title = "Validation logloss",
              .column = "validation_logloss",
              .color = "#c2571a",
              .marker = summary.best_validation_step},
             SeriesOf(rows, &CurveRow::validation_logloss), x);
  o << Chart({.title = "Throughput (samples/s, worker 0)",
              .column = "samples_per_s",
              .color = "#6a4bbd",
              .from_zero = true},
             SeriesOf(rows, &CurveRow::samples_per_s), x);
  o << "</div>\n";
  if (!summary.trials.empty()) {
    o << "<h2>Search trials</h2>\n<table class=\"trials\"><tr><th>trial</th><th>config</th>"
         "<th>steps</th><th>validation AUC</th><th>validation logloss</th><th>test AUC</th></tr>\n";
    for (const ReportTrial& t : summary.trials) {
      o << "<tr" << (t.winner ? " class=\"winner\"" : "") << "><td>" << Escape(t.name)
        << (t.winner ? " (winner)" : "") << "</td><td>" << Escape(t.config) << "</td><td>"
        << t.steps << "</td><td>" << Known(t.validation_auc) << "</td><td>"
        << Known(t.validation_logloss) << "</td><td>"
        << (std::isfinite(t.test_auc) ? Printf("%.4f", t.test_auc) : std::string("-"))
        << "</td></tr>\n";
    }
    o << "</table>\n<div class=\"sub\">Picked by validation AUC only; each rung keeps the best "
         "by it and only the winner is tested.</div>\n";
  }
  o << "<footer>Written by tessera-worker 0 from metrics.csv next to this file "
       "(columns step, samples, train_loss, validation_auc, validation_logloss, samples_per_s). "
       "Hover a point for its figures.</footer>\n</body></html>\n";
  return o.str();
}

Status WriteReport(const std::string& metrics_csv, const ReportSummary& summary,
                   const std::string& html_path) {
  TESSERA_ASSIGN_OR_RETURN(std::vector<CurveRow> rows, ReadCurveCsv(metrics_csv));
  const std::string page = RenderReport(rows, summary);
  std::FILE* f = std::fopen(html_path.c_str(), "w");
  if (f == nullptr) {
    return Status::IOError("cannot create '" + html_path + "': " + std::strerror(errno));
  }
  const bool ok = std::fwrite(page.data(), 1, page.size(), f) == page.size();
  if (std::fclose(f) != 0 || !ok) return Status::IOError("cannot write '" + html_path + "'");
  return Status::OK();
}

}  // namespace tessera::worker
