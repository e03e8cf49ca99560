// The `tessera` Python module: DLRM's dot interaction on the CPU, forward and backward, for
// tessera.torch.dot_interaction. For each sample, the n = 1 + F vectors of width d (the dense
// vector, then the F pooled fields) give [dense vector, the dots <v_i, v_j> of every pair
// j < i in row order (i = 1..n-1, j = 0..i-1)]. torch 1.13's CPU bmm runs one small GEMM
// per sample with a dispatch each, and the pair gather and its backward (index_put) add
// several passes over a (B, n, n) tensor; here it is one pass per sample over its n x d floats.
//
// Arrays are read and written in place (checked, never converted), as bags.cc's kernels.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "python/module_internal.h"

namespace tessera::python {
namespace {

struct Shapes {
  int64_t batch = 0, fields = 0, dim = 0, width = 0;  // width: dim + pairs
};

// dense (B, d) and sparse (B, F, d), float32, C-contiguous.
Shapes CheckInputs(const py::array& dense, const py::array& sparse) {
  if (dense.ndim() != 2) {
    throw py::value_error("dense: expected shape (batch, dim), got " +
                          std::to_string(dense.ndim()) + " dimensions");
  }
  if (sparse.ndim() != 3 || sparse.shape(0) != dense.shape(0) ||
      sparse.shape(2) != dense.shape(1)) {
    throw py::value_error("sparse: expected shape (" + std::to_string(dense.shape(0)) +
                          ", fields, " + std::to_string(dense.shape(1)) + ") to match dense, got " +
                          std::to_string(sparse.ndim()) + " dimensions with " +
                          std::to_string(sparse.size()) + " floats");
  }
  Shapes s;
  s.batch = dense.shape(0);
  s.dim = dense.shape(1);
  s.fields = sparse.shape(1);
  const int64_t n = s.fields + 1;
  s.width = s.dim + n * (n - 1) / 2;
  return s;
}

void CheckOut(const py::array& a, const char* what, int64_t rows, int64_t cols) {
  if (a.ndim() != 2 || a.shape(0) != rows || a.shape(1) != cols) {
    throw py::value_error(std::string(what) + ": expected shape (" + std::to_string(rows) + ", " +
                          std::to_string(cols) + "), got " + std::to_string(a.ndim()) +
                          " dimensions with " + std::to_string(a.size()) + " floats");
  }
}

// The kernels work on blocks of kLanes floats (fixed-length loops the compiler turns into
// vector instructions), over buffers padded with zeros to whole blocks.
constexpr int64_t kLanes = 8;

int64_t Padded(int64_t x) { return (x + kLanes - 1) / kLanes * kLanes; }

// x86-64: a copy for AVX2 with FMA besides the baseline one, picked at load time.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define TESSERA_VECTOR_CLONES __attribute__((target_clones("default", "arch=haswell")))
#else
#define TESSERA_VECTOR_CLONES
#endif

// Per sample: its n vectors transposed into d rows of np floats (vt[k * np + j] = v_j[k],
// zeros past n), then for each i the dots with v_0 .. v_{i-1} a block of kLanes j at a time.
TESSERA_VECTOR_CLONES
void ForwardLoop(const Shapes& s, const float* dense, const float* sparse, float* out) {
  const int64_t n = s.fields + 1, d = s.dim, np = Padded(n);
  std::vector<float> vt(static_cast<size_t>(d * np), 0.0f);
  for (int64_t b = 0; b < s.batch; ++b) {
    const float* v0 = dense + b * d;
    const float* fields = sparse + b * s.fields * d;
    float* o = out + b * s.width;
    std::copy(v0, v0 + d, o);
    for (int64_t k = 0; k < d; ++k) vt[k * np] = v0[k];
    for (int64_t j = 1; j < n; ++j) {
      const float* v = fields + (j - 1) * d;
      for (int64_t k = 0; k < d; ++k) vt[k * np + j] = v[k];
    }
    float* dots = o + d;
    for (int64_t i = 1; i < n; ++i) {
      float* row = dots + i * (i - 1) / 2;  // the dots of v_i with v_0 .. v_{i-1}
      for (int64_t j0 = 0; j0 < i; j0 += kLanes) {
        float acc[kLanes] = {};
        for (int64_t k = 0; k < d; ++k) {
          const float a = vt[k * np + i];
          const float* col = vt.data() + k * np + j0;
          for (int64_t l = 0; l < kLanes; ++l) acc[l] += a * col[l];
        }
        const int64_t m = std::min(kLanes, i - j0);
        for (int64_t l = 0; l < m; ++l) row[j0 + l] = acc[l];
      }
    }
  }
}

// grad_v_i = sum over pairs (i, j) of g_ij v_j plus sum over pairs (j, i) of g_ji v_j; the
// dense vector's gradient also gets grad_out's first d columns (the pass-through). Rows are
// padded to dp floats (zeros past d).
TESSERA_VECTOR_CLONES
void BackwardLoop(const Shapes& s, const float* grad_out, const float* dense, const float* sparse,
                  float* grad_dense, float* grad_sparse) {
  const int64_t n = s.fields + 1, d = s.dim, dp = Padded(d);
  std::vector<float> v(static_cast<size_t>(n * dp), 0.0f), gv(static_cast<size_t>(n * dp));
  for (int64_t b = 0; b < s.batch; ++b) {
    const float* g = grad_out + b * s.width;
    std::copy(dense + b * d, dense + (b + 1) * d, v.begin());
    for (int64_t j = 1; j < n; ++j) {
      const float* src = sparse + (b * s.fields + j - 1) * d;
      std::copy(src, src + d, v.begin() + j * dp);
    }
    std::fill(gv.begin(), gv.end(), 0.0f);
    std::copy(g, g + d, gv.begin());
    const float* dots = g + d;
    for (int64_t i = 1; i < n; ++i) {
      const float* gi = dots + i * (i - 1) / 2;
      for (int64_t k0 = 0; k0 < dp; k0 += kLanes) {
        // v_i's block and its gradient in locals: the stores into gv (rows j < i) cannot
        // alias them, so the lane loops vectorize.
        float vi[kLanes], acc[kLanes] = {};
        std::copy(v.data() + i * dp + k0, v.data() + i * dp + k0 + kLanes, vi);
        for (int64_t j = 0; j < i; ++j) {
          const float gij = gi[j];
          const float* vj = v.data() + j * dp + k0;
          float* gvj = gv.data() + j * dp + k0;
          for (int64_t l = 0; l < kLanes; ++l) {
            acc[l] += gij * vj[l];
            gvj[l] += gij * vi[l];
          }
        }
        float* gvi = gv.data() + i * dp + k0;
        for (int64_t l = 0; l < kLanes; ++l) gvi[l] += acc[l];
      }
    }
    std::copy(gv.begin(), gv.begin() + d, grad_dense + b * d);
    for (int64_t j = 1; j < n; ++j) {
      std::copy(gv.begin() + j * dp, gv.begin() + j * dp + d,
                grad_sparse + (b * s.fields + j - 1) * d);
    }
  }
}

}  // namespace

void RegisterInteraction(py::module_& m) {
  m.def(
      "dot_interaction",
      [](py::handle dense, py::handle sparse, py::handle out) {
        auto de = Strict<float>(dense, "dense", "float32", false);
        auto sp = Strict<float>(sparse, "sparse", "float32", false);
        const Shapes s = CheckInputs(de, sp);
        auto o = Strict<float>(out, "out", "float32", true);
        CheckOut(o, "out", s.batch, s.width);
        const float* dp = de.data();
        const float* spp = sp.data();
        float* op = o.mutable_data();
        MaybeWithoutGil(s.batch * s.width * s.dim, [&] { ForwardLoop(s, dp, spp, op); });
      },
      py::arg("dense"), py::arg("sparse"), py::arg("out"),
      "DLRM's dot interaction: for dense (B, d) and sparse (B, F, d), out (B, d + n(n-1)/2) "
      "with n = F + 1 gets [dense, <v_i, v_j> for i = 1..n-1, j = 0..i-1], where v_0 is the "
      "sample's dense row and v_1..v_F its sparse rows. All float32, C-contiguous, none "
      "converted; out is overwritten.");
  m.def(
      "dot_interaction_backward",
      [](py::handle grad_out, py::handle dense, py::handle sparse, py::handle grad_dense,
         py::handle grad_sparse) {
        auto de = Strict<float>(dense, "dense", "float32", false);
        auto sp = Strict<float>(sparse, "sparse", "float32", false);
        const Shapes s = CheckInputs(de, sp);
        auto go = Strict<float>(grad_out, "grad_out", "float32", false);
        CheckOut(go, "grad_out", s.batch, s.width);
        auto gd = Strict<float>(grad_dense, "grad_dense", "float32", true);
        CheckOut(gd, "grad_dense", s.batch, s.dim);
        auto gs = Strict<float>(grad_sparse, "grad_sparse", "float32", true);
        if (gs.ndim() != 3 || gs.shape(0) != s.batch || gs.shape(1) != s.fields ||
            gs.shape(2) != s.dim) {
          throw py::value_error("grad_sparse: expected the shape of sparse (" +
                                std::to_string(s.batch) + ", " + std::to_string(s.fields) + ", " +
                                std::to_string(s.dim) + ")");
        }
        const float* gp = go.data();
        const float* dp = de.data();
        const float* spp = sp.data();
        float* gdp = gd.mutable_data();
        float* gsp = gs.mutable_data();
        MaybeWithoutGil(s.batch * s.width * s.dim,
                        [&] { BackwardLoop(s, gp, dp, spp, gdp, gsp); });
      },
      py::arg("grad_out"), py::arg("dense"), py::arg("sparse"), py::arg("grad_dense"),
      py::arg("grad_sparse"),
      "The backward of dot_interaction: grad_dense (B, d) and grad_sparse (B, F, d) are "
      "overwritten with the gradients of dense and sparse given grad_out (B, d + n(n-1)/2).");
}

}  // namespace tessera::python
