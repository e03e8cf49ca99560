// Worker clocks, the staleness gate that parks reads, and named barriers.
#pragma once

#include <absl/container/flat_hash_map.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ps/server/request_internal.h"

namespace tessera::internal {

/// The server's view of the job's progress: each worker's clock (the steps it has finished),
/// reads parked until the slowest worker is within their staleness bound, and barriers.
/// Not thread-safe: the I/O thread owns it.
class Consistency {
 public:
  /// A worker waiting at a barrier, answered when the last one arrives.
  struct BarrierWait {
    zmq::message_t identity;
    Header header;
  };

  /// The smallest clock of workers 0..num_workers-1 (a worker not heard from counts as 0);
  /// INT64_MAX for 0 workers. Costs O(clocks held), whatever num_workers is.
  int64_t MinClock(uint32_t num_workers) const;
  /// The largest clock any worker reported (0 when none did).
  int64_t MaxClock() const;

  /// True when `p` may run now: it is no read, it has no staleness bound, or every worker is
  /// within the bound. Otherwise `p` is parked until a clock moves (TakeParked).
  bool AdmitOrPark(const std::shared_ptr<Pending>& p);
  /// The requests parked so far, to be admitted again (they may park anew).
  std::vector<std::shared_ptr<Pending>> TakeParked();

  /// Sets `worker`'s clock to `clock` (a restarted worker may set it back to its stored
  /// value) and, unless `num_workers` is 0, records the job as `num_workers` workers: the job's
  /// size follows its latest Clock, so it shrinks when the job goes on with fewer workers.
  void SetClock(uint32_t worker, int64_t clock, uint32_t num_workers);

  /// Worker `h.worker_id` arrives at barrier `h.name` of `h.num_workers` workers. Returns the
  /// waiters to answer: all of them when this one was the last, none otherwise. A worker that
  /// arrives again (it retried after reconnecting) replaces its earlier request. A resend of
  /// an arrival that was released already (its answer was lost: the same worker, name, client
  /// id and request id as the worker's last released arrival) is answered at once, alone.
  std::vector<BarrierWait> Arrive(zmq::message_t identity, const Header& h);

  /// The job's size by its latest Clock (0: none had one).
  uint32_t job_workers() const { return job_workers_; }
  /// Workers waiting at any barrier (bounded by the server: kMaxBarrierWaiters).
  size_t barrier_waiters() const { return barrier_waiters_; }
  size_t parked_now() const { return parked_.size(); }
  uint64_t parked_total() const { return parked_total_; }

 private:
  absl::flat_hash_map<uint32_t, int64_t> clocks_;
  std::vector<std::shared_ptr<Pending>> parked_;
  std::map<std::string, std::vector<BarrierWait>> barriers_;
  // Per worker, its arrival at the last barrier that released it (client id != 0 only).
  struct Released {
    uint64_t client_id = 0, request_id = 0;
    std::string name;
  };
  absl::flat_hash_map<uint32_t, Released> released_;
  static constexpr size_t kMaxReleased = size_t{1} << 16;
  uint32_t job_workers_ = 0;
  uint64_t parked_total_ = 0;
  size_t barrier_waiters_ = 0;
};

}  // namespace tessera::internal
