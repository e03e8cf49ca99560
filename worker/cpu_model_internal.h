// The CPU implementation of the click model, templated on the scalar type so that gradient
// checks can run it in double precision. Internal: use CreateCpuBackend.
#pragma once

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <vector>

#include "worker/cpu_gemm_internal.h"
#include "worker/model.h"

namespace tessera::worker::internal {

template <typename T>
struct InputT {
  uint32_t batch_size = 0;
  const T* dense = nullptr;
  const T* labels = nullptr;
  const uint32_t* offsets = nullptr;
  const uint32_t* rows = nullptr;
  const T* weights = nullptr;
  uint32_t num_rows = 0;
  const T* embeddings = nullptr;
  const T* wide = nullptr;
  const T* params = nullptr;
};

template <typename T>
struct GradsT {
  std::vector<T> embeddings, wide, params;
  double loss_sum = 0;
};

/// The matrix products the model runs (row-major; see cpu_gemm_internal.h), for one instruction
/// set.
template <typename T>
struct CpuGemms {
  using Fn = void (*)(int64_t m, int64_t n, int64_t k, const T* a, const T* b, T* c,
                      bool accumulate);
  Fn ab_t;  // c = a b^T
  Fn at_b;  // c = a^T b
  Fn ab;    // c = a b
  const char* isa;
};

/// The products compiled for the compiler's default target (every CPU of the architecture).
template <typename T>
const CpuGemms<T>& GenericGemms() {
  static const CpuGemms<T> gemms{&generic::GemmABt<T>, &generic::GemmAtB<T>,
                                 &generic::GemmAB<T>, "generic"};
  return gemms;
}

/// Float products for `isa`: "auto" (the fastest this build has that the CPU runs), "generic",
/// or "avx2" (AVX2 and FMA; nullptr where the build or the CPU lacks them). nullptr for an
/// unknown name. Defined in cpu_backend.cc.
const CpuGemms<float>* FloatGemmsFor(std::string_view isa);

/// Forward and backward of the model on a CPU. Not thread-safe; splits a batch over `threads`
/// OpenMP threads.
template <typename T>
class CpuModel {
 public:
  using Mat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  using Vec = Eigen::Matrix<T, Eigen::Dynamic, 1>;
  using RowVec = Eigen::Matrix<T, 1, Eigen::Dynamic>;
  using CMap = Eigen::Map<const Mat>;
  using MMap = Eigen::Map<Mat>;

  CpuModel(const ModelLayout& layout, int threads,
           const CpuGemms<T>& gemms = GenericGemms<T>())
      : layout_(layout), threads_(std::max(threads, 1)), gemms_(gemms) {}

  /// The instruction set of the matrix products.
  const char* isa() const { return gemms_.isa; }

  /// grads == nullptr: forward only.
  void Run(const InputT<T>& in, T loss_scale, T* probs, GradsT<T>* grads) {
    const ModelConfig& c = layout_.config();
    const uint32_t b = in.batch_size;
    const int nt =
        static_cast<int>(std::max<uint32_t>(1, std::min<uint32_t>(threads_, (b + 255) / 256)));
    if (grads != nullptr) {
      grads->embeddings.assign(c.deep ? size_t{in.num_rows} * c.embedding_dim : 0, T(0));
      grads->wide.assign(c.wide ? in.num_rows : 0, T(0));
      grads->params.assign(layout_.num_params(), T(0));
      grads->loss_sum = 0;
    }
    if (b == 0) return;
    if (static_cast<int>(local_.size()) < nt) local_.resize(nt);
    if (static_cast<int>(workspaces_.size()) < nt) workspaces_.resize(nt);
    const uint32_t chunk = (b + nt - 1) / nt;
#ifdef _OPENMP
#pragma omp parallel for num_threads(nt) schedule(static, 1) if (nt > 1)
#endif
    for (int t = 0; t < nt; ++t) {
      const uint32_t s0 = std::min(b, t * chunk), s1 = std::min(b, s0 + chunk);
      GradsT<T>* g = grads;
      if (grads != nullptr && t > 0) {
        g = &local_[t];
        g->embeddings.assign(grads->embeddings.size(), T(0));
        g->wide.assign(grads->wide.size(), T(0));
        g->params.assign(grads->params.size(), T(0));
        g->loss_sum = 0;
      }
      if (s1 > s0) RunChunk(in, s0, s1, loss_scale, probs, g, workspaces_[t]);
    }
    if (grads != nullptr) {
      for (int t = 1; t < nt; ++t) {
        const GradsT<T>& g = local_[t];
        Add(g.embeddings, &grads->embeddings);
        Add(g.wide, &grads->wide);
        Add(g.params, &grads->params);
        grads->loss_sum += g.loss_sum;
      }
    }
  }

