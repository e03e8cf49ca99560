// The `tessera` Python module: the batch-side kernels of tessera.torch on the CPU. A batch's
// keys deduplicated into unique keys and each key's index into them (what a pull needs), and
// the pooling of pulled rows into bags and its backward, the scatter-add of the bags' gradients
// into one gradient row per unique key (what a push needs). Each is one pass over the batch in
// C++, where the same in torch ops on the CPU costs several passes and per-index loops.
//
// Arrays are read and written in place (no conversion: a converted copy of `out` would
// receive the result instead of the caller's array). Index checks run inside the loops; a bad
// index raises ValueError after the loop stopped (an `out` may then be partly written).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ps/routing.h"
#include "python/module_internal.h"

namespace tessera::python {
namespace {

void Check1d(const py::array& a, const char* what, int64_t n) {
  if (a.ndim() != 1 || (n >= 0 && a.shape(0) != n)) {
    throw py::value_error(std::string(what) + ": expected a 1-D array" +
                          (n >= 0 ? " of " + std::to_string(n) + " entries" : std::string()) +
                          ", got ndim " + std::to_string(a.ndim()) + " with " +
                          std::to_string(a.size()) + " entries");
  }
}

// rows x dim floats: (rows, dim), or (rows,) when dim is 1.
void CheckRows(const py::array& a, const char* what, int64_t rows, int64_t dim) {
  const bool ok = (a.ndim() == 2 && a.shape(0) == rows && a.shape(1) == dim) ||
                  (a.ndim() == 1 && dim == 1 && a.shape(0) == rows);
  if (!ok) {
    throw py::value_error(std::string(what) + ": expected shape (" + std::to_string(rows) + ", " +
                          std::to_string(dim) + "), got " + std::to_string(a.ndim()) +
                          " dimensions with " + std::to_string(a.size()) + " floats");
  }
}

// The arguments every bag kernel shares, checked: each value's row index, the bags' bounds
// (num_bags + 1, non-decreasing from 0 to num_values; none: one bag per value) and optional
// per-value weights.
struct BagArgs {
  py::array_t<int64_t, py::array::c_style> inverse, bounds;
  std::optional<py::array_t<float, py::array::c_style>> weights;
  int64_t num_values = 0, num_bags = 0;
  const int64_t* inv = nullptr;
  const int64_t* bnd = nullptr;  // null: bag i is value i
  const float* w = nullptr;
};

BagArgs CheckBags(const py::handle& inverse, const py::handle& bounds, const py::handle& weights) {
  BagArgs b;
  b.inverse = Strict<int64_t>(inverse, "inverse", "int64", false);
  Check1d(b.inverse, "inverse", -1);
  b.num_values = b.inverse.shape(0);
  b.inv = b.inverse.data();
  b.num_bags = b.num_values;
  if (!bounds.is_none()) {
    b.bounds = Strict<int64_t>(bounds, "bounds", "int64", false);
    Check1d(b.bounds, "bounds", -1);
    if (b.bounds.shape(0) < 1) {
      throw py::value_error("bounds: expected num_bags + 1 entries, got none");
    }
    b.bnd = b.bounds.data();
    b.num_bags = b.bounds.shape(0) - 1;
    if (b.bnd[0] != 0 || b.bnd[b.num_bags] != b.num_values) {
      throw py::value_error("bounds: must run from 0 to the " + std::to_string(b.num_values) +
                            " values, got " + std::to_string(b.bnd[0]) + " .. " +
                            std::to_string(b.bnd[b.num_bags]));
    }
    for (int64_t i = 0; i < b.num_bags; ++i) {
      if (b.bnd[i + 1] < b.bnd[i]) {
        throw py::value_error("bounds: decreasing at bag " + std::to_string(i) + " (" +
                              std::to_string(b.bnd[i]) + " then " + std::to_string(b.bnd[i + 1]) +
                              ")");
      }
    }
  }
  if (!weights.is_none()) {
    b.weights = Strict<float>(weights, "weights", "float32", false);
    Check1d(*b.weights, "weights", b.num_values);
    b.w = b.weights->data();
  }
  return b;
}

[[noreturn]] void BadIndex(int64_t at, int64_t index, int64_t rows) {
  throw py::value_error("inverse[" + std::to_string(at) + "] = " + std::to_string(index) +
                        " is outside the " + std::to_string(rows) + " rows");
}

// out[b] = sum over bag b's values i of w[i] * rows[inverse[i]] (zeros for an empty bag).
// Returns the first bad value index, or -1.
int64_t PoolLoop(const BagArgs& b, const float* rows, int64_t num_rows, int64_t dim, float* out) {
  for (int64_t bag = 0; bag < b.num_bags; ++bag) {
    const int64_t lo = b.bnd ? b.bnd[bag] : bag;
    const int64_t hi = b.bnd ? b.bnd[bag + 1] : bag + 1;
    float* o = out + bag * dim;
    std::fill(o, o + dim, 0.0f);
    for (int64_t i = lo; i < hi; ++i) {
      const int64_t r = b.inv[i];
      if (r < 0 || r >= num_rows) return i;
      const float* src = rows + r * dim;
      const float wi = b.w ? b.w[i] : 1.0f;
      for (int64_t d = 0; d < dim; ++d) o[d] += wi * src[d];
    }
  }
  return -1;
}

// grad_rows[inverse[i]] += w[i] * grad_out[bag of i], for every value i.
int64_t ScatterLoop(const BagArgs& b, const float* grad_out, int64_t num_rows, int64_t dim,
                    float* grad_rows) {
  for (int64_t bag = 0; bag < b.num_bags; ++bag) {
    const int64_t lo = b.bnd ? b.bnd[bag] : bag;
    const int64_t hi = b.bnd ? b.bnd[bag + 1] : bag + 1;
    const float* g = grad_out + bag * dim;
    for (int64_t i = lo; i < hi; ++i) {
      const int64_t r = b.inv[i];
      if (r < 0 || r >= num_rows) return i;
      float* dst = grad_rows + r * dim;
      const float wi = b.w ? b.w[i] : 1.0f;
      for (int64_t d = 0; d < dim; ++d) dst[d] += wi * g[d];
    }
  }
  return -1;
}

// Sorted unique keys and each key's index into them: a hash pass finds the unique keys in
// order of first appearance, a sort of those (not of every key) orders them.
void UniqueLoop(const uint64_t* keys, int64_t n, std::vector<uint64_t>& uniq, int64_t* inverse) {
  size_t cap = 16;
  while (cap < static_cast<size_t>(n) * 2) cap <<= 1;
  const size_t mask = cap - 1;
  std::vector<int64_t> slot(cap, -1);  // index into uniq
  uniq.clear();
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t k = keys[i];
    size_t s = Mix64(k) & mask;
    while (slot[s] >= 0 && uniq[slot[s]] != k) s = (s + 1) & mask;
    if (slot[s] < 0) {
      slot[s] = static_cast<int64_t>(uniq.size());
      uniq.push_back(k);
    }
    inverse[i] = slot[s];
  }
  std::vector<int64_t> order(uniq.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return uniq[a] < uniq[b]; });
  std::vector<int64_t> rank(uniq.size());
  std::vector<uint64_t> sorted(uniq.size());
  for (size_t r = 0; r < order.size(); ++r) {
    rank[order[r]] = static_cast<int64_t>(r);
    sorted[r] = uniq[order[r]];
  }
  for (int64_t i = 0; i < n; ++i) inverse[i] = rank[inverse[i]];
  uniq.swap(sorted);
}

}  // namespace

