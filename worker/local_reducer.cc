#include "worker/local_reducer.h"

#include <algorithm>
#include <condition_variable>

#include "ps/mutex.h"

namespace tessera::worker {

Status LocalReducer::ReduceSparse(std::span<const uint64_t> keys, std::span<const float> grads,
                                  uint32_t dim, std::vector<uint64_t>* out_keys,
                                  std::vector<float>* out_grads) {
  if (grads.size() != keys.size() * dim) {
    return Status::InvalidArgument("ReduceSparse: " + std::to_string(grads.size()) +
                                   " gradient floats for " + std::to_string(keys.size()) +
                                   " keys of dim " + std::to_string(dim));
  }
  std::vector<uint64_t> all;
  TESSERA_RETURN_IF_ERROR(UnionKeys(keys, &all));
  std::vector<float> aligned(all.size() * dim, 0.0f);
  for (size_t i = 0; i < keys.size(); ++i) {
    const size_t row = std::lower_bound(all.begin(), all.end(), keys[i]) - all.begin();
    for (uint32_t j = 0; j < dim; ++j) aligned[row * dim + j] += grads[i * dim + j];
  }
  TESSERA_RETURN_IF_ERROR(ReduceSum(aligned));
  if (leader()) {
    *out_keys = std::move(all);
    *out_grads = std::move(aligned);
  }
  return Status::OK();
}

Status LocalReducer::AllReduceSum(std::span<float> data) {
  TESSERA_RETURN_IF_ERROR(ReduceSum(data));
  return Broadcast(data);
}

Status LocalReducer::ReduceSumOnDevice(std::span<const DeviceSpan>, void*) {
  return Status::FailedPrecondition("this local reducer has no device collectives");
}

Status LocalReducer::WaitDevice(void*) {
  return Status::FailedPrecondition("this local reducer has no device collectives");
}

// Shared state of a CPU group: a reusable barrier that can be aborted, and one posted buffer
// per rank.
struct CpuReduceGroup::State {
  explicit State(uint32_t n) : size(n), ptrs(n), lens(n) {}
  const uint32_t size;
  mutable Mutex mu;
  std::condition_variable cv;
  uint32_t arrived ABSL_GUARDED_BY(mu) = 0;
  uint64_t generation ABSL_GUARDED_BY(mu) = 0;
  bool aborted ABSL_GUARDED_BY(mu) = false;
  Status why ABSL_GUARDED_BY(mu);  // the first reason of Abort
  // Written by rank r before a barrier, read by others after it.
  std::vector<const void*> ptrs;
  std::vector<size_t> lens;

  // False when the group was aborted.
  bool Wait() {
    MutexLock lock(mu);
    if (aborted) return false;
    const uint64_t gen = generation;
    if (++arrived == size) {
      arrived = 0;
      ++generation;
      cv.notify_all();
      return true;
    }
    while (generation == gen && !aborted) cv.wait(lock.native());
    // A barrier that completed before the abort still counts: its result is delivered.
    return generation != gen;
  }
  void Abort(const Status& reason) {
    MutexLock lock(mu);
    if (!aborted) why = reason.ok() ? Status::Cancelled("aborted without a reason") : reason;
    aborted = true;
    cv.notify_all();
  }
  Status Reason() const {
    MutexLock lock(mu);
    return aborted ? why : Status::OK();
  }
  Status Cancelled() const {
    return Status::Cancelled("local reduction group aborted: " + Reason().ToString());
  }
};

namespace {

class CpuMember final : public LocalReducer {
 public:
  CpuMember(std::shared_ptr<CpuReduceGroup> group, CpuReduceGroup::State* st, uint32_t rank)
      : group_(std::move(group)), st_(st), rank_(rank) {}
  uint32_t rank() const override { return rank_; }
  uint32_t size() const override { return st_->size; }
  void Abort(const Status& why) override { st_->Abort(why); }

