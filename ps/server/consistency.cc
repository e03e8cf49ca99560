#include <algorithm>

#include "ps/server/consistency_internal.h"

namespace tessera::internal {
namespace {

bool IsRead(Op op) {
  return op == Op::kSparsePull || op == Op::kSparsePushPull || op == Op::kDensePull;
}

}  // namespace

int64_t Consistency::MinClock(uint32_t num_workers) const {
  // Loops over the clocks held, never over a count taken from a request: a worker not heard
  // from counts as clock 0, the lowest a clock can be, so fewer clocks than workers is 0.
  if (num_workers == 0) return INT64_MAX;
  if (clocks_.size() < num_workers) return 0;
  int64_t m = INT64_MAX;
  uint32_t seen = 0;
  for (auto& [w, c] : clocks_) {
    if (w >= num_workers) continue;
    ++seen;
    m = std::min(m, c);
  }
  return seen < num_workers ? std::min<int64_t>(m, 0) : m;
}

int64_t Consistency::MaxClock() const {
  int64_t m = 0;
  for (auto& [w, c] : clocks_) m = std::max(m, c);
  return m;
}

bool Consistency::AdmitOrPark(const std::shared_ptr<Pending>& p) {
  const Header& h = p->header;
  if (!IsRead(h.op) || NoClockOrder(h)) return true;
  if (MinClock(h.num_workers) >= h.clock - h.staleness) return true;
  parked_.push_back(p);
  ++parked_total_;
  return false;
}

std::vector<std::shared_ptr<Pending>> Consistency::TakeParked() {
  auto parked = std::move(parked_);
  parked_.clear();
  return parked;
}

void Consistency::SetClock(uint32_t worker, int64_t clock, uint32_t num_workers) {
  clocks_[worker] = clock;
  // The job's size is what its workers say now: a job that went on with fewer workers (a
  // scale-down, a worker that died) is not waited for by the ones that left. A Clock without
  // a job size (0) says nothing about it.
  if (num_workers > 0) job_workers_ = num_workers;
}

std::vector<Consistency::BarrierWait> Consistency::Arrive(zmq::message_t identity,
                                                          const Header& h) {
  if (h.client_id != 0) {
    auto r = released_.find(h.worker_id);
    if (r != released_.end() && r->second.client_id == h.client_id &&
        r->second.request_id == h.request_id && r->second.name == h.name) {
      std::vector<BarrierWait> again;
      again.push_back(BarrierWait{std::move(identity), h});
      return again;
    }
  }
  auto& waiting = barriers_[h.name];
  for (auto it = waiting.begin(); it != waiting.end(); ++it) {
    if (it->header.worker_id == h.worker_id) {
      waiting.erase(it);
      --barrier_waiters_;
      break;
    }
  }
  waiting.push_back(BarrierWait{std::move(identity), h});
  ++barrier_waiters_;
  if (waiting.size() < h.num_workers) return {};
  auto all = std::move(waiting);
  barriers_.erase(h.name);
  barrier_waiters_ -= all.size();
  if (released_.size() + all.size() > kMaxReleased) released_.clear();  // a bound, never met
  for (const BarrierWait& w : all) {
    if (w.header.client_id == 0) continue;
    released_[w.header.worker_id] = Released{w.header.client_id, w.header.request_id, h.name};
  }
  return all;
}

}  // namespace tessera::internal
