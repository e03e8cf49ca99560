// A search over a few model configs on the validation split (tessera-worker --search=N,
// examples/ctr/search.sh; docs/worker.md "Search"): successive halving of N trials against the
// same servers, each under its own table prefix, the best on validation tested alone.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "ps/status.h"
#include "worker/auto_config.h"
#include "worker/job.h"

namespace tessera::worker {

/// One config a search trains: the fields of JobOptions it sets. A value type.
struct TrialConfig {
  ModelKind model = ModelKind::kDlrm;
  /// 0 and "auto" as in JobOptions: from the data.
  uint32_t embedding_dim = 0;
  std::string bottom_mlp = kAutoMlp;
  std::string top_mlp = kAutoMlp;
  double emb_lr = JobOptions{}.emb_lr;
  double dense_lr = JobOptions{}.dense_lr;
  double emb_l2 = JobOptions{}.emb_l2;
  double dense_l2 = JobOptions{}.dense_l2;

  /// The job's own config (its model, widths, rates, L2).
  static TrialConfig Of(const JobOptions& options);
  /// Sets these fields of `options`.
  void ApplyTo(JobOptions* options) const;
  /// "dlrm d=8 mlp=64/64 lr=0.05/0.003 l2=0/0" ("auto" where left to the data).
  std::string Describe() const;
};

/// The configs of a search of `n`: the job's own first (its defaults), then n - 1 distinct
/// others drawn with `seed` from a grid around it (model dlrm | deepfm | dcn; width half,
/// same, double that of `default_width`, the job's width from the data; MLPs DefaultMlp of
/// the width or "256,256"; both learning rates x0.5, x1, x2; embedding L2 0 or 1e-4 and MLP L2
/// 0 or 1e-5). Fewer than n where the grid is smaller.
std::vector<TrialConfig> SearchTrials(const JobOptions& base, uint32_t default_width, uint32_t n,
                                      uint64_t seed = 1);

/// A rung of successive halving: `trials` trials each train `fraction` of the full budget.
struct Rung {
  uint32_t trials = 0;
  double fraction = 1;
};
/// Successive halving of n trials with factor eta (>= 2): rungs of n, ceil(n / eta),
/// ceil(n / eta^2) ... trials down to 1, the last one at the full budget and each before it at
/// 1 / eta of the next (n = 8, eta = 3: 8 at 1/9, 3 at 1/3, 1 at 1: 2.9 full runs).
std::vector<Rung> HalvingPlan(uint32_t n, uint32_t eta = 3);

/// What one trial of one rung did.
struct TrialResult {
  uint32_t trial = 0;  ///< Index into the search's configs.
  uint32_t rung = 0;
  TrialConfig config;  ///< With the widths the data gave, once trained.
  std::string job;     ///< Its job name: the prefix of its tables.
  uint64_t steps = 0;  ///< Steps trained.
  uint64_t resumed_steps = 0;
  double seconds = 0;
  /// Its best validation round's figures (NaN: none).
  double validation_auc = std::numeric_limits<double>::quiet_NaN();
  double validation_logloss = std::numeric_limits<double>::quiet_NaN();
  /// Test figures: the winner's; every trial's only with SearchOptions::audit_test (NaN: not
  /// tested).
  double test_auc = std::numeric_limits<double>::quiet_NaN();
  double test_logloss = std::numeric_limits<double>::quiet_NaN();
  /// Its tables on the servers (dropped after the search unless it is the winner's run).
  std::vector<std::string> tables;
};

/// Which trials of a rung go on: the `keep` best by validation AUC (the earlier trial of
/// equals first; NaN last). Never reads test figures. Returns indexes into `results`.
std::vector<size_t> BestByValidation(const std::vector<TrialResult>& results, size_t keep);

/// Options of RunSearch.
struct SearchOptions {
  /// Trials (N). Default: 8.
  uint32_t trials = 8;
  /// Halving factor (>= 2). Default: 3.
  uint32_t eta = 3;
  /// The configs; empty: SearchTrials(base, width from the data, trials). Default: empty.
  std::vector<TrialConfig> configs;
  /// Names the search's table prefixes "<job>-<id>-r<rung>t<trial>" (1 to 32 letters, digits,
  /// '-' or '_'); empty: from the clock (a later search never meets an earlier one's tables),
  /// which only one worker may do: with more than one, every worker must be given the same id.
  /// Default: empty.
  std::string id;
  /// Tests every trial after it trains (reported, never used to pick): for tests that check
  /// the pick. Default: false.
  bool audit_test = false;
  /// Called after each trial (rung by rung, in order), with its result. May be null.
  std::function<void(const TrialResult&)> on_trial;
};

/// What a search did.
struct SearchReport {
  /// Every trial of every rung, in the order they ran.
  std::vector<TrialResult> trials;
  /// The winner's index into `trials` (its run at the full budget).
  size_t winner = 0;
  /// The winner's job report (its test, metrics.csv, report.html with the trials section).
  JobReport report;
  /// Path of trials.csv (beside metrics.csv).
  std::string trials_csv;
  /// Tables of the other trials dropped after the search, and those a drop failed for (a line
  /// on stderr says why; they stay on the servers).
  uint64_t dropped_tables = 0;
  uint64_t tables_not_dropped = 0;
};

/// Runs the search with `base`'s cluster, data and schedule: each rung's trials in turn, each
/// a job (RunJob) under its own prefix with max_steps the rung's fraction of the planned steps,
/// validated on the validation split and not tested (audit_test aside); the best
/// ceil(n / eta) by validation AUC go on; the last rung's trial is tested (with
/// base.admin_root, its best validated state, restored) and its report gets
/// the trials table (report.html, trials.csv). Validation on (InvalidArgument otherwise, with
/// *options_error set). With base.num_workers > 1 every worker calls RunSearch with the same
/// options but its worker_id and the same search.id (refused without one): each trial is a job
/// of all the workers, as a normal run; worker 0, the one that scores validation, puts each
/// rung's pick on the servers ("<job>-<id>/search/r<rung>") and the others train what it names
/// (they wait up to 30 minutes for it; their TrialResults carry no validation figures). Once
/// the winner is tested, worker 0 drops every other trial's tables (Client::DropTable; the
/// servers must grant this client the admin right); the winner's stay. The trials table,
/// trials.csv and the drops are worker 0's; the others' reports list the same trials and
/// winner.
Result<SearchReport> RunSearch(const JobOptions& base, const SearchOptions& search,
                               bool* options_error = nullptr);

}  // namespace tessera::worker
