#include "worker/search.h"

#include <algorithm>
#include <charconv>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <numeric>
#include <optional>
#include <random>
#include <set>
#include <thread>
#include <tuple>

#include "worker/data_source.h"
#include "worker/validation.h"

namespace tessera::worker {
namespace {

// How long a worker other than 0 waits for worker 0's pick of a rung: worker 0 picks right
// after the rung's last validation round, which every worker takes part in.
constexpr std::chrono::seconds kPickWait{1800};

std::string Num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", v);
  return buf;
}

// The width of a config: its own, or the job's from the data.
uint32_t WidthOf(const TrialConfig& c, uint32_t default_width) {
  return c.embedding_dim != 0 ? c.embedding_dim : default_width;
}

// The planned steps of the full budget: what Job::SetUpValidation plans (worker 0's node).
Result<uint64_t> FullBudgetSteps(const JobOptions& base) {
  TESSERA_ASSIGN_OR_RETURN(const uint64_t shard, SmallestTrainShard(DataOptionsOf(base)));
  const uint32_t batch = base.batch_size != 0 ? base.batch_size : DefaultBatchSize(shard);
  uint64_t steps = PlannedSteps(shard, base.epochs, batch);
  if (base.max_steps != 0 && (steps == 0 || base.max_steps < steps)) steps = base.max_steps;
  if (steps == 0) return Status::InvalidArgument("--search: no planned last step (no data?)");
  return steps;
}

// The width the job would take from the data (its own where set).
Result<uint32_t> DefaultWidth(const JobOptions& base) {
  if (base.embedding_dim != 0) return base.embedding_dim;
  DataSourceOptions first = DataOptionsOf(base);
  first.rank = 0;
  first.epochs = 1;
  first.shuffle_buffer = 0;
  TESSERA_ASSIGN_OR_RETURN(auto reader, OpenTrainData(first));
  TESSERA_ASSIGN_OR_RETURN(DataProfile profile, ProfileData(reader.get()));
  return DefaultEmbeddingDim(profile);
}

// What a worker other than 0 puts before its search lines ("worker 1 search ..."): worker 0's
// lines are the search's, the others' say which worker follows.
std::string LinePrefix(const JobOptions& base) {
  return base.worker_id == 0 ? std::string() : "worker " + std::to_string(base.worker_id) + " ";
}

// A search id becomes part of table names: letters, digits, '-' and '_', at most 32.
bool ValidSearchId(const std::string& id) {
  if (id.empty() || id.size() > 32) return false;
  for (char c : id) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_') return false;
  }
  return true;
}

std::string SearchId() {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                      std::chrono::system_clock::now().time_since_epoch())
                      .count();
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%llx", static_cast<unsigned long long>(ms));
  return buf;
}

Status WriteTrialsCsv(const std::string& path, const std::vector<TrialResult>& trials,
                      size_t winner) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) return Status::IOError("cannot create '" + path + "'");
  std::fprintf(f, "rung,trial,job,config,steps,seconds,validation_auc,validation_logloss,"
                  "test_auc,test_logloss,winner\n");
  for (size_t i = 0; i < trials.size(); ++i) {
    const TrialResult& t = trials[i];
    auto num = [](double v) { return std::isfinite(v) ? Num(v) : std::string(); };
    std::fprintf(f, "%u,%u,%s,\"%s\",%llu,%.1f,%s,%s,%s,%s,%d\n", t.rung, t.trial, t.job.c_str(),
                 t.config.Describe().c_str(), static_cast<unsigned long long>(t.steps),
                 t.seconds, num(t.validation_auc).c_str(), num(t.validation_logloss).c_str(),
                 num(t.test_auc).c_str(), num(t.test_logloss).c_str(), i == winner ? 1 : 0);
  }
  const bool ok = std::ferror(f) == 0;
  if (std::fclose(f) != 0 || !ok) return Status::IOError("cannot write '" + path + "'");
  return Status::OK();
}

// One trial of one rung, as RunSearch runs it.
struct TrialRun {
  const JobOptions& base;
  const TrialConfig& config;
  const std::string& id;
  uint32_t rung, trial;
  uint64_t steps;      // its budget (max_steps)
  bool last;           // of the last rung: the winner, tested
  bool audit_test;     // SearchOptions::audit_test
  int64_t start_clock;  // the steps of every trial before it
};

