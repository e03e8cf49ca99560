// How the client cuts a large dense request into chunk requests (ClientOptions::
// dense_chunk_bytes).
#pragma once

#include <algorithm>
#include <cstdint>

#include "ps/routing.h"

namespace tessera::internal {

/// The chunks of a dense call: boundaries at the multiples of `floats` (rounded up to whole
/// server chunks, kDenseChunkFloats, so that no server chunk is split between two requests),
/// and at the ends of each part's range. 0 floats: one request per part. A pure value type.
class DenseChunking {
 public:
  explicit DenseChunking(uint64_t floats)
      : floats_(floats == 0 ? 0
                            : (floats + kDenseChunkFloats - 1) / kDenseChunkFloats *
                                  kDenseChunkFloats) {}
  /// The end of the chunk that starts at `begin`, in a part whose range of the call ends at `e`.
  uint64_t End(uint64_t begin, uint64_t e) const {
    if (floats_ == 0) return e;
    return std::min(e, (begin / floats_ + 1) * floats_);
  }
  /// Whether a chunk starts at `x` in a part whose range of the call starts at `b`.
  bool Starts(uint64_t x, uint64_t b) const {
    return x == b || (floats_ != 0 && x > b && x % floats_ == 0);
  }
  uint64_t floats() const { return floats_; }

 private:
  uint64_t floats_;
};

}  // namespace tessera::internal