 private:
  static void Add(const std::vector<T>& from, std::vector<T>* to) {
    for (size_t i = 0; i < from.size(); ++i) (*to)[i] += from[i];
  }

  Eigen::Map<const RowVec> BiasOf(const T* params, const LayerShape& l) const {
    return Eigen::Map<const RowVec>(params + l.offset + uint64_t{l.out} * l.in, l.out);
  }
  // z = x W^T + b for layer l (the MLPs' and DCN's cross layers' affine part).
  void Affine(const Mat& x, const T* params, const LayerShape& l, Mat* z) const {
    z->resize(x.rows(), l.out);
    gemms_.ab_t(x.rows(), l.out, l.in, x.data(), params + l.offset, z->data(), false);
    z->rowwise() += BiasOf(params, l);
  }

  // Runs layers on `acts[0]`, filling acts[1..]; returns the last activation.
  void Mlp(const std::vector<LayerShape>& layers, const T* params, std::vector<Mat>* acts) const {
    for (size_t i = 0; i < layers.size(); ++i) {
      const LayerShape& l = layers[i];
      Mat& z = (*acts)[i + 1];
      Affine((*acts)[i], params, l, &z);
      if (l.relu) z = z.cwiseMax(T(0));
    }
  }

  // Backward through layers given (*d)[layers.size()] = d(last activation): (*d)[i] becomes
  // d(acts[i]) (for i = 0 only when want_input). One matrix per layer boundary, so each keeps
  // its shape from batch to batch (Eigen reallocates on every change of size).
  void MlpBackward(const std::vector<LayerShape>& layers, const T* params,
                   const std::vector<Mat>& acts, std::vector<Mat>* d, T* grad_params,
                   bool want_input) const {
    for (size_t i = layers.size(); i-- > 0;) {
      const LayerShape& l = layers[i];
      Mat& di = (*d)[i + 1];
      if (l.relu) di = di.cwiseProduct((acts[i + 1].array() > T(0)).matrix().template cast<T>());
      const int64_t rows = di.rows();
      gemms_.at_b(l.out, l.in, rows, di.data(), acts[i].data(), grad_params + l.offset, true);
      Eigen::Map<RowVec>(grad_params + l.offset + uint64_t{l.out} * l.in, l.out) +=
          di.colwise().sum();
      if (i > 0 || want_input) {
        Mat& prev = (*d)[i];
        prev.resize(rows, l.in);
        gemms_.ab(rows, l.in, l.out, di.data(), params + l.offset, prev.data(), false);
      }
    }
  }

  // Per-thread buffers kept between calls (no allocation or page faults per batch).
  struct Workspace {
    std::vector<Mat> bottom_acts, top_acts;
    // DCN-v2: cross_x[l] = x_l (x_0 = x0 = tm), cross_z[l] = x_l W_l^T + b_l.
    std::vector<Mat> cross_x, cross_z;
    Mat tm, dtm, dx, dcross;
    std::vector<Mat> dtop, dbottom;  // gradients of top_acts, bottom_acts
    Vec logit, g, denom;
    // DLRM: kLanes samples' vectors and gradients (lanes), one row of S, the terms' vectors.
    std::vector<T> lanes, dlanes, srow, acc;
    std::vector<const T*> vptr;
  };

  T WeightOf(const InputT<T>& in, uint32_t e) const { return in.weights ? in.weights[e] : T(1); }

