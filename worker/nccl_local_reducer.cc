// The NCCL ReduceGroup: one rank per GPU of the node, one thread per rank.
//
// Communicators are non-blocking (ncclConfig_t::blocking = 0): creating one and every call on it
// return at once, and each rank then polls — ncclCommGetAsyncError for NCCL's side,
// cudaStreamQuery for the stream, and the group's shared abort flag — so that a rank that fails
// anywhere (before it joined, in a kernel, on the network of a peer) ends every other rank's
// wait within about a millisecond: each rank that sees the flag aborts its own communicator,
// which also ends the NCCL kernels its peers wait in.
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <set>
#include <thread>

#include "ps/mutex.h"
#include "worker/backend.h"
#include "worker/cuda_kernels_internal.h"
#include "worker/cuda_util_internal.h"
#include "worker/local_reducer.h"

namespace tessera::worker {
namespace {

using Clock = std::chrono::steady_clock;
using internal::DeviceBuffer;
using internal::PinnedBuffer;

Status NcclError(ncclResult_t r, const std::string& what) {
  return Status::Internal(what + ": " + ncclGetErrorString(r));
}

// Sleeps a little longer the longer a wait lasts: yields for the first polls (a step's
// reduction takes tens of microseconds), then up to 200 us, which bounds an abort's latency.
void Backoff(int polls) {
  if (polls < 64) {
    std::this_thread::yield();
  } else {
    std::this_thread::sleep_for(std::chrono::microseconds(polls < 1024 ? 50 : 200));
  }
}

class NcclGroup final : public ReduceGroup, public std::enable_shared_from_this<NcclGroup> {
 public:
  NcclGroup(const NcclReduceGroupOptions& options, const ncclUniqueId& id)
      : options_(options), id_(id) {}

  std::string_view kind() const override { return "nccl"; }
  uint32_t size() const override { return options_.size; }
  Result<std::unique_ptr<LocalReducer>> Join(uint32_t rank) override;
  void Abort(const Status& why) override {
    MutexLock lock(mu_);
    if (aborted_.load(std::memory_order_relaxed)) return;
    why_ = why.ok() ? Status::Cancelled("aborted without a reason") : why;
    aborted_.store(true, std::memory_order_release);
  }
  Status abort_reason() const override {
    MutexLock lock(mu_);
    return aborted_.load(std::memory_order_relaxed) ? why_ : Status::OK();
  }

  bool aborted() const { return aborted_.load(std::memory_order_acquire); }
  Status Cancelled() const {
    return Status::Cancelled("local reduction group aborted: " + abort_reason().ToString());
  }
  const NcclReduceGroupOptions& options() const { return options_; }

