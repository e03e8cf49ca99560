// The search's pure parts: the halving plan, the pick by validation only, the trial configs;
// and the early-stopping rule (EarlyStopper) the defaults use.
#include "worker/search.h"

#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "worker/validation.h"

namespace tessera::worker {
namespace {

TEST(Search, HalvingPlanKeepsATrialInEtaAndEndsAtTheFullBudget) {
  const std::vector<Rung> eight = HalvingPlan(8, 3);
  ASSERT_EQ(eight.size(), 3u);
  EXPECT_EQ(eight[0].trials, 8u);
  EXPECT_EQ(eight[1].trials, 3u);
  EXPECT_EQ(eight[2].trials, 1u);
  EXPECT_DOUBLE_EQ(eight[0].fraction, 1.0 / 9);
  EXPECT_DOUBLE_EQ(eight[1].fraction, 1.0 / 3);
  EXPECT_DOUBLE_EQ(eight[2].fraction, 1.0);
  double cost = 0;
  for (const Rung& r : eight) cost += r.trials * r.fraction;
  EXPECT_NEAR(cost, 2.89, 0.01);  // full runs

  const std::vector<Rung> two = HalvingPlan(2, 2);
  ASSERT_EQ(two.size(), 2u);
  EXPECT_EQ(two[0].trials, 2u);
  EXPECT_DOUBLE_EQ(two[0].fraction, 0.5);
  EXPECT_EQ(two[1].trials, 1u);
  EXPECT_DOUBLE_EQ(two[1].fraction, 1.0);

  const std::vector<Rung> one = HalvingPlan(1, 3);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_DOUBLE_EQ(one[0].fraction, 1.0);
  EXPECT_TRUE(HalvingPlan(0, 3).empty());
  // eta below 2 is taken as 2: the plan still ends.
  EXPECT_EQ(HalvingPlan(4, 1).back().trials, 1u);
}

// Trials whose test figures rank opposite to their validation figures: the pick follows
// validation, whatever the test says.
TEST(Search, BestByValidationReadsValidationOnly) {
  std::vector<TrialResult> r(4);
  const double val[] = {0.70, 0.74, NAN, 0.72};
  const double test[] = {0.80, 0.60, 0.90, 0.70};
  for (int i = 0; i < 4; ++i) {
    r[i].trial = i;
    r[i].validation_auc = val[i];
    r[i].test_auc = test[i];
  }
  EXPECT_EQ(BestByValidation(r, 1), std::vector<size_t>({1}));
  EXPECT_EQ(BestByValidation(r, 2), std::vector<size_t>({1, 3}));
  EXPECT_EQ(BestByValidation(r, 4), std::vector<size_t>({1, 3, 0, 2}));  // NaN last
  EXPECT_EQ(BestByValidation(r, 9).size(), 4u);
  r[3].validation_auc = 0.74;  // a tie: the earlier trial first
  EXPECT_EQ(BestByValidation(r, 2), std::vector<size_t>({1, 3}));
}

TEST(Search, TrialsStartWithTheJobsOwnConfigAndAreDistinct) {
  JobOptions base;
  const std::vector<TrialConfig> t = SearchTrials(base, 8, 8);
  ASSERT_EQ(t.size(), 8u);
  EXPECT_EQ(t[0].Describe(), TrialConfig::Of(base).Describe());
  EXPECT_EQ(t[0].embedding_dim, 0u);  // the default: from the data
  std::set<std::string> seen;
  for (const TrialConfig& c : t) {
    EXPECT_TRUE(seen.insert(c.Describe()).second) << c.Describe();
    if (&c == &t[0]) continue;
    EXPECT_TRUE(c.embedding_dim == 4 || c.embedding_dim == 8 || c.embedding_dim == 16)
        << c.Describe();
    // Not the default written out.
    EXPECT_FALSE(c.model == ModelKind::kDlrm && c.embedding_dim == 8 && c.top_mlp == "64" &&
                 c.emb_lr == base.emb_lr && c.emb_l2 == base.emb_l2)
        << c.Describe();
  }
  // The same seed draws the same trials; the grid bounds how many there are.
  const std::vector<TrialConfig> again = SearchTrials(base, 8, 8);
  for (size_t i = 0; i < t.size(); ++i) EXPECT_EQ(t[i].Describe(), again[i].Describe());
  EXPECT_LE(SearchTrials(base, 8, 1000).size(), 108u);
  EXPECT_TRUE(SearchTrials(base, 8, 0).empty());

  JobOptions o;
  t[3].ApplyTo(&o);
  EXPECT_EQ(TrialConfig::Of(o).Describe(), t[3].Describe());
}

ValidationPoint Round(uint64_t step, double auc, double logloss) {
  return ValidationPoint{step, 100, auc, logloss};
}

// The default early stopping (both): the AUC still rising while the logloss rises does not
// stop; the best round is the best AUC's.
TEST(EarlyStopper, BothStopsOnlyWhenNeitherFigureImproves) {
  EarlyStopper both(/*by_auc=*/true, /*patience_on_both=*/true, /*patience=*/2);
  EarlyStopper logloss(/*by_auc=*/false, /*patience_on_both=*/false, /*patience=*/2);
  const ValidationPoint rounds[] = {Round(1, 0.80, 0.40), Round(2, 0.81, 0.42),
                                    Round(3, 0.82, 0.45), Round(4, 0.815, 0.39),
                                    Round(5, 0.81, 0.41), Round(6, 0.80, 0.43)};
  std::vector<bool> both_stop, logloss_stop;
  for (const ValidationPoint& p : rounds) {
    both.Add(p);
    logloss.Add(p);
    both_stop.push_back(both.stop());
    logloss_stop.push_back(logloss.stop());
  }
  // logloss alone stops after round 3 (two rounds worse than round 1's 0.40).
  EXPECT_EQ(logloss_stop, std::vector<bool>({false, false, true, false, false, true}));
  // both: rounds 2, 3 improve the AUC, round 4 the logloss; rounds 5, 6 neither.
  EXPECT_EQ(both_stop, std::vector<bool>({false, false, false, false, false, true}));
  EXPECT_EQ(both.best()->step, 3u);  // by AUC
  EXPECT_EQ(logloss.best()->step, 4u);

  EarlyStopper auc_only(true, false, 2);
  for (const ValidationPoint& p : rounds) auc_only.Add(p);
  EXPECT_TRUE(auc_only.stop());
  EXPECT_EQ(auc_only.rounds_without_improvement(), 3u);
  EarlyStopper never(true, true, 0);
  for (const ValidationPoint& p : rounds) never.Add(p);
  EXPECT_FALSE(never.stop());
}

}  // namespace
}  // namespace tessera::worker
