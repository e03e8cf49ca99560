// The embedding-bag kernels alone (worker/embedding_bag.h) against a host loop, at widths that
// take each access path: 16-byte rows (width a multiple of 4, aligned pointers) and floats
// (other widths, or pointers one float off 16 bytes), with sum and mean pooling, weights or
// none, and empty bags. Suite Gpu*: label gpu, skipped with the reason where there is no GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#ifdef TESSERA_WITH_CUDA
#include <cuda_runtime.h>

#include "worker/embedding_bag.h"
#endif

namespace tessera::worker {
namespace {

#ifdef TESSERA_WITH_CUDA

// Device memory of `n` floats (or uint32s) plus `shift` in front, freed at scope exit; at()
// is `shift` elements in, so that shift 1 puts it 4 bytes off the allocation's alignment.
template <typename T>
struct Device {
  Device(size_t n, size_t shift, const std::vector<T>* from = nullptr) : shift(shift) {
    EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&base), (n + shift + 1) * sizeof(T)),
              cudaSuccess);
    cudaMemset(base, 0, (n + shift + 1) * sizeof(T));
    if (from != nullptr && !from->empty()) {
      cudaMemcpy(at(), from->data(), from->size() * sizeof(T), cudaMemcpyHostToDevice);
    }
  }
  ~Device() { cudaFree(base); }
  T* at() const { return base + shift; }
  std::vector<T> Read(size_t n) const {
    std::vector<T> v(n);
    cudaMemcpy(v.data(), at(), n * sizeof(T), cudaMemcpyDeviceToHost);
    return v;
  }
  T* base = nullptr;
  size_t shift;
};

struct Bags {
  std::vector<uint32_t> offsets, rows;
  std::vector<float> weights;  // empty: none
};

Bags MakeBags(uint32_t num_bags, uint32_t table_rows, bool weighted, std::mt19937& rng) {
  Bags b;
  b.offsets.push_back(0);
  for (uint32_t i = 0; i < num_bags; ++i) {
    const uint32_t keys = rng() % 6;  // 0 (an empty bag) to 5
    for (uint32_t k = 0; k < keys; ++k) {
      b.rows.push_back(rng() % table_rows);
      if (weighted) b.weights.push_back(0.5f + static_cast<float>(rng() % 1000) / 1000.0f);
    }
    b.offsets.push_back(static_cast<uint32_t>(b.rows.size()));
  }
  return b;
}

TEST(GpuEmbeddingBag, MatchesAHostLoopAtEveryWidthAndAlignment) {
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus == 0) {
    GTEST_SKIP() << "no GPU: " << cudaGetErrorString(cudaGetLastError());
  }
  constexpr uint32_t kRows = 257, kBags = 300;
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (uint32_t dim : {1u, 4u, 8u, 12u, 33u, 64u, 128u}) {
    for (size_t shift : {size_t{0}, size_t{1}}) {
      for (int variant = 0; variant < 3; ++variant) {  // sum; weighted sum; weighted mean
        const bool weighted = variant > 0, mean = variant == 2;
        SCOPED_TRACE("dim " + std::to_string(dim) + ", shift " + std::to_string(shift) +
                     ", variant " + std::to_string(variant));
        const Bags b = MakeBags(kBags, kRows, weighted, rng);
        std::vector<float> table(size_t{kRows} * dim), d_out(size_t{kBags} * dim);
        for (float& x : table) x = u(rng);
        for (float& x : d_out) x = u(rng);
        // The host loop: the entries of a bag in order, as the kernels add them.
        std::vector<float> want(size_t{kBags} * dim, 0.0f), want_grad(table.size(), 0.0f);
        for (uint32_t i = 0; i < kBags; ++i) {
          float wsum = 0.0f;
          for (uint32_t e = b.offsets[i]; e < b.offsets[i + 1]; ++e) {
            wsum += weighted ? b.weights[e] : 1.0f;
          }
          const float inv = mean && wsum != 0.0f ? 1.0f / wsum : 1.0f;
          for (uint32_t q = 0; q < dim; ++q) {
            float acc = 0.0f;
            for (uint32_t e = b.offsets[i]; e < b.offsets[i + 1]; ++e) {
              const float w = weighted ? b.weights[e] : 1.0f;
              acc += w * table[size_t{b.rows[e]} * dim + q];
              want_grad[size_t{b.rows[e]} * dim + q] += w * (d_out[size_t{i} * dim + q] * inv);
            }
            want[size_t{i} * dim + q] = acc * inv;
          }
        }
        Device<uint32_t> off(b.offsets.size(), 0, &b.offsets), rows(b.rows.size(), 0, &b.rows);
        Device<float> w(b.weights.size(), 0, &b.weights), tab(table.size(), shift, &table);
        Device<float> out(want.size(), shift), inv(kBags, 0), grad(table.size(), shift);
        Device<float> dout(d_out.size(), shift, &d_out);
        EmbeddingBagArgs a;
        a.offsets = off.at();
        a.rows = rows.at();
        a.weights = weighted ? w.at() : nullptr;
        a.table = tab.at();
        a.num_bags = kBags;
        a.dim = dim;
        a.mean = mean;
        a.out = out.at();
        a.inv_denom = mean ? inv.at() : nullptr;
        ASSERT_TRUE(EmbeddingBagForward(a, nullptr).ok());
        ASSERT_TRUE(EmbeddingBagBackward(a, dout.at(), grad.at(), nullptr).ok());
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        const std::vector<float> got = out.Read(want.size()), got_grad = grad.Read(table.size());
        for (size_t i = 0; i < want.size(); ++i) {
          ASSERT_NEAR(got[i], want[i], 1e-5f * (1.0f + std::abs(want[i]))) << "output " << i;
        }
        // Atomic adds: any order of a row's entries.
        for (size_t i = 0; i < want_grad.size(); ++i) {
          ASSERT_NEAR(got_grad[i], want_grad[i], 1e-5f * (4.0f + std::abs(want_grad[i])))
              << "gradient " << i;
        }
      }
    }
  }
}

#else

TEST(GpuEmbeddingBag, MatchesAHostLoopAtEveryWidthAndAlignment) {
  GTEST_SKIP() << "built without CUDA";
}

#endif

}  // namespace
}  // namespace tessera::worker
