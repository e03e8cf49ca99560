// A checkpoint at a clock cut (docs/operations.md, "Checkpoints"): the cut a server waits for,
// and the pushes of later steps parked until it is taken.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ps/server/request_internal.h"
#include "ps/status.h"

namespace tessera::internal {

/// A checkpoint waiting for every worker to finish the steps up to its cut.
struct CutState {
  int64_t cut;
  uint32_t num_workers;
  std::string dir;
  std::shared_ptr<Pending> request;
  // The map version every server takes it at (0: the server follows no map).
  uint64_t map_version = 0;
  // When it is given up if the workers have not reached it (zero: never). A cut always has
  // one in the server, so that what it parked is released even when a worker never comes.
  std::chrono::steady_clock::time_point deadline{};
};

/// At most one checkpoint at a time: while one waits for its cut C, pushes of steps after C
/// are parked (Park) until it is taken or aborted. Also the highest clock of a push that
/// reached the lanes, so that a cut already passed is refused. Not thread-safe: the server's
/// I/O thread owns it; the server decides when the cut is ready (every worker's clock past
/// it, no push up to it still waiting for its backups) and writes the files.
class CheckpointCut {
 public:
  bool pending() const { return cut_.has_value(); }
  /// The pending cut; null when none.
  const CutState* state() const { return cut_ ? &*cut_ : nullptr; }

  /// FailedPrecondition while a checkpoint is pending.
  Status CheckIdle() const;
  /// FailedPrecondition when checkpoint request `h` asks for a cut at a clock that a push
  /// already applied passed.
  Status CheckNotPassed(const Header& h) const;
  /// Makes `cut` the pending one (CheckIdle passed).
  void Begin(CutState cut) { cut_ = std::move(cut); }
  /// Ends the pending cut (taken or aborted) and returns it; nullopt when none. The parked
  /// requests stay for TakeParked.
  std::optional<CutState> Take();
  /// The requests parked by the cut, in arrival order, to be sent through the gates again.
  std::vector<std::shared_ptr<Pending>> TakeParked();

  /// True when `p` is a push of a step after the pending cut: it is parked.
  bool Park(const std::shared_ptr<Pending>& p);
  /// The workers the pending cut waits for when the job has `job_workers` by its latest Clock
  /// (0: none had one): at most the job's, so those that left a job that went on with fewer
  /// are not waited for.
  uint32_t Workers(uint32_t job_workers) const {
    return job_workers > 0 ? std::min(cut_->num_workers, job_workers) : cut_->num_workers;
  }
  /// True when a cut is pending past its deadline at `now`.
  bool Expired(std::chrono::steady_clock::time_point now) const {
    return cut_ && cut_->deadline != std::chrono::steady_clock::time_point{} &&
           now >= cut_->deadline;
  }
  /// True when `h` is a push of a step up to the pending cut (the cut must hold for it).
  bool Covers(const Header& h) const;
  /// Push `h` reaches the lanes.
  void NotePush(const Header& h);
  int64_t max_push_clock() const { return max_push_clock_; }
  size_t parked_now() const { return parked_.size(); }

 private:
  std::optional<CutState> cut_;
  std::vector<std::shared_ptr<Pending>> parked_;
  int64_t max_push_clock_ = -1;
};

}  // namespace tessera::internal
