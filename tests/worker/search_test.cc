// tessera-worker --search (worker/search.h) against real tessera-server processes: the pick
// reads the validation split only, and each trial trains on tables of its own.
#include "worker/search.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <future>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "ps/client/client.h"
#include "tests/cluster_fixture.h"

namespace tessera::worker {
namespace {

using tessera::testing::LocalCluster;

// A CSV of `lines` clicks whose label follows columns 1 and 2 (50 values each, a planted
// logit per value). Every 10th line (holdout_mod 10: the test part) has its label flipped
// when `flip_test`: a model that learns the data scores below 0.5 on the test, one that
// learns nothing about 0.5; the validation part (of the training part) is not flipped.
std::string WriteClicks(const std::string& dir, uint32_t lines, bool flip_test) {
  const std::string path = dir + "/clicks.csv";
  std::ofstream f(path);
  std::mt19937 rng(5);
  std::normal_distribution<double> n(0, 1.5);
  std::vector<double> wa(50), wb(50);
  for (double& w : wa) w = n(rng);
  for (double& w : wb) w = n(rng);
  std::uniform_real_distribution<double> u(0, 1);
  for (uint32_t i = 0; i < lines; ++i) {
    const uint32_t a = rng() % 50, b = rng() % 50, c = rng() % 20;
    const double p = 1 / (1 + std::exp(-(wa[a] + wb[b])));
    bool click = u(rng) < p;
    if (flip_test && i % 10 == 9) click = !click;
    f << (click ? 1 : 0) << ",a" << a << ",b" << b << ",c" << c << "\n";
  }
  return path;
}

JobOptions Base(const LocalCluster& cluster, const std::string& data, std::FILE* out) {
  JobOptions o;
  o.servers = cluster.endpoints();
  o.data = "csv:" + data;
  o.schema = "label=0;categorical=1,2,3;header=false";
  o.epochs = 2;
  o.wide = false;  // the deep part alone: its learning rates decide what it learns
  o.early_stopping_patience = 0;
  o.request_timeout_ms = 20000;
  o.retry_for_ms = 0;
  o.job = "srch";
  o.out_dir = cluster.dir() + "/out";
  o.out = out;
  return o;
}

// Trial 1 learns next to nothing (learning rates 1e-6): on the flipped test it scores about
// 0.5, above trial 0, which learns the clicks and so scores below 0.5 there. The search must
// still pick trial 0, the better on validation, and test only it.
TEST(SearchTest, PicksByValidationEvenWhereTheTestSaysOtherwise) {
  LocalCluster cluster(testing::Servers(2));
  ASSERT_TRUE(cluster.Start().ok());
  const std::string data = WriteClicks(cluster.dir(), 6000, /*flip_test=*/true);
  std::FILE* out = std::tmpfile();
  ASSERT_NE(out, nullptr);
  const JobOptions base = Base(cluster, data, out);
  SearchOptions so;
  so.eta = 2;
  so.id = "pick";
  so.audit_test = true;  // every trial tested, to show the plant works; never read by the pick
  TrialConfig learns = TrialConfig::Of(base);
  TrialConfig still = learns;
  still.emb_lr = 1e-6;
  still.dense_lr = 1e-6;
  so.configs = {learns, still};
  auto r = RunSearch(base, so);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->trials.size(), 3u);  // rung 0: both at half the budget; rung 1: the winner
  const TrialResult& t0 = r->trials[0];
  const TrialResult& t1 = r->trials[1];
  ASSERT_EQ(t0.trial, 0u);
  ASSERT_EQ(t1.trial, 1u);
  // The plant: trial 0 is better on validation and worse on the (flipped) test.
  EXPECT_GT(t0.validation_auc, t1.validation_auc + 0.05);
  EXPECT_LT(t0.test_auc, t1.test_auc - 0.05);
  EXPECT_LT(t0.test_auc, 0.5);
  // The pick: trial 0, trained at the full budget and tested.
  const TrialResult& w = r->trials[r->winner];
  EXPECT_EQ(w.trial, 0u);
  EXPECT_EQ(w.rung, 1u);
  EXPECT_GT(w.steps, t0.steps);
  EXPECT_TRUE(r->report.tested);
  EXPECT_LT(r->report.test.auc, 0.5);
  // The trials table: trials.csv and report.html beside metrics.csv.
  std::ifstream csv(r->trials_csv);
  ASSERT_TRUE(csv.good()) << r->trials_csv;
  std::string line;
  int rows = 0;
  for (std::getline(csv, line); std::getline(csv, line);) ++rows;
  EXPECT_EQ(rows, 3);
  std::ifstream html(r->report.report_html);
  std::string page((std::istreambuf_iterator<char>(html)), std::istreambuf_iterator<char>());
  EXPECT_NE(page.find("Search trials"), std::string::npos);
  EXPECT_NE(page.find("r1t0 (winner)"), std::string::npos);
  std::fclose(out);
}

// Two trials of the same config, one after the other: each starts on fresh tables under its
// own prefix (no resumed steps, its whole budget trained), and a later trial never changes an
// earlier one's tables (its global bias, read back after every trial, stays bit for bit).
// After the search the other trials' tables are dropped and the winner's kept.
TEST(SearchTest, TrialsTrainOnTablesOfTheirOwn) {
  LocalCluster cluster(testing::Servers(2));
  ASSERT_TRUE(cluster.Start().ok());
  const std::string data = WriteClicks(cluster.dir(), 4000, /*flip_test=*/false);
  std::FILE* out = std::tmpfile();
  ASSERT_NE(out, nullptr);
  const JobOptions base = Base(cluster, data, out);
  ClientOptions copt;
  copt.servers = cluster.endpoints();
  copt.worker_id = 7;
  auto client = Client::Create(copt);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  auto bias_of = [&](const std::string& job) -> double {
    auto t = (*client)->GetTable(job + "/bias", DeadlineAfterMs(10000));
    if (!t.ok()) {
      ADD_FAILURE() << job << ": " << t.status().ToString();
      return NAN;
    }
    float v = NAN;
    Status s = (*client)->Wait((*client)->DensePull(*t, 0, 1, &v), DeadlineAfterMs(10000));
    if (!s.ok()) ADD_FAILURE() << job << ": " << s.ToString();
    return v;
  };
  std::vector<TrialResult> done;
  std::map<std::string, double> first_bias;  // job -> its bias right after it trained
  SearchOptions so;
  so.eta = 2;
  so.id = "own";
  so.configs = {TrialConfig::Of(base), TrialConfig::Of(base)};
  so.on_trial = [&](const TrialResult& t) {
    for (const TrialResult& before : done) {
      EXPECT_EQ(bias_of(before.job), first_bias[before.job])
          << t.job << " changed " << before.job << "'s tables";
    }
    first_bias[t.job] = bias_of(t.job);
    done.push_back(t);
  };
  auto r = RunSearch(base, so);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(done.size(), 3u);
  EXPECT_NE(done[0].job, done[1].job);
  EXPECT_NE(done[1].job, done[2].job);
  EXPECT_NE(done[0].job, done[2].job);
  for (const TrialResult& t : done) {
    EXPECT_EQ(t.resumed_steps, 0u) << t.job;
    EXPECT_NE(first_bias[t.job], 0.0) << t.job << " trained nothing";
  }
  // Rung 0 trains half the full budget, rung 1 all of it.
  EXPECT_EQ(done[0].steps, done[1].steps);
  EXPECT_GE(done[2].steps, 2 * done[0].steps - 1);
  // Afterwards the other trials' tables are gone from the servers, the winner's are there.
  uint64_t others = 0;
  for (const TrialResult& t : done) {
    ASSERT_FALSE(t.tables.empty()) << t.job;
    const bool winner = &t == &done[2];
    for (const std::string& table : t.tables) {
      EXPECT_EQ(table.rfind(t.job + "/", 0), 0u) << table;
      auto got = (*client)->GetTable(table, DeadlineAfterMs(10000));
      if (winner) {
        EXPECT_TRUE(got.ok()) << table << ": " << got.status().ToString();
      } else {
        EXPECT_EQ(got.status().code(), StatusCode::kNotFound) << table;
        ++others;
      }
    }
  }
  EXPECT_EQ(r->dropped_tables, others);
  EXPECT_EQ(r->tables_not_dropped, 0u);
  std::fclose(out);
}

// The winner keeps its best validated state (--admin_root) after trials that ran more clocks
// than its first rounds: each trial goes on from the clocks before it, so its checkpoint cuts do
// not wait for a clock an earlier trial reached (servers give a cut up after 3 s here).
TEST(SearchTest, TheWinnerCheckpointsItsBestStateAfterEarlierTrials) {
  testing::LocalClusterOptions copt = testing::Servers(2);
  copt.extra_flags = {"--checkpoint_cut_timeout_s=3"};
  LocalCluster cluster(copt);
  ASSERT_TRUE(cluster.Start().ok());
  const std::string data = WriteClicks(cluster.dir(), 4000, /*flip_test=*/false);
  std::FILE* out = std::tmpfile();
  ASSERT_NE(out, nullptr);
  JobOptions base = Base(cluster, data, out);
  base.admin_root = cluster.admin_root();
  base.validate_every_steps = 5;
  SearchOptions so;
  so.eta = 2;
  so.id = "ckpt";
  so.configs = {TrialConfig::Of(base), TrialConfig::Of(base)};
  auto r = RunSearch(base, so);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const JobReport& w = r->report;
  ASSERT_TRUE(w.tested);
  ASSERT_TRUE(w.best_validation.has_value());
  EXPECT_EQ(w.tested_step, w.best_validation->step);
  if (w.best_validation->step < w.train.steps) {
    EXPECT_TRUE(w.restored);
    EXPECT_NEAR(w.restored_validation_auc, w.best_validation->auc, 1e-9);
  }
  std::fclose(out);
}

// A search of two workers: RunSearch on each (threads of this process, each with its own
// client), the same options but the worker id. Gives each worker's result; a search that has
// not ended after 180 s (workers that disagree on a trial wait for each other forever) fails
// the test, and the servers are killed so that the workers' requests fail and they return.
std::vector<Result<SearchReport>> SearchOnTwoWorkers(LocalCluster* cluster, const JobOptions& base,
                                                     const SearchOptions& so,
                                                     std::vector<std::FILE*> outs) {
  std::vector<std::future<Result<SearchReport>>> running;
  for (uint32_t w = 0; w < 2; ++w) {
    JobOptions o = base;
    o.num_workers = 2;
    o.worker_id = w;
    o.out = outs[w];
    running.push_back(std::async(std::launch::async, [o, so] { return RunSearch(o, so); }));
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(180);
  for (auto& r : running) {
    if (r.wait_until(deadline) != std::future_status::ready) {
      ADD_FAILURE() << "the 2-worker search has not ended after 180 s: the workers disagree?";
      cluster->Kill(0);
      cluster->Kill(1);
      break;
    }
  }
  std::vector<Result<SearchReport>> done;
  for (auto& r : running) done.push_back(r.get());
  return done;
}

// Two workers search together: trial 0 learns next to nothing (rates 1e-6), trial 1 learns the
// clicks, whose test labels are flipped (so trial 1 tests worse). Worker 0, the one that
// validates, picks trial 1 by validation, and worker 1 (which scores no validation and by
// itself would rank its trials as equals, the first first) trains the same winner. Every trial
// is trained by both workers (the same steps on each, the job's samples twice worker 0's), and
// afterwards the other trials' tables are gone and the winner's are there.
TEST(SearchTest, TwoWorkersTrainEachTrialTogetherAndAgreeOnTheWinner) {
  LocalCluster cluster(testing::Servers(2));
  ASSERT_TRUE(cluster.Start().ok());
  const std::string data = WriteClicks(cluster.dir(), 6000, /*flip_test=*/true);
  std::vector<std::FILE*> outs = {std::tmpfile(), std::tmpfile()};
  ASSERT_NE(outs[0], nullptr);
  ASSERT_NE(outs[1], nullptr);
  const JobOptions base = Base(cluster, data, outs[0]);
  SearchOptions so;
  so.eta = 2;
  so.id = "two";
  TrialConfig learns = TrialConfig::Of(base);
  TrialConfig still = learns;
  still.emb_lr = 1e-6;
  still.dense_lr = 1e-6;
  so.configs = {still, learns};
  auto done = SearchOnTwoWorkers(&cluster, base, so, outs);
  ASSERT_TRUE(done[0].ok()) << done[0].status().ToString();
  ASSERT_TRUE(done[1].ok()) << done[1].status().ToString();
  const SearchReport& r0 = *done[0];
  const SearchReport& r1 = *done[1];
  ASSERT_EQ(r0.trials.size(), 3u);  // rung 0: both at half the budget; rung 1: the winner
  ASSERT_EQ(r1.trials.size(), 3u);
  // The pick, by worker 0's validation rounds: trial 1, better there, worse on the test.
  EXPECT_GT(r0.trials[1].validation_auc, r0.trials[0].validation_auc + 0.05);
  const TrialResult& w0 = r0.trials[r0.winner];
  const TrialResult& w1 = r1.trials[r1.winner];
  EXPECT_EQ(w0.trial, 1u);
  EXPECT_EQ(w0.rung, 1u);
  EXPECT_TRUE(r0.report.tested);
  EXPECT_LT(r0.report.test.auc, 0.5);
  EXPECT_FALSE(r1.report.tested);
  // Both workers trained the same trials, each to the same step, and agree on the winner.
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(r0.trials[i].trial, r1.trials[i].trial) << i;
    EXPECT_EQ(r0.trials[i].job, r1.trials[i].job) << i;
    EXPECT_EQ(r0.trials[i].steps, r1.trials[i].steps) << i;
    EXPECT_GT(r0.trials[i].steps, 0u) << i;
  }
  EXPECT_EQ(w1.trial, w0.trial);
  EXPECT_EQ(w1.config.Describe(), w0.config.Describe());
  // The winner's run is a job of both workers: its samples are both workers' (each its half).
  EXPECT_EQ(r0.report.job_samples, 2 * r0.report.train.samples);
  // Worker 0 dropped the other trials' tables; the winner's stay. Worker 1 dropped none.
  ClientOptions copt;
  copt.servers = cluster.endpoints();
  copt.worker_id = 7;
  auto client = Client::Create(copt);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  uint64_t others = 0;
  for (size_t i = 0; i < 3; ++i) {
    const TrialResult& t = r0.trials[i];
    ASSERT_FALSE(t.tables.empty()) << t.job;
    for (const std::string& table : t.tables) {
      auto got = (*client)->GetTable(table, DeadlineAfterMs(10000));
      if (i == r0.winner) {
        EXPECT_TRUE(got.ok()) << table << ": " << got.status().ToString();
      } else {
        EXPECT_EQ(got.status().code(), StatusCode::kNotFound) << table;
        ++others;
      }
    }
  }
  EXPECT_GT(others, 0u);
  EXPECT_EQ(r0.dropped_tables, others);
  EXPECT_EQ(r0.tables_not_dropped, 0u);
  EXPECT_EQ(r1.dropped_tables, 0u);
  std::fclose(outs[0]);
  std::fclose(outs[1]);
}

TEST(SearchTest, RefusesSeveralWorkersWithoutAnIdABadIdAndNoValidation) {
  JobOptions o;
  o.servers = {"tcp://127.0.0.1:9"};
  o.num_workers = 2;
  bool options_error = false;
  EXPECT_EQ(RunSearch(o, {}, &options_error).status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(options_error);
  SearchOptions bad_id;
  bad_id.id = "a/b";
  options_error = false;
  auto r = RunSearch(o, bad_id, &options_error);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("'a/b'"), std::string::npos) << r.status().ToString();
  EXPECT_TRUE(options_error);
  o.num_workers = 1;
  o.validate = false;
  options_error = false;
  EXPECT_EQ(RunSearch(o, {}, &options_error).status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(options_error);
}

}  // namespace
}  // namespace tessera::worker
