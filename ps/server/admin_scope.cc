// What a checkpoint, restore or export covers in a cluster that follows a map
// (docs/operations.md, "Checkpoints"): every server takes part at one map version; a server
// writes the rows of the slots and dense parts it is the primary of (so each row is in the
// files once, never a backup's copy or rows a move left behind), and a restore keeps the rows
// the server now serves as primary or backup. A map change while a checkpoint waits for its
// cut aborts it, and so does a push of a step up to the cut refused by map version (it comes
// again, maybe after its step's Clock); a checkpoint or export refuses a map under which rows
// are still being copied into this server.
#include <glog/logging.h>

#include <algorithm>

#include "ps/server/server_impl_internal.h"
#include "ps/server/snapshot_internal.h"

namespace tessera::internal {

// The rows and dense chunks this server serves: as primary, and also as backup when
// `with_backups` (a static cluster: the slots and dense range it owns).
RowFilter ServerImpl::HeldRows(bool with_backups) {
  RowFilter f;
  f.slots.assign(kNumSlots, false);
  const ClusterMapState* map = options_.follow_cluster_map ? fence_.Current() : nullptr;
  const uint32_t me = options_.rank;
  const SlotMap& owners = fence_.Owners();
  const bool backups = with_backups && map != nullptr && !map->backup.empty();
  for (uint32_t s = 0; s < kNumSlots; ++s) {
    f.slots[s] = owners.ServerOfSlot(s) == me || (backups && map->backup[s] == me);
  }
  const uint32_t parts = fence_.DenseServers();
  for (const auto& [id, t] : tables_) {
    if (t.spec.kind != TableKind::kDense) continue;
    for (uint32_t part = 0; part < parts; ++part) {
      const bool mine = map == nullptr ? part == me
                                       : map->DenseOwner(part) == me ||
                                             (with_backups && map->DenseBackup(part) == me);
      if (!mine) continue;
      const DenseRange r = DenseRangeOfServer(id, t.spec.length, part, parts);
      f.dense.push_back({id, r.begin, r.end});
    }
  }
  return f;
}

// Under a map: the filter of the rows this server is the primary of; else null (every row).
std::shared_ptr<const RowFilter> ServerImpl::PrimaryRowsFilter() {
  if (!options_.follow_cluster_map || fence_.Current() == nullptr) return nullptr;
  return std::make_shared<const RowFilter>(HeldRows(false));
}

// Under a map: FailedPrecondition, prefixed with `what`, when `h` carries another map
// version, or when rows are still being copied into this server under it.
Status ServerImpl::CheckAdminMap(const Header& h, const std::string& what) {
  if (!options_.follow_cluster_map) return Status::OK();
  TESSERA_RETURN_IF_ERROR(CheckMapVersion(h, /*exempt_retries=*/false).WithContext(what));
  const ClusterMapState* map = fence_.Current();
  if (map == nullptr) return Status::OK();
  for (uint32_t part = 0; part < map->dense_moving_from.size(); ++part) {
    if (map->dense_moving_from[part] != RoutingMap::kNoBackup &&
        map->DenseOwner(part) == options_.rank && DenseHeldForFill(part)) {
      return Status::FailedPrecondition(
          what + " at cluster map version " + std::to_string(map->version) + ": dense part " +
          std::to_string(part) + " is still being copied into server " +
          std::to_string(options_.rank) +
          " (a move left unfinished); finish it with tessera-ctl scale, then run it again");
    }
  }
  if (map->importing.empty()) return Status::OK();
  for (uint32_t slot = 0; slot < kNumSlots; ++slot) {
    if (map->importing[slot] && !migration_.slot_filled(slot)) {
      return Status::FailedPrecondition(
          what + " at cluster map version " + std::to_string(map->version) + ": slot " +
          std::to_string(slot) + " is still being copied into server " +
          std::to_string(options_.rank) +
          " (a move left unfinished); finish it with tessera-ctl scale, then run it again");
    }
  }
  return Status::OK();
}

// Servers in the cluster (the live ids of the map).
uint32_t ServerImpl::ClusterSize() {
  const ClusterMapState* map = options_.follow_cluster_map ? fence_.Current() : nullptr;
  if (map == nullptr) return options_.num_servers;
  uint32_t n = 0;
  for (const std::string& a : map->addresses) n += a.empty() ? 0 : 1;
  return n;
}

// Answers the pending checkpoint with `why` and lets the pushes it held run.
void ServerImpl::AbortCut(const Status& why) {
  std::optional<CutState> cut = cut_.Take();
  if (!cut) return;
  ReplyError(std::move(cut->request->identity), cut->request->header, why);
  Readmit(cut_.TakeParked());
}

// Aborts the pending checkpoint when the map is no longer the one it was asked at.
void ServerImpl::AbortCutOnMapChange() {
  const CutState* cut = cut_.state();
  if (cut == nullptr || !options_.follow_cluster_map) return;
  const ClusterMapState* map = fence_.Current();
  const uint64_t now = map == nullptr ? 0 : map->version;
  if (now == cut->map_version) return;
  LOG(INFO) << "checkpoint at clock " << cut->cut << " aborted: the cluster map changed from "
            << cut->map_version << " to " << now;
  AbortCut(Status::FailedPrecondition(
      "the cluster map changed from version " + std::to_string(cut->map_version) + " to " +
      std::to_string(now) + " on server " + std::to_string(options_.rank) +
      " while the checkpoint waited for its cut; nothing was written: take it again"));
}

// Aborts the pending checkpoint when `h`, refused by map version (the server at `version`),
// is a push of a step up to its cut.
// Gives up a checkpoint whose workers did not reach its cut by its deadline (Maintain): a
// worker that left, or a cut asked for more workers than the job has, must not hold the
// pushes of later steps for good.
void ServerImpl::AbortExpiredCut() {
  const CutState* cut = cut_.state();
  const uint32_t workers = cut_.Workers(consistency_.job_workers());
  const int64_t reached = consistency_.MinClock(workers);
  LOG(WARNING) << "checkpoint at clock " << cut->cut << " given up: the slowest of " << workers
               << " workers is at clock " << reached << " after the cut's timeout";
  AbortCut(Status::DeadlineExceeded(
      "checkpoint at clock " + std::to_string(cut->cut) + " given up on server " +
      std::to_string(options_.rank) + ": the slowest of its " + std::to_string(workers) +
      " workers finished clock " + std::to_string(reached) + ", not the cut, within " +
      "--checkpoint_cut_timeout_s; nothing was written, the pushes it held went on"));
}

void ServerImpl::AbortCutForRefusedPush(const Header& h, uint64_t version, bool held) {
  // A push refused by map version comes again once its client has the right map, and one
  // ahead of the server's map waits for it (MapWait): either may be applied after the Clock
  // that ends its step has arrived here, so the cut could be taken without it.
  if (!cut_.Covers(h)) return;
  LOG(INFO) << "checkpoint at clock " << cut_.state()->cut << " aborted: a push of clock "
            << h.clock << " was " << (held ? "held" : "refused") << " by map version ("
            << h.map_version << ", server at " << version << ")";
  AbortCut(Status::FailedPrecondition(
      "the cluster map changed under the checkpoint: server " + std::to_string(options_.rank) +
      (held ? " holds" : " refused") + " a push of clock " + std::to_string(h.clock) +
      " (map version " + std::to_string(h.map_version) + ", the server's " +
      std::to_string(version) + "), " +
      (held ? "applied when that map arrives" : "which its client sends again later") +
      "; nothing was written: take it again"));
}

}  // namespace tessera::internal
