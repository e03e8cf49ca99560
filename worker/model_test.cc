// Finite-difference gradient checks of the CPU model, and layout checks.
#include "worker/model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "worker/backend.h"
#include "worker/batch.h"
#include "worker/cpu_model_internal.h"
#include "worker/synthetic_data.h"

namespace tessera::worker {
namespace {

struct Case {
  ModelConfig config;
  Batch batch;
  IndexedBatch index;
  std::vector<double> dense, labels, weights, emb, wide, params;
};

Case MakeCase(ModelConfig c, bool weighted, uint64_t seed, uint32_t batch_size = 6) {
  Case k;
  k.config = c;
  SyntheticOptions so;
  so.num_dense = c.num_dense;
  so.cardinalities.assign(c.num_fields, 5);  // small: keys repeat within the batch
  so.seed = seed;
  auto gen = SyntheticReader::Create(so);
  EXPECT_TRUE(gen.ok());
  k.batch.Clear((*gen)->schema());
  EXPECT_EQ((*gen)->Read(batch_size, &k.batch).value(), batch_size);
  IndexBatch(k.batch, &k.index);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-0.5, 0.5);
  for (float x : k.batch.dense) k.dense.push_back(x * 0.5);
  for (float y : k.batch.labels) k.labels.push_back(y);
  if (weighted) {
    for (size_t i = 0; i < k.batch.keys.size(); ++i) k.weights.push_back(0.5 + u(rng) + 0.5);
  }
  auto layout = ModelLayout::Create(c);
  EXPECT_TRUE(layout.ok());
  const size_t rows = k.index.unique_keys.size();
  for (size_t i = 0; i < rows * c.embedding_dim; ++i) k.emb.push_back(u(rng));
  for (size_t i = 0; i < rows; ++i) k.wide.push_back(u(rng) * 0.2);
  for (size_t i = 0; i < layout->num_params(); ++i) k.params.push_back(u(rng));
  return k;
}

internal::InputT<double> InputOf(const Case& k) {
  internal::InputT<double> in;
  in.batch_size = k.batch.size;
  in.dense = k.dense.data();
  in.labels = k.labels.data();
  in.offsets = k.batch.offsets.data();
  in.rows = k.index.rows.data();
  in.weights = k.weights.empty() ? nullptr : k.weights.data();
  in.num_rows = static_cast<uint32_t>(k.index.unique_keys.size());
  in.embeddings = k.emb.data();
  in.wide = k.wide.data();
  in.params = k.params.data();
  return in;
}

double Loss(const ModelLayout& layout, const Case& k) {
  internal::CpuModel<double> m(layout, 1);
  internal::GradsT<double> g;
  std::vector<double> probs(k.batch.size);
  m.Run(InputOf(k), 1.0, probs.data(), &g);
  return g.loss_sum;
}

// Compares analytic gradients with central differences for every parameter of every kind.
void CheckGradients(const ModelConfig& c, bool weighted, int threads, uint32_t batch_size = 6) {
  Case k = MakeCase(c, weighted, 42, batch_size);
  auto layout = ModelLayout::Create(c);
  ASSERT_TRUE(layout.ok()) << layout.status().ToString();
  internal::CpuModel<double> m(*layout, threads);
  internal::GradsT<double> g;
  std::vector<double> probs(k.batch.size);
  m.Run(InputOf(k), 1.0, probs.data(), &g);
  const double eps = 1e-6;
  auto check = [&](std::vector<double>* v, const std::vector<double>& grad, const char* what) {
    ASSERT_EQ(v->size(), grad.size()) << what;
    for (size_t i = 0; i < v->size(); ++i) {
      const double orig = (*v)[i];
      (*v)[i] = orig + eps;
      const double up = Loss(*layout, k);
      (*v)[i] = orig - eps;
      const double down = Loss(*layout, k);
      (*v)[i] = orig;
      const double fd = (up - down) / (2 * eps);
      EXPECT_NEAR(grad[i], fd, 1e-6 + 1e-5 * std::abs(fd)) << what << "[" << i << "]";
    }
  };
  if (c.deep) check(&k.emb, g.embeddings, "embeddings");
  if (c.wide) check(&k.wide, g.wide, "wide");
  check(&k.params, g.params, "params");
}

ModelConfig Small() {
  ModelConfig c;
  c.num_dense = 3;
  c.num_fields = 4;
  c.embedding_dim = 3;
  c.bottom_mlp = {5};
  c.top_mlp = {4};
  return c;
}

TEST(ModelConfigTest, ParseLayerWidths) {
  EXPECT_EQ(*ParseLayerWidths("256,64"), (std::vector<uint32_t>{256, 64}));
  EXPECT_TRUE(ParseLayerWidths("")->empty());
  EXPECT_EQ(ParseLayerWidths("64,x").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseLayerWidths("0").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseLayerWidths("99999999999").status().code(), StatusCode::kInvalidArgument);
}

TEST(GradientCheck, DlrmWithWideSumPooling) { CheckGradients(Small(), false, 1); }

TEST(GradientCheck, MeanPoolingWeightedBags) {
  ModelConfig c = Small();
  c.pooling = Pooling::kMean;
  CheckGradients(c, true, 1);
}

// DLRM's interaction runs on blocks of samples (SIMD lanes) and of dots and elements: a width
// over twice the element block with a remainder, 7 vectors (dots blocked by 4 with
// remainders) and a batch that ends in a partial block of samples.
TEST(GradientCheck, DlrmWideVectorsPartialBlocks) {
  ModelConfig c = Small();
  c.num_fields = 6;
  c.embedding_dim = 10;
  CheckGradients(c, true, 1, 7);
}

TEST(GradientCheck, NoDenseFeatures) {
  ModelConfig c = Small();
  c.num_dense = 0;
  c.wide = false;
  CheckGradients(c, true, 1);
}

TEST(GradientCheck, WideOnly) {
  ModelConfig c = Small();
  c.deep = false;
  CheckGradients(c, false, 1);
}

TEST(GradientCheck, DeeperMlpsThreaded) {
  ModelConfig c = Small();
  c.bottom_mlp = {6, 4};
  c.top_mlp = {5, 3};
  CheckGradients(c, false, 3);
}

TEST(ModelConfigTest, ParseModelKind) {
  EXPECT_EQ(*ParseModelKind("dlrm"), ModelKind::kDlrm);
  EXPECT_EQ(*ParseModelKind("deepfm"), ModelKind::kDeepFm);
  EXPECT_EQ(*ParseModelKind("dcn"), ModelKind::kDcn);
  for (ModelKind k : {ModelKind::kDlrm, ModelKind::kDeepFm, ModelKind::kDcn}) {
    EXPECT_EQ(*ParseModelKind(ModelKindName(k)), k);
  }
  const Status bad = ParseModelKind("DeepFM").status();
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("'DeepFM'"), std::string::npos) << bad.ToString();
  EXPECT_EQ(ParseModelKind("").status().code(), StatusCode::kInvalidArgument);
}