  // Forward (and, when grads is set, backward) of samples [s0, s1). The formulas of the three
  // kinds are in model.h (ModelKind).
  void RunChunk(const InputT<T>& in, uint32_t s0, uint32_t s1, T scale, T* probs, GradsT<T>* grads,
                Workspace& ws) const {
    const ModelConfig& c = layout_.config();
    const uint32_t bc = s1 - s0, nf = c.num_fields;
    Vec& logit = ws.logit;
    logit.setConstant(bc, in.params[layout_.bias_offset()]);
    if (c.wide) {
      for (uint32_t s = 0; s < bc; ++s) {
        const uint32_t b = in.offsets[size_t{s0 + s} * nf], e = in.offsets[size_t{s0 + s + 1} * nf];
        T sum = 0;
        for (uint32_t k = b; k < e; ++k) sum += WeightOf(in, k) * in.wide[in.rows[k]];
        logit[s] += sum;
      }
    }
    if (c.deep) {
      PoolForward(in, s0, bc, ws);
      ws.top_acts.resize(layout_.top().size() + 1);
      switch (c.kind) {
        case ModelKind::kDlrm:
          DotsForward(bc, ws);
          break;
        case ModelKind::kDeepFm:
          ws.top_acts[0] = ws.tm;
          FmForward(bc, ws.tm, &logit);
          break;
        case ModelKind::kDcn:
          CrossForward(in.params, ws);
          ws.top_acts[0] = ws.cross_x.back();
          break;
      }
      Mlp(layout_.top(), in.params, &ws.top_acts);
      logit += ws.top_acts.back().col(0);
    }
    for (uint32_t s = 0; s < bc; ++s) probs[s0 + s] = T(1) / (T(1) + std::exp(-logit[s]));
    if (grads == nullptr) return;

    Vec& g = ws.g;
    g.resize(bc);
    double loss = 0;
    for (uint32_t s = 0; s < bc; ++s) {
      const T y = in.labels[s0 + s], l = logit[s];
      loss += static_cast<double>(std::max(l, T(0)) - y * l + std::log1p(std::exp(-std::abs(l))));
      g[s] = (probs[s0 + s] - y) * scale;
    }
    grads->loss_sum += loss;
    grads->params[layout_.bias_offset()] += g.sum();
    if (c.wide) {
      for (uint32_t s = 0; s < bc; ++s) {
        const uint32_t b = in.offsets[size_t{s0 + s} * nf], e = in.offsets[size_t{s0 + s + 1} * nf];
        for (uint32_t k = b; k < e; ++k) grads->wide[in.rows[k]] += g[s] * WeightOf(in, k);
      }
    }
    if (!c.deep) return;
    ws.dtop.resize(layout_.top().size() + 1);
    ws.dtop.back() = g;
    MlpBackward(layout_.top(), in.params, ws.top_acts, &ws.dtop, grads->params.data(), true);
    ws.dx.swap(ws.dtop[0]);  // same shape from batch to batch: no reallocation
    switch (c.kind) {
      case ModelKind::kDlrm:
        DotsBackward(bc, ws);
        break;
      case ModelKind::kDeepFm:
        FmBackward(bc, ws);
        break;
      case ModelKind::kDcn:
        CrossBackward(in.params, grads->params.data(), ws);
        break;
    }
    PoolBackward(in, s0, bc, ws, grads);
  }

  // ws.tm (bc x n*d) = [bottom MLP output (with dense features), pooled field 0, field 1, ...];
  // ws.denom the mean pooling's weight sums.
  void PoolForward(const InputT<T>& in, uint32_t s0, uint32_t bc, Workspace& ws) const {
    const ModelConfig& c = layout_.config();
    const uint32_t nf = c.num_fields, nd = c.num_dense, d = c.embedding_dim;
    const uint32_t n = layout_.num_vectors();
    const bool hb = nd > 0;
    Mat& tm = ws.tm;
    tm.setZero(bc, size_t{n} * d);
    if (hb) {
      std::vector<Mat>& bottom_acts = ws.bottom_acts;
      bottom_acts.resize(layout_.bottom().size() + 1);
      bottom_acts[0] = CMap(in.dense + size_t{s0} * nd, bc, nd);
      Mlp(layout_.bottom(), in.params, &bottom_acts);
      tm.leftCols(d) = bottom_acts.back();
    }
    Vec& denom = ws.denom;
    denom.setOnes(size_t{bc} * nf);
    for (uint32_t s = 0; s < bc; ++s) {
      for (uint32_t f = 0; f < nf; ++f) {
        const size_t bag = size_t{s0 + s} * nf + f;
        T* out = tm.row(s).data() + size_t{f + (hb ? 1 : 0)} * d;
        T wsum = 0;
        for (uint32_t k = in.offsets[bag]; k < in.offsets[bag + 1]; ++k) {
          const T w = WeightOf(in, k);
          const T* row = in.embeddings + size_t{in.rows[k]} * d;
          for (uint32_t j = 0; j < d; ++j) out[j] += w * row[j];
          wsum += w;
        }
        if (c.pooling == Pooling::kMean && wsum != T(0)) {
          denom[size_t{s} * nf + f] = wsum;
          for (uint32_t j = 0; j < d; ++j) out[j] /= wsum;
        }
      }
    }
  }