  Status UnionKeys(std::span<const uint64_t> keys, std::vector<uint64_t>* out) override {
    Post(keys.data(), keys.size());
    if (!st_->Wait()) return st_->Cancelled();
    out->clear();
    for (uint32_t r = 0; r < st_->size; ++r) {
      const auto* p = static_cast<const uint64_t*>(st_->ptrs[r]);
      out->insert(out->end(), p, p + st_->lens[r]);
    }
    std::sort(out->begin(), out->end());
    out->erase(std::unique(out->begin(), out->end()), out->end());
    if (!st_->Wait()) return st_->Cancelled();  // others may still read our keys
    return Status::OK();
  }

  Status ReduceSum(std::span<float> data) override {
    Post(data.data(), data.size());
    if (!st_->Wait()) return st_->Cancelled();
    Status s = SameLengths("ReduceSum");
    if (s.ok() && leader()) {
      for (uint32_t r = 1; r < st_->size; ++r) {
        const auto* p = static_cast<const float*>(st_->ptrs[r]);
        for (size_t i = 0; i < data.size(); ++i) data[i] += p[i];
      }
    }
    if (!st_->Wait()) return st_->Cancelled();
    return s;
  }

  Status Broadcast(std::span<float> data) override {
    Post(data.data(), data.size());
    if (!st_->Wait()) return st_->Cancelled();
    Status s = SameLengths("Broadcast");
    if (s.ok() && !leader()) {
      const auto* p = static_cast<const float*>(st_->ptrs[0]);
      std::copy(p, p + data.size(), data.begin());
    }
    if (!st_->Wait()) return st_->Cancelled();
    return s;
  }

  Status AllGather(uint64_t value, std::vector<uint64_t>* out) override {
    Post(&value, 1);
    if (!st_->Wait()) return st_->Cancelled();
    out->resize(st_->size);
    for (uint32_t r = 0; r < st_->size; ++r)
      (*out)[r] = *static_cast<const uint64_t*>(st_->ptrs[r]);
    if (!st_->Wait()) return st_->Cancelled();
    return Status::OK();
  }

 private:
  void Post(const void* p, size_t n) {
    st_->ptrs[rank_] = p;
    st_->lens[rank_] = n;
  }
  Status SameLengths(const char* op) const {
    for (uint32_t r = 1; r < st_->size; ++r) {
      if (st_->lens[r] != st_->lens[0]) {
        return Status::InvalidArgument(std::string(op) + ": rank " + std::to_string(r) + " has " +
                                       std::to_string(st_->lens[r]) + " elements, rank 0 has " +
                                       std::to_string(st_->lens[0]));
      }
    }
    return Status::OK();
  }

  std::shared_ptr<CpuReduceGroup> group_;
  CpuReduceGroup::State* st_;
  uint32_t rank_;
};

}  // namespace

CpuReduceGroup::CpuReduceGroup(std::unique_ptr<State> state) : state_(std::move(state)) {}
CpuReduceGroup::~CpuReduceGroup() = default;
uint32_t CpuReduceGroup::size() const { return state_->size; }
void CpuReduceGroup::Abort(const Status& why) { state_->Abort(why); }
Status CpuReduceGroup::abort_reason() const { return state_->Reason(); }

Result<std::shared_ptr<CpuReduceGroup>> CpuReduceGroup::Create(uint32_t size) {
  if (size == 0) return Status::InvalidArgument("a reduction group needs at least one rank");
  return std::shared_ptr<CpuReduceGroup>(new CpuReduceGroup(std::make_unique<State>(size)));
}

Result<std::unique_ptr<LocalReducer>> CpuReduceGroup::Join(uint32_t rank) {
  if (rank >= state_->size) {
    return Status::InvalidArgument("local rank " + std::to_string(rank) + " of a group of " +
                                   std::to_string(state_->size));
  }
  return std::unique_ptr<LocalReducer>(
      std::make_unique<CpuMember>(shared_from_this(), state_.get(), rank));
}

}  // namespace tessera::worker
