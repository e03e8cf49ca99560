// CPU vs CUDA backend on cases built so that a wrong kernel fails (backend_test_util.h).
//
// Suites named Gpu* need a GPU (ctest label gpu; they skip with the reason where there is
// none). The others run everywhere (label unit) and make the GPU comparison mean something:
// the CPU backend of every case is pinned to the double-precision model and to finite
// differences, every case is shown to exercise each tensor (no dead layer, no all-zero
// gradient), and the comparison is shown to reject the outputs of known kinds of wrong kernel.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>

#include "worker/backend.h"
#include "worker/backend_test_util.h"
#include "worker/cpu_model_internal.h"

namespace tessera::worker {
namespace {

using testing::BackendCase;
using testing::BackendCases;
using testing::CompareOutputs;
using testing::MakeStep;
using testing::Outputs;
using testing::RunStep;
using testing::StepInput;

// DeepFM and DCN-v2 on the shapes of BackendCases: the production shape, multi-key weighted
// bags, mean pooling without dense features, width 33 (two lane passes).
std::vector<BackendCase> ModelCases() {
  auto of = [](ModelConfig c, ModelKind kind, uint32_t cross_layers) {
    c.kind = kind;
    c.num_cross_layers = cross_layers;
    return c;
  };
  const ModelKind fm = ModelKind::kDeepFm, dcn = ModelKind::kDcn;
  std::vector<BackendCase> v;
  v.push_back({"deepfm_criteo_shape",
               of(testing::CaseConfig(13, 26, 8, {32}, {32}, Pooling::kSum, true, true), fm, 0),
               {300, 1037},
               {1531, 2903},
               1,
               false,
               21});
  v.push_back({"deepfm_mean_weighted_no_dense",
               of(testing::CaseConfig(0, 7, 8, {}, {16, 8}, Pooling::kMean, true, false), fm, 0),
               {100, 257},
               {151, 389},
               3,
               true,
               22});
  v.push_back({"deepfm_width_33_weighted_multikey",
               of(testing::CaseConfig(3, 3, 33, {10}, {6}, Pooling::kSum, true, true), fm, 0),
               {65, 130},
               {33, 77},
               3,
               true,
               23});
  v.push_back({"dcn_criteo_shape",
               of(testing::CaseConfig(13, 26, 8, {32}, {32}, Pooling::kSum, true, true), dcn, 3),
               {300, 1037},
               {1531, 2903},
               1,
               false,
               24});
  v.push_back({"dcn_mean_weighted_no_dense",
               of(testing::CaseConfig(0, 7, 8, {}, {16, 8}, Pooling::kMean, true, false), dcn, 2),
               {100, 257},
               {151, 389},
               3,
               true,
               25});
  v.push_back({"dcn_width_33_one_layer_no_top_hidden",
               of(testing::CaseConfig(3, 3, 33, {10}, {}, Pooling::kSum, true, true), dcn, 1),
               {65, 130},
               {33, 77},
               3,
               true,
               26});
  return v;
}

// testing::MakeStep initialises the bottom and top layers; the cross layers get LeCun-uniform
// weights (variance 1/fan_in: z = x W^T + b stays O(1), so x0 * z neither vanishes nor explodes
// over the layers) and small biases here.
StepInput MakeModelStep(const ModelLayout& layout, const BackendCase& c, size_t step) {
  StepInput s = MakeStep(layout, c, step);
  std::mt19937_64 rng(c.seed * 7919 + step);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (const LayerShape& l : layout.cross()) {
    const float a = std::sqrt(3.0f / static_cast<float>(l.in));
    for (uint64_t i = 0; i < uint64_t{l.out} * l.in; ++i) s.params[l.offset + i] = a * u(rng);
    for (uint32_t j = 0; j < l.out; ++j) {
      s.params[l.offset + uint64_t{l.out} * l.in + j] = 0.1f * u(rng);
    }
  }
  return s;
}

// The cross layers' W and b gradients: testing::Tensors covers the bottom and top layers only.
std::vector<testing::Tensor> CrossTensors(const ModelLayout& layout, const Outputs& o) {
  std::vector<testing::Tensor> t;
  const std::vector<float>& p = o.grads.params;
  if (p.size() != layout.num_params()) return t;  // testing::Tensors reports the size
  for (size_t i = 0; i < layout.cross().size(); ++i) {
    const LayerShape& l = layout.cross()[i];
    const uint64_t w = uint64_t{l.out} * l.in;
    t.push_back(
        {"cross" + std::to_string(i) + ".W", std::span<const float>(p).subspan(l.offset, w)});
    t.push_back({"cross" + std::to_string(i) + ".b",
                 std::span<const float>(p).subspan(l.offset + w, l.out)});
  }
  return t;
}

std::vector<testing::Tensor> AllTensors(const ModelLayout& layout, const Outputs& o) {
  std::vector<testing::Tensor> t = testing::Tensors(layout, o), cross = CrossTensors(layout, o);
  t.insert(t.end(), cross.begin(), cross.end());
  return t;
}

// The largest error of a cross tensor in units of the tolerance of testing::CompareOutputs.
double WorstCrossError(const ModelLayout& layout, const Outputs& ref, const Outputs& got) {
  const testing::Tolerance tol;
  const std::vector<testing::Tensor> a = CrossTensors(layout, ref), b = CrossTensors(layout, got);
  if (a.size() != b.size()) return INFINITY;
  double worst = 0;
  for (size_t t = 0; t < a.size(); ++t) {
    double sq = 0;
    for (float x : a[t].values) sq += double{x} * x;
    const double rms = std::sqrt(sq / a[t].values.size());
    for (size_t i = 0; i < a[t].values.size(); ++i) {
      const double r = a[t].values[i], g = b[t].values[i];
      worst =
          std::max(worst, std::abs(g - r) / (tol.rtol * std::abs(r) + tol.atol_rms * rms + 1e-12));
    }
  }
  return worst;
}

// testing::CompareOutputs, and the cross tensors at the same tolerance (x factor).
std::string CompareAll(const ModelLayout& layout, const Outputs& ref, const Outputs& got,
                       double factor = 1.0) {
  std::string report = CompareOutputs(layout, ref, got, factor);
  const double worst = WorstCrossError(layout, ref, got);
  if (worst > factor) {
    report += "cross layers: worst error " + std::to_string(worst / factor) + " of the tolerance\n";
  }
  return report;
}

double WorstErrorAll(const ModelLayout& layout, const Outputs& ref, const Outputs& got) {
  return std::max(testing::WorstError(layout, ref, got), WorstCrossError(layout, ref, got));
}

// Steps alternate the summed loss (scale 1) and the mean loss (scale 1 / batch).
float ScaleOf(const StepInput& s, size_t step) {
  return step % 2 == 0 ? 1.0f : 1.0f / static_cast<float>(s.batch);
}

std::string CaseName(const ::testing::TestParamInfo<BackendCase>& info) { return info.param.name; }

// The double-precision CPU model on the same step.
struct DoubleStep {
  std::vector<double> dense, labels, weights, emb, wide, params;
  internal::InputT<double> Input(const StepInput& s) const {
    internal::InputT<double> in;
    in.batch_size = s.batch;
    in.dense = dense.data();
    in.labels = labels.data();
    in.offsets = s.offsets.data();
    in.rows = s.rows.data();
    in.weights = weights.empty() ? nullptr : weights.data();
    in.num_rows = s.num_rows;
    in.embeddings = emb.data();
    in.wide = wide.data();
    in.params = params.data();
    return in;
  }
};

DoubleStep ToDouble(const StepInput& s) {
  auto d = [](const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); };
  return {d(s.dense), d(s.labels), d(s.weights), d(s.emb), d(s.wide), d(s.params)};
}

double LossOf(const ModelLayout& layout, const StepInput& s, const DoubleStep& d) {
  internal::CpuModel<double> m(layout, 1);
  internal::GradsT<double> g;
  std::vector<double> probs(s.batch);
  m.Run(d.Input(s), 1.0, probs.data(), &g);
  return g.loss_sum;
}

class CpuBackendCase : public ::testing::TestWithParam<BackendCase> {};

// Float CPU backend == double model (a quarter of the GPU tolerance), and both == central
// finite differences of the double loss at the largest and at random coordinates of every
// tensor. Two steps on one backend object, the second batch larger.
TEST_P(CpuBackendCase, MatchesDoubleModelAndFiniteDifferences) {
  const BackendCase& c = GetParam();
  auto layout = ModelLayout::Create(c.config);
  ASSERT_TRUE(layout.ok()) << layout.status().ToString();
  auto cpu = CreateCpuBackend(*layout, {2});
  ASSERT_TRUE(cpu.ok());
  for (size_t step = 0; step < c.batches.size(); ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const StepInput s = MakeModelStep(*layout, c, step);
    const float scale = ScaleOf(s, step);
    Status st;
    Outputs f = RunStep(cpu->get(), s, scale, &st);
    ASSERT_TRUE(st.ok()) << st.ToString();

    DoubleStep d = ToDouble(s);
    internal::CpuModel<double> model(*layout, 1);
    internal::GradsT<double> gd;
    std::vector<double> pd(s.batch);
    model.Run(d.Input(s), scale, pd.data(), &gd);
    auto fl = [](const std::vector<double>& v) { return std::vector<float>(v.begin(), v.end()); };
    Outputs ref{fl(pd), {fl(gd.embeddings), fl(gd.wide), fl(gd.params), gd.loss_sum}};
    EXPECT_EQ(CompareAll(*layout, ref, f, 0.25), "");
    std::printf("%s step %zu: float vs double: worst error %.3g of the GPU tolerance\n",
                c.name.c_str(), step, WorstErrorAll(*layout, ref, f));

    // Finite differences of scale * loss_sum with respect to inputs of each kind.
    const double eps = 1e-6;
    auto check = [&](std::vector<double>* v, const std::vector<double>& grad,
                     const std::vector<float>& fgrad, const char* what) {
      ASSERT_EQ(v->size(), grad.size()) << what;
      ASSERT_EQ(fgrad.size(), grad.size()) << what;
      if (v->empty()) return;
      double sq = 0;
      for (double g : grad) sq += g * g;
      const double rms = std::sqrt(sq / grad.size());
      std::vector<size_t> idx(grad.size());
      for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
      const size_t top = std::min<size_t>(4, idx.size());
      std::partial_sort(idx.begin(), idx.begin() + top, idx.end(),
                        [&](size_t a, size_t b) { return std::abs(grad[a]) > std::abs(grad[b]); });
      std::mt19937_64 rng(c.seed + step);
      std::vector<size_t> probe(idx.begin(), idx.begin() + top);
      for (int k = 0; k < 4; ++k) probe.push_back(rng() % grad.size());
      for (size_t i : probe) {
        const double orig = (*v)[i];
        (*v)[i] = orig + eps;
        const double up = LossOf(*layout, s, d);
        (*v)[i] = orig - eps;
        const double down = LossOf(*layout, s, d);
        (*v)[i] = orig;
        const double fd = scale * (up - down) / (2 * eps);
        EXPECT_NEAR(grad[i], fd, 1e-4 * std::abs(fd) + 1e-6 * (1 + rms)) << what << "[" << i << "]";
        EXPECT_NEAR(fgrad[i], fd, 2e-3 * std::abs(fd) + 2e-4 * rms) << what << "[" << i << "]";
      }
    };
    if (c.config.deep) check(&d.emb, gd.embeddings, f.grads.embeddings, "embeddings");
    if (c.config.wide) check(&d.wide, gd.wide, f.grads.wide, "wide");
    check(&d.params, gd.params, f.grads.params, "params");
  }
}

// Every tensor of every case carries signal: predictions spread out, and most entries of each
// weight, bias, wide and embedding gradient are non-zero (a dead layer would hide a wrong
// kernel behind zeros, as a constant top layer did before).
TEST_P(CpuBackendCase, ExercisesEveryTensor) {
  const BackendCase& c = GetParam();
  auto layout = ModelLayout::Create(c.config);
  ASSERT_TRUE(layout.ok());
  auto cpu = CreateCpuBackend(*layout);
  ASSERT_TRUE(cpu.ok());
  const size_t last = c.batches.size() - 1;
  const StepInput s = MakeModelStep(*layout, c, last);
  Status st;
  Outputs o = RunStep(cpu->get(), s, 1.0f, &st);
  ASSERT_TRUE(st.ok()) << st.ToString();
  double mean = 0, var = 0;
  for (float p : o.probs) mean += p / o.probs.size();
  for (float p : o.probs) var += (p - mean) * (p - mean) / o.probs.size();
  EXPECT_GT(std::sqrt(var), 0.05) << "predictions hardly vary";
  for (const testing::Tensor& t : AllTensors(*layout, o)) {
    if (t.name == "probs" || t.values.empty()) continue;
    size_t nonzero = 0;
    for (float x : t.values) nonzero += x != 0.0f;
    EXPECT_GE(nonzero, t.values.size() / 2)
        << t.name << ": " << nonzero << " of " << t.values.size() << " non-zero";
  }
  EXPECT_EQ(o.grads.embeddings.empty(), !c.config.deep);
  EXPECT_EQ(o.grads.wide.empty(), !c.config.wide);
}

// A wrong kernel as the CPU backend can imitate it: the step's inputs altered (`change`) and
// the model run with `config`, as the broken kernel would see them.
struct InputMutation {
  std::string name;
  std::function<void(StepInput*)> change;
  ModelConfig config;
};

// The input mutations that apply to case `c` (a model of `layout`).
std::vector<InputMutation> InputMutations(const BackendCase& c, const ModelLayout& layout) {
  const ModelConfig& m = c.config;
  std::vector<InputMutation> out;
  auto same = [](StepInput*) {};
  if (m.deep) {
    out.push_back({"embedding rows read x -5",
                   [](StepInput* in) {
                     for (float& x : in->emb) x *= -5.0f;
                   },
                   m});
    if (c.max_bag > 1 || c.weighted) {
      ModelConfig flipped = m;
      flipped.pooling = m.pooling == Pooling::kMean ? Pooling::kSum : Pooling::kMean;
      out.push_back({"sum and mean pooling swapped", same, flipped});
    }
  }
  if (c.weighted) {
    out.push_back({"bag weights ignored", [](StepInput* in) { in->weights.clear(); }, m});
  }
  if (c.max_bag > 1) {
    out.push_back({"last entry of each bag skipped",
                   [](StepInput* in) {
                     std::vector<uint32_t> offsets{0}, rows;
                     std::vector<float> weights;
                     for (size_t bag = 0; bag + 1 < in->offsets.size(); ++bag) {
                       const uint32_t b = in->offsets[bag], e = in->offsets[bag + 1];
                       for (uint32_t k = b; k + 1 < e; ++k) {
                         rows.push_back(in->rows[k]);
                         if (!in->weights.empty()) weights.push_back(in->weights[k]);
                       }
                       offsets.push_back(static_cast<uint32_t>(rows.size()));
                     }
                     in->offsets = offsets;
                     in->rows = rows;
                     in->weights = weights;
                   },
                   m});
  }
  out.push_back({"row index off by one",
                 [](StepInput* in) {
                   for (uint32_t& r : in->rows) r = (r + 1) % in->num_rows;
                 },
                 m});
  if (m.deep && m.num_dense > 0) {
    out.push_back(
        {"dense features not uploaded",
         [](StepInput* in) { std::fill(in->dense.begin(), in->dense.end(), 0.0f); }, m});
  }
  if (m.wide) {
    out.push_back({"wide weights not read",
                   [](StepInput* in) { std::fill(in->wide.begin(), in->wide.end(), 0.0f); }, m});
  }
  if (m.kind == ModelKind::kDeepFm) {
    // DCN-v2 without cross layers has DeepFM's layout and its DNN: only the FM term differs.
    ModelConfig no_fm = m;
    no_fm.kind = ModelKind::kDcn;
    no_fm.num_cross_layers = 0;
    out.push_back({"FM term left out", same, no_fm});
  }
  if (!layout.cross().empty()) {
    std::vector<LayerShape> cross = layout.cross();
    out.push_back({"cross layers read as zeros (x_L = x0)",
                   [cross](StepInput* in) {
                     for (const LayerShape& l : cross) {
                       std::fill_n(in->params.begin() + l.offset, l.size(), 0.0f);
                     }
                   },
                   m});
  }
  return out;
}

// The comparison at the GPU tolerance rejects what known kinds of wrong kernel would return:
// each mutation below is computed by the CPU backend on altered inputs, as the broken kernel
// would see them.
TEST_P(CpuBackendCase, ComparisonRejectsWrongKernels) {
  const BackendCase& c = GetParam();
  const ModelConfig& m = c.config;
  auto layout = ModelLayout::Create(m);
  ASSERT_TRUE(layout.ok());
  const StepInput prev = MakeModelStep(*layout, c, 0);
  const StepInput s = MakeModelStep(*layout, c, 1);
  const float scale = 0.5f;
  auto run = [&](const ModelConfig& config, const StepInput& in, float sc) {
    auto l = ModelLayout::Create(config);
    auto b = CreateCpuBackend(*l);
    Status st;
    Outputs o = RunStep(b->get(), in, sc, &st);
    EXPECT_TRUE(st.ok()) << st.ToString();
    return o;
  };
  const Outputs ref = run(m, s, scale);
  ASSERT_EQ(CompareAll(*layout, ref, run(m, s, scale)), "");  // deterministic

  struct Mutation {
    std::string name;
    Outputs out;
  };
  std::vector<Mutation> wrong;
  for (const InputMutation& mutation : InputMutations(c, *layout)) {
    StepInput in = s;
    mutation.change(&in);
    wrong.push_back({mutation.name, run(mutation.config, in, scale)});
  }
  wrong.push_back({"loss scale ignored", run(m, s, 1.0f)});
  {
    // A grid that misses the samples of the last partial block of 256.
    StepInput in = s;
    const uint32_t kept = s.batch / 256 * 256;
    in.batch = kept;
    in.offsets.resize(size_t{kept} * m.num_fields + 1);
    in.dense.resize(size_t{kept} * m.num_dense);
    in.labels.resize(kept);
    Outputs o = run(m, in, scale);
    o.probs.resize(s.batch, 0.0f);
    wrong.push_back({"last partial block of samples skipped", o});
  }
  {
    // Gradient buffers not cleared between the two steps of one backend.
    Outputs o = ref;
    const Outputs first = run(m, prev, scale);
    for (size_t i = 0; i < o.grads.params.size(); ++i) o.grads.params[i] += first.grads.params[i];
    wrong.push_back({"dense gradients kept from the previous step", o});
  }
  for (const Mutation& w : wrong) {
    EXPECT_NE(CompareAll(*layout, ref, w.out), "") << c.name << ": not caught: " << w.name;
    std::printf("%s: %s: worst error %.3g of the GPU tolerance\n", c.name.c_str(), w.name.c_str(),
                WorstErrorAll(*layout, ref, w.out));
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, CpuBackendCase, ::testing::ValuesIn(BackendCases()), CaseName);
INSTANTIATE_TEST_SUITE_P(Models, CpuBackendCase, ::testing::ValuesIn(ModelCases()), CaseName);

class GpuCudaBackend : public ::testing::TestWithParam<BackendCase> {};

// The CUDA backend against the CPU backend, element by element per tensor, over two steps of
// one backend object each (the second batch larger: buffers grow and are reused), alternating
// the loss scale; Forward gives the probabilities ForwardBackward gave.
TEST_P(GpuCudaBackend, MatchesCpuBackend) {
  std::string why;
  if (!CudaBackendAvailable(&why)) GTEST_SKIP() << "no GPU for the CUDA backend: " << why;
  const BackendCase& c = GetParam();
  auto layout = ModelLayout::Create(c.config);
  ASSERT_TRUE(layout.ok());
  auto cpu = CreateCpuBackend(*layout);
  auto gpu = CreateCudaBackend(*layout, 0);
  ASSERT_TRUE(gpu.ok()) << gpu.status().ToString();
  for (size_t step = 0; step < c.batches.size(); ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const StepInput s = MakeModelStep(*layout, c, step);
    const float scale = ScaleOf(s, step);
    Status sc, sg;
    const Outputs oc = RunStep(cpu->get(), s, scale, &sc);
    const Outputs og = RunStep(gpu->get(), s, scale, &sg);
    ASSERT_TRUE(sc.ok()) << sc.ToString();
    ASSERT_TRUE(sg.ok()) << sg.ToString();
    EXPECT_EQ(CompareAll(*layout, oc, og), "");
    std::vector<float> pf(s.batch);
    ASSERT_TRUE((*gpu)->Forward(s.Input(), pf.data()).ok());
    for (uint32_t i = 0; i < s.batch; ++i) ASSERT_NEAR(pf[i], og.probs[i], 1e-6) << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, GpuCudaBackend, ::testing::ValuesIn(BackendCases()), CaseName);
// DeepFM and DCN-v2 (FM kernels, cross layers on cuBLAS) against the CPU backend.
INSTANTIATE_TEST_SUITE_P(Models, GpuCudaBackend, ::testing::ValuesIn(ModelCases()), CaseName);

// ForwardBackward of `in` on `gpu` against a fresh CPU backend: "" when they agree (CompareAll),
// else what differs or failed.
std::string GpuVsCpu(const ModelLayout& layout, Backend* gpu, const ModelInput& in, float scale) {
  auto cpu = CreateCpuBackend(layout);
  if (!cpu.ok()) return cpu.status().ToString();
  Outputs oc, og;
  oc.probs.assign(in.batch_size, -1.0f);
  og.probs.assign(in.batch_size, -1.0f);
  const Status sc = (*cpu)->ForwardBackward(in, scale, oc.probs.data(), &oc.grads);
  if (!sc.ok()) return "cpu: " + sc.ToString();
  const Status sg = gpu->ForwardBackward(in, scale, og.probs.data(), &og.grads);
  if (!sg.ok()) return "gpu: " + sg.ToString();
  return CompareAll(layout, oc, og);
}

// The case with two more steps: a small batch, then one larger than all before (the upload
// slots shrink in use, then grow, between staged batches).
BackendCase WithMoreShapes(BackendCase c) {
  c.batches.push_back(7);
  c.rows.push_back(c.rows[0] / 2 + 1);
  c.batches.push_back(2 * c.batches[1] + 3);
  c.rows.push_back(2 * c.rows[1] + 5);
  return c;
}

class GpuCudaBackendStaging : public ::testing::TestWithParam<BackendCase> {};

// As a trainer that overlaps the next batch's upload with this batch's computation:
// Stage(step k + 1), then ForwardBackward(step k), over steps of four shapes back to back. Every
// step equals the CPU backend, and Forward of a staged batch gives ForwardBackward's
// probabilities.
TEST_P(GpuCudaBackendStaging, StageNextThenComputeMatchesCpu) {
  std::string why;
  if (!CudaBackendAvailable(&why)) GTEST_SKIP() << "no GPU for the CUDA backend: " << why;
  const BackendCase c = WithMoreShapes(GetParam());
  auto layout = ModelLayout::Create(c.config);
  ASSERT_TRUE(layout.ok());
  auto gpu = CreateCudaBackend(*layout, 0);
  ASSERT_TRUE(gpu.ok()) << gpu.status().ToString();
  std::vector<StepInput> steps;
  for (size_t k = 0; k < c.batches.size(); ++k) steps.push_back(MakeModelStep(*layout, c, k));
  ASSERT_TRUE((*gpu)->Stage(steps[0].Input()).ok());
  for (size_t k = 0; k < steps.size(); ++k) {
    SCOPED_TRACE("step " + std::to_string(k) + ", batch " + std::to_string(steps[k].batch));
    if (k + 1 < steps.size()) {
      ASSERT_TRUE((*gpu)->Stage(steps[k + 1].Input()).ok());
    }
    EXPECT_EQ(GpuVsCpu(*layout, gpu->get(), steps[k].Input(), ScaleOf(steps[k], k)), "");
  }
  // Forward of a staged batch (labels staged too, unused).
  const StepInput& last = steps.back();
  ASSERT_TRUE((*gpu)->Stage(last.Input()).ok());
  std::vector<float> pf(last.batch), pb(last.batch);
  ASSERT_TRUE((*gpu)->Forward(last.Input(), pf.data()).ok());
  ModelGrads g;
  ASSERT_TRUE((*gpu)->ForwardBackward(last.Input(), 1.0f, pb.data(), &g).ok());
  for (uint32_t i = 0; i < last.batch; ++i) ASSERT_NEAR(pf[i], pb[i], 1e-6) << i;
}

// The batch staged before its parameters are pulled (their pointers null, as while the pulls
// are in flight), then computed with them: equal to the CPU backend; so is the same batch with
// other parameter memory, and with four times the rows (the slot's buffers must grow, which
// loses the staged batch: it is uploaded again).
TEST_P(GpuCudaBackendStaging, BatchStagedBeforeItsParametersMatchesCpu) {
  std::string why;
  if (!CudaBackendAvailable(&why)) GTEST_SKIP() << "no GPU for the CUDA backend: " << why;
  const BackendCase& c = GetParam();
  auto layout = ModelLayout::Create(c.config);
  ASSERT_TRUE(layout.ok());
  auto gpu = CreateCudaBackend(*layout, 0);
  ASSERT_TRUE(gpu.ok()) << gpu.status().ToString();
  const StepInput s = MakeModelStep(*layout, c, 1);
  ModelInput batch_only = s.Input();
  batch_only.params = nullptr;
  batch_only.embeddings = nullptr;
  batch_only.wide = nullptr;
  ASSERT_TRUE((*gpu)->Stage(batch_only).ok());
  EXPECT_EQ(GpuVsCpu(*layout, gpu->get(), s.Input(), 1.0f), "");

  const StepInput other = MakeModelStep(*layout, c, 0);  // other parameter values
  ModelInput mixed = s.Input();
  std::vector<float> params = other.params;
  mixed.params = params.data();
  ASSERT_TRUE((*gpu)->Stage(s.Input()).ok());
  EXPECT_EQ(GpuVsCpu(*layout, gpu->get(), mixed, 0.5f), "");

  StepInput more = s;
  const uint32_t extra = 3 * s.num_rows;
  more.num_rows += extra;
  std::mt19937_64 rng(c.seed);
  std::uniform_real_distribution<float> u(-0.1f, 0.1f);
  for (size_t i = 0; i < size_t{extra} * c.config.embedding_dim && c.config.deep; ++i) {
    more.emb.push_back(u(rng));
  }
  for (size_t i = 0; i < extra && c.config.wide; ++i) more.wide.push_back(u(rng));
  ModelInput grown = s.Input();
  grown.num_rows = more.num_rows;
  grown.embeddings = more.emb.data();
  grown.wide = more.wide.data();
  ASSERT_TRUE((*gpu)->Stage(batch_only).ok());
  EXPECT_EQ(GpuVsCpu(*layout, gpu->get(), grown, 1.0f), "");
}

INSTANTIATE_TEST_SUITE_P(Cases, GpuCudaBackendStaging, ::testing::ValuesIn(BackendCases()),
                         CaseName);
INSTANTIATE_TEST_SUITE_P(Models, GpuCudaBackendStaging, ::testing::ValuesIn(ModelCases()),
                         CaseName);

// A call on another batch than the staged one computes its own (the staged one waits for its
// call); a third Stage replaces the oldest of two; a batch staged without labels is uploaded
// again by ForwardBackward; a staged batch never computed expires (or is dropped by Stage of
// an empty batch) and its refilled memory is uploaded again; missing pointers are refused.
TEST(GpuCudaBackendStagingEdges, OtherBatchesThirdStageAndRefusals) {
  std::string why;
  if (!CudaBackendAvailable(&why)) GTEST_SKIP() << "no GPU for the CUDA backend: " << why;
  const BackendCase c = WithMoreShapes(BackendCases()[2]);
  auto layout = ModelLayout::Create(c.config);
  ASSERT_TRUE(layout.ok());
  auto gpu = CreateCudaBackend(*layout, 0);
  ASSERT_TRUE(gpu.ok()) << gpu.status().ToString();
  Backend* b = gpu->get();
  std::vector<StepInput> s;
  for (size_t k = 0; k < c.batches.size(); ++k) s.push_back(MakeModelStep(*layout, c, k));

  ASSERT_TRUE(b->Stage(s[0].Input()).ok());
  EXPECT_EQ(GpuVsCpu(*layout, b, s[1].Input(), 1.0f), "") << "a batch other than the staged one";
  EXPECT_EQ(GpuVsCpu(*layout, b, s[0].Input(), 1.0f), "") << "the staged batch after another";

  for (size_t k = 0; k < 3; ++k) ASSERT_TRUE(b->Stage(s[k].Input()).ok());
  for (size_t k = 0; k < 3; ++k) {
    EXPECT_EQ(GpuVsCpu(*layout, b, s[k].Input(), 1.0f), "") << "three staged, step " << k;
  }

  ModelInput no_labels = s[3].Input();
  no_labels.labels = nullptr;
  ASSERT_TRUE(b->Stage(no_labels).ok());
  EXPECT_EQ(GpuVsCpu(*layout, b, s[3].Input(), 1.0f), "") << "staged without labels";

  // A batch staged and then abandoned, its memory refilled with another batch of the same
  // size (same pointers): not taken for it after two calls on other batches, nor after Stage
  // of an empty batch.
  auto refill = [](StepInput* x) {
    for (float& y : x->labels) y = 1.0f - y;
    for (float& v : x->emb) v = -2.0f * v;
    for (float& v : x->dense) v = 0.5f - v;
  };
  StepInput reused = s[1];
  ASSERT_TRUE(b->Stage(reused.Input()).ok());
  EXPECT_EQ(GpuVsCpu(*layout, b, s[0].Input(), 1.0f), "");
  EXPECT_EQ(GpuVsCpu(*layout, b, s[2].Input(), 1.0f), "");
  refill(&reused);
  EXPECT_EQ(GpuVsCpu(*layout, b, reused.Input(), 1.0f), "") << "stale batch after two calls";
  ASSERT_TRUE(b->Stage(reused.Input()).ok());
  ModelInput none;
  ASSERT_TRUE(b->Stage(none).ok());
  refill(&reused);
  EXPECT_EQ(GpuVsCpu(*layout, b, reused.Input(), 1.0f), "") << "stale batch after a drop";

  ModelInput bad = s[1].Input();
  bad.rows = nullptr;
  EXPECT_EQ(b->Stage(bad).code(), StatusCode::kInvalidArgument);
  bad = s[1].Input();
  bad.dense = nullptr;
  EXPECT_EQ(b->Stage(bad).code(), StatusCode::kInvalidArgument);
  ModelInput empty = s[1].Input();
  empty.batch_size = 0;
  EXPECT_TRUE(b->Stage(empty).ok());
  EXPECT_EQ(GpuVsCpu(*layout, b, s[1].Input(), 1.0f), "") << "after the refusals";
}

TEST(GpuCudaBackendEdges, EmptyBatchBadRowsAndMissingDevice) {
  std::string why;
  if (!CudaBackendAvailable(&why)) GTEST_SKIP() << "no GPU for the CUDA backend: " << why;
  const BackendCase c = BackendCases()[1];
  auto layout = ModelLayout::Create(c.config);
  auto gpu = CreateCudaBackend(*layout, 0);
  ASSERT_TRUE(gpu.ok()) << gpu.status().ToString();
  StepInput s = MakeModelStep(*layout, c, 0);
  ModelInput in = s.Input();
  in.batch_size = 0;
  ModelGrads g;
  float p = 0;
  ASSERT_TRUE((*gpu)->ForwardBackward(in, 1.0f, &p, &g).ok());
  EXPECT_EQ(g.params.size(), layout->num_params());
  EXPECT_EQ(g.embeddings.size(), size_t{s.num_rows} * c.config.embedding_dim);
  for (float x : g.params) EXPECT_EQ(x, 0.0f);
  EXPECT_EQ(g.loss_sum, 0.0);
  in = s.Input();
  in.num_rows = 1;  // fewer rows than the batch uses
  std::vector<float> probs(s.batch);
  EXPECT_EQ((*gpu)->ForwardBackward(in, 1.0f, probs.data(), &g).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(CreateCudaBackend(*layout, 4096).status().code(), StatusCode::kInvalidArgument);
}

TEST(CudaBackendWithoutGpu, RefusedWithTheReason) {
  std::string why;
  if (CudaBackendAvailable(&why)) GTEST_SKIP() << "a GPU is present: the Gpu* suites cover it";
  auto layout = ModelLayout::Create(BackendCases()[0].config);
  auto gpu = CreateCudaBackend(*layout, 0);
  EXPECT_EQ(gpu.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_FALSE(why.empty());
  EXPECT_FALSE(CudaDeviceCount().ok());
}

}  // namespace
}  // namespace tessera::worker
