// The local ranks of a node: which reducer they use, and running them so that one rank's
// failure ends them all.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "ps/status.h"
#include "worker/local_reducer.h"

namespace tessera::worker {

/// The most local ranks a node may run (--local_ranks). Each is a thread with its own model
/// copy and batches (or a GPU): 256 is above the cores of the largest CPU nodes and the GPUs of
/// any node, and keeps a mistyped count from spawning threads until the process runs out.
inline constexpr uint32_t kMaxLocalRanks = 256;

/// How the local ranks of a node reduce their gradients.
enum class ReducerKind : uint8_t {
  kNone = 0,  ///< One local rank: nothing to reduce.
  kCpu = 1,   ///< CpuReduceGroup: threads sharing host memory.
  kNccl = 2,  ///< NCCL across GPUs (one GPU per rank), on the device.
};
/// "none", "cpu" or "nccl".
std::string_view ReducerKindName(ReducerKind kind);

/// The reducer of a node: NCCL for the "cuda" backend with more than one local rank, the CPU
/// group for other backends ("cpu", "null") with more than one, none for one rank.
ReducerKind ChooseReducer(std::string_view backend, uint32_t local_ranks);

/// The GPU of a local rank: the rank modulo the number of GPUs.
int DeviceOfLocalRank(uint32_t local_rank, int device_count);

/// The group for `kind` (null for kNone). NCCL: FailedPrecondition naming the counts when the
/// node has fewer GPUs than ranks, or saying why no GPU can be used.
Result<std::shared_ptr<ReduceGroup>> CreateReduceGroup(ReducerKind kind, uint32_t local_ranks);

/// One line for the log: "reducer: nccl (2 local ranks on GPUs 0,1)", "reducer: cpu (4 local
/// ranks on CPU threads)", "reducer: none (1 local rank)".
std::string DescribeReducer(ReducerKind kind, uint32_t local_ranks);

/// Runs fn(r) for every local rank r in [0, ranks), each on its own thread (rank 0 on the
/// caller's). A rank whose fn fails aborts `group` (when not null) with "local rank r: <error>",
/// so that no other rank waits for it forever, whatever it was doing (joining the group,
/// setting up its backend, or in a collective). Returns OK when every rank succeeded, else the
/// group's first abort reason (the failure that caused the others' Cancelled), else the first
/// failure by rank.
/// A thread that cannot be started (std::system_error) aborts `group` and is ResourceExhausted;
/// the ranks already started are joined.
Status RunLocalRanks(uint32_t ranks, ReduceGroup* group,
                     const std::function<Status(uint32_t rank)>& fn);

}  // namespace tessera::worker
