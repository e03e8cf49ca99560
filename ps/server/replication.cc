// Primary-backup replication (docs/elasticity.md, "Replication and fail-over"). With a map
// that gives this server's slots a backup, every push this server takes as primary is first
// sent to the backup of the slots it touches; it is logged and applied here, and answered, only
// once every backup answered it. So an acknowledged push is durable on two servers, and when
// the primary dies the backup promoted in its place holds every push the primary acknowledged.
//
// Order: requests wait in one queue (ReplicationQueue) and are handed to the log and the lanes in
// arrival order, the head first, once its backups answered; pulls and pushes that need no
// backup wait behind earlier pushes too, so a client still reads its own writes. A backup
// applies a primary's pushes in the order it receives them, which is the primary's order.
//
// Fencing: a backup applies a forwarded push only while its map names the sender the primary
// of every slot the push touches (or, while a slot moves, the primary it moves from), and
// never for a slot it is the primary of. Once the backup was promoted (or the move settled),
// it refuses, and the old primary, which applies nothing before the backup answered, applies
// nothing either: a primary cut off from etcd past its lease cannot change a row after its
// backup took over.
#include <glog/logging.h>

#include <cstring>
#include <zmq_addon.hpp>

#include "ps/server/server_impl_internal.h"

namespace tessera::internal {
namespace {

// Per-request dedup key of a push that counts in another server's sequence (a push forwarded
// by a primary, or sent again to the new primary after a fail-over): the client's id mixed
// with that server, so its numbers never meet the client's own numbers on this server.
uint64_t OriginKey(uint64_t client, uint32_t origin) {
  const uint64_t k = Mix64(client ^ (uint64_t{origin} * 0x9E3779B97F4A7C15ULL));
  return k != 0 ? k : 1;
}

}  // namespace

// A push that counts in another server's sequence (Header::client_origin) is deduplicated
// under the client's id mixed with that server: rewrites header.client_id to that key and
// keeps the client's own id in p.origin_client. Every push passes here before anything else.
void ServerImpl::KeyByOrigin(Pending& p) {
  Header& h = p.header;
  p.origin_client = h.client_id;
  // A push counted in this server's own sequence comes with no origin. One with this server
  // as its origin was sent here before this process (its id retired by a fail-over and given
  // back after a restart, ids otherwise never come back): its number may be below marks
  // this data dir logged before, though nothing of it is here (the slots were copied in
  // since), so it is keyed like any other origin's.
  if (h.client_id == 0 || h.client_origin == 0) {
    h.client_origin = 0;
    return;
  }
  h.client_id = OriginKey(h.client_id, h.client_origin);
}

// True while data requests go through the replication queue: the map gives some slot a
// backup, or requests still wait there.
bool ServerImpl::ReplicationActive() {
  const ClusterMapState* map = fence_.Current();
  return !repl_.queue.empty() ||
         (map != nullptr && (!map->backup.empty() || !map->dense_backup.empty()));
}

// Unavailable while this server's map is older than forwarded request `h`'s (the primary
// asks again); FailedPrecondition without a map.
Result<const ClusterMapState*> ServerImpl::ReplicaMap(const Header& h) {
  const ClusterMapState* map = fence_.Current();
  if (!options_.follow_cluster_map || map == nullptr) {
    return Status::FailedPrecondition("server " + std::to_string(options_.rank) +
                                      " follows no cluster map: it backs up nothing");
  }
  if (h.map_version > map->version) {
    // The primary saw a newer map first: this backup catches up by its watch.
    return Status::Unavailable("backup server " + std::to_string(options_.rank) +
                               " is at cluster map version " + std::to_string(map->version) +
                               ", behind the primary's " + std::to_string(h.map_version));
  }
  return map;
}

// The dense part (DenseRangeOfServer) holding elements [h.offset, h.offset + h.count) of
// a table of `length` floats; FailedPrecondition when the range spans two parts.
Result<uint32_t> ServerImpl::DensePartOf(const Header& h, uint64_t length,
                                         const std::string& name) {
  const uint32_t parts = fence_.DenseServers();
  for (uint32_t part = 0; part < parts; ++part) {
    const DenseRange r = DenseRangeOfServer(h.table_id, length, part, parts);
    if (h.offset < r.begin || h.offset >= r.end) continue;
    if (h.offset + h.count > r.end) {
      return Status::FailedPrecondition(
          "dense range [" + std::to_string(h.offset) + ", " + std::to_string(h.offset + h.count) +
          ") of table '" + name + "' spans dense parts: part " + std::to_string(part) +
          " is [" + std::to_string(r.begin) + ", " + std::to_string(r.end) + ")");
    }
    return part;
  }
  return Status::InvalidArgument("dense range [" + std::to_string(h.offset) + ", " +
                                 std::to_string(h.offset + h.count) + ") of table '" + name +
                                 "' is in no dense part");
}

// CheckReplica of a forwarded dense push of dense part `part`.
Status ServerImpl::CheckDenseReplica(const Header& h, uint32_t part) {
  const uint32_t from = h.replica_from - 1;
  TESSERA_ASSIGN_OR_RETURN(const ClusterMapState* map, ReplicaMap(h));
  if (map->DenseBackup(part) != options_.rank || map->DenseOwner(part) != from) {
    ++counts_.fenced_replicas;
    const uint16_t b = map->DenseBackup(part);
    return Status::FailedPrecondition(
        "replication refused: at cluster map version " + std::to_string(map->version) +
        " dense part " + std::to_string(part) + " has primary " +
        std::to_string(map->DenseOwner(part)) + " and backup " +
        (b == RoutingMap::kNoBackup ? std::string("none") : std::to_string(b)) +
        ", not primary " + std::to_string(from) + " and backup " +
        std::to_string(options_.rank) + "; nothing of it was applied");
  }
  return Status::OK();
}

// A push forwarded by a primary (Header::replica_from): Unavailable while this server is
// behind the sender's map; FailedPrecondition unless, in its map, the sender is the primary
// and this server the backup of every slot the push touches (the fencing of an old primary).
Status ServerImpl::CheckReplica(const Pending& p) {
  const Header& h = p.header;
  const uint32_t from = h.replica_from - 1;
  TESSERA_ASSIGN_OR_RETURN(const ClusterMapState* map, ReplicaMap(h));
  for (uint64_t i = 0; i < h.count; ++i) {
    const uint32_t slot = SlotOfKey(p.keys[i]);
    // While the slot moves, its old primary's pushes sequenced before it gave the slot up are
    // still taken: that server applies them once this backup answered, and its copy at the
    // flip waits for them (ExportLanes), so the new primary has them too, and it
    // forwards nothing here before that copy is in.
    const bool moving = !map->moving_from.empty() && map->moving_from[slot] == from;
    // A backup dropped from the slot (resharding gives it another) still takes its primary's
    // pushes sent before: refusing one would fail the client's push after the primary applied
    // a later one of it (FailEntry). Its rows here no longer count; they are dropped before
    // this server holds the slot again.
    // (Never a slot primaried here: moving_from leaves those out, their rows come by a copy.)
    const uint16_t primary = map->primary.ServerOfSlot(slot);
    if (primary != from && !moving) {
      ++counts_.fenced_replicas;
      return Status::FailedPrecondition(
          "replication refused: at cluster map version " + std::to_string(map->version) +
          " slot " + std::to_string(slot) + " has primary " +
          std::to_string(primary) + " and backup " +
          (map->backup.empty() || map->backup[slot] == RoutingMap::kNoBackup
               ? std::string("none")
               : std::to_string(map->backup[slot])) +
          ", not primary " + std::to_string(from) + "; nothing of it was applied");
    }
  }
  return Status::OK();
}

// Forwarded push `p` checked before it may wait anywhere (ReplicaPark): its primary is
// another server, its envelope names a map version, an existing table of its kind, a dim,
// element type and count that its data frames match, a dense range inside the table; under
// this server's map (when its version is not ahead), the fencing of CheckReplica. What only
// a newer map can say waits for it (ParkedReplica); Sparse() and Dense() check all again.
Status ServerImpl::ValidateForwarded(Pending& p) {
  const Header& h = p.header;
  const std::string what = "forwarded " + std::string(OpName(h.op));
  if (!options_.follow_cluster_map) {
    return Status::FailedPrecondition("server " + std::to_string(options_.rank) +
                                      " follows no cluster map: it backs up nothing");
  }
  const uint64_t from = uint64_t{h.replica_from} - 1;
  if (from == options_.rank || from >= RoutingMap::kNoBackup) {
    return Status::InvalidArgument(what + " names server " + std::to_string(from) +
                                   " as its primary: not a server that forwards to server " +
                                   std::to_string(options_.rank));
  }
  if (h.map_version == 0) {
    return Status::InvalidArgument(what + " names no cluster map version");
  }
  if (h.elem_type != ElemType::kF32) {
    return Status::InvalidArgument(what + ": values must be F32, got element type " +
                                   std::to_string(static_cast<int>(h.elem_type)));
  }
  if (h.count == 0) return Status::InvalidArgument(what + " of zero items");
  const bool dense = h.op == Op::kDensePush;
  TESSERA_ASSIGN_OR_RETURN(
      const TableInfo* t,
      tables_.Find(h, dense ? TableKind::kDense : TableKind::kSparse, options_.rank));
  const uint64_t floats_per_item = dense ? 1 : t->spec.dim;
  TESSERA_RETURN_IF_ERROR(CheckBudget(h.count, floats_per_item, !dense));
  if (!dense && h.dim != t->spec.dim) {
    return Status::InvalidArgument(what + ": table '" + t->spec.name + "' has dim " +
                                   std::to_string(t->spec.dim) + ", request says " +
                                   std::to_string(h.dim));
  }
  if (dense && (h.offset > t->spec.length || h.count > t->spec.length - h.offset)) {
    return Status::InvalidArgument(what + ": range [" + std::to_string(h.offset) + ", +" +
                                   std::to_string(h.count) + ") outside table '" + t->spec.name +
                                   "' of length " + std::to_string(t->spec.length));
  }
  // The data frames the envelope implies: keys and values, or the dense values.
  std::vector<std::pair<const char*, uint64_t>> frames;
  if (!dense) frames.emplace_back("keys", h.count * 8);
  frames.emplace_back("values", h.count * floats_per_item * 4);
  if (p.frames.size() != frames.size()) {
    return Status::InvalidArgument(what + " of " + std::to_string(h.count) + " items expects " +
                                   std::to_string(frames.size()) + " data frame(s), got " +
                                   std::to_string(p.frames.size()));
  }
  for (size_t i = 0; i < frames.size(); ++i) {
    if (p.frames[i].size() != frames[i].second) {
      return Status::InvalidArgument(what + ": " + frames[i].first + " frame has " +
                                     std::to_string(p.frames[i].size()) +
                                     " bytes, envelope implies " +
                                     std::to_string(frames[i].second));
    }
  }
  const ClusterMapState* map = fence_.Current();
  if (map == nullptr || h.map_version > map->version || IsRetriedPush(h)) return Status::OK();
  // The map it names is here: the sender must be the primary of what it writes.
  if (dense) {
    TESSERA_ASSIGN_OR_RETURN(const uint32_t part, DensePartOf(h, t->spec.length, t->spec.name));
    return CheckDenseReplica(h, part);
  }
  p.keys = ViewOf<uint64_t>(p.frames[0], &p.key_copy);
  return CheckReplica(p);
}

// True when forwarded push `p` (validated: ValidateForwarded) waits (or, a resend of one
// that waits, is dropped) in ReplicaPark until this server's map catches up (ReadmitReplicas,
// on a map change and at each maintenance pass); false when it may be served now. One ahead
// of this server's map has the map read again from its store (MapRecheck) and is refused if
// it is ahead of that too (ExpireReplicas).
bool ServerImpl::ParkedReplica(const std::shared_ptr<Pending>& p) {
  if (!options_.follow_cluster_map) return false;
  const ClusterMapState* map = fence_.Current();
  const uint64_t mine = map != nullptr ? map->version : 0;
  const uint64_t ticket = p->header.map_version > mine ? recheck_.Request() : 0;
  return repl_.park.Admit(p, mine, ticket) != ReplicaPark::Verdict::kServe;
}

// Answers the held forwarded pushes ReplicaPark::Expire gives up: ahead of the store's newest
// map, or held past ReplicaPark::kHoldLimit (with the later ones of the same primary); then
// serves what may go now.
void ServerImpl::ExpireReplicas() {
  std::vector<ReplicaPark::Refusal> refused = repl_.park.Expire(
      std::chrono::steady_clock::now(),
      [this](uint64_t ticket) { return recheck_.NewestSince(ticket); }, options_.rank);
  if (refused.empty()) return;
  // Latest first: each number given back for a resend is then the lowest its client's later
  // pushes wait for (PushDedup::Abandon), so none of them is logged before it comes again.
  for (auto r = refused.rbegin(); r != refused.rend(); ++r) {
    const Header& h = r->p->header;
    if (r->status.code() == StatusCode::kUnavailable && h.client_id != 0) {
      dedup_.Accept(h.client_id, h.client_seq);
      GiveBackSeq(h, /*resend=*/true);
    }
  }
  // Answered in the order they came (the primary reads them so).
  for (ReplicaPark::Refusal& r : refused) {
    LOG_EVERY_N(WARNING, 100) << r.status.ToString();
    ReplyError(std::move(r.p->identity), r.p->header, r.status);
  }
  ReadmitReplicas();
}

// Holds forwarded push `p` for a backup fill (HeldForFill, DenseHeldForFill): ReplicaPark.
Status ServerImpl::HoldForFill(const std::shared_ptr<Pending>& p) {
  return repl_.park.HoldForFill(p, options_.rank);
}

void ServerImpl::ReadmitReplicas() {
  const ClusterMapState* map = fence_.Current();
  repl_.park.Readmit(map != nullptr ? map->version : 0,
                        [this](const std::shared_ptr<Pending>& p) {
                          const Status s = p->header.op == Op::kDensePush ? Dense(p) : Sparse(p);
                          if (!s.ok()) ReplyError(std::move(p->identity), p->header, s);
                        });
}

// The DEALER to backup `server` (connected on first use, again when its address changed);
// null when the map has no address for it.
zmq::socket_t* ServerImpl::BackupSocket(uint16_t server) {
  const ClusterMapState* map = fence_.Current();
  if (map == nullptr || server >= map->addresses.size() || map->addresses[server].empty()) {
    return nullptr;
  }
  return repl_.links.Get(server, map->addresses[server]);
}

// Hands `p` to `release` at once, or, while replication is active, after every request
// ahead of it and, for a push, after its backups answered.
void ServerImpl::Sequence(const std::shared_ptr<Pending>& p, std::function<void()> release) {
  const Header& h = p->header;
  // A backup applies what its primary forwards as it comes (the primary orders it), and
  // never waits for its own backups: two servers backing each other up must not wait on
  // each other.
  if (h.replica_from != 0 || !ReplicationActive()) {
    release();
    return;
  }
  const ClusterMapState* map = fence_.Current();
  ReplEntry& e = repl_.queue.Enqueue(p, std::move(release), map != nullptr ? map->version : 0);
  if (h.op == Op::kSparsePush || h.op == Op::kSparsePushPull) ForwardToBackups(e);
  if (h.op == Op::kDensePush) ForwardDenseToBackup(e);
  ReleaseReady();
}

// Sends the dense push of `e` to the backup of its dense part, if it has one.
void ServerImpl::ForwardDenseToBackup(ReplEntry& e) {
  const ClusterMapState* map = fence_.Current();
  if (map == nullptr || map->dense_backup.empty()) return;
  Pending& p = *e.p;
  const Header& h = p.header;
  auto t = tables_.find(h.table_id);
  if (t == tables_.end()) return;
  auto part = DensePartOf(h, t->second.spec.length, t->second.spec.name);
  if (!part.ok()) return;  // checked by Dense() already
  const uint16_t backup = map->DenseBackup(*part);
  if (backup == RoutingMap::kNoBackup) return;
  Header r = repl_.queue.ForwardedHeader(p, Op::kDensePush, map->version, options_.rank);
  r.offset = h.offset;
  r.count = h.count;
  ReplPiece piece;
  piece.backup = backup;
  piece.request_id = r.request_id;
  piece.dense_part = *part;
  piece.parts.push_back(EnvelopeOf(r));
  piece.parts.emplace_back().copy(p.frames[0]);  // shared, not copied
  e.pieces.push_back(std::move(piece));
  repl_.queue.Track(e);
  SendPiece(e.pieces[0]);
}

// Splits the push of `e` by the backup of its keys' slots and sends each backup its part.
void ServerImpl::ForwardToBackups(ReplEntry& e) {
  const ClusterMapState* map = fence_.Current();
  if (map == nullptr || map->backup.empty()) return;
  Pending& p = *e.p;
  const Header& h = p.header;
  // The keys by the backup of their slot (one backup in the usual layout).
  absl::flat_hash_map<uint16_t, std::vector<uint32_t>> by_backup;
  for (uint64_t i = 0; i < h.count; ++i) {
    const uint16_t b = map->backup[SlotOfKey(p.keys[i])];
    if (b != RoutingMap::kNoBackup) by_backup[b].push_back(static_cast<uint32_t>(i));
  }
  if (by_backup.empty()) return;
  const uint32_t dim = h.dim;
  for (auto& [backup, idx] : by_backup) {
    Header r = repl_.queue.ForwardedHeader(p, Op::kSparsePush, map->version, options_.rank);
    r.count = idx.size();
    r.dim = dim;
    ReplPiece piece;
    piece.backup = backup;
    piece.request_id = r.request_id;
    for (uint32_t i : idx) piece.slots.push_back(SlotOfKey(p.keys[i]));
    piece.parts.push_back(EnvelopeOf(r));
    if (idx.size() == h.count) {
      // The whole request: the frames are shared, not copied (zmq_msg_copy counts references).
      piece.parts.emplace_back().copy(p.frames[0]);
      piece.parts.emplace_back().copy(p.frames[1]);
    } else {
      zmq::message_t keys(idx.size() * sizeof(uint64_t));
      zmq::message_t values(idx.size() * size_t{dim} * sizeof(float));
      for (size_t k = 0; k < idx.size(); ++k) {
        std::memcpy(static_cast<char*>(keys.data()) + k * sizeof(uint64_t), p.keys + idx[k],
                    sizeof(uint64_t));
        std::memcpy(static_cast<char*>(values.data()) + k * size_t{dim} * sizeof(float),
                    p.values + size_t{idx[k]} * dim, size_t{dim} * sizeof(float));
      }
      piece.parts.push_back(std::move(keys));
      piece.parts.push_back(std::move(values));
    }
    std::sort(piece.slots.begin(), piece.slots.end());
    piece.slots.erase(std::unique(piece.slots.begin(), piece.slots.end()), piece.slots.end());
    e.pieces.push_back(std::move(piece));
  }
  repl_.queue.Track(e);
  for (ReplPiece& piece : e.pieces) SendPiece(piece);
}

zmq::message_t ServerImpl::EnvelopeOf(const Header& h) {
  std::string env;
  EncodeHeader(h, &env);
  return zmq::message_t(env.data(), env.size());
}

void ServerImpl::SendPiece(ReplPiece& piece) {
  piece.sent_at = std::chrono::steady_clock::now();
  if (piece.heard == std::chrono::steady_clock::time_point{}) piece.heard = piece.sent_at;
  zmq::socket_t* sock = BackupSocket(piece.backup);
  // Sent again after kReplicaResend, or dropped by a new map.
  if (sock == nullptr) return;
  std::vector<zmq::message_t> wire(piece.parts.size());
  for (size_t i = 0; i < wire.size(); ++i) wire[i].copy(piece.parts[i]);
  try {
    (void)zmq::send_multipart(*sock, wire, zmq::send_flags::dontwait);
  } catch (const zmq::error_t& e) {
    VLOG(1) << "replication: send to backup " << piece.backup << ": " << e.what();
  }
}

// Counts the backups' answers: OK completes a piece, Unavailable sends it again soon, any
// other error fails the entry (nothing applied; the client is told to retry).
void ServerImpl::DrainBackupReplies() {
  for (auto& [server, link] : repl_.links.links()) {
    for (;;) {
      std::vector<zmq::message_t> parts;
      std::optional<size_t> got;
      try {
        got = zmq::recv_multipart(link.dealer, std::back_inserter(parts),
                                  zmq::recv_flags::dontwait);
      } catch (const zmq::error_t&) {
        break;
      }
      if (!got) break;
      if (parts.empty()) continue;
      Header h;
      if (!DecodeHeader(parts[0].data(), parts[0].size(), &h).ok()) continue;
      auto [entry, index] = repl_.queue.Find(h.request_id);
      if (entry == nullptr) continue;  // an answer to a resend already counted
      ReplPiece& piece = entry->pieces[index];
      piece.heard = std::chrono::steady_clock::now();
      if (h.status == StatusCode::kOk) {
        piece.acked = true;
        repl_.queue.PieceDone(*entry, index);
      } else if (h.status == StatusCode::kUnavailable ||
                 h.status == StatusCode::kResourceExhausted) {
        // The backup is behind the map, the push is still waiting there, or this primary has
        // more requests in flight there than the backup takes from one peer: ask again soon.
        piece.sent_at = std::chrono::steady_clock::now() - ReplicationQueue::kReplicaResend +
                        std::chrono::milliseconds(20);
      } else {
        FailEntry(*entry, Status(h.status, h.message)
                              .WithContext("backup server " + std::to_string(server)));
      }
    }
  }
  ReleaseReady();
}

void ServerImpl::FailEntry(ReplEntry& e, const Status& why) {
  const Status s = why.code() == StatusCode::kFailedPrecondition
                       ? Status::Unavailable(why.message() +
                                             " (this server may no longer be the primary; "
                                             "nothing was applied: retry by the current map)")
                       : why;
  for (ReplEntry* f : repl_.queue.Fail(e)) {
    // Nothing of it is logged or applied here: the client may send it again (anywhere).
    const Status reply =
        f == &e ? s
                : Status::Unavailable("an earlier push of this client to server " +
                                      std::to_string(options_.rank) + " failed (" + s.message() +
                                      "); nothing of this one was applied either");
    GiveBackSeq(f->p->header, /*resend=*/reply.code() == StatusCode::kUnavailable);
    ReplyError(std::move(f->p->identity), f->p->header, reply);
  }
}

// Runs the entries at the head of the queue whose backups all answered.
void ServerImpl::ReleaseReady() {
  repl_.queue.ReleaseReady();
  RunWaitingExports();
  TakeSnapshotIfReady();  // a checkpoint cut may have waited for these pushes' backups
}

// Sends again the pieces due (ReplicationQueue::Due) and fails the orphans past the limit.
void ServerImpl::ResendReplication() {
  if (repl_.queue.waiting() == 0) return;
  std::vector<ReplPiece*> due;
  const auto now = std::chrono::steady_clock::now();
  const std::vector<ReplEntry*> failing = repl_.queue.Due(now, &due);
  for (ReplPiece* piece : due) SendPiece(*piece);
  for (ReplEntry* e : failing) {
    if (e->orphaned != std::chrono::steady_clock::time_point{}) {
      FailEntry(*e, Status::Unavailable(
                        "the push's slots moved away from server " +
                        std::to_string(options_.rank) + " and its backup did not answer within " +
                        std::to_string(ReplicationQueue::kOrphanLimit.count()) +
                        " s: it may or may not be applied on the new primary"));
      continue;
    }
    std::string silent;
    for (const ReplPiece& piece : e->pieces) {
      if (!piece.done) silent += (silent.empty() ? "" : ", ") + std::to_string(piece.backup);
    }
    LOG_EVERY_N(WARNING, 100) << "replication: backup server(s) " << silent
                              << " answered nothing for "
                              << ReplicationQueue::kSilenceLimit.count() << " s";
    FailEntry(*e, Status::Unavailable(
                      "backup server(s) " + silent + " of server " +
                      std::to_string(options_.rank) + " did not answer the push within " +
                      std::to_string(ReplicationQueue::kSilenceLimit.count()) +
                      " s; nothing of it was applied here, send it again"));
  }
  if (!failing.empty()) ReleaseReady();
}

// After a map change: a piece whose backup the map dropped no longer waits for it; an entry
// whose slots this server no longer owns waits for its backup's answer (orphaned).
void ServerImpl::ReplicationMapChanged() {
  const ClusterMapState* map = fence_.Current();
  if (map == nullptr) return;
  repl_.queue.MapChanged(*map, options_.rank);
  CloseUnusedLinks();
  ReleaseReady();
}

// Closes the links to servers that back up none of this server's slots and dense parts and
// that no waiting piece names (after a map change, and at each maintenance pass).
void ServerImpl::CloseUnusedLinks() {
  if (repl_.links.empty()) return;
  const ClusterMapState* map = fence_.Current();
  absl::flat_hash_set<uint16_t> used;
  repl_.queue.AddWaitingBackups(&used);
  if (map != nullptr) {
    // The backups of this server's own slots and dense parts.
    const std::vector<uint16_t>& owners = map->primary.owners();
    for (size_t slot = 0; slot < map->backup.size() && slot < owners.size(); ++slot) {
      if (owners[slot] == options_.rank) used.insert(map->backup[slot]);
    }
    for (uint32_t part = 0; part < map->dense_backup.size(); ++part) {
      if (map->DenseOwner(part) == options_.rank) used.insert(map->dense_backup[part]);
    }
  }
  repl_.links.CloseUnused(used);
}

}  // namespace tessera::internal
