#include "worker/local_ranks.h"

#include <system_error>
#include <thread>
#include <vector>

#include "worker/backend.h"

namespace tessera::worker {

std::string_view ReducerKindName(ReducerKind kind) {
  switch (kind) {
    case ReducerKind::kNone:
      return "none";
    case ReducerKind::kCpu:
      return "cpu";
    case ReducerKind::kNccl:
      return "nccl";
  }
  return "unknown";
}

ReducerKind ChooseReducer(std::string_view backend, uint32_t local_ranks) {
  if (local_ranks <= 1) return ReducerKind::kNone;
  return backend == "cuda" ? ReducerKind::kNccl : ReducerKind::kCpu;
}

int DeviceOfLocalRank(uint32_t local_rank, int device_count) {
  return device_count > 0 ? static_cast<int>(local_rank % static_cast<uint32_t>(device_count)) : 0;
}

Result<std::shared_ptr<ReduceGroup>> CreateReduceGroup(ReducerKind kind, uint32_t local_ranks) {
  switch (kind) {
    case ReducerKind::kNone:
      return std::shared_ptr<ReduceGroup>();
    case ReducerKind::kCpu: {
      TESSERA_ASSIGN_OR_RETURN(auto group, CpuReduceGroup::Create(local_ranks));
      return std::shared_ptr<ReduceGroup>(std::move(group));
    }
    case ReducerKind::kNccl: {
      NcclReduceGroupOptions o;
      o.size = local_ranks;
      TESSERA_ASSIGN_OR_RETURN(int n, CudaDeviceCount());
      for (uint32_t r = 0; r < local_ranks; ++r) o.devices.push_back(DeviceOfLocalRank(r, n));
      if (local_ranks > static_cast<uint32_t>(n)) o.devices.clear();  // refused with the counts
      return CreateNcclReduceGroup(o);
    }
  }
  return Status::InvalidArgument("unknown reducer kind");
}

std::string DescribeReducer(ReducerKind kind, uint32_t local_ranks) {
  std::string s = "reducer: " + std::string(ReducerKindName(kind)) + " (" +
                  std::to_string(local_ranks) + " local rank" + (local_ranks == 1 ? "" : "s");
  if (kind == ReducerKind::kCpu) s += " on CPU threads";
  if (kind == ReducerKind::kNccl) {
    const int n = CudaDeviceCount().ValueOr(1);
    s += " on GPUs ";
    for (uint32_t r = 0; r < local_ranks; ++r) {
      s += (r > 0 ? "," : "") + std::to_string(DeviceOfLocalRank(r, n));
    }
  }
  return s + ")";
}

Status RunLocalRanks(uint32_t ranks, ReduceGroup* group,
                     const std::function<Status(uint32_t rank)>& fn) {
  std::vector<Status> results(ranks);
  auto run = [&](uint32_t r) {
    results[r] = fn(r);
    if (!results[r].ok() && group != nullptr) {
      group->Abort(results[r].WithContext("local rank " + std::to_string(r)));
    }
  };
  std::vector<std::thread> threads;
  Status not_started;
  for (uint32_t r = 1; r < ranks && not_started.ok(); ++r) {
    try {
      threads.emplace_back(run, r);
    } catch (const std::system_error& e) {
      // The ranks started wait for this one in the group's collectives: the abort ends them.
      not_started = Status::ResourceExhausted("cannot start the thread of local rank " +
                                              std::to_string(r) + " of " +
                                              std::to_string(ranks) + ": " + e.what());
      if (group != nullptr) group->Abort(not_started);
    }
  }
  if (ranks > 0 && not_started.ok()) run(0);
  for (auto& t : threads) t.join();
  if (!not_started.ok()) return not_started;
  for (const Status& s : results) {
    if (s.ok()) continue;
    if (group != nullptr) {
      Status why = group->abort_reason();
      if (!why.ok()) return why;
    }
    return s;
  }
  return Status::OK();
}

}  // namespace tessera::worker