  // Bottom MLP and embedding gradients from ws.dtm = d(loss)/d(tm).
  void PoolBackward(const InputT<T>& in, uint32_t s0, uint32_t bc, Workspace& ws,
                    GradsT<T>* grads) const {
    const ModelConfig& c = layout_.config();
    const uint32_t nf = c.num_fields, d = c.embedding_dim;
    const bool hb = c.num_dense > 0;
    const Mat& dtm = ws.dtm;
    if (hb) {
      ws.dbottom.resize(layout_.bottom().size() + 1);
      ws.dbottom.back() = dtm.leftCols(d);
      MlpBackward(layout_.bottom(), in.params, ws.bottom_acts, &ws.dbottom, grads->params.data(),
                  false);
    }
    for (uint32_t s = 0; s < bc; ++s) {
      for (uint32_t f = 0; f < nf; ++f) {
        const size_t bag = size_t{s0 + s} * nf + f;
        const T* dp = dtm.row(s).data() + size_t{f + (hb ? 1 : 0)} * d;
        const T inv = c.pooling == Pooling::kMean ? T(1) / ws.denom[size_t{s} * nf + f] : T(1);
        for (uint32_t k = in.offsets[bag]; k < in.offsets[bag + 1]; ++k) {
          const T w = WeightOf(in, k) * inv;
          T* out = grads->embeddings.data() + size_t{in.rows[k]} * d;
          for (uint32_t j = 0; j < d; ++j) out[j] += w * dp[j];
        }
      }
    }
  }

  // DLRM's interaction works on kLanes samples at a time with the samples innermost ("lanes":
  // element (i, q) of the block's samples at lanes[(i * d + q) * kLanes + l]), so that every
  // operation is on a whole SIMD register of samples whatever d and n are, and each dot still
  // sums q = 0, 1, ..., d - 1 in order. A block past the batch's end is padded with zero samples.
  // kLanes: one register of the widest vector unit this file is compiled for.
#ifdef __AVX__
  static constexpr uint32_t kVectorBytes = 32;
#else
  static constexpr uint32_t kVectorBytes = 16;
#endif
  static constexpr uint32_t kLanes = kVectorBytes / sizeof(T);

  // Copies `rows` rows (samples s0..) of the columns [c0, c0 + w) of m into lanes (zeros past
  // `rows`).
  static void ToLanes(const Mat& m, uint32_t s0, uint32_t rows, size_t c0, size_t w, T* lanes) {
    if (rows == kLanes) {  // a full block: the lanes written in order
      const T* src[kLanes];
      for (uint32_t l = 0; l < kLanes; ++l) src[l] = m.row(s0 + l).data() + c0;
      for (size_t e = 0; e < w; ++e, lanes += kLanes) {
        for (uint32_t l = 0; l < kLanes; ++l) lanes[l] = src[l][e];
      }
      return;
    }
    for (uint32_t l = 0; l < kLanes; ++l) {
      if (l < rows) {
        const T* src = m.row(s0 + l).data() + c0;
        for (size_t e = 0; e < w; ++e) lanes[e * kLanes + l] = src[e];
      } else {
        for (size_t e = 0; e < w; ++e) lanes[e * kLanes + l] = T(0);
      }
    }
  }

