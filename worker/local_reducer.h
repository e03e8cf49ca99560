// Reduction inside a node: the local ranks' gradients are combined before one push leaves it.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "ps/status.h"

namespace tessera::worker {

/// Collective operations among the local ranks of a node (GPUs, or CPU threads). Every local
/// rank calls the same collectives in the same order, each from its own thread; a collective
/// returns when the rank's part is done. Rank 0 is the leader: only it pushes and pulls.
/// A member is used by one thread; different members are used concurrently.
///
/// Errors: mismatched sizes across ranks fail the collective on every rank with
/// InvalidArgument; after Abort() every pending and later collective fails with Cancelled.
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
  /// Makes every pending and later collective of the group fail (a rank hit an error).
  virtual void Abort() = 0;

  /// Merges sparse gradients by key: rows of `dim` floats for `keys` (unique per rank) from
  /// every rank; on the leader, out_keys is the sorted union and out_grads the summed rows
  /// (zeros where a rank had no row). Built on UnionKeys and ReduceSum.
  Status ReduceSparse(std::span<const uint64_t> keys, std::span<const float> grads, uint32_t dim,
                      std::vector<uint64_t>* out_keys, std::vector<float>* out_grads);
  /// ReduceSum then Broadcast: every rank gets the sum.
  Status AllReduceSum(std::span<float> data);
};

/// A group of CPU local ranks (threads of one process) sharing memory. Thread-safe.
class CpuReduceGroup : public std::enable_shared_from_this<CpuReduceGroup> {
 public:
  /// Internal: the shared barrier and buffers.
  struct State;
  static Result<std::shared_ptr<CpuReduceGroup>> Create(uint32_t size);
  /// The member for local rank `rank` (call once per rank). It keeps the group alive.
  std::unique_ptr<LocalReducer> Member(uint32_t rank);
  uint32_t size() const;
  ~CpuReduceGroup();

 private:
  explicit CpuReduceGroup(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

/// The NCCL implementation across the GPUs of a node (one rank per GPU, one thread per rank).
/// Host spans are staged through device buffers. Available when built with CUDA.
struct NcclReducerOptions {
  /// This rank and the number of ranks. Required.
  uint32_t rank = 0;
  uint32_t size = 1;
  /// The GPU of this rank. Default: rank.
  int device = -1;
  /// The NCCL unique id (128 bytes) from NcclUniqueId(), the same on every rank. Required.
  std::vector<char> unique_id;
};
/// A new NCCL unique id (call once, on one rank, and share it). FailedPrecondition without CUDA.
Result<std::vector<char>> NcclUniqueId();
/// Joins the NCCL communicator (blocks until every rank joined).
Result<std::unique_ptr<LocalReducer>> CreateNcclReducer(const NcclReducerOptions& options);

}  // namespace tessera::worker
