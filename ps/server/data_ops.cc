// Sparse and dense pulls and pushes: validated on the I/O thread, logged, split by lane and
// answered once when every lane has done its part.
#include <glog/logging.h>

#include <algorithm>
#include <cstring>
#include <iterator>

#include "ps/message_pool_internal.h"
#include "ps/server/server_impl_internal.h"

namespace tessera::internal {
namespace {

// Requests of at most this many floats that touch one lane may run on the I/O thread.
constexpr uint64_t kInlineMaxFloats = 16384;
// Dense requests up to this many floats may run on the I/O thread across lanes (RunParts).
constexpr uint64_t kInlineMaxDenseFloats = uint64_t{1} << 20;

Status CheckFrameSize(const zmq::message_t& f, uint64_t expected, const char* what) {
  if (f.size() != expected) {
    return Status::InvalidArgument(std::string(what) + " frame has " + std::to_string(f.size()) +
                                   " bytes, envelope implies " + std::to_string(expected));
  }
  return Status::OK();
}

Status CheckLrScale(float scale) {
  if (!(scale >= 0.0f && scale <= kMaxLrScale)) {
    return Status::InvalidArgument("learning-rate scale " + std::to_string(scale) +
                                   " is not in [0, " + std::to_string(kMaxLrScale) + "]");
  }
  return Status::OK();
}

// A dense request's `dim`: how a DensePull takes its values (0 one frame, 1 a frame per server
// chunk), 0 for a DensePush. Any other value is refused: a push's `dim` goes to the request log
// as it came, and one over the log's bound would make the log unreadable at the next start.
Status CheckDenseDim(const Header& h) {
  if (h.op == Op::kDensePull && h.dim > kDensePullRunFrames) {
    return Status::InvalidArgument("DensePull dim must be 0 (values as one frame), 1 (a frame "
                                   "per server chunk) or 2 (an index, then frames of several "
                                   "chunks), got " + std::to_string(h.dim));
  }
  if (h.op == Op::kDensePush && h.dim != 0) {
    return Status::InvalidArgument("DensePush dim must be 0, got " + std::to_string(h.dim));
  }
  return Status::OK();
}

}  // namespace

// True when `h` retries a push this server accepted already (PushDedup).
bool ServerImpl::IsRetriedPush(const Header& h) const {
  if (!IsPush(h.op) || h.client_id == 0) return false;
  const PushDedup::Verdict v = dedup_.Check(h.client_id, h.client_seq);
  return v == PushDedup::Verdict::kApplied || v == PushDedup::Verdict::kPending ||
         v == PushDedup::Verdict::kBlocked;
}

// With follow_cluster_map: FailedPrecondition, naming both versions, when data request `h`
// carries another map version than the server's. Skipped, when `exempt_retries`, for a
// retried push that is already logged or accepted (it applies nothing again;
// AnsweredAsRetry answers it). A request checked again after waiting (Resubmit) was
// accepted by this server itself, so it is not exempt.
Status ServerImpl::CheckMapVersion(const Header& h, bool exempt_retries) {
  uint64_t mine = 0;
  if (fence_.Matches(h, &mine)) return Status::OK();
  // A retry of a push this server already took applies nothing again: it is answered as a
  // retry (AnsweredAsRetry) at any version, so that a client resending it after a lost reply
  // does not send it again elsewhere under a new sequence number.
  if (exempt_retries && IsRetriedPush(h)) return Status::OK();
  Status refused = fence_.Refuse(h, mine);
  AbortCutForRefusedPush(h, mine);
  return refused;
}

// True when client push `p` waits for this server's map (MapWait), is dropped (a copy of one
// that waits) or is answered here: a numbered push that names a map version ahead of the
// server's, and a later push of a client one of whose pushes waits. A refusal by a server
// behind the push's map would prove nothing about an attempt of it still on its way here
// (map_wait_internal.h). A push this server took already passes (AnsweredAsRetry answers it
// at any version). Past MapWait's bounds one is answered Unavailable, its number kept free
// for its resend (PushDedup::Refused), which the client sends here again as it is.
bool ServerImpl::HeldForMap(const std::shared_ptr<Pending>& p) {
  const Header& h = p->header;
  if (!options_.follow_cluster_map || h.replica_from != 0 || !IsPush(h.op) || h.client_id == 0) {
    return false;
  }
  const ClusterMapState* map = fence_.Current();
  const uint64_t mine = map != nullptr ? map->version : 0;
  if ((h.map_version <= mine && !map_wait_.Holds(h.client_id)) || IsRetriedPush(h)) return false;
  const uint64_t ticket = h.map_version > mine ? recheck_.Request() : 0;
  switch (map_wait_.Admit(p, mine, ticket)) {
    case MapWait::Verdict::kServe:
      return false;
    case MapWait::Verdict::kDropped:
      return true;
    case MapWait::Verdict::kHeld:
      if (h.map_version > mine) AbortCutForRefusedPush(h, mine, /*held=*/true);  // applied later
      return true;
    case MapWait::Verdict::kFull:
      break;
  }
  dedup_.Refused(h.client_id, h.client_seq);
  ReplyError(std::move(p->identity), h,
             Status::Unavailable("server " + std::to_string(options_.rank) + " (map version " +
                                 std::to_string(mine) + ") holds " +
                                 std::to_string(map_wait_.size()) +
                                 " pushes waiting for its cluster map, as push " +
                                 std::to_string(h.client_seq) + " of map version " +
                                 std::to_string(h.map_version) + " would; nothing of it was "
                                 "applied, retry"));
  return true;
}

// Serves the pushes MapWait holds that the server's map serves now, in their clients' order,
// and the Clocks that waited behind them.
void ServerImpl::ReadmitMapWait() {
  const ClusterMapState* map = fence_.Current();
  map_wait_.Readmit(map != nullptr ? map->version : 0, [this](const std::shared_ptr<Pending>& p) {
    const Status s = p->header.op == Op::kClock ? ApplyClock(p) : ServeData(p);
    if (!s.ok()) ReplyError(std::move(p->identity), p->header, s);
  });
}

// Answers the pushes MapWait gives up: one ahead of every map the store had is refused by its
// version (ServeData, as a client's request of another version always was); one held past
// MapWait::kHoldLimit, and the later ones of its client, Unavailable: the client sends them
// again under their numbers, which stay free for them (PushDedup::Refused).
void ServerImpl::ExpireMapWait() {
  std::vector<MapWait::Expired> given_up = map_wait_.Expire(
      std::chrono::steady_clock::now(),
      [this](uint64_t ticket) { return recheck_.NewestSince(ticket); });
  if (given_up.empty()) return;
  const uint64_t mine = fence_.version();
  for (MapWait::Expired& e : given_up) {
    const Header& h = e.p->header;
    Status s;
    if (e.ahead_of_store) {
      s = ServeData(e.p);
      if (s.ok()) continue;  // its map came after all
    } else {
      dedup_.Refused(h.client_id, h.client_seq);
      AbortCutForRefusedPush(h, mine);  // its client sends it again, maybe after its Clock
      s = Status::Unavailable(
          "push " + std::to_string(h.client_seq) + " of cluster map version " +
          std::to_string(h.map_version) + " waited " + std::to_string(MapWait::kHoldLimit.count()) +
          " s for server " + std::to_string(options_.rank) + " to have that map (it is at " +
          std::to_string(mine) + "), or behind one that did; nothing of it was applied, retry");
      LOG_EVERY_N(WARNING, 100) << s.ToString();
    }
    ReplyError(std::move(e.p->identity), h, s);
  }
  ReadmitMapWait();  // later pushes of their clients may go now
}

// Whether a push staged for the next group write came on connection `identity`.
bool ServerImpl::StagedFrom(const zmq::message_t& identity) const {
  for (const StagedRun& r : staged_) {
    if (r.p->identity.to_string_view() == identity.to_string_view()) return true;
  }
  return false;
}

// Hands each part of `p` to its lane (or runs it inline when `may_inline`, the request has
// one part and the lane is idle) and answers `p` once, when the last part finishes,
// whichever thread that is. `writes` and `seq` describe every part (Task).
void ServerImpl::RunParts(const std::shared_ptr<Pending>& p, std::vector<LanePart> parts,
                          bool writes, uint64_t seq, bool may_inline) {
  // What the lanes may reorder (Task::Pass): a sparse pull that no clock orders may go before
  // pushes of other connections that are durable once applied (logged; or nothing is).
  const Header& h = p->header;
  Task::Pass pass = Task::Pass::kNone;
  if (!writes && UnorderedSparsePull(h)) {
    pass = Task::Pass::kRead;
  } else if (writes && IsPush(h.op) && (seq != 0 || !log_->durable())) {
    pass = Task::Pass::kWrite;
  }
  // Pushes staged earlier reach the lanes first, unless this is such a pull of a connection
  // that staged none of them (nothing orders it after them; they are not answered yet).
  if (pass != Task::Pass::kRead || StagedFrom(p->identity)) FlushStaged();
  // A request of one lane runs on this thread when that lane is idle. One of several lanes
  // (a dense request over 64 KiB) does too, lane by lane, when no other request is waiting on
  // the socket: two thread hops and the reply's trip through the lane's socket cost more than
  // the lanes' parallelism gains for it; with requests waiting, the lanes take them in parallel.
  const bool inline_ok =
      may_inline &&
      (parts.size() == 1 || (router_.get(zmq::sockopt::events) & ZMQ_POLLIN) == 0);
  p->parts.Add(static_cast<uint32_t>(parts.size()));
  for (LanePart& part : parts) {
    Task t{p, std::move(part.run), writes, seq, pass};
    if (inline_ok && lanes_[part.lane]->TryRunInline(t, router_)) continue;
    lanes_[part.lane]->Submit(std::move(t));
  }
  FinishPart(*p, Status::OK(), router_);  // the guard
  NoteDroppedReply(*p);  // a reply sent here (inline, or the guard's) found the queue full
}

// RunParts with the same body on every lane.
void ServerImpl::RunOnAllLanes(const std::shared_ptr<Pending>& p, std::function<Status(Lane&)> fn,
                               bool writes) {
  std::vector<LanePart> parts;
  for (uint32_t l = 0; l < lanes_.size(); ++l) parts.push_back(LanePart{l, fn});
  RunParts(p, std::move(parts), writes, /*seq=*/0, /*may_inline=*/false);
}

// Exactly-once pushes: true when `p` retries a push that is already logged and has been
// answered here; a retried push-pull becomes a pull (false). Unavailable when the original
// is still waiting to be logged. A new push is accepted (false). Aborted when a client's own
// push (not forwarded, not counted in another server's sequence) is not its first here and
// its client is known nowhere: its mark may be gone (a memory-only server restarted, or past
// --push_dedup_retention_s), so it is not applied blind; the client numbers it anew.
Result<bool> ServerImpl::AnsweredAsRetry(const std::shared_ptr<Pending>& p) {
  Header& h = p->header;
  switch (dedup_.Check(h.client_id, h.client_seq)) {
    case PushDedup::Verdict::kUnknown:
      if (h.client_origin == 0 && h.replica_from == 0) {
        ++counts_.unknown_client_pushes;
        return Status::Aborted(
            "push " + std::to_string(h.client_seq) +
            " of a client this server does not know (no mark: restarted without a durable "
            "log, or not seen for --push_dedup_retention_s): it may be a retry of a push "
            "already applied, so nothing was applied; start a new push numbering and send it "
            "again");
      }
      // A primary's numbering (forwarded) or a retired server's (client_origin): this server
      // may have missed the earlier ones; it is new here.
      [[fallthrough]];
    case PushDedup::Verdict::kNew:
      dedup_.Accept(h.client_id, h.client_seq);
      return false;
    case PushDedup::Verdict::kUnreadable:
      return Status::Unavailable("this server cannot read its push marks now; nothing of push " +
                                 std::to_string(h.client_seq) + " was applied, retry");
    case PushDedup::Verdict::kPending:
      return Status::Unavailable("push " + std::to_string(h.client_seq) +
                                 " of this client is still waiting to be applied; retry later");
    case PushDedup::Verdict::kBlocked:
      return Status::Unavailable("an earlier push of this client was refused and has not been "
                                 "sent again yet; nothing of push " +
                                 std::to_string(h.client_seq) + " was applied, retry");
    case PushDedup::Verdict::kApplied:
      break;
  }
  ++counts_.retried_pushes;
  if (h.op != Op::kSparsePushPull) {
    ReplyOk(std::move(p->identity), h);
    return true;
  }
  h.op = Op::kSparsePull;  // the push part is applied already
  h.client_id = 0;
  p->admitted_as_retry = true;
  return false;
}

// Hands push `p`'s lane parts to the lanes once it is logged: with a durable log, staged
// for the group write of FlushStaged(); without, at once.
void ServerImpl::LogAndRun(const std::shared_ptr<Pending>& p, std::vector<LanePart> parts,
                           bool may_inline) {
  if (!log_->durable()) {
    dedup_.Logged(p->header.client_id, p->header.client_seq);
    RunParts(p, std::move(parts), /*writes=*/true, /*seq=*/0, may_inline);
    return;
  }
  const uint64_t seq = log_->Stage(p);
  staged_.push_back(StagedRun{p, std::move(parts), seq, may_inline});
}

// Group commit: writes the staged pushes' log entries in one write, then hands them to the
// lanes in order (or answers them all with the write's error). Runs at the end of every
// burst and before anything else reaches a lane, so lanes still see requests in order.
void ServerImpl::FlushStaged() { FlushStagedWith(nullptr); }

void ServerImpl::FlushStagedWith(
    const std::function<Status(const std::vector<StagedRun>&)>& write) {
  if (staged_.empty()) return;
  std::vector<StagedRun> staged;
  staged.swap(staged_);
  const Status s = write ? write(staged) : log_->WriteStaged();
  if (!s.ok()) {
    // Latest first: each number given back is then its client's accepted mark (Abandon).
    for (auto r = staged.rbegin(); r != staged.rend(); ++r) {
      const Header& h = r->p->header;
      dedup_.Abandon(h.client_id, h.client_seq, /*resend=*/false);  // an error, not a retry
      ReplyError(std::move(r->p->identity), h, s);
    }
    return;
  }
  for (StagedRun& r : staged) {
    const Header& h = r.p->header;
    dedup_.Logged(h.client_id, h.client_seq);
    if (h.replica_from != 0) {
      // A backup answers its primary as soon as the forwarded push is durable here (it is
      // applied from the log after a crash); the lanes apply it after the answer, off the
      // primary's path. Answers leave in log order, the primary's order.
      ReplyOk(std::move(r.p->identity), h);
      r.p->silent = true;
    }
    RunParts(r.p, std::move(r.parts), /*writes=*/true, r.seq, r.may_inline);
  }
}

// Hands the lane parts of data request `p` on: a push to the log (LogAndRun), a pull to
// the lanes (RunParts); through the replication queue (Sequence) while it is active,
// except a push a primary forwarded here.
void ServerImpl::SubmitParts(const std::shared_ptr<Pending>& p, std::vector<LanePart> parts,
                             bool push, bool may_inline) {
  auto submit = [this, p, may_inline, push](std::vector<LanePart> parts) {
    if (push) {
      LogAndRun(p, std::move(parts), may_inline);
    } else {
      RunParts(p, std::move(parts), /*writes=*/false, /*seq=*/0, may_inline);
    }
  };
  if (p->header.replica_from != 0 || !ReplicationActive()) {
    submit(std::move(parts));
    return;
  }
  // Behind earlier requests; a push waits for the backups of what it writes, if any.
  Sequence(p, [submit, parts = std::move(parts)]() mutable { submit(std::move(parts)); });
}

// A push that waited and is answered without being applied gives its sequence number back
// (PushDedup::Abandon), so the client's resend is taken as new; `resend`: it is answered
// Unavailable, so the client sends it again as it is and its later pushes wait for it
// (PushDedup::kBlocked). No-op for reads.
void ServerImpl::GiveBackSeq(const Header& h, bool resend) {
  if (h.op != Op::kSparsePull && h.op != Op::kDensePull && h.client_id != 0) {
    dedup_.Abandon(h.client_id, h.client_seq, resend);
  }
}

// True when push `h`, refused with `refused` before it was taken, comes again under the same
// number, so that its later pushes of that sequence must wait for it (PushDedup::Refused):
// taken first, they would put the mark above it and its resend would be answered as a retry,
// applied nowhere. Two such refusals:
//  - one counted in another server's sequence (client_origin: the client resends such a push
//    where its keys are now, never renumbered) refused for its map version (the reply carries
//    another version than the request's, so the client routes it again);
//  - one forwarded by a primary that this server fenced off (CheckReplica: the sender is no
//    longer the primary of its slots here). That primary answers its client Unavailable
//    (FailEntry), and the client sends the push again under the same number: to the same
//    server, or, once its map retires it, to the slots' new primary, this server among them,
//    with that primary as its origin, the same dedup key as the forwarded copy's. A cut-off
//    primary resuming after a fail-over forwards a burst of such pushes; clearing the gap
//    here instead let the client's later rerouted pushes be taken first (issue 35's random
//    fault test lost an acknowledged push so).
bool ServerImpl::ResentUnderItsNumber(const Header& h, const Status& refused) {
  if (!IsPush(h.op) || h.client_id == 0 || refused.code() != StatusCode::kFailedPrecondition ||
      !options_.follow_cluster_map) {
    return false;
  }
  if (h.replica_from != 0) return true;
  if (h.client_origin == 0) return false;
  // The version the reply carries (not Current(), which may move to a newer map now).
  return fence_.ReplyVersion() != h.map_version;
}

// True when a gate kept `p`: held behind a parked push of its client (HeldBehindClient),
// parked by the checkpoint cut (ParkedByCut), a slot copy (ParkedByImport) or the
// staleness bound (ParkedByStaleness), to be readmitted later.
bool ServerImpl::Parked(const std::shared_ptr<Pending>& p) {
  // The gates in order, each asking one component; the first that keeps `p` parks or holds
  // it, and Readmit sends it through all of them again.
  using Gate = bool (ServerImpl::*)(const std::shared_ptr<Pending>&);
  static constexpr Gate kGates[] = {
      &ServerImpl::HeldBehindClient,   // PushOrder: behind a parked push of its client
      &ServerImpl::ParkedByCut,        // CheckpointCut: a push of a step after the cut
      &ServerImpl::ParkedByImport,     // a slot or dense part whose rows are being copied in
      &ServerImpl::ParkedByStaleness,  // Consistency: a read ahead of the staleness bound
  };
  for (Gate gate : kGates) {
    if ((this->*gate)(p)) return true;
  }
  return false;
}

bool ServerImpl::ParkedByCut(const std::shared_ptr<Pending>& p) {
  if (!cut_.Park(p)) return false;
  push_order_.NoteParked(*p);
  return true;
}

bool ServerImpl::ParkedByStaleness(const std::shared_ptr<Pending>& p) {
  if (consistency_.AdmitOrPark(p)) return false;
  push_order_.NoteParked(*p);
  return true;
}

// The gate of a client's order: true when `p` is held behind a parked push of its client
// (PushOrder).
bool ServerImpl::HeldBehindClient(const std::shared_ptr<Pending>& p) {
  return push_order_.Hold(p);
}

// The pushes held behind `client`'s parked one, once none is parked: readmitted in order,
// or, when the parked push was refused (`refused`), refused too (their numbers given back,
// latest first), since logging them would put the mark above the refused one.
void ServerImpl::ReleaseHeld(uint64_t client, const Status* refused) {
  std::deque<std::shared_ptr<Pending>> held = push_order_.Release(client);
  if (held.empty()) return;
  if (refused == nullptr) {
    Readmit(std::vector<std::shared_ptr<Pending>>(std::make_move_iterator(held.begin()),
                                                  std::make_move_iterator(held.end())));
    return;
  }
  // Latest first: each number given back is then the client's accepted mark (Abandon).
  for (auto q = held.rbegin(); q != held.rend(); ++q) {
    const Header& h = (*q)->header;
    GiveBackSeq(h, /*resend=*/true);
    ReplyError(std::move((*q)->identity), h,
               Status::Unavailable("push " + std::to_string(h.client_seq) +
                                   " waited behind an earlier push of this client, which was "
                                   "refused (" + refused->ToString() +
                                   "); nothing of it was applied, retry"));
  }
}

// Submits a validated request that was parked.
Status ServerImpl::Resubmit(const std::shared_ptr<Pending>& p) {
  const Header& h = p->header;
  // Taken before an earlier push of its client was refused for a resend: it waits for that
  // one (PushDedup::kBlocked), or its logging would hide the refused one.
  if (PushOrder::Ordered(*p) &&
      dedup_.Check(h.client_id, h.client_seq) == PushDedup::Verdict::kBlocked) {
    return Status::Unavailable("an earlier push of this client was refused and has not been "
                               "sent again yet; nothing of push " +
                               std::to_string(h.client_seq) + " was applied, retry");
  }
  // Fenced again: the map it was admitted by may have moved its slots or dense part while it
  // waited (the staleness gate parks pulls, a checkpoint cut pushes, a copy in both); nothing
  // of it is logged or applied yet, so the client routes it anew.
  if (!p->admitted_as_retry && h.replica_from == 0) {
    const Status fenced = CheckMapVersion(h, /*exempt_retries=*/false);
    if (!fenced.ok()) return fenced;  // the caller gives the number back (Readmit)
  }
  if (h.op == Op::kDensePull || h.op == Op::kDensePush) return SubmitDense(p);
  KeySplit split;  // cheap compared to waiting
  (void)SplitKeysByLane(p->keys, h.count, static_cast<uint32_t>(lanes_.size()), nullptr, 0, &split);
  return SubmitSparse(p, std::move(split));
}

Status ServerImpl::Sparse(const std::shared_ptr<Pending>& p) {
  const Header& h = p->header;
  TESSERA_ASSIGN_OR_RETURN(const TableInfo* t, tables_.Find(h, TableKind::kSparse, options_.rank));
  const uint32_t dim = t->spec.dim;
  if (h.dim != dim) {
    return Status::InvalidArgument("table '" + t->spec.name + "' has dim " + std::to_string(dim) +
                                   ", request says " + std::to_string(h.dim));
  }
  const bool push = h.op != Op::kSparsePull;
  const bool pull = h.op != Op::kSparsePush;
  TESSERA_RETURN_IF_ERROR(CheckBudget(h.count, dim * ((push ? 1 : 0) + (pull ? 1 : 0)), true));
  TESSERA_RETURN_IF_ERROR(ExpectFrames(*p, push ? 2 : 1));
  if (h.elem_type != ElemType::kF32) {
    return Status::InvalidArgument("sparse values must be F32, got element type " +
                                   std::to_string(static_cast<int>(h.elem_type)));
  }
  TESSERA_RETURN_IF_ERROR(CheckFrameSize(p->frames[0], h.count * 8, "keys"));
  if (push) TESSERA_RETURN_IF_ERROR(CheckFrameSize(p->frames[1], h.count * dim * 4, "values"));
  p->keys = ViewOf<uint64_t>(p->frames[0], &p->key_copy);
  if (push) p->values = ViewOf<float>(p->frames[1], &p->value_copy);

  // Split by lane; refuse keys this server does not own (a stale slot map): under the cluster
  // map it follows, else the static one. A retry of a push taken already is not checked: it
  // is answered as a retry (AnsweredAsRetry) and applies nothing.
  const ClusterMapState* map = fence_.Current();
  const SlotMap* owners = &fence_.Owners();
  // A push its primary forwards is checked against the slots' primary and backup instead
  // (a retry of one applies nothing: AnsweredAsRetry answers it).
  const bool retried = IsRetriedPush(h);
  if (h.replica_from != 0 && !retried) {
    TESSERA_RETURN_IF_ERROR(CheckReplica(*p));
    // This backup is being filled with the rows of a slot it touches: the push waits for the
    // copy, at the head of the forwarded pushes (it came from there, or they were none).
    if (HeldForFill(*p)) return HoldForFill(p);
  }
  if (map != nullptr && (retried || h.replica_from != 0)) owners = nullptr;
  KeySplit split;
  const uint64_t foreign = SplitKeysByLane(p->keys, h.count, static_cast<uint32_t>(lanes_.size()),
                                           owners, options_.rank, &split);
  if (foreign != kAllOwned) {
    const uint32_t slot = SlotOfKey(p->keys[foreign]);
    const std::string what = "key " + std::to_string(p->keys[foreign]) + " (slot " +
                             std::to_string(slot) + ") belongs to server " +
                             std::to_string(owners->ServerOfSlot(slot));
    if (map == nullptr) {
      return Status::FailedPrecondition(what + ", not server " + std::to_string(options_.rank));
    }
    fence_.CountRefusal();
    return Status::FailedPrecondition("stale cluster map: " + what + " at map version " +
                                      std::to_string(map->version) + ", not server " +
                                      std::to_string(options_.rank) +
                                      "; nothing of the request was applied");
  }
  if (push) {
    TESSERA_RETURN_IF_ERROR(CheckLrScale(h.lr_scale));
    const uint64_t bad = FirstNonFinite(p->values, h.count * dim);
    if (bad != kAllFinite) {
      return Status::InvalidArgument("gradient of key " + std::to_string(p->keys[bad / dim]) +
                                     " is not finite");
    }
    TESSERA_ASSIGN_OR_RETURN(bool answered, AnsweredAsRetry(p));
    if (answered) return Status::OK();
  }
  if (Parked(p)) return Status::OK();
  return SubmitSparse(p, std::move(split));
}

Status ServerImpl::SubmitSparse(const std::shared_ptr<Pending>& p, KeySplit by_lane) {
  const Header& h = p->header;
  const bool push = h.op != Op::kSparsePull;
  const bool pull = h.op != Op::kSparsePush;
  const uint32_t dim = h.dim;
  if (pull) {
    p->out = MessagePool::Shared().Message(h.count * dim * sizeof(float));
    p->has_out = true;
    ++counts_.pulls;
    counts_.pull_keys += h.count;
  }
  if (push) {
    ++counts_.pushes;
    counts_.push_keys += h.count;
    cut_.NotePush(h);
  }
  const uint64_t table_id = h.table_id;
  const float lr_scale = h.lr_scale;
  Pending* raw = p.get();
  std::vector<LanePart> parts;
  for (uint32_t l = 0; l < by_lane.size(); ++l) {
    if (by_lane[l].empty()) continue;
    auto idx = std::make_shared<std::vector<uint32_t>>(std::move(by_lane[l]));
    parts.push_back(LanePart{l, [raw, idx, table_id, dim, push, pull, lr_scale](Lane& lane) {
                               return RunSparsePart(lane, *raw, *idx, table_id, dim, push, pull,
                                                    lr_scale);
                             }});
  }
  SubmitParts(p, std::move(parts), push, h.count * dim <= kInlineMaxFloats);
  return Status::OK();
}

Status ServerImpl::Dense(const std::shared_ptr<Pending>& p) {
  const Header& h = p->header;
  TESSERA_ASSIGN_OR_RETURN(const TableInfo* t, tables_.Find(h, TableKind::kDense, options_.rank));
  const bool push = h.op == Op::kDensePush;
  TESSERA_RETURN_IF_ERROR(CheckBudget(h.count, 1, false));
  if (h.count == 0) return Status::InvalidArgument("dense range of zero elements");
  if (h.offset > t->spec.length || h.count > t->spec.length - h.offset) {
    return Status::InvalidArgument("dense range [" + std::to_string(h.offset) + ", " +
                                   std::to_string(h.offset + h.count) + ") outside table '" +
                                   t->spec.name + "' of length " + std::to_string(t->spec.length));
  }
  TESSERA_RETURN_IF_ERROR(CheckDenseDim(h));
  TESSERA_ASSIGN_OR_RETURN(const uint32_t part, DensePartOf(h, t->spec.length, t->spec.name));
  if (h.replica_from != 0) {
    // A primary's forwarded push: fenced by the part's primary and backup (a retry of one
    // applies nothing: AnsweredAsRetry answers it).
    if (!IsRetriedPush(h)) {
      TESSERA_RETURN_IF_ERROR(CheckDenseReplica(h, part));
      if (DenseHeldForFill(part)) return HoldForFill(p);  // as a sparse one (Sparse)
    }
  } else {
    const ClusterMapState* map = fence_.Current();
    const uint32_t owner = map != nullptr ? map->DenseOwner(part) : part;
    if (owner != options_.rank && !IsRetriedPush(h)) {
      const DenseRange r =
          DenseRangeOfServer(h.table_id, t->spec.length, part, fence_.DenseServers());
      return Status::FailedPrecondition(
          std::string(map != nullptr ? "stale cluster map: " : "") + "dense range [" +
          std::to_string(h.offset) + ", " + std::to_string(h.offset + h.count) + ") of table '" +
          t->spec.name + "' is in part " + std::to_string(part) + " [" +
          std::to_string(r.begin) + ", " + std::to_string(r.end) + "), served by server " +
          std::to_string(owner) + ", not server " + std::to_string(options_.rank));
    }
  }
  TESSERA_RETURN_IF_ERROR(ExpectFrames(*p, push ? 1 : 0));
  if (push) {
    if (h.elem_type != ElemType::kF32) return Status::InvalidArgument("dense values must be F32");
    TESSERA_RETURN_IF_ERROR(CheckFrameSize(p->frames[0], h.count * 4, "values"));
    p->values = ViewOf<float>(p->frames[0], &p->value_copy);
    TESSERA_RETURN_IF_ERROR(CheckLrScale(h.lr_scale));
    const uint64_t bad = FirstNonFinite(p->values, h.count);
    if (bad != kAllFinite) {
      return Status::InvalidArgument("dense gradient element " + std::to_string(h.offset + bad) +
                                     " is not finite");
    }
    TESSERA_ASSIGN_OR_RETURN(bool answered, AnsweredAsRetry(p));
    if (answered) return Status::OK();
  }
  if (Parked(p)) return Status::OK();
  return SubmitDense(p);
}

Status ServerImpl::SubmitDense(const std::shared_ptr<Pending>& p) {
  const Header& h = p->header;
  const bool push = h.op == Op::kDensePush;
  if (!push) {
    if (h.dim == kDensePullRunFrames) {
      // Frames of adjacent chunks, set by each lane (RunDensePart), and their index.
      p->lane_frames.resize(lanes_.size());
      p->lane_index.resize(lanes_.size());
    } else if (h.dim == kDensePullChunkFrames) {
      // One frame per server chunk of the range, set by its lane (RunDensePart).
      const uint64_t first = h.offset / kDenseChunkFloats;
      const uint64_t last = (h.offset + h.count - 1) / kDenseChunkFloats;
      p->out_frames.resize(last - first + 1);
    } else {
      p->out = MessagePool::Shared().Message(h.count * sizeof(float));
    }
    p->has_out = true;
    ++counts_.pulls;
  } else {
    ++counts_.pushes;
    cut_.NotePush(h);
  }
  DenseSplit by_lane =
      SplitDenseByLane(h.table_id, h.offset, h.count, static_cast<uint32_t>(lanes_.size()));
  const uint64_t table_id = h.table_id;
  const float lr_scale = h.lr_scale;
  Pending* raw = p.get();
  std::vector<LanePart> parts;
  for (uint32_t l = 0; l < by_lane.size(); ++l) {
    if (by_lane[l].empty()) continue;
    auto segs = std::make_shared<std::vector<DenseSegment>>(std::move(by_lane[l]));
    parts.push_back(LanePart{l, [raw, segs, table_id, push, lr_scale, l](Lane& lane) {
                               return RunDensePart(lane, l, *raw, *segs, table_id, push,
                                                   lr_scale);
                             }});
  }
  SubmitParts(p, std::move(parts), push, h.count <= kInlineMaxDenseFloats);
  return Status::OK();
}

}  // namespace tessera::internal