  // kLanes values of T as one GCC/Clang vector (the compiler splits it into the registers the
  // target has); element-wise + and * on it round as the scalar operations do.
  typedef T LaneVec __attribute__((vector_size(kLanes * sizeof(T))));
  static LaneVec LoadLanes(const T* p) {
    LaneVec v;
    std::memcpy(&v, p, sizeof(v));
    return v;
  }
  static void StoreLanes(T* p, const LaneVec& v) { std::memcpy(p, &v, sizeof(v)); }

  // Up to kBlock dots at once (independent sums that the CPU overlaps): acc[k][l] = sum over
  // q = 0, 1, ..., d - 1 (in order) of a[q][l] b_k[q][l], b_k = b + k * d * kLanes, k < nb.
  static constexpr uint32_t kBlock = 4;
  static void DotLanes(uint32_t d, uint32_t nb, const T* a, const T* b, T* acc) {
    const size_t stride = size_t{d} * kLanes;
    if (nb == kBlock) {
      LaneVec c0 = {}, c1 = {}, c2 = {}, c3 = {};
      for (uint32_t q = 0; q < d; ++q, a += kLanes, b += kLanes) {
        const LaneVec x = LoadLanes(a);
        c0 += x * LoadLanes(b);
        c1 += x * LoadLanes(b + stride);
        c2 += x * LoadLanes(b + 2 * stride);
        c3 += x * LoadLanes(b + 3 * stride);
      }
      StoreLanes(acc, c0);
      StoreLanes(acc + kLanes, c1);
      StoreLanes(acc + 2 * kLanes, c2);
      StoreLanes(acc + 3 * kLanes, c3);
      return;
    }
    for (uint32_t k = 0; k < nb; ++k) {
      LaneVec c = {};
      const T* bk = b + k * stride;
      for (uint32_t q = 0; q < d; ++q) c += LoadLanes(a + q * kLanes) * LoadLanes(bk + q * kLanes);
      StoreLanes(acc + k * kLanes, c);
    }
  }

  // For q in [q0, q0 + nq), nq <= kBlock: out[q][l] = init[q][l] (zero when init is null) plus
  // the sum over m = 0, 1, ..., nterms - 1 (in order) of s[m][l] v_m[q][l], v_m = vs[m].
  static void SumLanes(uint32_t q0, uint32_t nq, uint32_t nterms, const T* init, const T* s,
                       const T* const* vs, T* out) {
    const size_t o = size_t{q0} * kLanes;
    if (nq == kBlock) {
      LaneVec c0 = {}, c1 = {}, c2 = {}, c3 = {};
      if (init != nullptr) {
        c0 = LoadLanes(init + o);
        c1 = LoadLanes(init + o + kLanes);
        c2 = LoadLanes(init + o + 2 * kLanes);
        c3 = LoadLanes(init + o + 3 * kLanes);
      }
      for (uint32_t m = 0; m < nterms; ++m, s += kLanes) {
        const LaneVec x = LoadLanes(s);
        const T* v = vs[m] + o;
        c0 += x * LoadLanes(v);
        c1 += x * LoadLanes(v + kLanes);
        c2 += x * LoadLanes(v + 2 * kLanes);
        c3 += x * LoadLanes(v + 3 * kLanes);
      }
      StoreLanes(out + o, c0);
      StoreLanes(out + o + kLanes, c1);
      StoreLanes(out + o + 2 * kLanes, c2);
      StoreLanes(out + o + 3 * kLanes, c3);
      return;
    }
    for (uint32_t k = 0; k < nq; ++k) {
      const size_t ok = o + size_t{k} * kLanes;
      LaneVec c = {};
      if (init != nullptr) c = LoadLanes(init + ok);
      for (uint32_t m = 0; m < nterms; ++m) c += LoadLanes(s + m * kLanes) * LoadLanes(vs[m] + ok);
      StoreLanes(out + ok, c);
    }
  }

