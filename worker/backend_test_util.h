// Test cases for the compute backends, built so that a wrong kernel cannot pass: random
// parameters scaled by 1/sqrt(fan_in) (live ReLUs, non-zero gradients everywhere), multi-key
// weighted bags with empty ones, batch and row counts that divide no block size, two steps of
// one backend with a growing batch; and a comparison that is element-wise per tensor. Used by
// cuda_backend_test.cc and nccl_reducer_test.cc. Test-only.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <ostream>
#include <random>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "worker/backend.h"
#include "worker/model.h"

namespace tessera::worker::testing {

/// One model and its steps.
struct BackendCase {
  std::string name;
  ModelConfig config;
  /// Batch size of each step (run one after the other on one backend object).
  std::vector<uint32_t> batches;
  /// Distinct rows of each step's pulled parameters.
  std::vector<uint32_t> rows;
  /// Keys per bag are uniform in [0, max_bag] (0: empty bags).
  uint32_t max_bag = 1;
  bool weighted = false;
  uint64_t seed = 1;
};

inline ModelConfig CaseConfig(uint32_t num_dense, uint32_t num_fields, uint32_t dim,
                              std::vector<uint32_t> bottom, std::vector<uint32_t> top,
                              Pooling pooling, bool deep, bool wide) {
  ModelConfig c;
  c.num_dense = num_dense;
  c.num_fields = num_fields;
  c.embedding_dim = dim;
  c.bottom_mlp = std::move(bottom);
  c.top_mlp = std::move(top);
  c.pooling = pooling;
  c.deep = deep;
  c.wide = wide;
  return c;
}

/// Test names and ctest print a case by its name.
inline void PrintTo(const BackendCase& c, std::ostream* os) { *os << c.name; }

/// The cases. Batches and row counts are chosen so that none divides 32 or 256.
inline std::vector<BackendCase> BackendCases() {
  std::vector<BackendCase> v;
  // The production shape: 13 dense features, 26 one-key fields, width 8, sum pooling.
  v.push_back({"criteo_shape",
               CaseConfig(13, 26, 8, {32}, {32}, Pooling::kSum, true, true),
               {300, 1037},
               {1531, 2903},
               1,
               false,
               11});
  v.push_back({"weighted_multikey_sum",
               CaseConfig(5, 6, 5, {7}, {9, 4}, Pooling::kSum, true, true),
               {37, 301},
               {97, 613},
               4,
               true,
               12});
  v.push_back({"mean_pooling_dense_weighted",
               CaseConfig(4, 5, 16, {12}, {20}, Pooling::kMean, true, true),
               {129, 517},
               {211, 997},
               5,
               true,
               13});
  v.push_back({"deep_only_mean_no_dense",
               CaseConfig(0, 7, 8, {}, {16, 8}, Pooling::kMean, true, false),
               {100, 257},
               {151, 389},
               3,
               false,
               14});
  v.push_back({"wide_only",
               CaseConfig(3, 9, 8, {}, {}, Pooling::kSum, false, true),
               {1, 1001},
               {7, 1999},
               4,
               true,
               15});
  v.push_back({"width_33_two_lane_passes",
               CaseConfig(3, 3, 33, {10}, {6}, Pooling::kSum, true, true),
               {65, 130},
               {33, 77},
               3,
               true,
               16});
  return v;
}

/// One step's inputs, owned.
struct StepInput {
  uint32_t batch = 0, num_rows = 0;
  std::vector<uint32_t> offsets, rows;
  std::vector<float> weights, dense, labels, emb, wide, params;

