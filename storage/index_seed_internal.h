// The hash seed of a new in-memory index (SlotIndex, SlotTagIndex).
#pragma once

#include <atomic>
#include <cstdint>
#include <random>

#include "ps/routing.h"

namespace tessera::internal {

/// A seed for a new index: another for each index of the process, and random per process
/// (tables on two servers must differ too). One hash for all tables makes a fill of one table
/// from another's iteration order quadratic.
inline uint64_t NewIndexSeed() {
  static const uint64_t process =
      (uint64_t{std::random_device{}()} << 32) ^ std::random_device{}();
  static std::atomic<uint64_t> n{0};
  return Mix64(process + n.fetch_add(1, std::memory_order_relaxed) * 0x9e3779b97f4a7c15ull);
}

}  // namespace tessera::internal
