// The CPU model's matrix products built with AVX2 and FMA (CMake compiles this file alone with
// -mavx2 -mfma); the CPU backend calls them only where the CPU has both (FloatGemmsFor). Eigen is
// renamed in this file so that none of its template instances (compiled for AVX2 here) is
// merged by the linker with the default target's instances of the same templates, which run on
// every CPU. Only plain functions of namespace internal::avx2 leave this file.
#define Eigen tessera_eigen_avx2
#define TESSERA_CPU_ISA avx2
#include "worker/cpu_gemm_internal.h"

#if !defined(__AVX2__) || !defined(__FMA__)
#error "cpu_gemm_avx2.cc must be compiled with -mavx2 -mfma"
#endif

namespace tessera::worker::internal::avx2 {

void GemmABtF(int64_t m, int64_t n, int64_t k, const float* a, const float* b, float* c,
              bool accumulate) {
  GemmABt<float>(m, n, k, a, b, c, accumulate);
}
void GemmAtBF(int64_t m, int64_t n, int64_t k, const float* a, const float* b, float* c,
              bool accumulate) {
  GemmAtB<float>(m, n, k, a, b, c, accumulate);
}
void GemmABF(int64_t m, int64_t n, int64_t k, const float* a, const float* b, float* c,
             bool accumulate) {
  GemmAB<float>(m, n, k, a, b, c, accumulate);
}

}  // namespace tessera::worker::internal::avx2
