// The run report: a self-contained report.html with the training curves of a metrics.csv
// (CurveFile) and the run's final figures.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "ps/status.h"
#include "worker/metrics.h"

namespace tessera::worker {

/// A trial of a search (worker/search.h), a row of the report's trials table.
struct ReportTrial {
  std::string name;    ///< e.g. "r0t3": rung 0, trial 3.
  std::string config;  ///< TrialConfig::Describe().
  uint64_t steps = 0;
  double validation_auc = std::numeric_limits<double>::quiet_NaN();
  double validation_logloss = std::numeric_limits<double>::quiet_NaN();
  double test_auc = std::numeric_limits<double>::quiet_NaN();  ///< NaN: not tested
  bool winner = false;
};

/// The final figures of a run, shown above the curves. NaN and nullopt are unknown (not
/// shown).
struct ReportSummary {
  /// The run's data spec (tessera-worker --data), shown under the title. Default: empty.
  std::string data;
  /// Steps trained. Default: 0.
  uint64_t steps = 0;
  /// Test samples scored and the test figures. Defaults: 0, NaN.
  uint64_t test_samples = 0;
  double test_auc = std::numeric_limits<double>::quiet_NaN();
  double test_logloss = std::numeric_limits<double>::quiet_NaN();
  /// The planted model's AUC and logloss on the test part (generated data only). Default: NaN.
  double oracle_auc = std::numeric_limits<double>::quiet_NaN();
  double oracle_logloss = std::numeric_limits<double>::quiet_NaN();
  /// Worker 0's training time in seconds and its mean training loss. Default: NaN.
  double train_seconds = std::numeric_limits<double>::quiet_NaN();
  double train_loss = std::numeric_limits<double>::quiet_NaN();
  /// Whether training stopped early on the validation AUC. Default: false.
  bool early_stopped = false;
  /// The step of the best validation round (by the job's early-stopping metric), and that
  /// round's AUC and logloss. Default: none.
  std::optional<uint64_t> best_validation_step;
  double best_validation_auc = std::numeric_limits<double>::quiet_NaN();
  double best_validation_logloss = std::numeric_limits<double>::quiet_NaN();
  /// The step whose state the test scored (the best one when it was restored). Default: none.
  std::optional<uint64_t> tested_step;
  /// The trials of the search this run won (none: no search), as a table below the charts.
  std::vector<ReportTrial> trials;
};

/// Reads a training curve as CurveFile writes it: a header line naming the columns (any order;
/// step is required, the others may be missing), then one row per line; an empty value is NaN.
/// Errors: NotFound, Corruption naming the file and line (a row whose step or a value is not a
/// number, or has more columns than the header).
Result<std::vector<CurveRow>> ReadCurveCsv(const std::string& path);

/// The report page: a header with `summary`'s figures, then four charts against the step, as
/// inline SVG (train loss, validation AUC with the best step marked, validation logloss,
/// samples/s). Each chart's line is `<polyline data-series="COLUMN" points="x,y ...">` through
/// the rows whose COLUMN is a number (NaN rows are left out); a chart without any says so.
/// Self-contained: no script, font, style sheet or image from elsewhere. Pure function.
std::string RenderReport(std::span<const CurveRow> rows, const ReportSummary& summary);

/// Reads `metrics_csv` (ReadCurveCsv) and writes RenderReport of it to `html_path`
/// (truncating). Errors: those of ReadCurveCsv; IOError when the page cannot be written.
Status WriteReport(const std::string& metrics_csv, const ReportSummary& summary,
                   const std::string& html_path);

}  // namespace tessera::worker