ModelConfig SmallOf(ModelKind kind) {
  ModelConfig c = Small();
  c.kind = kind;
  c.num_cross_layers = 2;
  return c;
}

// DeepFM: bias + wide + FM over [bottom output, fields] + the DNN on their concatenation.
TEST(GradientCheck, DeepFmWithWideSumPooling) {
  CheckGradients(SmallOf(ModelKind::kDeepFm), false, 1);
}

TEST(GradientCheck, DeepFmMeanPoolingWeightedNoDense) {
  ModelConfig c = SmallOf(ModelKind::kDeepFm);
  c.pooling = Pooling::kMean;
  c.num_dense = 0;
  c.wide = false;
  CheckGradients(c, true, 1);
}

TEST(GradientCheck, DeepFmDeeperMlpsThreaded) {
  ModelConfig c = SmallOf(ModelKind::kDeepFm);
  c.bottom_mlp = {6, 4};
  c.top_mlp = {5, 3};
  CheckGradients(c, true, 3);
}

// DCN-v2: stacked full-rank cross layers on x0, then the top MLP.
TEST(GradientCheck, DcnWithWideSumPooling) { CheckGradients(SmallOf(ModelKind::kDcn), false, 1); }

TEST(GradientCheck, DcnThreeCrossLayersMeanWeightedNoDense) {
  ModelConfig c = SmallOf(ModelKind::kDcn);
  c.num_cross_layers = 3;
  c.pooling = Pooling::kMean;
  c.num_dense = 0;
  c.wide = false;
  CheckGradients(c, true, 1);
}

