// Blocks shared copy-on-write between a lane's row store (CachedRows, SparseRows) and the views
// frozen from it for snapshots and write-backs, whose readers give them back as they go.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "ps/status.h"

namespace tessera::internal {

/// Makes `block` (a shared_ptr) the owner's alone before a write, for a block that a view frozen
/// since its last write may hold (`*frozen` set; cleared here): when a view still holds it,
/// replaces it by `copy(block)`. Returns whether it copied. Only the owner's thread adds holders
/// (by freezing), so a count that falls meanwhile costs at most one needless copy.
template <typename Ptr, typename Copy>
bool UnshareBlock(Ptr& block, uint8_t* frozen, Copy&& copy) {
  *frozen = 0;
  if (block.use_count() > 1) {
    block = copy(block);
    return true;
  }
  // The last view let go (a release decrement): its reads happen before the owner's writes.
  std::atomic_thread_fence(std::memory_order_acquire);
  return false;
}

/// A snapshot scans each table once: its scan gives the rows back as it goes. `*scanned` is
/// set; FailedPrecondition when it already was.
inline Status ClaimScan(bool* scanned, const std::string& table) {
  if (*scanned) {
    return Status::FailedPrecondition("table '" + table +
                                      "' was already scanned in this snapshot");
  }
  *scanned = true;
  return Status::OK();
}

}  // namespace tessera::internal
