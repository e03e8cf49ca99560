#include "worker/param_store.h"

#include <gtest/gtest.h>

#include "ps/initializer.h"
#include "worker/trainer.h"
#include "worker/validation.h"

namespace tessera::worker {
namespace {

TEST(LocalStore, SparseAndDenseFollowTheOptimizerAndInitializer) {
  auto store = CreateLocalStore();
  OptimizerSpec sgd;
  sgd.learning_rate = 0.5f;
  InitializerSpec init;
  init.kind = InitializerKind::kUniform;
  init.a = -1;
  init.b = 1;
  init.seed = 3;
  auto t = store->AddTable(TableSpec::Sparse("emb", 2, sgd, init));
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(store->AddTable(TableSpec::Sparse("emb", 2, sgd, init)).value(), *t);
  EXPECT_EQ(store->AddTable(TableSpec::Sparse("emb", 3, sgd, init)).status().code(),
            StatusCode::kAlreadyExists);
  std::vector<uint64_t> keys = {9, 4};
  std::vector<float> out(4), want(2);
  ASSERT_TRUE(store->Pull(*t, keys, out.data()).Wait().ok());
  InitializeValues(init, 9, 0, 2, want.data());
  EXPECT_EQ(out[0], want[0]);
  EXPECT_EQ(out[1], want[1]);
  ASSERT_TRUE(store->Push(*t, keys, std::vector<float>{1, 2, 0, 0}).Wait().ok());
  std::vector<float> after(4);
  ASSERT_TRUE(store->Pull(*t, keys, after.data()).Wait().ok());
  EXPECT_FLOAT_EQ(after[0], out[0] - 0.5f);
  EXPECT_FLOAT_EQ(after[1], out[1] - 1.0f);
  EXPECT_FLOAT_EQ(after[2], out[2]);

  auto d = store->AddTable(TableSpec::Dense("w", 3, sgd));
  ASSERT_TRUE(d.ok());
  ASSERT_TRUE(store->DensePush(*d, 1, std::vector<float>{2, 4}).Wait().ok());
  std::vector<float> w(3);
  ASSERT_TRUE(store->DensePull(*d, 0, 3, w.data()).Wait().ok());
  EXPECT_EQ(w, (std::vector<float>{0, -1, -2}));
  EXPECT_FALSE(store->DensePull(*d, 2, 5, w.data()).Wait().ok());

  ASSERT_TRUE(store->PutMeta("k", "v").ok());
  EXPECT_EQ(store->GetMeta("k").value().value(), "v");
  EXPECT_FALSE(store->GetMeta("none").value().has_value());
  store->Clock().Wait().IgnoreError();
  EXPECT_EQ(store->clock(), 1);
}

// The in-process store applies the learning-rate scale as the servers do.
TEST(LocalStore, LearningRateScaleMultipliesTheStep) {
  auto store = CreateLocalStore();
  const OptimizerSpec sgd{.kind = OptimizerKind::kSgd, .learning_rate = 1.0f};
  auto d = store->AddTable(TableSpec::Dense("w", 2, sgd));
  ASSERT_TRUE(d.ok());
  ASSERT_TRUE(store->SetLearningRateScale(0.25f).ok());
  ASSERT_TRUE(store->DensePush(*d, 0, std::vector<float>{-4, -8}).Wait().ok());
  std::vector<float> w(2);
  ASSERT_TRUE(store->DensePull(*d, 0, 2, w.data()).Wait().ok());
  EXPECT_EQ(w, (std::vector<float>{1, 2}));
  EXPECT_FALSE(store->SetLearningRateScale(-0.5f).ok());
}

// Rounds after every N steps, or after the step in which each epoch ends, and after the last.
TEST(ValidationSchedule, RoundsByStepsEpochsAndTheEnd) {
  ValidationSchedule every;
  every.every_steps = 3;
  every.last_step = 10;
  std::vector<uint64_t> due;
  for (uint64_t s = 0; s <= 12; ++s) {
    if (every.Due(s)) due.push_back(s);
  }
  EXPECT_EQ(due, (std::vector<uint64_t>{3, 6, 9, 10, 12}));

  // Epochs of 1000 samples, 256 a step: epochs end in steps 4 (1024), 8 (2048), 12 (3072).
  ValidationSchedule epochs;
  epochs.epoch_samples = 1000;
  epochs.batch_size = 256;
  due.clear();
  for (uint64_t s = 0; s <= 12; ++s) {
    if (epochs.Due(s)) due.push_back(s);
  }
  EXPECT_EQ(due, (std::vector<uint64_t>{4, 8, 12}));
  ValidationSchedule none;
  EXPECT_FALSE(none.Due(1));

  // 1000 samples a rank, 3 epochs, 256 a step: 3000 / 256 rounded up.
  EXPECT_EQ(PlannedSteps(1000, 3, 256), 12u);
  EXPECT_EQ(PlannedSteps(1000, 0, 256), 0u);
  EXPECT_EQ(PlannedSteps(1024, 1, 256), 4u);
}

TEST(LrSchedule, WarmUpThenDecay) {
  LrSchedule none;
  EXPECT_FALSE(none.active());
  EXPECT_EQ(none.Factor(1), 1.0f);
  EXPECT_EQ(none.Factor(1000000), 1.0f);

  LrSchedule s;
  s.warmup_steps = 4;
  s.decay = LrSchedule::Decay::kLinear;
  s.decay_steps = 10;
  s.final_scale = 0.5f;
  ASSERT_TRUE(s.active());
  EXPECT_FLOAT_EQ(s.Factor(1), 0.25f);
  EXPECT_FLOAT_EQ(s.Factor(3), 0.75f);
  EXPECT_FLOAT_EQ(s.Factor(4), 1.0f);    // warm-up over; decay starts
  EXPECT_FLOAT_EQ(s.Factor(9), 0.75f);   // halfway down
  EXPECT_FLOAT_EQ(s.Factor(14), 0.5f);   // the end of the decay
  EXPECT_FLOAT_EQ(s.Factor(100), 0.5f);  // and after it

  s.decay = LrSchedule::Decay::kCosine;
  EXPECT_FLOAT_EQ(s.Factor(4), 1.0f);
  EXPECT_FLOAT_EQ(s.Factor(9), 0.75f);  // cosine's midpoint is the linear one
  EXPECT_LT(s.Factor(6), 1.0f);
  EXPECT_GT(s.Factor(6), 1.0f - 0.5f * 2 / 10);  // slower than linear at the start
  EXPECT_FLOAT_EQ(s.Factor(14), 0.5f);

  EXPECT_EQ(ParseLrDecay("cosine").value(), LrSchedule::Decay::kCosine);
  EXPECT_EQ(ParseLrDecay("step").status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tessera::worker
