// The plans of the resharding controller (ps/control/scale.h): which slots, backups and dense
// parts go where. Internal to tessera_control.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "ps/coord/cluster_map.h"

namespace tessera::internal {

/// The slots to move and where (slot, new primary), in the order of `targets`: each target
/// keeps its lowest slots up to its share (kNumSlots / targets, the first ones one more); the
/// rest, and every slot of a server not among the targets, go in slot order to the targets
/// short of their share.
std::vector<std::pair<uint32_t, uint16_t>> PlanMoves(const ClusterMap& m,
                                                     const std::vector<uint16_t>& targets);

/// The backups of a replicated map whose slots' primaries become `primary`: each slot keeps
/// its backup while that is one of `targets`, not the slot's primary, and short of its share
/// (as above); the rest go, in slot order, to the target other than the slot's primary with the
/// most room left (the lowest id on a tie). kNoServer for every slot when there is one target.
std::vector<uint16_t> PlanBackups(const ClusterMap& m, const std::vector<uint16_t>& primary,
                                  const std::vector<uint16_t>& targets);

/// The server of each dense part once the servers are `targets` (not empty): a part whose
/// server stays keeps it; one of a server not among them goes to its backup when that stays,
/// else to the target with the fewest parts (the lowest id on a tie); then, while two targets'
/// counts differ by more than one, a part of the one with the most goes to the one with the
/// fewest (a part that one backs up first, else the highest-numbered).
std::vector<uint16_t> PlanDense(const ClusterMap& m, const std::vector<uint16_t>& targets);

/// A map with replication: ClusterMap::Replicated (its replication factor is 2, or some slot
/// or dense part has a backup), or its dense parts list backups (a record written before the
/// map kept its replication factor: `map init --replication=2` writes that list, which stays
/// when a fail-over empties it).
bool Replicated(const ClusterMap& m);

}  // namespace tessera::internal
