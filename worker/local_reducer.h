// Reduction inside a node: the local ranks' gradients are combined before one push leaves it.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "ps/status.h"

namespace tessera::worker {

/// Elements in the memory of a rank's GPU (types erased so that this header needs no CUDA).
struct DeviceSpan {
  void* data = nullptr;
  /// Elements (floats, or doubles when `float64`).
  size_t size = 0;
  bool float64 = false;
};

/// Collective operations among the local ranks of a node (GPUs, or CPU threads). Every local
/// rank calls the same collectives in the same order, each from its own thread; a collective
/// returns when the rank's part is done. Rank 0 is the leader: only it pushes and pulls.
/// A member is used by one thread; different members are used concurrently.
///
/// Errors: mismatched sizes across ranks fail a host collective on every rank with
/// InvalidArgument; after Abort() (of any member, or of the ReduceGroup) every pending and later
/// collective of every rank fails with Cancelled, naming the first reason.
class LocalReducer {
 public:
  virtual ~LocalReducer() = default;
  virtual uint32_t rank() const = 0;
  virtual uint32_t size() const = 0;
  bool leader() const { return rank() == 0; }

  /// The sorted union of every rank's keys, on every rank.
  virtual Status UnionKeys(std::span<const uint64_t> keys, std::vector<uint64_t>* out) = 0;
  /// Sums `data` element-wise over the ranks into the leader's `data` (others' data unchanged).
  virtual Status ReduceSum(std::span<float> data) = 0;
  /// Copies the leader's `data` into every rank's `data`.
  virtual Status Broadcast(std::span<float> data) = 0;
  /// Every rank's `value`, in rank order, on every rank.
  virtual Status AllGather(uint64_t value, std::vector<uint64_t>* out) = 0;
  /// Makes every pending and later collective of the group fail with Cancelled naming `why`
  /// (this rank hit an error); the first reason of the group is kept. Called from the rank's
  /// own thread (ReduceGroup::Abort may be called from any thread).
  virtual void Abort(const Status& why) = 0;

  /// The GPU whose memory the device collectives work on; -1 for host reducers.
  virtual int device() const { return -1; }
  /// Sums each span element-wise over the ranks into the leader's span, on the device, ordered
  /// on `stream` (a cudaStream_t of device()) after the work already there; returns once
  /// enqueued (call WaitDevice). Every rank passes spans of the same sizes (not checked: the
  /// sizes come from the batch's union of keys and the model, equal on every rank).
  /// FailedPrecondition for host reducers (device() < 0).
  virtual Status ReduceSumOnDevice(std::span<const DeviceSpan> spans, void* stream);
  /// Waits until `stream` is idle, watching the group: returns Cancelled within a millisecond or
  /// so of an Abort anywhere in the group (and aborts the communicator, which ends the
  /// collectives in flight), or the error that NCCL or CUDA reported. FailedPrecondition for
  /// host reducers.
  virtual Status WaitDevice(void* stream);

  /// Merges sparse gradients by key: rows of `dim` floats for `keys` (unique per rank) from
  /// every rank; on the leader, out_keys is the sorted union and out_grads the summed rows
  /// (zeros where a rank had no row). Built on UnionKeys and ReduceSum.
  Status ReduceSparse(std::span<const uint64_t> keys, std::span<const float> grads, uint32_t dim,
                      std::vector<uint64_t>* out_keys, std::vector<float>* out_grads);
  /// ReduceSum then Broadcast: every rank gets the sum.
  Status AllReduceSum(std::span<float> data);
};

/// The local ranks of one node: makes each rank's LocalReducer. Thread-safe.
///
/// Abort(why) from any thread (for example a rank whose set-up failed before it joined) ends
/// every member's pending and later collectives, and every Join still waiting, with Cancelled
/// naming the first reason. A rank that fails must abort the group, or its peers wait forever.
class ReduceGroup {
 public:
  virtual ~ReduceGroup() = default;
  /// "cpu" or "nccl".
  virtual std::string_view kind() const = 0;
  virtual uint32_t size() const = 0;
  /// The member of local rank `rank` (once per rank, from the thread that will use it). NCCL:
  /// joins the communicator, waiting until every rank joined, the group is aborted, or the
  /// init timeout passes (DeadlineExceeded, and the group is aborted).
  virtual Result<std::unique_ptr<LocalReducer>> Join(uint32_t rank) = 0;
  /// Records `why` (the first reason wins) and cancels the group.
  virtual void Abort(const Status& why) = 0;
  /// OK while the group runs; the first reason passed to Abort afterwards.
  virtual Status abort_reason() const = 0;
};

/// A group of CPU local ranks (threads of one process) sharing memory. Thread-safe.
class CpuReduceGroup : public ReduceGroup, public std::enable_shared_from_this<CpuReduceGroup> {
 public:
  /// Internal: the shared barrier and buffers.
  struct State;
  static Result<std::shared_ptr<CpuReduceGroup>> Create(uint32_t size);
  ~CpuReduceGroup() override;

  std::string_view kind() const override { return "cpu"; }
  uint32_t size() const override;
  /// Never waits; the member keeps the group alive. InvalidArgument for a rank out of range.
  Result<std::unique_ptr<LocalReducer>> Join(uint32_t rank) override;
  void Abort(const Status& why) override;
  Status abort_reason() const override;

 private:
  explicit CpuReduceGroup(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

/// Options of an NCCL group.
struct NcclReduceGroupOptions {
  /// Local ranks. Required, at most the number of GPUs (NCCL refuses two ranks on one GPU).
  uint32_t size = 0;
  /// The GPU of each rank, distinct. Default (empty): rank r on GPU r.
  std::vector<int> devices;
  /// How long Join waits for every rank's communicator (non-blocking init). Default: 60 s.
  int64_t init_timeout_ms = 60000;
  /// How long one wait for the device (WaitDevice, a host collective) may take before the group
  /// is aborted with DeadlineExceeded. Default: 300 s.
  int64_t op_timeout_ms = 300000;
};

/// The NCCL group across the GPUs of a node (one rank per GPU, one thread per rank). Host-span
/// collectives are staged through device buffers; ReduceSumOnDevice and WaitDevice work on the
/// backend's device memory and stream. FailedPrecondition when the build has no CUDA, no GPU is
/// present, or there are more ranks than GPUs (the message says how many of each).
Result<std::shared_ptr<ReduceGroup>> CreateNcclReduceGroup(const NcclReduceGroupOptions& options);

}  // namespace tessera::worker