  ModelInput Input() const {
    ModelInput in;
    in.batch_size = batch;
    in.dense = dense.data();
    in.labels = labels.data();
    in.offsets = offsets.data();
    in.rows = rows.data();
    in.weights = weights.empty() ? nullptr : weights.data();
    in.num_rows = num_rows;
    in.embeddings = emb.data();
    in.wide = wide.data();
    in.params = params.data();
    return in;
  }
};

/// Step `step` of case `c`. Rows are drawn with a skew (some rows in many bags, so gradient
/// atomics collide), bags hold 0..max_bag entries and may repeat a row.
inline StepInput MakeStep(const ModelLayout& layout, const BackendCase& c, size_t step) {
  const ModelConfig& m = layout.config();
  std::mt19937_64 rng(c.seed * 1000 + step);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  StepInput s;
  s.batch = c.batches[step];
  s.num_rows = c.rows[step];
  s.offsets.push_back(0);
  std::uniform_int_distribution<uint32_t> bag_size(0, c.max_bag);
  for (uint32_t i = 0; i < s.batch * m.num_fields; ++i) {
    const uint32_t k = c.max_bag <= 1 ? c.max_bag : bag_size(rng);
    for (uint32_t e = 0; e < k; ++e) {
      const float x = 0.5f * (u(rng) + 1.0f);
      s.rows.push_back(std::min(s.num_rows - 1, static_cast<uint32_t>(x * x * s.num_rows)));
      if (c.weighted) s.weights.push_back(1.0f + 0.75f * u(rng));
    }
    s.offsets.push_back(static_cast<uint32_t>(s.rows.size()));
  }
  for (uint32_t i = 0; i < s.batch * m.num_dense; ++i) s.dense.push_back(n01(rng));
  for (uint32_t i = 0; i < s.batch; ++i) s.labels.push_back(u(rng) > 0 ? 1.0f : 0.0f);
  if (m.deep) {
    for (uint32_t i = 0; i < s.num_rows * m.embedding_dim; ++i) s.emb.push_back(0.5f * n01(rng));
  }
  if (m.wide) {
    for (uint32_t i = 0; i < s.num_rows; ++i) s.wide.push_back(0.3f * n01(rng));
  }
  s.params.assign(layout.num_params(), 0.0f);
  s.params[layout.bias_offset()] = 0.1f;
  auto init = [&](const std::vector<LayerShape>& layers) {
    for (const LayerShape& l : layers) {
      // He-uniform for ReLU layers, LeCun-uniform for the linear output: variance 2/fan_in or
      // 1/fan_in keeps activations O(1) and about half the ReLUs live.
      const float a = std::sqrt((l.relu ? 6.0f : 3.0f) / static_cast<float>(l.in));
      for (uint64_t i = 0; i < uint64_t{l.out} * l.in; ++i) s.params[l.offset + i] = a * u(rng);
      for (uint32_t j = 0; j < l.out; ++j) {
        s.params[l.offset + uint64_t{l.out} * l.in + j] = 0.1f * u(rng);
      }
    }
  };
  init(layout.bottom());
  init(layout.top());
  return s;
}

/// What a backend returned for one step.
struct Outputs {
  std::vector<float> probs;
  ModelGrads grads;
};

/// Runs ForwardBackward; on failure the status is in *error.
inline Outputs RunStep(Backend* backend, const StepInput& s, float scale, Status* error) {
  Outputs o;
  o.probs.assign(s.batch, -1.0f);
  *error = backend->ForwardBackward(s.Input(), scale, o.probs.data(), &o.grads);
  return o;
}

/// A named part of the outputs.
struct Tensor {
  std::string name;
  std::span<const float> values;
};

/// The outputs cut into tensors: probs, the global bias, each layer's weights and biases, the
/// wide and the embedding gradients.
inline std::vector<Tensor> Tensors(const ModelLayout& layout, const Outputs& o) {
  std::vector<Tensor> t;
  t.push_back({"probs", o.probs});
  const std::vector<float>& p = o.grads.params;
  if (p.size() != layout.num_params()) {
    t.push_back({"params (wrong size)", p});
  } else {
    t.push_back({"bias", std::span<const float>(p).subspan(layout.bias_offset(), 1)});
    auto layers = [&](const std::vector<LayerShape>& ls, const std::string& what) {
      for (size_t i = 0; i < ls.size(); ++i) {
        const LayerShape& l = ls[i];
        const uint64_t w = uint64_t{l.out} * l.in;
        t.push_back(
            {what + std::to_string(i) + ".W", std::span<const float>(p).subspan(l.offset, w)});
        t.push_back({what + std::to_string(i) + ".b",
                     std::span<const float>(p).subspan(l.offset + w, l.out)});
      }
    };
    layers(layout.bottom(), "bottom");
    layers(layout.top(), "top");
  }
  t.push_back({"wide", o.grads.wide});
  t.push_back({"embeddings", o.grads.embeddings});
  return t;
}

/// Element-wise tolerance of one tensor: |got - ref| <= rtol |ref| + atol_rms * rms(ref).
/// The CPU backend in float differs from the double model by at most 2.2% of it on every case
/// (so a GPU in float, also rounding differently, has a margin of about 20x); every mutation of
/// ComparisonRejectsWrongKernels exceeds it at least 9 times, most by 1000 times or more.
struct Tolerance {
  double rtol = 5e-4;
  double atol_rms = 5e-5;
};

/// The largest error of `got` against `ref`, over every element of every tensor and the loss,
/// in units of the factor-1 tolerance of CompareOutputs (below 1: within it). Infinite when the
/// sizes differ.
inline double WorstError(const ModelLayout& layout, const Outputs& ref, const Outputs& got) {
  const Tolerance tol;
  const std::vector<Tensor> a = Tensors(layout, ref), b = Tensors(layout, got);
  double worst = 0;
  for (size_t t = 0; t < a.size(); ++t) {
    if (b.size() != a.size() || a[t].values.size() != b[t].values.size()) return INFINITY;
    double sq = 0;
    for (float x : a[t].values) sq += double{x} * x;
    const double rms = a[t].values.empty() ? 0 : std::sqrt(sq / a[t].values.size());
    for (size_t i = 0; i < a[t].values.size(); ++i) {
      const double r = a[t].values[i], g = b[t].values[i];
      worst =
          std::max(worst, std::abs(g - r) / (tol.rtol * std::abs(r) + tol.atol_rms * rms + 1e-12));
    }
  }
  const double la = ref.grads.loss_sum, lb = got.grads.loss_sum;
  return std::max(worst, std::abs(la - lb) / (1e-4 * std::abs(la) + 1e-9));
}

/// "" when `got` matches `ref` tensor by tensor (and in the loss, relative 1e-4 x factor), else
/// a report of the mismatches: counts per tensor and the first few elements. `factor` scales
/// both tolerances.
inline std::string CompareOutputs(const ModelLayout& layout, const Outputs& ref, const Outputs& got,
                                  double factor = 1.0) {
  const Tolerance tol{Tolerance().rtol * factor, Tolerance().atol_rms * factor};
  std::ostringstream report;
  const std::vector<Tensor> a = Tensors(layout, ref), b = Tensors(layout, got);
  for (size_t t = 0; t < a.size(); ++t) {
    if (b.size() != a.size() || a[t].values.size() != b[t].values.size() ||
        a[t].name != b[t].name) {
      report << a[t].name << ": " << a[t].values.size() << " values expected, got "
             << (t < b.size() ? b[t].values.size() : 0) << "\n";
      continue;
    }
    double sq = 0;
    for (float x : a[t].values) sq += double{x} * x;
    const double rms = a[t].values.empty() ? 0 : std::sqrt(sq / a[t].values.size());
    size_t bad = 0;
    std::ostringstream first;
    for (size_t i = 0; i < a[t].values.size(); ++i) {
      const double r = a[t].values[i], g = b[t].values[i];
      if (!(std::abs(g - r) <= tol.rtol * std::abs(r) + tol.atol_rms * rms + 1e-12)) {
        if (bad < 3) first << " [" << i << "] " << r << " vs " << g << ";";
        ++bad;
      }
    }
    if (bad > 0) {
      report << a[t].name << ": " << bad << " of " << a[t].values.size() << " differ (rms " << rms
             << "):" << first.str() << "\n";
    }
  }
  const double la = ref.grads.loss_sum, lb = got.grads.loss_sum;
  if (!(std::abs(la - lb) <= 1e-4 * factor * std::abs(la) + 1e-9)) {
    report << "loss_sum: " << la << " vs " << lb << "\n";
  }
  return report.str();
}

}  // namespace tessera::worker::testing
