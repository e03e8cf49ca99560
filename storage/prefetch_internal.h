// A cache-line prefetch that the compiler keeps.
#pragma once

namespace tessera::internal {

/// Starts loading the cache line at `p` into the caches (a hint: no fault, no effect on
/// results). Unlike __builtin_prefetch, never dropped by the optimizer: GCC 12 at -O2 removed
/// every __builtin_prefetch of SlotIndex::Prefetch and SparseRows::PrefetchRow once inlined
/// into their callers (MemoryLaneStore::Apply compiled with no prefetch at all), apparently
/// treating the small wrappers as side-effect free. A volatile asm with the line as an input
/// operand is kept and orders no other memory access.
inline void PrefetchLine(const void* p) {
#if defined(__x86_64__) || defined(__i386__)
  asm volatile("prefetcht0 %0" : : "m"(*static_cast<const char*>(p)));
#elif defined(__aarch64__)
  asm volatile("prfm pldl1keep, %0" : : "Q"(*static_cast<const char*>(p)));
#else
  __builtin_prefetch(p);
#endif
}

}  // namespace tessera::internal
