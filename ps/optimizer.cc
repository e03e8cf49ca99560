#include "ps/optimizer.h"

#include <cmath>

#include "ps/vector_clones_internal.h"

namespace tessera {

void Optimizer::InitState(float* state, uint32_t dim) const {
  const uint32_t n = StateFloats(dim);
  for (uint32_t i = 0; i < n; ++i) state[i] = 0.0f;
}

namespace {

// The element-wise optimizers' loops, as functions of their own: one clone per instruction
// set (ps/vector_clones_internal.h; a virtual function cannot be cloned itself).
TESSERA_VECTOR_CLONES
void SgdLoop(float* w, const float* g, uint32_t begin, uint32_t end, float lr, float l2) {
  for (uint32_t j = begin; j < end; ++j) w[j] -= lr * (g[j - begin] + l2 * w[j]);
}

TESSERA_VECTOR_CLONES
void MomentumLoop(float* w, float* m, const float* g, uint32_t begin, uint32_t end, float lr,
                  float mu, float l2) {
  for (uint32_t j = begin; j < end; ++j) {
    m[j] = mu * m[j] + g[j - begin] + l2 * w[j];
    w[j] -= lr * m[j];
  }
}

TESSERA_VECTOR_CLONES
void AdagradLoop(float* w, float* a, const float* g, uint32_t begin, uint32_t end, float lr,
                 float eps, float l2) {
  for (uint32_t j = begin; j < end; ++j) {
    const float gj = g[j - begin] + l2 * w[j];
    a[j] += gj * gj;
    w[j] -= lr * gj / (std::sqrt(a[j]) + eps);
  }
}

TESSERA_VECTOR_CLONES
void AdamLoop(float* w, float* m, float* v, const float* g, uint32_t begin, uint32_t end,
              float lr_t, float b1, float b2, float eps, float l2) {
  for (uint32_t j = begin; j < end; ++j) {
    const float gj = g[j - begin] + l2 * w[j];
    m[j] = b1 * m[j] + (1 - b1) * gj;
    v[j] = b2 * v[j] + (1 - b2) * gj * gj;
    w[j] -= lr_t * m[j] / (std::sqrt(v[j]) + eps);
  }
}

class Sgd final : public Optimizer {
 public:
  using Optimizer::Optimizer;
  uint32_t StateFloats(uint32_t) const override { return 0; }
  void Apply(float* w, float*, const float* g, uint32_t, uint32_t begin, uint32_t end,
             uint64_t, float lr_scale) const override {
    SgdLoop(w, g, begin, end, spec_.learning_rate * lr_scale, spec_.l2);
  }
};

class Momentum final : public Optimizer {
 public:
  using Optimizer::Optimizer;
  uint32_t StateFloats(uint32_t dim) const override { return dim; }
  void Apply(float* w, float* m, const float* g, uint32_t, uint32_t begin, uint32_t end,
             uint64_t, float lr_scale) const override {
    MomentumLoop(w, m, g, begin, end, spec_.learning_rate * lr_scale, spec_.momentum, spec_.l2);
  }
};

class Adagrad final : public Optimizer {
 public:
  using Optimizer::Optimizer;
  uint32_t StateFloats(uint32_t dim) const override { return dim; }
  void InitState(float* a, uint32_t dim) const override {
    for (uint32_t j = 0; j < dim; ++j) a[j] = spec_.initial_accumulator;
  }
  void Apply(float* w, float* a, const float* g, uint32_t, uint32_t begin, uint32_t end,
             uint64_t, float lr_scale) const override {
    AdagradLoop(w, a, g, begin, end, spec_.learning_rate * lr_scale, spec_.epsilon, spec_.l2);
  }
};

class RowwiseAdagrad final : public Optimizer {
 public:
  using Optimizer::Optimizer;
  uint32_t StateFloats(uint32_t) const override { return 1; }
  void InitState(float* a, uint32_t) const override { a[0] = spec_.initial_accumulator; }
  void Apply(float* w, float* a, const float* g, uint32_t, uint32_t begin, uint32_t end,
             uint64_t, float lr_scale) const override {
    if (end <= begin) return;
    const float l2 = spec_.l2;
    double sq = 0;
    for (uint32_t j = begin; j < end; ++j) {
      const double gj = double{g[j - begin]} + double{l2} * w[j];
      sq += gj * gj;
    }
    a[0] += static_cast<float>(sq / (end - begin));
    const float scale = spec_.learning_rate * lr_scale / (std::sqrt(a[0]) + spec_.epsilon);
    for (uint32_t j = begin; j < end; ++j) w[j] -= scale * (g[j - begin] + l2 * w[j]);
  }
};

class Adam final : public Optimizer {
 public:
  using Optimizer::Optimizer;
  uint32_t StateFloats(uint32_t dim) const override { return 2 * dim; }
  void Apply(float* w, float* s, const float* g, uint32_t dim, uint32_t begin, uint32_t end,
             uint64_t step, float lr_scale) const override {
    const float b1 = spec_.beta1, b2 = spec_.beta2;
    const double t = static_cast<double>(step == 0 ? 1 : step);
    const float lr_t = static_cast<float>(double{spec_.learning_rate} * lr_scale *
                                          std::sqrt(1.0 - std::pow(double{b2}, t)) /
                                          (1.0 - std::pow(double{b1}, t)));
    AdamLoop(w, s, s + dim, g, begin, end, lr_t, b1, b2, spec_.epsilon, spec_.l2);
  }
};

// FTRL-Proximal, per-coordinate learning rates (McMahan et al., KDD 2013, Algorithm 1).
// State planes: z, n. The value is a closed form of (z, n).
class Ftrl final : public Optimizer {
 public:
  using Optimizer::Optimizer;
  uint32_t StateFloats(uint32_t dim) const override { return 2 * dim; }
  bool ValueFromStateOnly() const override { return true; }
  void Apply(float* w, float* s, const float* g, uint32_t dim, uint32_t begin, uint32_t end,
             uint64_t, float) const override {
    float* z = s;
    float* n = s + dim;
    const float alpha = spec_.learning_rate, beta = spec_.ftrl_beta, l1 = spec_.l1, l2 = spec_.l2;
    for (uint32_t j = begin; j < end; ++j) {
      const float gj = g[j - begin];
      const float n_new = n[j] + gj * gj;
      const float sigma = (std::sqrt(n_new) - std::sqrt(n[j])) / alpha;
      z[j] += gj - sigma * w[j];
      n[j] = n_new;
      if (std::fabs(z[j]) <= l1) {
        w[j] = 0.0f;
      } else {
        const float sign = z[j] > 0 ? 1.0f : -1.0f;
        w[j] = -(z[j] - sign * l1) / ((beta + std::sqrt(n[j])) / alpha + l2);
      }
    }
  }
};

}  // namespace

std::unique_ptr<Optimizer> Optimizer::Make(const OptimizerSpec& spec) {
  switch (spec.kind) {
    case OptimizerKind::kSgd:
      return std::unique_ptr<Optimizer>(new Sgd(spec));
    case OptimizerKind::kMomentum:
      return std::unique_ptr<Optimizer>(new Momentum(spec));
    case OptimizerKind::kAdagrad:
      return std::unique_ptr<Optimizer>(new Adagrad(spec));
    case OptimizerKind::kRowwiseAdagrad:
      return std::unique_ptr<Optimizer>(new RowwiseAdagrad(spec));
    case OptimizerKind::kAdam:
      return std::unique_ptr<Optimizer>(new Adam(spec));
    case OptimizerKind::kFtrl:
      return std::unique_ptr<Optimizer>(new Ftrl(spec));
  }
  return std::unique_ptr<Optimizer>(new Sgd(spec));
}

}  // namespace tessera
