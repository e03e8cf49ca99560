// The CUDA backend's host-side planning (cuda_plan_internal.h), which needs no GPU (label unit):
// the upload and download blocks, packing, buffer growth, and which call may use a staged batch.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "worker/backend_test_util.h"
#include "worker/cuda_plan_internal.h"

namespace tessera::worker::internal {
namespace {

using testing::BackendCase;
using testing::BackendCases;
using testing::MakeStep;
using testing::StepInput;

struct Section {
  const char* name;
  size_t at, bytes;
};

// The sections of a plan of `in` with their byte sizes, in block order.
std::vector<Section> SectionsOf(const ModelLayout& layout, const ModelInput& in,
                                const UploadPlan& p) {
  const ModelConfig& c = layout.config();
  const size_t b = in.batch_size, r = in.num_rows;
  return {{"offsets", p.offsets, (b * c.num_fields + 1) * 4},
          {"rows", p.rows, p.entries * 4},
          {"weights", p.weights, in.weights != nullptr ? p.entries * 4 : 0},
          {"dense", p.dense, c.deep && c.num_dense > 0 ? b * c.num_dense * 4 : 0},
          {"labels", p.labels, p.with_labels ? b * 4 : 0},
          {"params", p.params, layout.num_params() * 4},
          {"wide", p.wide, c.wide ? r * 4 : 0},
          {"emb", p.emb, c.deep ? r * c.embedding_dim * 4 : 0}};
}

// Every case, both steps, with and without labels: sections aligned to 256 bytes, in order,
// disjoint, the batch part before batch_bytes and the parameters after; packed bytes read back
// equal to the inputs, and each Pack writes its own part only.
TEST(CudaPlan, UploadBlockHoldsEveryInputInItsPart) {
  for (const BackendCase& c : BackendCases()) {
    auto layout = ModelLayout::Create(c.config);
    ASSERT_TRUE(layout.ok());
    for (size_t step = 0; step < c.batches.size(); ++step) {
      for (bool labels : {false, true}) {
        SCOPED_TRACE(c.name + " step " + std::to_string(step) + (labels ? " labels" : ""));
        const StepInput s = MakeStep(*layout, c, step);
        const ModelInput in = s.Input();
        const UploadPlan p = PlanUpload(*layout, in, labels);
        EXPECT_EQ(p.entries, s.rows.size());
        const std::vector<Section> secs = SectionsOf(*layout, in, p);
        size_t end = 0;
        for (size_t i = 0; i < secs.size(); ++i) {
          SCOPED_TRACE(secs[i].name);
          EXPECT_EQ(secs[i].at % 256, 0u);
          EXPECT_GE(secs[i].at, end);
          end = secs[i].at + secs[i].bytes;
          if (i < 5) {
            EXPECT_LE(end, p.batch_bytes);
          } else {
            EXPECT_GE(secs[i].at, p.batch_bytes);
          }
        }
        EXPECT_LE(end, p.upload_bytes);
        EXPECT_LT(p.upload_bytes - end, 256u);

        std::vector<char> block(p.upload_bytes, '\x5a');
        PackBatch(*layout, in, p, block.data());
        for (size_t i = p.batch_bytes; i < block.size(); ++i) {
          ASSERT_EQ(block[i], '\x5a') << "PackBatch wrote byte " << i;
        }
        std::vector<char> params_only(p.upload_bytes, '\x5a');
        PackParams(*layout, in, p, params_only.data());
        for (size_t i = 0; i < p.batch_bytes; ++i) {
          ASSERT_EQ(params_only[i], '\x5a') << "PackParams wrote byte " << i;
        }
        PackParams(*layout, in, p, block.data());
        const void* sources[] = {in.offsets, in.rows,   in.weights, in.dense,
                                 in.labels,  in.params, in.wide,    in.embeddings};
        for (size_t i = 0; i < secs.size(); ++i) {
          if (secs[i].bytes == 0) continue;
          EXPECT_EQ(std::memcmp(block.data() + secs[i].at, sources[i], secs[i].bytes), 0)
              << secs[i].name;
        }
      }
    }
  }
}

// The batch part is laid out the same whatever the rows: Stage may upload it before the pulls
// end, and a call with other rows only re-uploads the parameters.
TEST(CudaPlan, BatchPartDoesNotDependOnTheRows) {
  const BackendCase c = BackendCases()[2];
  auto layout = ModelLayout::Create(c.config);
  ASSERT_TRUE(layout.ok());
  StepInput s = MakeStep(*layout, c, 1);
  ModelInput a = s.Input(), b = a;
  b.num_rows = a.num_rows * 3 + 1;
  b.params = nullptr;
  const UploadPlan pa = PlanUpload(*layout, a, true), pb = PlanUpload(*layout, b, true);
  EXPECT_EQ(pa.offsets, pb.offsets);
  EXPECT_EQ(pa.rows, pb.rows);
  EXPECT_EQ(pa.weights, pb.weights);
  EXPECT_EQ(pa.dense, pb.dense);
  EXPECT_EQ(pa.labels, pb.labels);
  EXPECT_EQ(pa.batch_bytes, pb.batch_bytes);
  EXPECT_GT(pb.upload_bytes, pa.upload_bytes);
  EXPECT_GT(PlanUpload(*layout, a, true).batch_bytes, PlanUpload(*layout, a, false).batch_bytes);
}

// [loss | probs | params, wide, embeddings]: the gradients contiguous after the probabilities,
// none for Forward.
TEST(CudaPlan, DownloadBlock) {
  for (const BackendCase& c : BackendCases()) {
    SCOPED_TRACE(c.name);
    auto layout = ModelLayout::Create(c.config);
    ASSERT_TRUE(layout.ok());
    const StepInput s = MakeStep(*layout, c, 1);
    const DownloadPlan t = PlanDownload(*layout, s.Input(), true);
    const ModelConfig& m = c.config;
    EXPECT_EQ(t.loss, 0u);
    EXPECT_GE(t.probs, sizeof(double));
    EXPECT_GE(t.grads, t.probs + s.batch * sizeof(float));
    EXPECT_EQ(t.grad_floats, layout->num_params() + (m.wide ? s.num_rows : 0) +
                                 (m.deep ? size_t{s.num_rows} * m.embedding_dim : 0));
    EXPECT_EQ(t.download_bytes, t.grads + t.grad_floats * sizeof(float));
    const DownloadPlan f = PlanDownload(*layout, s.Input(), false);
    EXPECT_EQ(f.grad_floats, 0u);
    EXPECT_EQ(f.probs, t.probs);
  }
}

// Growth: never below the request, at least 1.5x, at least 64; a request that fits keeps the
// capacity; a batch growing one element at a time to a million reallocates a few dozen times.
TEST(CudaPlan, BuffersGrowGeometrically) {
  EXPECT_EQ(GrownCapacity(0, 0), 0u);
  EXPECT_EQ(GrownCapacity(0, 1), 64u);
  EXPECT_EQ(GrownCapacity(100, 100), 100u);
  EXPECT_EQ(GrownCapacity(100, 7), 100u);
  EXPECT_EQ(GrownCapacity(100, 101), 150u);
  EXPECT_EQ(GrownCapacity(100, 1000), 1000u);
  size_t cap = 0, grows = 0;
  for (size_t n = 1; n <= 1000000; ++n) {
    const size_t next = GrownCapacity(cap, n);
    ASSERT_GE(next, n);
    if (next != cap) {
      ++grows;
      ASSERT_GE(next, cap + cap / 2);
    }
    cap = next;
  }
  EXPECT_LE(grows, 30u);  // log base 1.5 of 1e6 / 64 is 24
  EXPECT_GE(grows, 20u);
}

// Which parts of a staged batch a call may use.
TEST(CudaPlan, StagedBatchIsUsedOnlyByTheSameInput) {
  const BackendCase c = BackendCases()[2];
  auto layout = ModelLayout::Create(c.config);
  ASSERT_TRUE(layout.ok());
  const StepInput s = MakeStep(*layout, c, 0), other = MakeStep(*layout, c, 0);
  const ModelInput in = s.Input();
  const StagedKey full{in, true, true, 5};
  auto match = [](const StagedKey& k, const ModelInput& x, bool labels, uint64_t calls = 6) {
    const StageMatch m = MatchStaged(k, x, labels, calls);
    return std::string(m.batch ? "batch" : "-") + (m.params ? "+params" : "");
  };
  EXPECT_EQ(match(full, in, true), "batch+params");
  EXPECT_EQ(match(full, in, false), "batch+params");
  EXPECT_EQ(match({in, true, false, 5}, in, true), "batch");  // parameters not staged
  EXPECT_EQ(match({in, false, true, 5}, in, true), "-");      // labels not staged
  EXPECT_EQ(match({in, false, true, 5}, in, false), "batch+params");
  // Staged at call 5: calls 6 and 7 may use it, call 8 and later not.
  EXPECT_EQ(match(full, in, true, 7), "batch+params");
  EXPECT_EQ(match(full, in, true, 8), "-");
  EXPECT_EQ(match(full, in, true, 1000), "-");
  EXPECT_FALSE(StagedExpired(full, 6));
  EXPECT_FALSE(StagedExpired(full, 7));
  EXPECT_TRUE(StagedExpired(full, 8));

  auto with = [&](auto change) {
    ModelInput x = in;
    change(&x);
    return x;
  };
  const ModelInput o = other.Input();
  // Another batch (equal contents, other memory) or size: nothing.
  EXPECT_EQ(match(full, o, true), "-");
  EXPECT_EQ(match(full, with([](ModelInput* x) { x->batch_size -= 1; }), true), "-");
  EXPECT_EQ(match(full, with([&](ModelInput* x) { x->offsets = o.offsets; }), true), "-");
  EXPECT_EQ(match(full, with([&](ModelInput* x) { x->rows = o.rows; }), true), "-");
  EXPECT_EQ(match(full, with([&](ModelInput* x) { x->weights = nullptr; }), true), "-");
  EXPECT_EQ(match(full, with([&](ModelInput* x) { x->dense = o.dense; }), true), "-");
  EXPECT_EQ(match(full, with([&](ModelInput* x) { x->labels = o.labels; }), true), "-");
  EXPECT_EQ(match(full, with([&](ModelInput* x) { x->labels = o.labels; }), false), "batch+params");
  // Same batch, other parameters: the batch only.
  EXPECT_EQ(match(full, with([&](ModelInput* x) { x->params = o.params; }), true), "batch");
  EXPECT_EQ(match(full, with([&](ModelInput* x) { x->embeddings = o.embeddings; }), true), "batch");
  EXPECT_EQ(match(full, with([&](ModelInput* x) { x->wide = o.wide; }), true), "batch");
  EXPECT_EQ(match(full, with([&](ModelInput* x) { x->num_rows += 1; }), true), "batch");
  // An empty batch is never staged.
  ModelInput empty = in;
  empty.batch_size = 0;
  EXPECT_EQ(match({empty, true, true, 5}, empty, false), "-");
}

TEST(CudaPlan, HasParamsNeedsTheRowsTheModelReads) {
  const BackendCase c = BackendCases()[2];  // deep and wide
  auto layout = ModelLayout::Create(c.config);
  ASSERT_TRUE(layout.ok());
  const StepInput s = MakeStep(*layout, c, 0);
  ModelInput in = s.Input();
  EXPECT_TRUE(HasParams(*layout, in));
  in.wide = nullptr;
  EXPECT_FALSE(HasParams(*layout, in));
  in.num_rows = 0;
  EXPECT_TRUE(HasParams(*layout, in));
  in = s.Input();
  in.embeddings = nullptr;
  EXPECT_FALSE(HasParams(*layout, in));
  in = s.Input();
  in.params = nullptr;
  EXPECT_FALSE(HasParams(*layout, in));
  // A wide-only model reads no embeddings.
  const BackendCase w = BackendCases()[4];
  auto wl = ModelLayout::Create(w.config);
  const StepInput ws = MakeStep(*wl, w, 1);
  in = ws.Input();
  in.embeddings = nullptr;
  EXPECT_TRUE(HasParams(*wl, in));
}

}  // namespace
}  // namespace tessera::worker::internal