TEST(GradientCheck, DcnNoTopHiddenLayerThreaded) {
  ModelConfig c = SmallOf(ModelKind::kDcn);
  c.top_mlp = {};
  c.bottom_mlp = {6, 4};
  CheckGradients(c, true, 3);
}

TEST(GradientCheck, DcnWithoutCrossLayers) {
  ModelConfig c = SmallOf(ModelKind::kDcn);
  c.num_cross_layers = 0;
  CheckGradients(c, false, 1);
}

// The float backend (its SIMD lanes are twice as many as double's) against the double model.
void CheckFloatMatchesDouble(const ModelConfig& c, uint32_t batch_size) {
  Case k = MakeCase(c, false, 7, batch_size);
  auto layout = ModelLayout::Create(c);
  ASSERT_TRUE(layout.ok());
  internal::CpuModel<double> ref(*layout, 1);
  internal::GradsT<double> gd;
  std::vector<double> pd(k.batch.size);
  ref.Run(InputOf(k), 0.5, pd.data(), &gd);
  auto f = [](const std::vector<double>& v) { return std::vector<float>(v.begin(), v.end()); };
  std::vector<float> dense = f(k.dense), labels = f(k.labels), emb = f(k.emb), wide = f(k.wide),
                     params = f(k.params);
  ModelInput in;
  in.batch_size = k.batch.size;
  in.dense = dense.data();
  in.labels = labels.data();
  in.offsets = k.batch.offsets.data();
  in.rows = k.index.rows.data();
  in.num_rows = static_cast<uint32_t>(k.index.unique_keys.size());
  in.embeddings = emb.data();
  in.wide = wide.data();
  in.params = params.data();
  // Both instruction sets of the matrix products where this build and CPU have AVX2.
  std::vector<std::string> isas = {"generic"};
  if (!CpuBackendIsa("avx2").empty()) isas.push_back("avx2");
  for (const std::string& isa : isas) {
  for (int threads : {1, 2, 4}) {
    SCOPED_TRACE("isa " + isa + ", threads " + std::to_string(threads));
    CpuBackendOptions o;
    o.threads = threads;
    o.isa = isa;
    auto backend = CreateCpuBackend(*layout, o);
    ASSERT_TRUE(backend.ok());
    ModelGrads g;
    std::vector<float> p(k.batch.size);
    ASSERT_TRUE((*backend)->ForwardBackward(in, 0.5f, p.data(), &g).ok());
    for (size_t i = 0; i < p.size(); ++i) EXPECT_NEAR(p[i], pd[i], 1e-5);
    for (size_t i = 0; i < g.params.size(); ++i) EXPECT_NEAR(g.params[i], gd.params[i], 1e-4);
    for (size_t i = 0; i < g.embeddings.size(); ++i) {
      EXPECT_NEAR(g.embeddings[i], gd.embeddings[i], 1e-4);
    }
    std::vector<float> p2(k.batch.size);
    ASSERT_TRUE((*backend)->Forward(in, p2.data()).ok());
    EXPECT_EQ(p, p2);
  }
  }
}

TEST(CpuBackend, InstructionSets) {
  auto layout = ModelLayout::Create(Small());
  ASSERT_TRUE(layout.ok());
  EXPECT_EQ(CpuBackendIsa("generic"), "generic");
  EXPECT_TRUE(CpuBackendIsa("auto") == "generic" || CpuBackendIsa("auto") == "avx2");
  EXPECT_EQ(CpuBackendIsa("sse9"), "");
  CpuBackendOptions o;
  o.isa = "sse9";
  EXPECT_EQ(CreateCpuBackend(*layout, o).status().code(), StatusCode::kInvalidArgument);
  o.isa = "avx2";
  auto avx2 = CreateCpuBackend(*layout, o);
  EXPECT_EQ(avx2.ok(), !CpuBackendIsa("avx2").empty());
  if (!avx2.ok()) {
    EXPECT_EQ(avx2.status().code(), StatusCode::kFailedPrecondition);
  }
}

TEST(CpuBackend, FloatMatchesDoubleAndThreadsAgree) { CheckFloatMatchesDouble(Small(), 6); }

// Bench_train's width with a batch that ends in a partial block of samples.
TEST(CpuBackend, FloatMatchesDoubleWideDlrm) {
  ModelConfig c = Small();
  c.num_fields = 9;
  c.embedding_dim = 16;
  CheckFloatMatchesDouble(c, 13);
}

