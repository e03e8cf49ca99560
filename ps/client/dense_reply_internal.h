// How the client reads the data frames of a DensePull reply into the caller's buffer: one
// frame of all the values (a server of an older build), or, for a request with
// kDensePullRunFrames, an index frame then frames of several server chunks each
// (docs/wire-protocol.md, "Dense pulls from the table's memory").
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>
#include <zmq.hpp>

#include "ps/routing.h"

namespace tessera::internal {

/// Copies the values of a DensePull reply of `count` floats at table offset `offset` to
/// `dst` (`count` floats). The reply's data frames are either one frame of `4 * count` bytes,
/// or an index frame followed by data frames: the index is u64s, for each data frame in turn
/// its number of server chunks n then those n chunk indices; a data frame is its chunks' parts
/// of the range (each server chunk cut to [offset, offset + count)), one after the other.
/// Every server chunk the range touches must appear exactly once. Returns false, writing
/// nothing, for any other shape.
inline bool CopyDenseReply(const std::vector<zmq::message_t>& frames, uint64_t offset,
                           uint64_t count, float* dst) {
  if (frames.size() == 1) {
    if (frames[0].size() != count * sizeof(float)) return false;
    std::memcpy(dst, frames[0].data(), frames[0].size());
    return true;
  }
  if (frames.size() < 2 || frames[0].size() % sizeof(uint64_t) != 0) return false;
  const uint64_t end = offset + count;
  const uint64_t first = offset / kDenseChunkFloats, last = (end - 1) / kDenseChunkFloats;
  const size_t n_index = frames[0].size() / sizeof(uint64_t);
  std::vector<uint64_t> index(n_index);
  std::memcpy(index.data(), frames[0].data(), frames[0].size());
  // The part of server chunk c in the range: [b, e) of the table.
  auto part = [&](uint64_t c, uint64_t* b, uint64_t* e) {
    *b = std::max(offset, c * kDenseChunkFloats);
    *e = std::min(end, (c + 1) * kDenseChunkFloats);
  };
  // First pass: the index names each chunk of the range once and the frames' sizes fit.
  std::vector<uint8_t> seen(last - first + 1, 0);
  size_t at = 0;
  for (size_t f = 1; f < frames.size(); ++f) {
    if (at >= n_index) return false;
    const uint64_t n = index[at++];
    if (n == 0 || n > n_index - at) return false;
    uint64_t bytes = 0;
    for (uint64_t i = 0; i < n; ++i) {
      const uint64_t c = index[at++];
      if (c < first || c > last || seen[c - first]) return false;
      seen[c - first] = 1;
      uint64_t b, e;
      part(c, &b, &e);
      bytes += (e - b) * sizeof(float);
    }
    if (frames[f].size() != bytes) return false;
  }
  if (at != n_index) return false;
  for (uint8_t s : seen) {
    if (!s) return false;
  }
  // Second pass: each chunk's part to its place.
  at = 0;
  for (size_t f = 1; f < frames.size(); ++f) {
    const char* src = static_cast<const char*>(frames[f].data());
    const uint64_t n = index[at++];
    for (uint64_t i = 0; i < n; ++i) {
      uint64_t b, e;
      part(index[at++], &b, &e);
      std::memcpy(dst + (b - offset), src, (e - b) * sizeof(float));
      src += (e - b) * sizeof(float);
    }
  }
  return true;
}

}  // namespace tessera::internal
