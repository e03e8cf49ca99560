// Memory for the memory tier's large, randomly accessed arrays, backed by huge pages where the
// kernel allows them.
#pragma once

#include <sys/mman.h>

#include <cstddef>
#include <cstdlib>
#include <new>

namespace tessera::internal {

/// Bytes of a transparent huge page on x86-64 and most arm64 kernels.
inline constexpr size_t kHugePageBytes = size_t{2} << 20;

/// Allocates `bytes` aligned to a cache line; an allocation of a huge page or more is aligned
/// to one and advised to the kernel as huge-page memory (madvise MADV_HUGEPAGE, which counts
/// when /sys/kernel/mm/transparent_hugepage/enabled is "madvise" or "always"). A sparse
/// request touches its rows at random: with 4 KiB pages nearly every row of a large table is
/// also a TLB miss, a page walk that costs more than the row's own cache miss under
/// virtualisation (docs/benchmarks.md, "server CPU per key"). Throws std::bad_alloc like
/// operator new. Free with FreeHugePageable.
inline void* AllocateHugePageable(size_t bytes) {
  const bool huge = bytes >= kHugePageBytes;
  const size_t align = huge ? kHugePageBytes : 64;
  const size_t rounded = (bytes + align - 1) / align * align;
  void* p = std::aligned_alloc(align, rounded == 0 ? align : rounded);
  if (p == nullptr) throw std::bad_alloc();
#ifdef MADV_HUGEPAGE
  // A hint: where the kernel refuses (THP off), the memory stays in small pages.
  if (huge) (void)madvise(p, rounded, MADV_HUGEPAGE);
#endif
  return p;
}

inline void FreeHugePageable(void* p) { std::free(p); }

/// A std::allocator for vectors of that memory (AllocateHugePageable).
template <typename T>
struct HugePageAllocator {
  using value_type = T;
  HugePageAllocator() = default;
  template <typename U>
  HugePageAllocator(const HugePageAllocator<U>&) {}  // NOLINT: allocators convert implicitly
  T* allocate(size_t n) { return static_cast<T*>(AllocateHugePageable(n * sizeof(T))); }
  void deallocate(T* p, size_t) { FreeHugePageable(p); }
  template <typename U>
  bool operator==(const HugePageAllocator<U>&) const {
    return true;
  }
};

}  // namespace tessera::internal
