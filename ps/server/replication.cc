// Primary-backup replication (docs/elasticity.md, "Replication and fail-over"). With a map
// that gives this server's slots a backup, every push this server takes as primary is first
// sent to the backup of the slots it touches; it is logged and applied here, and answered, only
// once every backup answered it. So an acknowledged push is durable on two servers, and when
// the primary dies the backup promoted in its place holds every push the primary acknowledged.
//
// Order: requests wait in one queue (repl_queue_) and are handed to the log and the lanes in
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

bool ServerImpl::ReplicationActive() {
  const ClusterMapState* map = CurrentMap();
  return !repl_queue_.empty() ||
         (map != nullptr && (!map->backup.empty() || !map->dense_backup.empty()));
}

Result<const ServerImpl::ClusterMapState*> ServerImpl::ReplicaMap(const Header& h) {
  const ClusterMapState* map = CurrentMap();
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

Result<uint32_t> ServerImpl::DensePartOf(const Header& h, uint64_t length,
                                         const std::string& name) {
  const uint32_t parts = DenseServers();
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

Status ServerImpl::CheckDenseReplica(const Header& h, uint32_t part) {
  const uint32_t from = h.replica_from - 1;
  TESSERA_ASSIGN_OR_RETURN(const ClusterMapState* map, ReplicaMap(h));
  if (map->DenseBackup(part) != options_.rank || map->DenseOwner(part) != from) {
    ++fenced_replicas_;
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
      ++fenced_replicas_;
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

namespace {
// A forwarded push as its primary sends it, and again each kReplicaResend: the primary, the
// piece's request id, the client and its number.
std::tuple<uint64_t, uint64_t, uint64_t, uint64_t> ReplicaKey(const Header& h) {
  return {h.replica_from, h.request_id, h.client_id, h.client_seq};
}
}  // namespace

bool ServerImpl::ParkedReplica(const std::shared_ptr<Pending>& p) {
  if (!options_.follow_cluster_map) return false;
  const ClusterMapState* map = CurrentMap();
  const uint64_t mine = map != nullptr ? map->version : 0;
  if (replica_parked_.empty() && p->header.map_version <= mine) return false;
  if (replica_parked_keys_.contains(ReplicaKey(p->header))) {
    ++replica_resends_dropped_;  // waits here already (its answer answers this copy)
    return true;
  }
  // Behind the primary's map (or behind one that is): wait for it here, in arrival order,
  // rather than refuse (a refused push resent after a later one of the same client was
  // taken would be taken for a retry). Past the bound, CheckReplica refuses it.
  if (replica_parked_.size() >= kMaxReplicaParked) return false;
  replica_parked_.push_back(p);
  replica_parked_keys_.insert(ReplicaKey(p->header));
  return true;
}

Status ServerImpl::HoldForFill(const std::shared_ptr<Pending>& p) {
  if (p.get() != readmitting_replica_ && !replica_parked_.empty()) {
    return Status::Unavailable("backup server " + std::to_string(options_.rank) + " holds " +
                               std::to_string(replica_parked_.size()) +
                               " forwarded pushes (a backup fill is in progress); nothing of "
                               "this one was applied, send it again");
  }
  replica_parked_.push_front(p);
  replica_parked_keys_.insert(ReplicaKey(p->header));
  ++fill_held_total_;
  return Status::OK();
}

void ServerImpl::ReadmitReplicas() {
  const ClusterMapState* map = CurrentMap();
  const uint64_t mine = map != nullptr ? map->version : 0;
  while (!replica_parked_.empty() && replica_parked_.front()->header.map_version <= mine) {
    std::shared_ptr<Pending> p = std::move(replica_parked_.front());
    replica_parked_.pop_front();
    replica_parked_keys_.erase(ReplicaKey(p->header));
    readmitting_replica_ = p.get();
    const Status s = p->header.op == Op::kDensePush ? Dense(p) : Sparse(p);
    readmitting_replica_ = nullptr;
    if (!s.ok()) ReplyError(std::move(p->identity), p->header, s);
    // Held again for a backup fill (HoldForFill): it and everything after it wait on.
    if (!replica_parked_.empty() && replica_parked_.front() == p) break;
  }
}

zmq::socket_t* ServerImpl::BackupSocket(uint16_t server) {
  const ClusterMapState* map = CurrentMap();
  if (map == nullptr || server >= map->addresses.size() || map->addresses[server].empty()) {
    return nullptr;
  }
  const std::string& address = map->addresses[server];
  auto it = backup_links_.find(server);
  if (it != backup_links_.end() && it->second.address == address) return &it->second.dealer;
  BackupLink link{address, zmq::socket_t(ctx_, zmq::socket_type::dealer)};
  link.dealer.set(zmq::sockopt::linger, 0);
  // Pushes waiting for a backup that does not read are bounded by the queue's resends, not by
  // ZeroMQ's buffers.
  link.dealer.set(zmq::sockopt::sndhwm, 0);
  if (!options_.curve_secret_key.empty()) {
    // The servers share one key pair (--curve_secret_key_file): the link presents it.
    char public_key[41] = {};
    if (zmq_curve_public(public_key, options_.curve_secret_key.c_str()) == 0) {
      link.dealer.set(zmq::sockopt::curve_serverkey, std::string(public_key, 40));
      link.dealer.set(zmq::sockopt::curve_publickey, std::string(public_key, 40));
      link.dealer.set(zmq::sockopt::curve_secretkey, options_.curve_secret_key);
    }
  }
  try {
    link.dealer.connect(address);
  } catch (const zmq::error_t& e) {
    LOG(ERROR) << "replication: cannot connect to backup server " << server << " at " << address
               << ": " << e.what();
    return nullptr;
  }
  backup_links_.erase(server);
  auto [pos, inserted] = backup_links_.emplace(server, std::move(link));
  poll_items_dirty_ = true;
  return &pos->second.dealer;
}

void ServerImpl::Sequence(const std::shared_ptr<Pending>& p, std::function<void()> release) {
  const Header& h = p->header;
  // A backup applies what its primary forwards as it comes (the primary orders it), and
  // never waits for its own backups: two servers backing each other up must not wait on
  // each other.
  if (h.replica_from != 0 || !ReplicationActive()) {
    release();
    return;
  }
  repl_queue_.push_back(ReplEntry{p, std::move(release), {}, 0, false});
  ReplEntry& e = repl_queue_.back();
  const ClusterMapState* map = CurrentMap();
  e.version = map != nullptr ? map->version : 0;
  if (h.op == Op::kSparsePush || h.op == Op::kSparsePushPull) ForwardToBackups(e);
  if (h.op == Op::kDensePush) ForwardDenseToBackup(e);
  ReleaseReady();
}

// The forwarded request's header: op, table, and the client's numbering (or this primary's).
Header ServerImpl::ForwardedHeader(const Pending& p, Op op, uint64_t map_version) {
  const Header& h = p.header;
  Header r;
  r.op = op;
  r.table_id = h.table_id;
  r.elem_type = ElemType::kF32;
  r.lr_scale = h.lr_scale;
  r.map_version = map_version;
  r.replica_from = options_.rank + 1;
  if (p.origin_client != 0) {
    // The client's own numbering, in the sequence of the server it counts in: a client that
    // sends the push again to the backup after a fail-over sends these numbers.
    r.client_id = p.origin_client;
    r.client_seq = h.client_seq;
    r.client_origin = h.client_origin != 0 ? h.client_origin : options_.rank + 1;
  } else {
    // A push without a client id: numbered in this primary's own stream, so that a resend
    // after a lost answer applies once.
    r.client_id = replication_stream_;
    r.client_seq = ++replication_seq_;
  }
  r.request_id = ++replication_ids_;
  return r;
}

void ServerImpl::ForwardDenseToBackup(ReplEntry& e) {
  const ClusterMapState* map = CurrentMap();
  if (map == nullptr || map->dense_backup.empty()) return;
  Pending& p = *e.p;
  const Header& h = p.header;
  auto t = tables_.find(h.table_id);
  if (t == tables_.end()) return;
  auto part = DensePartOf(h, t->second.spec.length, t->second.spec.name);
  if (!part.ok()) return;  // checked by Dense() already
  const uint16_t backup = map->DenseBackup(*part);
  if (backup == RoutingMap::kNoBackup) return;
  Header r = ForwardedHeader(p, Op::kDensePush, map->version);
  r.offset = h.offset;
  r.count = h.count;
  ReplPiece piece;
  piece.backup = backup;
  piece.request_id = r.request_id;
  piece.dense_part = *part;
  piece.parts.push_back(EnvelopeOf(r));
  piece.parts.emplace_back().copy(p.frames[0]);  // shared, not copied
  e.pieces.push_back(std::move(piece));
  e.waiting = 1;
  repl_waiting_.emplace(e.pieces[0].request_id, std::make_pair(&e, size_t{0}));
  SendPiece(e.pieces[0]);
  ++replicated_pushes_;
}

void ServerImpl::ForwardToBackups(ReplEntry& e) {
  const ClusterMapState* map = CurrentMap();
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
    Header r = ForwardedHeader(p, Op::kSparsePush, map->version);
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
  e.waiting = static_cast<uint32_t>(e.pieces.size());
  for (size_t i = 0; i < e.pieces.size(); ++i) {
    repl_waiting_.emplace(e.pieces[i].request_id, std::make_pair(&e, i));
    SendPiece(e.pieces[i]);
  }
  ++replicated_pushes_;
}

zmq::message_t ServerImpl::EnvelopeOf(const Header& h) {
  std::string env;
  EncodeHeader(h, &env);
  return zmq::message_t(env.data(), env.size());
}

void ServerImpl::SendPiece(ReplPiece& piece) {
  piece.sent_at = std::chrono::steady_clock::now();
  zmq::socket_t* sock = BackupSocket(piece.backup);
  if (sock == nullptr) return;  // sent again after kReplicaResend, or dropped by a new map
  std::vector<zmq::message_t> wire(piece.parts.size());
  for (size_t i = 0; i < wire.size(); ++i) wire[i].copy(piece.parts[i]);
  try {
    (void)zmq::send_multipart(*sock, wire, zmq::send_flags::dontwait);
  } catch (const zmq::error_t& e) {
    VLOG(1) << "replication: send to backup " << piece.backup << ": " << e.what();
  }
}

void ServerImpl::DrainBackupReplies() {
  for (auto& [server, link] : backup_links_) {
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
      auto it = repl_waiting_.find(h.request_id);
      if (it == repl_waiting_.end()) continue;  // an answer to a resend already counted
      auto [entry, index] = it->second;
      ReplPiece& piece = entry->pieces[index];
      if (h.status == StatusCode::kOk) {
        piece.acked = true;
        PieceDone(*entry, index);
      } else if (h.status == StatusCode::kUnavailable ||
                 h.status == StatusCode::kResourceExhausted) {
        // The backup is behind the map, the push is still waiting there, or this primary has
        // more requests in flight there than the backup takes from one peer: ask again soon.
        piece.sent_at = std::chrono::steady_clock::now() - kReplicaResend +
                        std::chrono::milliseconds(20);
      } else {
        FailEntry(*entry, Status(h.status, h.message)
                              .WithContext("backup server " + std::to_string(server)));
      }
    }
  }
  ReleaseReady();
}

void ServerImpl::PieceDone(ReplEntry& e, size_t index) {
  ReplPiece& piece = e.pieces[index];
  if (piece.done) return;
  piece.done = true;
  repl_waiting_.erase(piece.request_id);
  if (e.waiting > 0) --e.waiting;
}

void ServerImpl::FailEntry(ReplEntry& e, const Status& why) {
  if (e.failed) return;
  // The pushes of the same client queued behind it fail too: one of them logged would move
  // the client's logged mark past this one, and its resend would then be taken as a retry
  // of something applied nowhere. Failed last-first, so that each gives its number back.
  std::vector<ReplEntry*> failing = {&e};
  const uint64_t client = e.p->header.client_id;
  bool behind = false;
  for (ReplEntry& q : repl_queue_) {
    if (&q == &e) {
      behind = true;
    } else if (behind && client != 0 && !q.failed && q.p->header.client_id == client &&
               q.p->header.op != Op::kSparsePull && q.p->header.op != Op::kDensePull) {
      // One a backup took already is applied there: it goes on (a narrow case: a backup
      // refusing one push of a client and taking the next).
      bool taken = false;
      for (const ReplPiece& piece : q.pieces) taken = taken || piece.acked;
      if (!taken) failing.push_back(&q);
    }
  }
  const Status s = why.code() == StatusCode::kFailedPrecondition
                       ? Status::Unavailable(why.message() +
                                             " (this server may no longer be the primary; "
                                             "nothing was applied: retry by the current map)")
                       : why;
  for (auto it = failing.rbegin(); it != failing.rend(); ++it) {
    ReplEntry& f = **it;
    f.failed = true;
    for (size_t i = 0; i < f.pieces.size(); ++i) PieceDone(f, i);
    f.waiting = 0;
    // Nothing of it is logged or applied here: the client may send it again (anywhere).
    const Status reply = &f == &e ? s
                                  : Status::Unavailable("an earlier push of this client to server " +
                                                        std::to_string(options_.rank) + " failed (" +
                                                        s.message() +
                                                        "); nothing of this one was applied either");
    GiveBackSeq(f.p->header, /*resend=*/reply.code() == StatusCode::kUnavailable);
    ++failed_replications_;
    ReplyError(std::move(f.p->identity), f.p->header, reply);
  }
}

void ServerImpl::ReleaseReady() {
  while (!repl_queue_.empty() && repl_queue_.front().waiting == 0) {
    ReplEntry e = std::move(repl_queue_.front());
    repl_queue_.pop_front();
    if (!e.failed) e.release();
  }
  RunWaitingExports();
  TakeSnapshotIfReady();  // a checkpoint cut may have waited for these pushes' backups
}

void ServerImpl::ResendReplication() {
  if (repl_waiting_.empty()) return;
  const auto now = std::chrono::steady_clock::now();
  std::vector<ReplEntry*> orphans;
  for (auto& [id, where] : repl_waiting_) {
    ReplEntry& e = *where.first;
    if (e.orphaned != std::chrono::steady_clock::time_point{} &&
        now - e.orphaned >= kOrphanLimit) {
      orphans.push_back(&e);
      continue;
    }
    ReplPiece& piece = e.pieces[where.second];
    if (now - piece.sent_at >= kReplicaResend) SendPiece(piece);
  }
  for (ReplEntry* e : orphans) {
    FailEntry(*e, Status::Unavailable(
                      "the push's slots moved away from server " + std::to_string(options_.rank) +
                      " and its backup did not answer within " +
                      std::to_string(kOrphanLimit.count()) +
                      " s: it may or may not be applied on the new primary"));
  }
  if (!orphans.empty()) ReleaseReady();
}

void ServerImpl::ReplicationMapChanged() {
  const ClusterMapState* map = CurrentMap();
  if (map == nullptr) return;
  for (ReplEntry& e : repl_queue_) {
    if (e.failed) continue;
    for (size_t i = 0; i < e.pieces.size() && !e.failed; ++i) {
      ReplPiece& piece = e.pieces[i];
      if (piece.done) continue;
      bool still_backup = false, still_primary = true;
      for (uint32_t slot : piece.slots) {
        if (map->primary.ServerOfSlot(slot) != options_.rank) still_primary = false;
        if (!map->backup.empty() && map->backup[slot] == piece.backup) still_backup = true;
      }
      if (piece.dense_part >= 0) {
        const auto part = static_cast<uint32_t>(piece.dense_part);
        still_primary = map->DenseOwner(part) == options_.rank;
        still_backup = map->DenseBackup(part) == piece.backup;
      }
      if (!still_primary) {
        // The push was sent to the backup, which may be the new primary now: its answer is
        // definitive (OK: it holds the push; a refusal: nothing was applied anywhere), so the
        // entry waits for it rather than telling the client now that nothing was applied
        // (the client would send it again under a new number, and the new primary would apply
        // it twice). Given up after kOrphanLimit without an answer.
        if (e.orphaned == std::chrono::steady_clock::time_point{}) {
          e.orphaned = std::chrono::steady_clock::now();
        }
      } else if (!still_backup) {
        // The backup was dropped from these slots (it died; the map no longer names it): the
        // push no longer waits for it. A replacement backup starts from a copy of the rows.
        PieceDone(e, i);
      }
    }
  }
  CloseUnusedLinks();
  ReleaseReady();
}

void ServerImpl::CloseUnusedLinks() {
  if (backup_links_.empty()) return;
  const ClusterMapState* map = CurrentMap();
  absl::flat_hash_map<uint16_t, bool> used;
  for (const auto& [id, where] : repl_waiting_) {
    used[where.first->pieces[where.second].backup] = true;
  }
  if (map != nullptr) {
    // The backups of this server's own slots and dense parts.
    const std::vector<uint16_t>& owners = map->primary.owners();
    for (size_t slot = 0; slot < map->backup.size() && slot < owners.size(); ++slot) {
      if (owners[slot] == options_.rank) used[map->backup[slot]] = true;
    }
    for (uint32_t part = 0; part < map->dense_backup.size(); ++part) {
      if (map->DenseOwner(part) == options_.rank) used[map->dense_backup[part]] = true;
    }
  }
  for (auto it = backup_links_.begin(); it != backup_links_.end();) {
    if (!used.contains(it->first)) {
      backup_links_.erase(it++);
      poll_items_dirty_ = true;
    } else {
      ++it;
    }
  }
}

}  // namespace tessera::internal
