#pragma once

// TESSERA_VECTOR_CLONES: a hot loop compiled twice, for AVX2 and for baseline x86-64 (SSE2),
// with the clone the CPU supports chosen once when the program loads (GCC's target_clones,
// resolved through an ifunc). The build itself keeps targeting baseline x86-64, so the
// binaries run on any x86-64 machine.
//
// AVX2 without FMA: GCC contracts a * b + c into a fused multiply-add when the target has one
// (-ffp-contract=fast is its default), which rounds once instead of twice. Neither clone has
// FMA, so each element goes through the same IEEE operations in the same order, and both
// clones give bit-identical results (OptimizerTest.VectorLoopsMatchTheScalarUpdateBitForBit
// in ps/optimizer_test.cc compares the clone in use with the scalar update).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__linux__)
#define TESSERA_VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define TESSERA_VECTOR_CLONES
#endif