// Runs the trial as a job of its own prefix; *job gets its report.
Result<TrialResult> RunTrial(const TrialRun& run, JobReport* job, bool* options_error) {
  JobOptions o = run.base;
  run.config.ApplyTo(&o);
  o.job = run.base.job + "-" + run.id + "-r" + std::to_string(run.rung) + "t" +
          std::to_string(run.trial);
  o.max_steps = run.steps;
  o.evaluate = run.last || run.audit_test;
  o.resume = false;
  o.observer = run.last ? run.base.observer : nullptr;
  // The servers hold worker 0's clock from trial to trial: each trial goes on from the clocks
  // of those before it, or the winner's best-state checkpoints would wait for a clock an
  // earlier trial reached.
  o.start_clock = run.start_clock;
  if (!run.last) {
    // A trial keeps no best state (no checkpoints) and writes its curve apart.
    o.admin_root.clear();
    o.out_dir = (std::filesystem::path(run.base.out_dir) / "trials" / o.job).string();
  }
  bool job_options_error = false;
  auto done = RunJob(o, &job_options_error);
  if (!done.ok()) {
    if (options_error) *options_error = job_options_error;
    return done.status().WithContext("search trial " + o.job);
  }
  TrialResult tr;
  tr.trial = run.trial;
  tr.rung = run.rung;
  tr.config = run.config;
  tr.config.embedding_dim = done->embedding_dim;
  tr.config.bottom_mlp = done->bottom_mlp;
  tr.config.top_mlp = done->top_mlp;
  tr.job = o.job;
  tr.steps = done->train.steps;
  tr.resumed_steps = done->train.resumed_steps;
  tr.seconds = done->train.seconds;
  if (done->best_validation) {
    tr.validation_auc = done->best_validation->auc;
    tr.validation_logloss = done->best_validation->logloss;
  }
  if (done->tested) {
    tr.test_auc = done->test.auc;
    tr.test_logloss = done->test.logloss;
  }
  if (run.base.worker_id == 0) {
    std::fprintf(run.base.out, "search rung %u trial %u: validation auc %.4f logloss %.4f\n",
                 run.rung, run.trial, tr.validation_auc, tr.validation_logloss);
  } else {
    std::fprintf(run.base.out, "%ssearch rung %u trial %u: trained %llu steps\n",
                 LinePrefix(run.base).c_str(), run.rung, run.trial,
                 static_cast<unsigned long long>(tr.steps));
  }
  std::fflush(run.base.out);
  tr.tables = done->tables;
  *job = std::move(*done);
  return tr;
}

// Drops every trial's tables but the winner's run's; a failure is printed and counted.
void DropTrialTables(const JobOptions& base, SearchReport* report) {
  auto client = ConnectClient(base);
  for (size_t i = 0; i < report->trials.size(); ++i) {
    if (i == report->winner) continue;
    for (const std::string& table : report->trials[i].tables) {
      Status s = client.ok() ? (*client)->DropTable(table) : client.status();
      if (s.ok()) {
        ++report->dropped_tables;
      } else {
        ++report->tables_not_dropped;
        std::fprintf(stderr, "tessera-worker 0: dropping %s: %s\n", table.c_str(),
                     s.ToString().c_str());
      }
    }
  }
  std::fprintf(base.out, "search dropped %llu tables of the other trials%s\n",
               static_cast<unsigned long long>(report->dropped_tables),
               report->tables_not_dropped > 0 ? " (some drops failed: see stderr)" : "");
  std::fflush(base.out);
}

