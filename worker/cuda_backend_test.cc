// CPU vs CUDA backend equivalence (label gpu): skipped with a message where no GPU is.
#include <gtest/gtest.h>

#include <cmath>

#include "worker/backend.h"
#include "worker/batch.h"
#include "worker/synthetic_data.h"

namespace tessera::worker {
namespace {

void Compare(ModelConfig c, uint32_t batch_size) {
  std::string why;
  if (!CudaBackendAvailable(&why)) GTEST_SKIP() << "no CUDA backend: " << why;
  auto layout = ModelLayout::Create(c);
  ASSERT_TRUE(layout.ok());
  SyntheticOptions so;
  so.num_dense = c.num_dense;
  so.cardinalities.assign(c.num_fields, 50);
  auto gen = SyntheticReader::Create(so);
  ASSERT_TRUE(gen.ok());
  Batch b;
  b.Clear((*gen)->schema());
  ASSERT_EQ((*gen)->Read(batch_size, &b).value(), batch_size);
  IndexedBatch ib;
  IndexBatch(b, &ib);
  std::vector<float> emb(ib.unique_keys.size() * c.embedding_dim), wide(ib.unique_keys.size()),
      params(layout->num_params());
  for (size_t i = 0; i < emb.size(); ++i) emb[i] = std::sin(0.37f * i) * 0.3f;
  for (size_t i = 0; i < wide.size(); ++i) wide[i] = std::cos(0.11f * i) * 0.1f;
  for (size_t i = 0; i < params.size(); ++i) params[i] = std::sin(0.013f * i + 1) * 0.2f;
  ModelInput in;
  in.batch_size = b.size;
  in.dense = b.dense.data();
  in.labels = b.labels.data();
  in.offsets = b.offsets.data();
  in.rows = ib.rows.data();
  in.num_rows = static_cast<uint32_t>(ib.unique_keys.size());
  in.embeddings = emb.data();
  in.wide = wide.data();
  in.params = params.data();
  auto cpu = CreateCpuBackend(*layout);
  auto gpu = CreateCudaBackend(*layout, 0);
  ASSERT_TRUE(gpu.ok()) << gpu.status().ToString();
  ModelGrads gc, gg;
  std::vector<float> pc(b.size), pg(b.size), pf(b.size);
  const float scale = 1.0f / b.size;
  ASSERT_TRUE((*cpu)->ForwardBackward(in, scale, pc.data(), &gc).ok());
  ASSERT_TRUE((*gpu)->ForwardBackward(in, scale, pg.data(), &gg).ok());
  ASSERT_TRUE((*gpu)->Forward(in, pf.data()).ok());
  for (uint32_t i = 0; i < b.size; ++i) {
    EXPECT_NEAR(pc[i], pg[i], 2e-4) << i;
    EXPECT_NEAR(pg[i], pf[i], 1e-6) << i;
  }
  EXPECT_NEAR(gc.loss_sum, gg.loss_sum, 1e-3 * std::abs(gc.loss_sum) + 1e-3);
  auto close = [](const std::vector<float>& a, const std::vector<float>& b, const char* what) {
    ASSERT_EQ(a.size(), b.size()) << what;
    double max_ref = 1e-6;
    for (float x : a) max_ref = std::max(max_ref, double(std::abs(x)));
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_NEAR(a[i], b[i], 1e-3 * max_ref) << what << "[" << i << "]";
    }
  };
  close(gc.embeddings, gg.embeddings, "embeddings");
  close(gc.wide, gg.wide, "wide");
  close(gc.params, gg.params, "params");
}

TEST(CudaBackend, MatchesCpuOnCriteoShape) {
  ModelConfig c;
  c.bottom_mlp = {32};
  c.top_mlp = {32};
  Compare(c, 256);
}

TEST(CudaBackend, MatchesCpuMeanPoolingNoDense) {
  ModelConfig c;
  c.num_dense = 0;
  c.num_fields = 5;
  c.embedding_dim = 8;
  c.pooling = Pooling::kMean;
  c.top_mlp = {16, 8};
  Compare(c, 100);
}

}  // namespace
}  // namespace tessera::worker