 private:
  const NcclReduceGroupOptions options_;
  const ncclUniqueId id_;
  std::atomic<bool> aborted_{false};
  mutable Mutex mu_;
  Status why_ ABSL_GUARDED_BY(mu_);
};

class NcclMember final : public LocalReducer {
 public:
  NcclMember(std::shared_ptr<NcclGroup> group, uint32_t rank, int device)
      : group_(std::move(group)), rank_(rank), device_(device) {}
  NcclMember(const NcclMember&) = delete;
  NcclMember& operator=(const NcclMember&) = delete;
  ~NcclMember() override {
    if (aborter_.joinable()) aborter_.join();
    cudaSetDevice(device_);
    if (comm_ != nullptr) {
      if (!healthy_ || group_->aborted() || !Finalize()) {
        ncclCommAbort(comm_);
      } else {
        ncclCommDestroy(comm_);
      }
    }
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  // Joins the communicator (non-blocking), waiting for every rank, the abort, or the timeout.
  Status Init(const ncclUniqueId& id) {
    const NcclReduceGroupOptions& o = group_->options();
    TESSERA_RETURN_IF_ERROR(Check(cudaSetDevice(device_), "cudaSetDevice"));
    TESSERA_RETURN_IF_ERROR(
        Check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate"));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    const ncclResult_t r = ncclCommInitRankConfig(&comm_, static_cast<int>(o.size), id,
                                                  static_cast<int>(rank_), &config);
    if (r != ncclSuccess && r != ncclInProgress) {
      comm_ = nullptr;
      return Fail(NcclError(r, "ncclCommInitRankConfig"));
    }
    return WaitComm("joining the NCCL communicator (every local rank must join)",
                    o.init_timeout_ms);
  }

  uint32_t rank() const override { return rank_; }
  uint32_t size() const override { return group_->size(); }
  int device() const override { return device_; }

  void Abort(const Status& why) override {
    group_->Abort(why);
    AbortComm();
  }

  Status AllGather(uint64_t value, std::vector<uint64_t>* out) override {
    TESSERA_RETURN_IF_ERROR(Ready());
    const uint32_t n = size();
    TESSERA_RETURN_IF_ERROR(Stage((1 + n) * sizeof(uint64_t)));
    auto* h = reinterpret_cast<uint64_t*>(host_.get());
    auto* d = reinterpret_cast<uint64_t*>(dev_.get());
    h[0] = value;
    TESSERA_RETURN_IF_ERROR(
        Check(cudaMemcpyAsync(d, h, sizeof(uint64_t), cudaMemcpyHostToDevice, stream_), "upload"));
    TESSERA_RETURN_IF_ERROR(
        Call(ncclAllGather(d, d + 1, 1, ncclUint64, comm_, stream_), "ncclAllGather"));
    TESSERA_RETURN_IF_ERROR(
        Check(cudaMemcpyAsync(h + 1, d + 1, n * sizeof(uint64_t), cudaMemcpyDeviceToHost, stream_),
              "download"));
    TESSERA_RETURN_IF_ERROR(WaitStream(stream_, "AllGather"));
    out->assign(h + 1, h + 1 + n);
    return Status::OK();
  }

  // The ranks' keys are gathered on the GPU (padded to the longest list), compacted, sorted and
  // deduped there (CUB); only the union comes back, with its length, in one copy.
  Status UnionKeys(std::span<const uint64_t> keys, std::vector<uint64_t>* out) override {
    std::vector<uint64_t> counts;
    TESSERA_RETURN_IF_ERROR(AllGather(keys.size(), &counts));
    const uint64_t max = *std::max_element(counts.begin(), counts.end());
    uint64_t total = 0;
    for (uint64_t c : counts) total += c;
    const uint32_t n = size();
    out->clear();
    if (max == 0) return Status::OK();
    // Device: [mine: max | gathered: n * max | compact: total | sorted: total | union: total |
    // its length: 1]; host: [mine: max] then [union: total | its length].
    const size_t gathered = max, compact = gathered + size_t{n} * max, sorted = compact + total,
                 unique = sorted + total, words = unique + total + 1;
    size_t scratch_bytes = 0;
    TESSERA_RETURN_IF_ERROR(
        Check(internal::SortUniqueKeysScratch(total, &scratch_bytes), "sizing the key sort"));
    TESSERA_RETURN_IF_ERROR(Stage(words * sizeof(uint64_t)));
    if (auto st = scratch_.Reserve(std::max<size_t>(scratch_bytes, 1)); !st.ok()) return Fail(st);
    auto* h = reinterpret_cast<uint64_t*>(host_.get());
    auto* d = reinterpret_cast<uint64_t*>(dev_.get());
    std::copy(keys.begin(), keys.end(), h);
    TESSERA_RETURN_IF_ERROR(Check(
        cudaMemcpyAsync(d, h, max * sizeof(uint64_t), cudaMemcpyHostToDevice, stream_), "upload"));
    TESSERA_RETURN_IF_ERROR(
        Call(ncclAllGather(d, d + gathered, max, ncclUint64, comm_, stream_), "ncclAllGather"));
    size_t at = compact;
    for (uint32_t r = 0; r < n; ++r) {
      if (counts[r] == 0) continue;
      TESSERA_RETURN_IF_ERROR(
          Check(cudaMemcpyAsync(d + at, d + gathered + size_t{r} * max,
                                counts[r] * sizeof(uint64_t), cudaMemcpyDeviceToDevice, stream_),
                "compacting the keys"));
      at += counts[r];
    }
    TESSERA_RETURN_IF_ERROR(Check(
        internal::LaunchSortUniqueKeys(d + compact, total, d + sorted, d + unique,
                                       d + unique + total, scratch_.get(), scratch_bytes, stream_),
        "sorting the keys"));
    // The union's length sits right after its room: one copy brings both.
    TESSERA_RETURN_IF_ERROR(Check(cudaMemcpyAsync(h, d + unique, (total + 1) * sizeof(uint64_t),
                                                  cudaMemcpyDeviceToHost, stream_),
                                  "download"));
    TESSERA_RETURN_IF_ERROR(WaitStream(stream_, "UnionKeys"));
    const uint64_t distinct = h[total];
    if (distinct > total) {
      return Fail(Status::Internal("key sort returned " + std::to_string(distinct) +
                                   " distinct keys of " + std::to_string(total)));
    }
    out->assign(h, h + distinct);
    return Status::OK();
  }

  Status ReduceSum(std::span<float> data) override {
    TESSERA_RETURN_IF_ERROR(SameLength(data.size(), "ReduceSum"));
    if (data.empty()) return Status::OK();
    TESSERA_RETURN_IF_ERROR(Stage(data.size_bytes()));
    std::memcpy(host_.get(), data.data(), data.size_bytes());
    auto* d = reinterpret_cast<float*>(dev_.get());
    TESSERA_RETURN_IF_ERROR(
        Check(cudaMemcpyAsync(d, host_.get(), data.size_bytes(), cudaMemcpyHostToDevice, stream_),
              "upload"));
    TESSERA_RETURN_IF_ERROR(
        Call(ncclReduce(d, d, data.size(), ncclFloat32, ncclSum, 0, comm_, stream_), "ncclReduce"));
    if (leader()) {
      TESSERA_RETURN_IF_ERROR(
          Check(cudaMemcpyAsync(host_.get(), d, data.size_bytes(), cudaMemcpyDeviceToHost, stream_),
                "download"));
    }
    TESSERA_RETURN_IF_ERROR(WaitStream(stream_, "ReduceSum"));
    if (leader()) std::memcpy(data.data(), host_.get(), data.size_bytes());
    return Status::OK();
  }

  Status Broadcast(std::span<float> data) override {
    TESSERA_RETURN_IF_ERROR(SameLength(data.size(), "Broadcast"));
    if (data.empty()) return Status::OK();
    TESSERA_RETURN_IF_ERROR(Stage(data.size_bytes()));
    auto* d = reinterpret_cast<float*>(dev_.get());
    if (leader()) {
      std::memcpy(host_.get(), data.data(), data.size_bytes());
      TESSERA_RETURN_IF_ERROR(
          Check(cudaMemcpyAsync(d, host_.get(), data.size_bytes(), cudaMemcpyHostToDevice, stream_),
                "upload"));
    }
    TESSERA_RETURN_IF_ERROR(
        Call(ncclBroadcast(d, d, data.size(), ncclFloat32, 0, comm_, stream_), "ncclBroadcast"));
    TESSERA_RETURN_IF_ERROR(
        Check(cudaMemcpyAsync(host_.get(), d, data.size_bytes(), cudaMemcpyDeviceToHost, stream_),
              "download"));
    TESSERA_RETURN_IF_ERROR(WaitStream(stream_, "Broadcast"));
    std::memcpy(data.data(), host_.get(), data.size_bytes());
    return Status::OK();
  }

  Status ReduceSumOnDevice(std::span<const DeviceSpan> spans, void* stream) override {
    TESSERA_RETURN_IF_ERROR(Ready());
    auto s = static_cast<cudaStream_t>(stream);
    // One group launch for all spans: a single fused NCCL operation per step.
    TESSERA_RETURN_IF_ERROR(Call(ncclGroupStart(), "ncclGroupStart"));
    ncclResult_t first = ncclSuccess;
    for (const DeviceSpan& sp : spans) {
      if (sp.size == 0) continue;
      const ncclResult_t r = ncclReduce(
          sp.data, sp.data, sp.size, sp.float64 ? ncclFloat64 : ncclFloat32, ncclSum, 0, comm_, s);
      if (r != ncclSuccess && r != ncclInProgress && first == ncclSuccess) first = r;
    }
    const ncclResult_t end = ncclGroupEnd();
    if (first != ncclSuccess) return Fail(NcclError(first, "ncclReduce"));
    return Call(end, "ncclGroupEnd (ReduceSumOnDevice)");
  }

  Status WaitDevice(void* stream) override {
    TESSERA_RETURN_IF_ERROR(Ready());
    return WaitStream(static_cast<cudaStream_t>(stream), "waiting for the GPU");
  }

 private:
  Status Ready() {
    if (group_->aborted()) {
      AbortComm();
      return group_->Cancelled();
    }
    if (comm_ == nullptr) return Status::Cancelled("NCCL communicator already aborted");
    return Check(cudaSetDevice(device_), "cudaSetDevice");
  }

  // This rank failed: the group learns why (every rank's waits end) and the communicator ends.
  Status Fail(Status s) {
    s = s.WithContext("local rank " + std::to_string(rank_) + " (GPU " + std::to_string(device_) +
                      ")");
    group_->Abort(s);
    AbortComm();
    return s;
  }
  Status Check(cudaError_t e, const char* what) {
    if (e == cudaSuccess) return Status::OK();
    return Fail(internal::CudaError(e, what));
  }
  // The communicator is aborted on a thread of its own: ncclCommAbort frees device memory,
  // which waits for the whole device, so a rank whose stream is busy (its own kernels, a host
  // function) would otherwise learn of another rank's failure only once the device is idle.
  // The member no longer uses the communicator; its destructor joins the thread.
  void AbortComm() {
    healthy_ = false;
    if (comm_ == nullptr) return;
    ncclComm_t comm = comm_;
    comm_ = nullptr;
    const int device = device_;
    aborter_ = std::thread([comm, device] {
      cudaSetDevice(device);
      ncclCommAbort(comm);
    });
  }

  // The result of a non-blocking NCCL call: in progress means it is still being enqueued.
  Status Call(ncclResult_t r, const char* what) {
    if (r == ncclSuccess) return Status::OK();
    if (r == ncclInProgress) return WaitComm(what, group_->options().op_timeout_ms);
    return Fail(NcclError(r, what));
  }

  // Between two polls: the group's abort, NCCL's asynchronous error, the deadline.
  // *done is set when NCCL reports no operation in progress.
  Status Watch(const char* what, Clock::time_point deadline, int64_t timeout_ms, bool* done) {
    if (group_->aborted()) {
      AbortComm();
      return group_->Cancelled();
    }
    ncclResult_t async = ncclSuccess;
    const ncclResult_t r = ncclCommGetAsyncError(comm_, &async);
    if (r != ncclSuccess) return Fail(NcclError(r, "ncclCommGetAsyncError"));
    if (async != ncclSuccess && async != ncclInProgress) return Fail(NcclError(async, what));
    if (done != nullptr) *done = async == ncclSuccess;
    if (Clock::now() > deadline) {
      return Fail(Status::DeadlineExceeded(std::string(what) + ": not done after " +
                                           std::to_string(timeout_ms) + " ms"));
    }
    return Status::OK();
  }

  Status WaitComm(const char* what, int64_t timeout_ms) {
    const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
    for (int polls = 0;; ++polls) {
      bool done = false;
      TESSERA_RETURN_IF_ERROR(Watch(what, deadline, timeout_ms, &done));
      if (done) return Status::OK();
      Backoff(polls);
    }
  }

  Status WaitStream(cudaStream_t stream, const char* what) {
    const int64_t timeout_ms = group_->options().op_timeout_ms;
    const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
    for (int polls = 0;; ++polls) {
      const cudaError_t q = cudaStreamQuery(stream);
      if (q == cudaSuccess) return Status::OK();
      if (q != cudaErrorNotReady) return Fail(internal::CudaError(q, what));
      TESSERA_RETURN_IF_ERROR(Watch(what, deadline, timeout_ms, nullptr));
      Backoff(polls);
    }
  }

  // Every rank must pass the same length; checked with a gather so that all ranks agree.
  Status SameLength(size_t n, const char* op) {
    std::vector<uint64_t> lens;
    TESSERA_RETURN_IF_ERROR(AllGather(n, &lens));
    for (uint32_t r = 1; r < size(); ++r) {
      if (lens[r] != lens[0]) {
        return Status::InvalidArgument(std::string(op) + ": rank " + std::to_string(r) + " has " +
                                       std::to_string(lens[r]) + " elements, rank 0 has " +
                                       std::to_string(lens[0]));
      }
    }
    return Status::OK();
  }

  // Staging for host-span collectives: pinned host memory and a device buffer.
  Status Stage(size_t bytes) {
    if (auto s = host_.Reserve(bytes); !s.ok()) return Fail(s);
    if (auto s = dev_.Reserve(bytes); !s.ok()) return Fail(s);
    return Status::OK();
  }

  // A clean end: flushes the communicator (bounded); false when that did not finish.
  bool Finalize() {
    const ncclResult_t r = ncclCommFinalize(comm_);
    if (r != ncclSuccess && r != ncclInProgress) return false;
    const auto deadline = Clock::now() + std::chrono::seconds(5);
    for (int polls = 0; Clock::now() < deadline; ++polls) {
      ncclResult_t async = ncclInProgress;
      if (ncclCommGetAsyncError(comm_, &async) != ncclSuccess) return false;
      if (async != ncclInProgress) return async == ncclSuccess;
      Backoff(polls);
    }
    return false;
  }

  std::shared_ptr<NcclGroup> group_;
  const uint32_t rank_;
  const int device_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  bool healthy_ = true;
  std::thread aborter_;  // the communicator's abort (AbortComm)
  PinnedBuffer<char> host_;
  DeviceBuffer<char> dev_;
  DeviceBuffer<char> scratch_;  // CUB's scratch for the key sort
};

Result<std::unique_ptr<LocalReducer>> NcclGroup::Join(uint32_t rank) {
  if (rank >= size()) {
    return Status::InvalidArgument("local rank " + std::to_string(rank) + " of a group of " +
                                   std::to_string(size()));
  }
  if (aborted()) return Cancelled();
  auto m = std::make_unique<NcclMember>(shared_from_this(), rank, options_.devices[rank]);
  TESSERA_RETURN_IF_ERROR(m->Init(id_));
  return std::unique_ptr<LocalReducer>(std::move(m));
}

}  // namespace

Result<std::shared_ptr<ReduceGroup>> CreateNcclReduceGroup(const NcclReduceGroupOptions& options) {
  NcclReduceGroupOptions o = options;
  if (o.size == 0) return Status::InvalidArgument("an NCCL group needs at least one rank");
  auto count = CudaDeviceCount();
  if (!count.ok()) {
    return Status::FailedPrecondition("NCCL reduction of " + std::to_string(o.size) +
                                      " local ranks: " + count.status().message());
  }
  const int n = *count;
  if (o.devices.empty()) {
    if (o.size > static_cast<uint32_t>(n)) {
      return Status::FailedPrecondition(
          std::to_string(o.size) + " local ranks need " + std::to_string(o.size) +
          " GPUs for NCCL (one GPU per rank), and this machine has " + std::to_string(n) +
          ": use --local_ranks=" + std::to_string(n) + " or fewer");
    }
    for (uint32_t r = 0; r < o.size; ++r) o.devices.push_back(static_cast<int>(r));
  }
  if (o.devices.size() != o.size) {
    return Status::InvalidArgument("devices names " + std::to_string(o.devices.size()) +
                                   " GPUs for " + std::to_string(o.size) + " ranks");
  }
  std::set<int> seen;
  for (int d : o.devices) {
    if (d < 0 || d >= n) {
      return Status::InvalidArgument("GPU " + std::to_string(d) + " does not exist (" +
                                     std::to_string(n) + " present)");
    }
    if (!seen.insert(d).second) {
      return Status::InvalidArgument("GPU " + std::to_string(d) +
                                     " is named twice: NCCL needs one GPU per rank");
    }
  }
  if (o.init_timeout_ms <= 0 || o.op_timeout_ms <= 0) {
    return Status::InvalidArgument("NCCL timeouts must be positive");
  }
  ncclUniqueId id;
  const ncclResult_t r = ncclGetUniqueId(&id);
  if (r != ncclSuccess) return NcclError(r, "ncclGetUniqueId");
  return std::shared_ptr<ReduceGroup>(std::make_shared<NcclGroup>(o, id));
}

}  // namespace tessera::worker