// trials.csv beside the winner's metrics.csv, and the trials table in its report.html; a
// failure is printed and does not fail the search.
void WriteTrialsTable(SearchReport* report) {
  JobReport& jr = report->report;
  const std::filesystem::path dir = std::filesystem::path(jr.metrics_csv).parent_path();
  report->trials_csv = (dir / "trials.csv").string();
  Status csv = WriteTrialsCsv(report->trials_csv, report->trials, report->winner);
  if (!csv.ok()) {
    std::fprintf(stderr, "tessera-worker 0: trials.csv: %s\n", csv.ToString().c_str());
    report->trials_csv.clear();
  }
  if (jr.report_html.empty()) return;
  ReportSummary summary = jr.summary;
  for (size_t i = 0; i < report->trials.size(); ++i) {
    const TrialResult& t = report->trials[i];
    summary.trials.push_back({"r" + std::to_string(t.rung) + "t" + std::to_string(t.trial),
                              t.config.Describe(), t.steps, t.validation_auc,
                              t.validation_logloss, t.test_auc, i == report->winner});
  }
  Status html = WriteReport(jr.metrics_csv, summary, jr.report_html);
  if (!html.ok()) {
    std::fprintf(stderr, "tessera-worker 0: report.html: %s\n", html.ToString().c_str());
  }
}

// The trials of a rung that go on, the same on every worker: worker 0, the only one that scores
// the validation rounds, ranks them (BestByValidation) and puts the list under `key` on the
// servers ("3,0,5"); the others wait for it (polling, as a validation round does) and check it.
// One worker: the ranking alone.
Result<std::vector<uint32_t>> SharedPick(const JobOptions& base, const std::string& key,
                                         const std::vector<TrialResult>& rung, size_t keep,
                                         size_t num_configs) {
  std::vector<uint32_t> picked;
  if (base.worker_id == 0) {
    for (size_t i : BestByValidation(rung, keep)) picked.push_back(rung[i].trial);
    if (base.num_workers == 1) return picked;
  }
  TESSERA_ASSIGN_OR_RETURN(auto client, ConnectClient(base));
  if (base.worker_id == 0) {
    std::string value;
    for (uint32_t t : picked) value += (value.empty() ? "" : ",") + std::to_string(t);
    TESSERA_RETURN_IF_ERROR(client->PutMeta(key, value).WithContext("--search: the pick"));
    return picked;
  }
  const auto give_up = std::chrono::steady_clock::now() + kPickWait;
  auto wait = std::chrono::milliseconds(1);
  std::optional<std::string> value;
  while (true) {
    TESSERA_ASSIGN_OR_RETURN(value, client->GetMeta(key));
    if (value.has_value()) break;
    if (std::chrono::steady_clock::now() > give_up) {
      return Status::DeadlineExceeded("--search: no pick '" + key + "' from worker 0 after " +
                                      std::to_string(kPickWait.count()) + " s");
    }
    std::this_thread::sleep_for(wait);
    wait = std::min(wait * 2, std::chrono::milliseconds(50));
  }
  // Every index names a trial of this rung, once; as many as the rung keeps.
  std::set<uint32_t> in_rung;
  for (const TrialResult& t : rung) in_rung.insert(t.trial);
  std::set<uint32_t> seen;
  size_t start = 0;
  while (start <= value->size()) {
    const size_t comma = std::min(value->find(',', start), value->size());
    const std::string item = value->substr(start, comma - start);
    uint32_t t = 0;
    const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), t);
    if (item.empty() || ec != std::errc() || end != item.data() + item.size() || t >= num_configs ||
        in_rung.count(t) == 0 || !seen.insert(t).second) {
      return Status::Corruption("--search: the pick '" + key + "' is '" + *value +
                                "': not a list of this rung's trials");
    }
    picked.push_back(t);
    start = comma + 1;
  }
  if (picked.size() != std::min(keep, rung.size())) {
    return Status::Corruption("--search: the pick '" + key + "' is '" + *value + "': " +
                              std::to_string(picked.size()) + " trials, expected " +
                              std::to_string(std::min(keep, rung.size())));
  }
  return picked;
}

}  // namespace

TrialConfig TrialConfig::Of(const JobOptions& o) {
  TrialConfig c;
  c.model = o.model;
  c.embedding_dim = o.embedding_dim;
  c.bottom_mlp = o.bottom_mlp;
  c.top_mlp = o.top_mlp;
  c.emb_lr = o.emb_lr;
  c.dense_lr = o.dense_lr;
  c.emb_l2 = o.emb_l2;
  c.dense_l2 = o.dense_l2;
  return c;
}

