#include "ps/server/replication_queue_internal.h"

#include <algorithm>

namespace tessera::internal {

ReplEntry& ReplicationQueue::Enqueue(std::shared_ptr<Pending> p, std::function<void()> release,
                                     uint64_t version) {
  // A deque keeps references to its other elements when one is added or the head removed:
  // waiting_ points into it.
  queue_.push_back(ReplEntry{std::move(p), std::move(release), {}, 0, false});
  ReplEntry& e = queue_.back();
  e.version = version;
  return e;
}

void ReplicationQueue::Track(ReplEntry& e) {
  if (e.pieces.empty()) return;
  e.waiting = static_cast<uint32_t>(e.pieces.size());
  for (size_t i = 0; i < e.pieces.size(); ++i) {
    waiting_.emplace(e.pieces[i].request_id, std::make_pair(&e, i));
  }
  ++replicated_;
}

Header ReplicationQueue::ForwardedHeader(const Pending& p, Op op, uint64_t map_version,
                                         uint32_t rank) {
  const Header& h = p.header;
  Header r;
  r.op = op;
  r.table_id = h.table_id;
  r.elem_type = ElemType::kF32;
  r.lr_scale = h.lr_scale;
  r.map_version = map_version;
  r.replica_from = rank + 1;
  if (p.origin_client != 0) {
    // The client's own numbering, in the sequence of the server it counts in: a client that
    // sends the push again to the backup after a fail-over sends these numbers.
    r.client_id = p.origin_client;
    r.client_seq = h.client_seq;
    r.client_origin = h.client_origin != 0 ? h.client_origin : rank + 1;
  } else {
    // A push without a client id: numbered in this primary's own stream, so that a resend
    // after a lost answer applies once.
    r.client_id = stream_;
    r.client_seq = ++stream_seq_;
  }
  r.request_id = ++request_ids_;
  return r;
}

std::pair<ReplEntry*, size_t> ReplicationQueue::Find(uint64_t request_id) const {
  auto it = waiting_.find(request_id);
  if (it == waiting_.end()) return {nullptr, 0};
  return it->second;
}

void ReplicationQueue::PieceDone(ReplEntry& e, size_t index) {
  ReplPiece& piece = e.pieces[index];
  if (piece.done) return;
  piece.done = true;
  waiting_.erase(piece.request_id);
  if (e.waiting > 0) --e.waiting;
}

std::vector<ReplEntry*> ReplicationQueue::Fail(ReplEntry& e) {
  if (e.failed) return {};
  std::vector<ReplEntry*> failing = {&e};
  const uint64_t client = e.p->header.client_id;
  bool behind = false;
  for (ReplEntry& q : queue_) {
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
  std::vector<ReplEntry*> latest_first(failing.rbegin(), failing.rend());
  for (ReplEntry* f : latest_first) {
    f->failed = true;
    for (size_t i = 0; i < f->pieces.size(); ++i) PieceDone(*f, i);
    f->waiting = 0;
    ++failed_;
  }
  return latest_first;
}

void ReplicationQueue::ReleaseReady() {
  while (!queue_.empty() && queue_.front().waiting == 0) {
    ReplEntry e = std::move(queue_.front());
    queue_.pop_front();
    if (!e.failed) e.release();
  }
}

std::vector<ReplEntry*> ReplicationQueue::Due(std::chrono::steady_clock::time_point now,
                                              std::vector<ReplPiece*>* due) {
  std::vector<ReplEntry*> failing;
  for (auto& [id, where] : waiting_) {
    ReplEntry& e = *where.first;
    ReplPiece& piece = e.pieces[where.second];
    const bool orphan =
        e.orphaned != std::chrono::steady_clock::time_point{} && now - e.orphaned >= kOrphanLimit;
    const bool silent =
        piece.heard != std::chrono::steady_clock::time_point{} && now - piece.heard >= kSilenceLimit;
    if (orphan || silent) {
      if (std::find(failing.begin(), failing.end(), &e) == failing.end()) failing.push_back(&e);
      continue;
    }
    if (now - piece.sent_at >= kReplicaResend) due->push_back(&piece);
  }
  // Request ids grow in the order pieces were made: a backup that lost them takes them again
  // in the primary's order (a later push of a client taken first would hide an earlier one).
  std::sort(due->begin(), due->end(),
            [](const ReplPiece* a, const ReplPiece* b) { return a->request_id < b->request_id; });
  return failing;
}

void ReplicationQueue::MapChanged(const ClusterMapState& map, uint32_t rank) {
  for (ReplEntry& e : queue_) {
    if (e.failed) continue;
    for (size_t i = 0; i < e.pieces.size() && !e.failed; ++i) {
      ReplPiece& piece = e.pieces[i];
      if (piece.done) continue;
      bool still_backup = false, still_primary = true;
      for (uint32_t slot : piece.slots) {
        if (map.primary.ServerOfSlot(slot) != rank) still_primary = false;
        if (!map.backup.empty() && map.backup[slot] == piece.backup) still_backup = true;
      }
      if (piece.dense_part >= 0) {
        const auto part = static_cast<uint32_t>(piece.dense_part);
        still_primary = map.DenseOwner(part) == rank;
        still_backup = map.DenseBackup(part) == piece.backup;
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
}

void ReplicationQueue::AddWaitingBackups(absl::flat_hash_set<uint16_t>* used) const {
  for (const auto& [id, where] : waiting_) used->insert(where.first->pieces[where.second].backup);
}

bool ReplicationQueue::WaitsForPushUpTo(int64_t cut) const {
  // A primary logs and applies a push only once its backups answered: a push of a step up to
  // the cut still waiting for them is not in the lanes yet, though its worker may have moved
  // its clock past the cut (Clock does not wait for the push's answer).
  for (const ReplEntry& e : queue_) {
    const Header& h = e.p->header;
    if (!e.failed && IsPush(h.op) && h.num_workers > 0 && h.clock <= cut) return true;
  }
  return false;
}

bool ReplicationQueue::HoldsOlderThan(uint64_t version) const {
  return !queue_.empty() && queue_.front().version < version;
}

ReplicaPark::Key ReplicaPark::KeyOf(const Header& h) {
  // A forwarded push as its primary sends it, and again each kReplicaResend: the primary, the
  // piece's request id, the client and its number.
  return {h.replica_from, h.request_id, h.client_id, h.client_seq};
}

void ReplicaPark::Push(Held held, bool front) {
  keys_.insert(KeyOf(held.p->header));
  bytes_ += FrameBytes(*held.p);
  if (front) {
    held_.push_front(std::move(held));
  } else {
    held_.push_back(std::move(held));
  }
}

void ReplicaPark::Erase(size_t index) {
  const Held& h = held_[index];
  keys_.erase(KeyOf(h.p->header));
  bytes_ -= FrameBytes(*h.p);
  held_.erase(held_.begin() + static_cast<std::ptrdiff_t>(index));
}

ReplicaPark::Verdict ReplicaPark::Admit(const std::shared_ptr<Pending>& p, uint64_t mine,
                                        uint64_t ticket, Clock::time_point now) {
  if (held_.empty() && p->header.map_version <= mine) return Verdict::kServe;
  if (keys_.contains(KeyOf(p->header))) {
    ++resends_dropped_;  // waits here already (its answer answers this copy)
    return Verdict::kDropped;
  }
  // Behind the primary's map (or behind one that is): wait for it here, in arrival order,
  // rather than refuse (a refused push resent after a later one of the same client was
  // taken would be taken for a retry). Past the bounds, its checks refuse it.
  if (held_.size() >= max_held_ || bytes_ + FrameBytes(*p) > max_held_bytes_) {
    return Verdict::kServe;
  }
  Push(Held{p, now, p->header.map_version > mine ? ticket : 0}, /*front=*/false);
  return Verdict::kHeld;
}

Status ReplicaPark::HoldForFill(const std::shared_ptr<Pending>& p, uint32_t rank,
                                Clock::time_point now) {
  const bool again = p.get() == readmitting_;
  if (!again && !held_.empty()) {
    return Status::Unavailable("backup server " + std::to_string(rank) + " holds " +
                               std::to_string(held_.size()) +
                               " forwarded pushes (a backup fill is in progress); nothing of "
                               "this one was applied, send it again");
  }
  // Held again, it keeps the time it came: the deadline is the push's, not the attempt's.
  Push(Held{p, again ? readmitting_held_.since : now, 0}, /*front=*/true);
  ++fill_held_total_;
  return Status::OK();
}

void ReplicaPark::Readmit(uint64_t mine,
                          const std::function<void(const std::shared_ptr<Pending>&)>& serve) {
  while (!held_.empty() && held_.front().p->header.map_version <= mine) {
    Held h = held_.front();
    Erase(0);
    readmitting_ = h.p.get();
    readmitting_held_ = h;
    serve(h.p);
    readmitting_ = nullptr;
    readmitting_held_ = Held{};
    // Held again for a backup fill (HoldForFill): it and everything after it wait on.
    if (!held_.empty() && held_.front().p == h.p) break;
  }
}

std::vector<ReplicaPark::Refusal> ReplicaPark::Expire(Clock::time_point now, const Newest& newest,
                                                      uint32_t rank) {
  std::vector<Refusal> out;
  // The primaries (Header::replica_from) one of whose held pushes expired: their later ones
  // leave with it, so none is taken before it comes again.
  absl::flat_hash_set<uint32_t> expired_from;
  for (size_t i = 0; i < held_.size();) {
    const Held& held = held_[i];
    const Header& h = held.p->header;
    const std::string what = "forwarded push (request " + std::to_string(h.request_id) +
                             " from server " + std::to_string(h.replica_from - 1) + ")";
    std::optional<Status> refuse;
    if (expired_from.contains(h.replica_from)) {
      refuse = Status::Unavailable(
          "backup server " + std::to_string(rank) + " gave up an earlier forwarded push of the "
          "same primary after " + std::to_string(kHoldLimit.count()) + " s; nothing of this " +
          what + " was applied, send it again after that one");
    } else if (const auto n = held.ticket != 0 ? newest(held.ticket) : std::nullopt;
               n.has_value() && h.map_version > *n) {
      ++refused_ahead_;
      refuse = Status::FailedPrecondition(
          "backup server " + std::to_string(rank) + " refuses " + what + " of cluster map version " +
          std::to_string(h.map_version) + ": the newest map stored is version " +
          std::to_string(*n) + " (a map version ahead of the store's is never valid); nothing of "
          "it was applied");
    } else if (now - held.since >= kHoldLimit) {
      expired_from.insert(h.replica_from);
      refuse = Status::Unavailable(
          "backup server " + std::to_string(rank) + " held " + what + " of cluster map version " +
          std::to_string(h.map_version) + " for " + std::to_string(kHoldLimit.count()) +
          " s (its map or a backup fill did not come); nothing of it was applied, send it again");
    }
    if (!refuse) {
      ++i;
      continue;
    }
    if (refuse->code() == StatusCode::kUnavailable) ++expired_;
    out.push_back(Refusal{held.p, *std::move(refuse)});
    Erase(i);
  }
  return out;
}

}  // namespace tessera::internal