  // DLRM: top_acts[0] = [bottom output (with dense features), v_i . v_j for i > j].
  void DotsForward(uint32_t bc, Workspace& ws) const {
    const uint32_t d = layout_.config().embedding_dim, n = layout_.num_vectors();
    const bool hb = layout_.config().num_dense > 0;
    const uint32_t dot0 = hb ? d : 0;
    Mat& x = ws.top_acts[0];
    x.resize(bc, layout_.top_input());
    if (hb) x.leftCols(d) = ws.bottom_acts.back();
    ws.lanes.resize(size_t{n} * d * kLanes);
    T* const v = ws.lanes.data();
    for (uint32_t s0 = 0; s0 < bc; s0 += kLanes) {
      const uint32_t rows = std::min(kLanes, bc - s0);
      ToLanes(ws.tm, s0, rows, 0, size_t{n} * d, v);
      uint32_t p = 0;
      for (uint32_t i = 1; i < n; ++i) {
        const T* vi = v + size_t{i} * d * kLanes;
        for (uint32_t j = 0; j < i; j += kBlock) {
          const uint32_t nb = std::min(kBlock, i - j);
          T acc[kBlock * kLanes];
          DotLanes(d, nb, vi, v + size_t{j} * d * kLanes, acc);
          for (uint32_t l = 0; l < rows; ++l) {
            T* xs = x.row(s0 + l).data() + dot0 + p;
            for (uint32_t k = 0; k < nb; ++k) xs[k] = acc[k * kLanes + l];
          }
          p += nb;
        }
      }
    }
  }

  // DLRM: ws.dtm from ws.dx = d(loss)/d(top input): per sample dV = S V with S symmetric,
  // S_ij = d(loss)/d(v_i . v_j), zero diagonal. Row i sums j = 0, 1, ..., n - 1 in order (j = i
  // left out; after the bottom output's direct gradient for i = 0), as the CUDA kernel does.
  void DotsBackward(uint32_t bc, Workspace& ws) const {
    const uint32_t d = layout_.config().embedding_dim, n = layout_.num_vectors();
    const bool hb = layout_.config().num_dense > 0;
    const uint32_t dot0 = hb ? d : 0;
    const size_t pairs = size_t{n} * (n - 1) / 2;
    Mat& dtm = ws.dtm;
    dtm.resize(bc, size_t{n} * d);
    ws.lanes.resize(size_t{n} * d * kLanes);
    ws.dlanes.resize((pairs + d) * kLanes);
    ws.srow.resize(size_t{n} * kLanes);
    ws.acc.resize(size_t{d} * kLanes);
    ws.vptr.resize(n);
    T* const v = ws.lanes.data();
    T* const g = ws.dlanes.data();  // [direct gradient of v_0 (d), dots' gradients (pairs)]
    const T* const gd = g + size_t{d} * kLanes;
    T* const srow = ws.srow.data();
    T* const acc = ws.acc.data();
    const T** const vs = ws.vptr.data();
    for (uint32_t s0 = 0; s0 < bc; s0 += kLanes) {
      const uint32_t rows = std::min(kLanes, bc - s0);
      ToLanes(ws.tm, s0, rows, 0, size_t{n} * d, v);
      if (hb) ToLanes(ws.dx, s0, rows, 0, d, g);
      ToLanes(ws.dx, s0, rows, dot0, pairs, g + size_t{d} * kLanes);
      for (uint32_t i = 0; i < n; ++i) {
        // The terms j != i in order: S_ij is dot i (i - 1) / 2 + j for j < i, j (j - 1) / 2 + i
        // for j > i.
        uint32_t m = 0;
        for (uint32_t j = 0; j < n; ++j) {
          if (j == i) continue;
          const size_t pij = j < i ? size_t{i} * (i - 1) / 2 + j : size_t{j} * (j - 1) / 2 + i;
          std::copy(gd + pij * kLanes, gd + (pij + 1) * kLanes, srow + size_t{m} * kLanes);
          vs[m++] = v + size_t{j} * d * kLanes;
        }
        const T* init = hb && i == 0 ? g : nullptr;
        for (uint32_t q0 = 0; q0 < d; q0 += kBlock) {
          SumLanes(q0, std::min(kBlock, d - q0), m, init, srow, vs, acc);
        }
        for (uint32_t l = 0; l < rows; ++l) {
          T* out = dtm.row(s0 + l).data() + size_t{i} * d;
          for (uint32_t q = 0; q < d; ++q) out[q] = acc[q * kLanes + l];
        }
      }
    }
  }