void TrialConfig::ApplyTo(JobOptions* o) const {
  o->model = model;
  o->embedding_dim = embedding_dim;
  o->bottom_mlp = bottom_mlp;
  o->top_mlp = top_mlp;
  o->emb_lr = emb_lr;
  o->dense_lr = dense_lr;
  o->emb_l2 = emb_l2;
  o->dense_l2 = dense_l2;
}

std::string TrialConfig::Describe() const {
  return std::string(ModelKindName(model)) + " d=" +
         (embedding_dim == 0 ? std::string("auto") : std::to_string(embedding_dim)) +
         " mlp=" + bottom_mlp + "/" + top_mlp + " lr=" + Num(emb_lr) + "/" + Num(dense_lr) +
         " l2=" + Num(emb_l2) + "/" + Num(dense_l2);
}

std::vector<TrialConfig> SearchTrials(const JobOptions& base, uint32_t default_width, uint32_t n,
                                      uint64_t seed) {
  std::vector<TrialConfig> out;
  if (n == 0) return out;
  const TrialConfig first = TrialConfig::Of(base);
  out.push_back(first);
  const uint32_t w0 = WidthOf(first, default_width);
  const ModelKind kinds[] = {ModelKind::kDlrm, ModelKind::kDeepFm, ModelKind::kDcn};
  const uint32_t widths[] = {std::max<uint32_t>(w0 / 2, 4), w0, std::min<uint32_t>(2 * w0, 64)};
  const double lr_scales[] = {0.5, 1, 2};
  // Every grid point once, in an order drawn with `seed`; the job's own config is skipped.
  std::vector<std::tuple<int, int, int, int, int>> grid;
  for (int k = 0; k < 3; ++k)
    for (int w = 0; w < 3; ++w)
      for (int m = 0; m < 2; ++m)
        for (int l = 0; l < 3; ++l)
          for (int r = 0; r < 2; ++r) grid.emplace_back(k, w, m, l, r);
  std::mt19937_64 rng(seed);
  std::shuffle(grid.begin(), grid.end(), rng);
  std::set<std::string> seen{first.Describe()};
  for (const auto& [k, w, m, l, r] : grid) {
    if (out.size() >= n) break;
    TrialConfig c = first;
    c.model = kinds[k];
    c.embedding_dim = widths[w];
    c.bottom_mlp = c.top_mlp = m == 0 ? DefaultMlp(widths[w]) : "256,256";
    if (m == 1) c.bottom_mlp = DefaultMlp(widths[w]);
    c.emb_lr = first.emb_lr * lr_scales[l];
    c.dense_lr = first.dense_lr * lr_scales[l];
    c.emb_l2 = r == 0 ? first.emb_l2 : 1e-4;
    c.dense_l2 = r == 0 ? first.dense_l2 : 1e-5;
    // The job's own config with the width written out is the same trial.
    TrialConfig resolved = first;
    resolved.embedding_dim = w0;
    if (resolved.bottom_mlp == kAutoMlp) resolved.bottom_mlp = DefaultMlp(w0);
    if (resolved.top_mlp == kAutoMlp) resolved.top_mlp = DefaultMlp(w0);
    if (c.Describe() == resolved.Describe()) continue;
    if (!seen.insert(c.Describe()).second) continue;
    out.push_back(c);
  }
  return out;
}

std::vector<Rung> HalvingPlan(uint32_t n, uint32_t eta) {
  std::vector<Rung> rungs;
  if (n == 0) return rungs;
  eta = std::max<uint32_t>(eta, 2);
  for (uint32_t t = n;; t = (t + eta - 1) / eta) {
    rungs.push_back({t, 1});
    if (t == 1) break;
  }
  double f = 1;
  for (size_t r = rungs.size(); r-- > 0;) {
    rungs[r].fraction = f;
    f /= eta;
  }
  return rungs;
}

std::vector<size_t> BestByValidation(const std::vector<TrialResult>& results, size_t keep) {
  std::vector<size_t> order(results.size());
  std::iota(order.begin(), order.end(), 0);
  auto auc = [&](size_t i) {
    const double a = results[i].validation_auc;
    return std::isfinite(a) ? a : -1.0;
  };
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return auc(a) > auc(b); });
  order.resize(std::min(keep, order.size()));
  return order;
}

