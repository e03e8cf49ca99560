// How ServerImpl hands a request to its lanes: the part each lane runs (data_ops.cc RunParts,
// and the ops that split by lane), and a push staged with its parts for the group write.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "ps/server/lane_internal.h"
#include "ps/server/request_internal.h"

namespace tessera::internal {

// One lane's part of a request: the lane and the body it runs there.
struct LanePart {
  uint32_t lane;
  std::function<Status(Lane&)> run;
};

// Pushes logged by the next group write, with their lane parts (FlushStaged).
struct StagedRun {
  std::shared_ptr<Pending> p;
  std::vector<LanePart> parts;
  uint64_t seq;
  bool may_inline;
};

}  // namespace tessera::internal
