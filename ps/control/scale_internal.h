// tessera-ctl scale: the controller of online resharding (docs/elasticity.md). Moves slots
// among the servers of a cluster map in etcd while clients go on training: adds registered
// servers, drains and retires others. Built into tessera-ctl only (it needs tessera_coord).
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "ps/client/client.h"
#include "ps/coord/cluster_map.h"
#include "ps/coord/etcd_client.h"

namespace tessera::internal {

struct ScaleOptions {
  /// The number of live servers wanted (server ids 0.. that have an address, plus new ids
  /// registered under PREFIX/members/server-<id>).
  uint32_t servers = 0;
  /// Slots moved per map flip: the requests for a moving slot wait while its batch copies.
  uint32_t batch_slots = 1024;
  /// The share of wall time the controller spends moving: after each batch it waits
  /// (1/pace - 1) times as long as the batch took, leaving the servers' cores to training in
  /// between (1: no pause). Default 0.5.
  double pace = 0.5;
  /// Rows per SlotImport request at most about this many bytes.
  size_t max_piece_bytes = size_t{64} << 20;
  Deadline deadline = NoDeadline();
  /// Progress lines (one per batch) go here; null: none.
  std::FILE* log = nullptr;
  /// When set and true, the run stops before its next batch (Cancelled); a batch under way
  /// finishes or fails by its calls' timeouts. A rebuild that stops so leaves nothing flipped.
  const std::atomic<bool>* cancel = nullptr;
  /// The run holds the controller lock (PREFIX/controller, ps/coord/membership.h) under a
  /// lease of this TTL, recorded as held by `controller_id`; it stops before its next batch
  /// (Unavailable) if the lease is lost.
  std::string controller_id = "tessera-ctl";
  int64_t controller_ttl_s = 10;
  /// Another controller holds the lock: wait for it until `deadline` (true), or fail at once
  /// with FailedPrecondition naming the holder (false).
  bool wait_for_controller = true;
};

struct ScaleReport {
  uint64_t from_version = 0, to_version = 0;
  /// Slots whose primary moved.
  uint32_t slots_moved = 0;
  /// Slots given a (new) backup: a rebuild's, or a replicated map's resharding.
  uint32_t slots_backed = 0;
  /// The dense parts given a backup, and moved to another primary.
  uint32_t dense_parts_backed = 0;
  uint32_t dense_parts_moved = 0;
  uint32_t batches = 0;
  /// Rows copied while their old owner still served them, and rows copied during the holds
  /// (updated after the copy ahead, or all of a move an interrupted run left flipped); bytes
  /// of both.
  uint64_t rows_ahead = 0, rows_in_hold = 0, bytes_moved = 0;
  double seconds = 0;
  /// The longest time a batch's slots waited: from the flip of the map to the copy being in.
  double max_hold_ms = 0;
};

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

/// A map with replication: some slot has a backup, or its dense parts list backups (`map init
/// --replication=2` writes that list, which stays when a fail-over empties it).
bool Replicated(const ClusterMap& m);

/// Brings the map under `prefix` to `options.servers` live servers with slots spread evenly,
/// moving as few slots as it can (each server keeps its lowest slots); finishes first any move
/// an interrupted run left flipped. Each batch: delete what the new owners hold of the slots
/// (stale rows of an earlier stay), copy the rows ahead from the old owners (still serving),
/// CAS the map (new primaries, `importing` the old), copy the rows the old owners updated
/// since, mark them in, CAS `importing` away, delete them from the old owners. Ends by
/// retiring drained ids. The dense parts of a server it drains move first, all in one flip
/// (MoveDense); a replicated map moves its backups too (MoveReplicated) and keeps a backup
/// for every slot and dense part among the servers it keeps.
Result<ScaleReport> Scale(EtcdClient& etcd, const std::string& prefix, const ClientOptions& base,
                          const ScaleOptions& options);

/// Gives every slot whose primary is a registered server and which has no backup a backup: the
/// next registered server after its primary (docs/elasticity.md, "Backup rebuild"); finishes
/// first any fill an interrupted run left flipped. Each batch: delete what the new backups hold
/// of the slots, copy the rows ahead from the primaries (serving), CAS the map (backup set,
/// `importing` the primary: the primaries forward the slots' pushes to the backups, which hold
/// them), copy the rows the primaries updated since, mark them in (the backups apply what
/// they held), CAS `importing` away. `options.servers` is not used. FailedPrecondition when a
/// slot without a backup has no other registered server to take one.
Result<ScaleReport> RebuildBackups(EtcdClient& etcd, const std::string& prefix,
                                   const ClientOptions& base, const ScaleOptions& options);

}  // namespace tessera::internal