  // DeepFM: logit[s] += 1/2 sum_q [(sum_i v_iq)^2 - sum_i v_iq^2], v_i the vectors of row s of tm.
  void FmForward(uint32_t bc, const Mat& tm, Vec* logit) const {
    const uint32_t d = layout_.config().embedding_dim, n = layout_.num_vectors();
    for (uint32_t s = 0; s < bc; ++s) {
      const T* ts = tm.row(s).data();
      T fm = 0;
      for (uint32_t q = 0; q < d; ++q) {
        T sum = 0, sq = 0;
        for (uint32_t i = 0; i < n; ++i) {
          const T v = ts[size_t{i} * d + q];
          sum += v;
          sq += v * v;
        }
        fm += sum * sum - sq;
      }
      (*logit)[s] += T(0.5) * fm;
    }
  }

  // DeepFM: d/dv_iq of the FM term is sum_j v_jq - v_iq; the DNN's input is tm itself.
  void FmBackward(uint32_t bc, Workspace& ws) const {
    const uint32_t d = layout_.config().embedding_dim, n = layout_.num_vectors();
    Mat& dtm = ws.dtm;
    dtm = ws.dx;
    for (uint32_t s = 0; s < bc; ++s) {
      const T* ts = ws.tm.row(s).data();
      T* dts = dtm.row(s).data();
      const T gs = ws.g[s];
      for (uint32_t q = 0; q < d; ++q) {
        T sum = 0;
        for (uint32_t i = 0; i < n; ++i) sum += ts[size_t{i} * d + q];
        for (uint32_t i = 0; i < n; ++i)
          dts[size_t{i} * d + q] += gs * (sum - ts[size_t{i} * d + q]);
      }
    }
  }

  // DCN-v2: x_0 = tm; z_l = x_l W_l^T + b_l; x_{l+1} = x_0 ⊙ z_l + x_l (rows are samples).
  void CrossForward(const T* params, Workspace& ws) const {
    const std::vector<LayerShape>& cross = layout_.cross();
    ws.cross_x.resize(cross.size() + 1);
    ws.cross_z.resize(cross.size());
    ws.cross_x[0] = ws.tm;
    for (size_t l = 0; l < cross.size(); ++l) {
      Mat& z = ws.cross_z[l];
      Affine(ws.cross_x[l], params, cross[l], &z);
      ws.cross_x[l + 1] = ws.tm.cwiseProduct(z) + ws.cross_x[l];
    }
  }

  // DCN-v2 backward from ws.dx = d(loss)/d(x_L): with dx = d/dx_{l+1}, dz_l = dx ⊙ x_0,
  // d/dx_0 (direct) += dx ⊙ z_l, dW_l += dz_l^T x_l, db_l += sum of dz_l's rows, and
  // d/dx_l = dx + dz_l W_l. ws.dtm = every path into x_0 = tm.
  void CrossBackward(const T* params, T* grad_params, Workspace& ws) const {
    const std::vector<LayerShape>& cross = layout_.cross();
    Mat& dtm = ws.dtm;
    dtm.setZero(ws.tm.rows(), ws.tm.cols());
    Mat& dx = ws.dcross;
    dx = ws.dx;
    for (size_t l = cross.size(); l-- > 0;) {
      const LayerShape& w = cross[l];
      const Mat dz = dx.cwiseProduct(ws.tm);
      dtm += dx.cwiseProduct(ws.cross_z[l]);
      gemms_.at_b(w.out, w.in, dz.rows(), dz.data(), ws.cross_x[l].data(), grad_params + w.offset,
                  true);
      Eigen::Map<RowVec>(grad_params + w.offset + uint64_t{w.out} * w.in, w.out) +=
          dz.colwise().sum();
      gemms_.ab(dx.rows(), w.in, w.out, dz.data(), params + w.offset, dx.data(), true);
    }
    dtm += dx;
  }

  const ModelLayout& layout_;
  int threads_;
  const CpuGemms<T>& gemms_;
  std::vector<GradsT<T>> local_;
  std::vector<Workspace> workspaces_;
};

}  // namespace tessera::worker::internal