void RegisterBags(py::module_& m) {
  m.def(
      "unique_keys",
      [](py::handle keys) {
        auto k = Strict<uint64_t>(keys, "keys", "uint64", false);
        Check1d(k, "keys", -1);
        const int64_t n = k.shape(0);
        py::array_t<int64_t> inverse(n);
        int64_t* inv = inverse.mutable_data();
        const uint64_t* src = k.data();
        std::vector<uint64_t> uniq;
        MaybeWithoutGil(n, [&] { UniqueLoop(src, n, uniq, inv); });
        py::array_t<uint64_t> out(static_cast<py::ssize_t>(uniq.size()));
        if (!uniq.empty()) {
          std::memcpy(out.mutable_data(), uniq.data(), uniq.size() * sizeof(uint64_t));
        }
        return py::make_tuple(out, inverse);
      },
      py::arg("keys"),
      "(unique, inverse) of a 1-D C-contiguous uint64 array: its distinct keys in increasing "
      "order (uint64) and, for each key, its index into them (int64): unique[inverse] == keys.");
  m.def(
      "bag_sum",
      [](py::handle rows, py::handle inverse, py::handle bounds, py::handle weights,
         py::handle out) {
        BagArgs b = CheckBags(inverse, bounds, weights);
        auto r = Strict<float>(rows, "rows", "float32", false);
        if (r.ndim() != 2 && r.ndim() != 1) {
          throw py::value_error("rows: expected shape (num_rows, dim)");
        }
        const int64_t num_rows = r.shape(0), dim = r.ndim() == 2 ? r.shape(1) : 1;
        auto o = Strict<float>(out, "out", "float32", true);
        CheckRows(o, "out", b.num_bags, dim);
        const float* src = r.data();
        float* dst = o.mutable_data();
        const int64_t bad = MaybeWithoutGil(b.num_values * dim,
                                            [&] { return PoolLoop(b, src, num_rows, dim, dst); });
        if (bad >= 0) BadIndex(bad, b.inv[bad], num_rows);
      },
      py::arg("rows"), py::arg("inverse"), py::arg("bounds"), py::arg("weights"), py::arg("out"),
      "out[j] = sum of weights[i] * rows[inverse[i]] over the values i of bag j, the values "
      "bounds[j] <= i < bounds[j + 1] (bounds None: bag j is value j; weights None: 1). rows "
      "(num_rows, dim) and out (num_bags, dim) float32, inverse and bounds int64, weights "
      "float32; all C-contiguous, none converted. out is overwritten (empty bags: zeros).");
  m.def(
      "bag_sum_backward",
      [](py::handle grad_out, py::handle inverse, py::handle bounds, py::handle weights,
         py::handle grad_rows) {
        BagArgs b = CheckBags(inverse, bounds, weights);
        auto gr = Strict<float>(grad_rows, "grad_rows", "float32", true);
        if (gr.ndim() != 2 && gr.ndim() != 1) {
          throw py::value_error("grad_rows: expected shape (num_rows, dim)");
        }
        const int64_t num_rows = gr.shape(0), dim = gr.ndim() == 2 ? gr.shape(1) : 1;
        auto go = Strict<float>(grad_out, "grad_out", "float32", false);
        CheckRows(go, "grad_out", b.num_bags, dim);
        const float* src = go.data();
        float* dst = gr.mutable_data();
        const int64_t bad = MaybeWithoutGil(
            b.num_values * dim, [&] { return ScatterLoop(b, src, num_rows, dim, dst); });
        if (bad >= 0) BadIndex(bad, b.inv[bad], num_rows);
      },
      py::arg("grad_out"), py::arg("inverse"), py::arg("bounds"), py::arg("weights"),
      py::arg("grad_rows"),
      "The backward of bag_sum: grad_rows[inverse[i]] += weights[i] * grad_out[bag of i] for "
      "every value i (repeated keys' gradients summed). grad_rows is added to, not cleared.");
}

}  // namespace tessera::python