Result<SearchReport> RunSearch(const JobOptions& base, const SearchOptions& search,
                               bool* options_error) {
  if (options_error) *options_error = false;
  auto refuse = [&](const std::string& why) {
    if (options_error) *options_error = true;
    return Status::InvalidArgument("--search: " + why);
  };
  if (!search.id.empty() && !ValidSearchId(search.id)) {
    return refuse("the search id '" + search.id +
                  "' must be 1 to 32 letters, digits, '-' or '_' (it names tables)");
  }
  if (base.num_workers > 1 && search.id.empty()) {
    return refuse("with more than one worker, every worker needs the same search id "
                  "(--search_id): it names the trials' tables");
  }
  if (!base.validate) return refuse("picks on the validation split: --validate_every must not be 0");
  if (search.eta < 2) return refuse("the halving factor must be at least 2");
  std::vector<TrialConfig> configs = search.configs;
  if (configs.empty()) {
    if (search.trials == 0) return refuse("needs at least 1 trial");
    TESSERA_ASSIGN_OR_RETURN(const uint32_t width, DefaultWidth(base));
    configs = SearchTrials(base, width, search.trials);
  }
  TESSERA_ASSIGN_OR_RETURN(const uint64_t full, FullBudgetSteps(base));
  const std::vector<Rung> plan = HalvingPlan(static_cast<uint32_t>(configs.size()), search.eta);
  const std::string id = search.id.empty() ? SearchId() : search.id;

  SearchReport report;
  int64_t clock = 0;  // this worker's clock on the servers after the trials so far
  std::vector<uint32_t> alive(configs.size());
  std::iota(alive.begin(), alive.end(), 0);
  for (uint32_t r = 0; r < plan.size(); ++r) {
    const bool last = r + 1 == plan.size();
    const uint64_t steps =
        std::max<uint64_t>(1, static_cast<uint64_t>(std::ceil(plan[r].fraction * full)));
    std::vector<TrialResult> rung;
    for (uint32_t t : alive) {
      std::fprintf(base.out, "%ssearch rung %u (%zu trials, %llu steps each) trial %u: %s\n",
                   LinePrefix(base).c_str(), r, alive.size(),
                   static_cast<unsigned long long>(steps), t, configs[t].Describe().c_str());
      std::fflush(base.out);
      const TrialRun run{base, configs[t], id, r, t, steps, last, search.audit_test, clock};
      JobReport job;
      TESSERA_ASSIGN_OR_RETURN(TrialResult tr, RunTrial(run, &job, options_error));
      clock += static_cast<int64_t>(tr.steps);
      if (search.on_trial) search.on_trial(tr);
      rung.push_back(std::move(tr));
      if (last) report.report = std::move(job);
    }
    if (!last) {
      const std::string key = base.job + "-" + id + "/search/r" + std::to_string(r);
      TESSERA_ASSIGN_OR_RETURN(std::vector<uint32_t> next,
                               SharedPick(base, key, rung, plan[r + 1].trials, configs.size()));
      alive = std::move(next);
    }
    for (TrialResult& tr : rung) report.trials.push_back(std::move(tr));
  }
  report.winner = report.trials.size() - 1;
  const TrialResult& w = report.trials[report.winner];
  if (base.worker_id == 0) {
    std::fprintf(base.out, "search winner: trial %u (%s), validation auc %.4f, test auc %.4f\n",
                 w.trial, w.config.Describe().c_str(), w.validation_auc, w.test_auc);
  } else {
    std::fprintf(base.out, "%ssearch winner: trial %u (%s), worker 0's pick\n",
                 LinePrefix(base).c_str(), w.trial, w.config.Describe().c_str());
  }
  std::fflush(base.out);
  // Worker 0 alone: it holds the figures, and it tests the winner after every worker's last
  // step (the job's barrier), so no trial's tables are in use any more.
  if (base.worker_id != 0) return report;
  WriteTrialsTable(&report);
  DropTrialTables(base, &report);
  return report;
}

}  // namespace tessera::worker
