// The null backend (worker/backend.h CreateNullBackend): the CPU backend's gradient shapes, all
// zeros, probabilities 0.5, the loss of those, input checks, and the reducer's sums.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "worker/backend.h"
#include "worker/backend_test_util.h"
#include "worker/job.h"
#include "worker/local_ranks.h"
#include "worker/local_reducer.h"

namespace tessera::worker {
namespace {

using testing::BackendCase;
using testing::BackendCases;
using testing::MakeStep;
using testing::StepInput;

bool AllZero(const std::vector<float>& v) {
  for (float x : v) {
    if (x != 0.0f) return false;
  }
  return true;
}

class NullBackendCase : public ::testing::TestWithParam<BackendCase> {};

// Every step of every case: the same gradient sizes as the CPU backend's, zeros, 0.5, log 2 per
// sample; gradients left from a previous step (other sizes, non-zero) are overwritten.
TEST_P(NullBackendCase, ZeroGradientsOfTheCpuBackendsShapes) {
  const BackendCase& c = GetParam();
  auto layout = ModelLayout::Create(c.config);
  ASSERT_TRUE(layout.ok()) << layout.status().ToString();
  auto null = CreateNullBackend(*layout);
  ASSERT_TRUE(null.ok()) << null.status().ToString();
  auto cpu = CreateCpuBackend(*layout);
  ASSERT_TRUE(cpu.ok()) << cpu.status().ToString();
  EXPECT_EQ((*null)->name(), "null");
  ModelGrads got;
  got.embeddings.assign(3, 1.0f);  // stale: wrong sizes, non-zero
  got.wide.assign(5, -2.0f);
  got.params.assign(1, 4.0f);
  for (size_t step = 0; step < c.batches.size(); ++step) {
    const StepInput s = MakeStep(*layout, c, step);
    ModelGrads want;
    std::vector<float> cpu_probs(s.batch);
    ASSERT_TRUE((*cpu)->ForwardBackward(s.Input(), 1.0f, cpu_probs.data(), &want).ok());
    std::vector<float> probs(s.batch, -1.0f);
    Status st = (*null)->ForwardBackward(s.Input(), 0.25f, probs.data(), &got);
    ASSERT_TRUE(st.ok()) << st.ToString();
    EXPECT_EQ(got.embeddings.size(), want.embeddings.size()) << "step " << step;
    EXPECT_EQ(got.wide.size(), want.wide.size()) << "step " << step;
    EXPECT_EQ(got.params.size(), want.params.size()) << "step " << step;
    EXPECT_EQ(got.embeddings.size(),
              c.config.deep ? size_t{s.num_rows} * c.config.embedding_dim : 0);
    EXPECT_EQ(got.wide.size(), c.config.wide ? s.num_rows : 0u);
    EXPECT_EQ(got.params.size(), layout->num_params());
    EXPECT_TRUE(AllZero(got.embeddings) && AllZero(got.wide) && AllZero(got.params));
    EXPECT_NEAR(got.loss_sum, s.batch * std::log(2.0), 1e-9 * s.batch);
    for (float p : probs) ASSERT_EQ(p, 0.5f);
    std::vector<float> fprobs(s.batch, -1.0f);
    ASSERT_TRUE((*null)->Forward(s.Input(), fprobs.data()).ok());
    for (float p : fprobs) ASSERT_EQ(p, 0.5f);
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, NullBackendCase, ::testing::ValuesIn(BackendCases()),
                         [](const auto& info) { return info.param.name; });

// Input the other backends refuse, the null backend refuses too.
TEST(NullBackend, RefusesWhatEveryBackendRefuses) {
  const BackendCase c = BackendCases()[0];
  auto layout = ModelLayout::Create(c.config);
  ASSERT_TRUE(layout.ok());
  auto null = CreateNullBackend(*layout);
  ASSERT_TRUE(null.ok());
  StepInput s = MakeStep(*layout, c, 0);
  std::vector<float> probs(s.batch);
  ModelGrads g;
  s.rows[s.rows.size() / 2] = s.num_rows;  // one row out of range
  Status st = (*null)->ForwardBackward(s.Input(), 1.0f, probs.data(), &g);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  EXPECT_NE(st.message().find("num_rows"), std::string::npos) << st.ToString();
  s = MakeStep(*layout, c, 0);
  ModelInput no_labels = s.Input();
  no_labels.labels = nullptr;
  EXPECT_EQ((*null)->ForwardBackward(no_labels, 1.0f, probs.data(), &g).code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE((*null)->Forward(no_labels, probs.data()).ok());  // Forward needs no labels
}

// Two local ranks of a CPU group (ForwardBackwardReduced): the leader gets the sum of both
// ranks' losses and zero gradients of the shapes of the node's rows.
TEST(NullBackend, ReducedOverLocalRanksSumsTheLosses) {
  const BackendCase c = BackendCases()[0];
  auto layout = ModelLayout::Create(c.config);
  ASSERT_TRUE(layout.ok());
  auto group = CreateReduceGroup(ChooseReducer("null", 2), 2);
  ASSERT_TRUE(group.ok()) << group.status().ToString();
  ASSERT_NE(*group, nullptr);
  EXPECT_EQ((*group)->kind(), "cpu");
  // Both ranks see the same rows (the node's union); their batches differ in size.
  const StepInput s0 = MakeStep(*layout, c, 0), s1 = MakeStep(*layout, c, 0);
  std::vector<ModelGrads> grads(2);
  std::vector<double> own_loss(2);
  Status st = RunLocalRanks(2, group->get(), [&](uint32_t r) -> Status {
    TESSERA_ASSIGN_OR_RETURN(auto reducer, (*group)->Join(r));
    TESSERA_ASSIGN_OR_RETURN(auto backend, CreateNullBackend(*layout));
    ModelInput in = (r == 0 ? s0 : s1).Input();
    if (r == 1) in.batch_size /= 2;  // a smaller batch on the same rows
    own_loss[r] = in.batch_size * std::log(2.0);
    std::vector<float> probs(in.batch_size);
    return backend->ForwardBackwardReduced(in, 1.0f, probs.data(), &grads[r], reducer.get());
  });
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_NEAR(grads[0].loss_sum, own_loss[0] + own_loss[1], 1e-3);
  EXPECT_EQ(grads[0].embeddings.size(), size_t{s0.num_rows} * c.config.embedding_dim);
  EXPECT_EQ(grads[0].wide.size(), s0.num_rows);
  EXPECT_EQ(grads[0].params.size(), layout->num_params());
  EXPECT_TRUE(AllZero(grads[0].embeddings) && AllZero(grads[0].wide) && AllZero(grads[0].params));
}

// RunJob takes "null" and refuses a backend it does not know, as an options error, before it
// connects anywhere (no server listens on port 9).
TEST(NullBackend, RunJobRefusesAnUnknownBackendByName) {
  JobOptions o;
  o.servers = {"tcp://127.0.0.1:9"};
  o.backend = "tpu";
  bool options_error = false;
  auto r = RunJob(o, &options_error);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(options_error);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("cpu, cuda or null, not 'tpu'"), std::string::npos)
      << r.status().ToString();
}

}  // namespace
}  // namespace tessera::worker
