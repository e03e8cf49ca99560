#include <algorithm>

#include "ps/server/checkpoint_cut_internal.h"

namespace tessera::internal {

Status CheckpointCut::CheckIdle() const {
  if (cut_) return Status::FailedPrecondition("a checkpoint is already in progress");
  return Status::OK();
}

Status CheckpointCut::CheckNotPassed(const Header& h) const {
  if (h.num_workers > 0 && max_push_clock_ > h.clock) {
    return Status::FailedPrecondition("cut at clock " + std::to_string(h.clock) +
                                      " already passed: a push of clock " +
                                      std::to_string(max_push_clock_) + " was applied");
  }
  return Status::OK();
}

std::optional<CutState> CheckpointCut::Take() {
  std::optional<CutState> cut = std::move(cut_);
  cut_.reset();
  return cut;
}

std::vector<std::shared_ptr<Pending>> CheckpointCut::TakeParked() {
  std::vector<std::shared_ptr<Pending>> parked;
  parked.swap(parked_);
  return parked;
}

bool CheckpointCut::Park(const std::shared_ptr<Pending>& p) {
  // While a checkpoint at cut C is pending, pushes of steps after C wait until it is taken.
  const Header& h = p->header;
  if (!cut_ || !IsPush(h.op) || h.num_workers == 0 || h.clock <= cut_->cut) return false;
  parked_.push_back(p);
  return true;
}

bool CheckpointCut::Covers(const Header& h) const {
  return cut_ && IsPush(h.op) && h.num_workers > 0 && h.clock <= cut_->cut;
}

void CheckpointCut::NotePush(const Header& h) {
  if (h.num_workers > 0) max_push_clock_ = std::max(max_push_clock_, h.clock);
}

}  // namespace tessera::internal