TEST(CpuBackend, RejectsRowsOutOfRange) {
  ModelConfig c = Small();
  Case k = MakeCase(c, false, 3);
  auto layout = ModelLayout::Create(c);
  auto backend = CreateCpuBackend(*layout);
  std::vector<float> params(layout->num_params()), emb(3), wide(1), dense(k.dense.size());
  ModelInput in;
  in.batch_size = k.batch.size;
  in.dense = dense.data();
  in.offsets = k.batch.offsets.data();
  in.rows = k.index.rows.data();
  in.num_rows = 1;  // fewer rows than the batch uses
  in.embeddings = emb.data();
  in.wide = wide.data();
  in.params = params.data();
  std::vector<float> p(k.batch.size);
  EXPECT_EQ((*backend)->Forward(in, p.data()).code(), StatusCode::kInvalidArgument);
}

TEST(ModelLayout, TablesCoverTheFlatVector) {
  ModelConfig c;  // Criteo-shaped defaults
  auto l = ModelLayout::Create(c);
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->num_vectors(), 27u);
  EXPECT_EQ(l->top_input(), 16u + 27u * 26u / 2u);
  uint64_t covered = 0;
  for (const auto& t : l->dense_tables()) {
    EXPECT_EQ(t.offset, covered);
    covered += t.spec.length;
  }
  EXPECT_EQ(covered, l->num_params());
  EXPECT_EQ(l->embedding_table().dim, 16u);
  EXPECT_EQ(l->wide_table().optimizer.kind, OptimizerKind::kFtrl);
  c.deep = false;
  c.wide = false;
  EXPECT_FALSE(ModelLayout::Create(c).ok());
}

// DeepFM and DCN-v2 read the concatenated vectors (27 x 16 with the defaults); DCN-v2 adds one
// dense table per cross layer (a square W and its b), between the bottom and the top layers.
TEST(ModelLayout, DeepFmAndDcnTables) {
  ModelConfig c;
  c.kind = ModelKind::kDeepFm;
  auto fm = ModelLayout::Create(c);
  ASSERT_TRUE(fm.ok());
  EXPECT_EQ(fm->top_input(), 27u * 16u);
  EXPECT_TRUE(fm->cross().empty());
  c.kind = ModelKind::kDcn;
  auto dcn = ModelLayout::Create(c);
  ASSERT_TRUE(dcn.ok());
  ASSERT_EQ(dcn->cross().size(), 3u);
  EXPECT_EQ(dcn->top_input(), 27u * 16u);
  std::vector<std::string> names;
  uint64_t covered = 0;
  for (const auto& t : dcn->dense_tables()) {
    EXPECT_EQ(t.offset, covered) << t.spec.name;
    covered += t.spec.length;
    names.push_back(t.spec.name);
  }
  EXPECT_EQ(covered, dcn->num_params());
  EXPECT_EQ(names, (std::vector<std::string>{"ctr/bias", "ctr/bottom0", "ctr/bottom1", "ctr/cross0",
                                             "ctr/cross1", "ctr/cross2", "ctr/top0", "ctr/top1"}));
  for (const LayerShape& l : dcn->cross()) {
    EXPECT_EQ(l.in, 27u * 16u);
    EXPECT_EQ(l.out, 27u * 16u);
    EXPECT_FALSE(l.relu);
  }
  EXPECT_EQ(dcn->cross()[0].offset, dcn->bottom().back().offset + dcn->bottom().back().size());
  EXPECT_EQ(dcn->top()[0].offset, dcn->cross().back().offset + dcn->cross().back().size());
  // The DLRM layout does not change with the new fields.
  c.kind = ModelKind::kDlrm;
  auto dlrm = ModelLayout::Create(c);
  ASSERT_TRUE(dlrm.ok());
  EXPECT_TRUE(dlrm->cross().empty());
  EXPECT_EQ(dlrm->num_params(), dcn->num_params() - 3 * dcn->cross()[0].size() -
                                    (dcn->top()[0].size() - dlrm->top()[0].size()));
  c.kind = ModelKind::kDcn;
  c.num_cross_layers = 65;
  EXPECT_EQ(ModelLayout::Create(c).status().code(), StatusCode::kInvalidArgument);
  c.num_cross_layers = 3;
  c.deep = false;
  EXPECT_EQ(ModelLayout::Create(c).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tessera::worker
