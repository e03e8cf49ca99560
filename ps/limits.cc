#include "ps/limits.h"

#include <string>

namespace tessera {

Status ValidateRequestLimits(const Header& h) {
  const std::string op(OpName(h.op));
  if (h.num_workers > kMaxWorkers) {
    return Status::InvalidArgument(op + ": num_workers " + std::to_string(h.num_workers) +
                                   " is above the limit of " + std::to_string(kMaxWorkers));
  }
  if (h.op != Op::kCheckpoint && h.num_workers > 0 && h.worker_id >= h.num_workers) {
    return Status::InvalidArgument(op + ": worker_id " + std::to_string(h.worker_id) +
                                   " is not below num_workers " + std::to_string(h.num_workers));
  }
  if (h.op == Op::kClock && h.worker_id >= kMaxWorkers) {
    return Status::InvalidArgument("Clock: worker_id " + std::to_string(h.worker_id) +
                                   " is not below " + std::to_string(kMaxWorkers));
  }
  const int64_t min_clock = h.op == Op::kCheckpoint ? -1 : 0;
  if (h.clock < min_clock || h.clock > kMaxClock) {
    return Status::InvalidArgument(op + ": clock " + std::to_string(h.clock) + " outside [" +
                                   std::to_string(min_clock) + ", " + std::to_string(kMaxClock) +
                                   "]");
  }
  if (h.staleness < -1 || h.staleness > kMaxStaleness) {
    return Status::InvalidArgument(op + ": staleness " + std::to_string(h.staleness) +
                                   " outside [-1, " + std::to_string(kMaxStaleness) + "]");
  }
  if (h.name.size() > kMaxRequestNameBytes) {
    return Status::InvalidArgument(op + ": name of " + std::to_string(h.name.size()) +
                                   " bytes is longer than " + std::to_string(kMaxRequestNameBytes));
  }
  if (h.op == Op::kBarrier && (h.name.empty() || h.name.size() > kMaxBarrierNameBytes)) {
    return Status::InvalidArgument("barrier name must have 1.." +
                                   std::to_string(kMaxBarrierNameBytes) + " bytes, got " +
                                   std::to_string(h.name.size()));
  }
  return Status::OK();
}

}  // namespace tessera
