// What the RocksDB engine's files (engine, lane store, snapshot, write-back) share: RocksDB's
// status as a Status, and the encodings of the meta keys the engine and its lanes both use.
#pragma once

#include <rocksdb/slice.h>
#include <rocksdb/status.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "ps/status.h"

namespace tessera::internal {

// Meta key of a lane's applied-log mark: "storage/lane/<num_lanes>/<lane>".
inline std::string LaneMarkKey(uint32_t lane, uint32_t num_lanes) {
  return "storage/lane/" + std::to_string(num_lanes) + "/" + std::to_string(lane);
}
// A request-log sequence number as 8 big-endian bytes: the keys of the "log" family (older
// versions' request log) and the value of a lane's applied-log mark.
inline std::string SeqKey(uint64_t seq) {
  std::string k(8, '\0');
  for (int i = 7; i >= 0; --i, seq >>= 8) k[i] = static_cast<char>(seq & 0xff);
  return k;
}
inline uint64_t SeqOfKey(const rocksdb::Slice& k) {
  uint64_t seq = 0;
  for (size_t i = 0; i < 8 && i < k.size(); ++i) seq = (seq << 8) | static_cast<uint8_t>(k[i]);
  return seq;
}

// A RocksDB status as a Status whose message starts with `what` (the operation).
inline Status FromRocks(const rocksdb::Status& s, std::string_view what) {
  if (s.ok()) return Status::OK();
  std::string msg = std::string(what) + ": " + s.ToString();
  if (s.IsCorruption()) return Status::Corruption(std::move(msg));
  if (s.IsNotFound()) return Status::NotFound(std::move(msg));
  if (s.IsInvalidArgument() || s.IsNotSupported()) return Status::InvalidArgument(std::move(msg));
  if (s.IsBusy() || s.IsTryAgain() || s.IsTimedOut()) return Status::Unavailable(std::move(msg));
  if (s.IsIOError() || s.IsNoSpace() || s.IsPathNotFound()) return Status::IOError(std::move(msg));
  return Status::IOError(std::move(msg));
}

}  // namespace tessera::internal
