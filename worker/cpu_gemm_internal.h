// The CPU model's matrix products (row-major, Eigen), compiled once per instruction set: by
// every file that includes cpu_model_internal.h for the compiler's default target (namespace
// internal::generic), and by cpu_gemm_avx2.cc with AVX2 and FMA (internal::avx2, Eigen renamed
// there so that no template instance is shared between the two). Internal.
#pragma once

#include <Eigen/Core>
#include <cstdint>

#ifndef TESSERA_CPU_ISA
#define TESSERA_CPU_ISA generic
#endif

namespace tessera::worker::internal::TESSERA_CPU_ISA {

template <typename T>
using RowMajorMatrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

/// c (m x n) = a (m x k) b^T, b being n x k; += when accumulate. Row-major, dense.
template <typename T>
void GemmABt(int64_t m, int64_t n, int64_t k, const T* a, const T* b, T* c, bool accumulate) {
  Eigen::Map<const RowMajorMatrix<T>> am(a, m, k), bm(b, n, k);
  Eigen::Map<RowMajorMatrix<T>> cm(c, m, n);
  if (accumulate) {
    cm.noalias() += am * bm.transpose();
  } else {
    cm.noalias() = am * bm.transpose();
  }
}

/// c (m x n) = a^T b, a being k x m and b k x n; += when accumulate.
template <typename T>
void GemmAtB(int64_t m, int64_t n, int64_t k, const T* a, const T* b, T* c, bool accumulate) {
  Eigen::Map<const RowMajorMatrix<T>> am(a, k, m), bm(b, k, n);
  Eigen::Map<RowMajorMatrix<T>> cm(c, m, n);
  if (accumulate) {
    cm.noalias() += am.transpose() * bm;
  } else {
    cm.noalias() = am.transpose() * bm;
  }
}

/// c (m x n) = a (m x k) b (k x n); += when accumulate.
template <typename T>
void GemmAB(int64_t m, int64_t n, int64_t k, const T* a, const T* b, T* c, bool accumulate) {
  Eigen::Map<const RowMajorMatrix<T>> am(a, m, k), bm(b, k, n);
  Eigen::Map<RowMajorMatrix<T>> cm(c, m, n);
  if (accumulate) {
    cm.noalias() += am * bm;
  } else {
    cm.noalias() = am * bm;
  }
}

}  // namespace tessera::worker::internal::TESSERA_CPU_ISA
