// The I/O thread: receives requests, validates their envelopes, dispatches them by op,
// forwards the lanes' replies, and sends parked requests through the gates again (Readmit).
// The small control ops (tables, meta, stats, clocks, barriers) are in control_ops.cc.
#include <glog/logging.h>

#include <cerrno>
#include <vector>
#include <zmq_addon.hpp>

#include "ps/server/server_impl_internal.h"
#include "ps/thread_name_internal.h"

namespace tessera::internal {
namespace {

// Whether `socket` has a message to read (this also resets its descriptor's signal).
bool Readable(zmq::socket_t& socket) {
  try {
    return (socket.get(zmq::sockopt::events) & ZMQ_POLLIN) != 0;
  } catch (const zmq::error_t&) {
    return true;  // EINTR: look again
  }
}

}  // namespace

// One message from `socket` without waiting into `parts` (cleared first); false when none is
// there, or when a signal interrupted the call (a signal in an embedding process: the next poll
// comes back here).
bool TryReceive(zmq::socket_t& socket, std::vector<zmq::message_t>* parts) {
  parts->clear();
  try {
    return zmq::recv_multipart(socket, std::back_inserter(*parts), zmq::recv_flags::dontwait)
        .has_value();
  } catch (const zmq::error_t& e) {
    if (e.num() != EINTR) throw;
    return false;
  }
}

void ServerImpl::IoLoop() {
  NameThisThread("io");
  // Polls the sockets' ZMQ_FD descriptors: the ROUTER's, the lanes' replies', the ROUTER
  // monitor's, then the links' to backups (replication.cc), rebuilt when those change. (Not
  // zmq::poll, which asks every socket for its events before and after each wait: two
  // syscalls a socket on every wake-up.) A descriptor signals a change of its socket's state
  // and is reset once the socket is read until it has nothing, as each handler below does.
  // The ROUTER and the links are also written to, and a send may take the signal of a
  // message that arrived meanwhile: their events are asked for after each round instead, and
  // the next wait is skipped while they have something. Nor does a message signal that
  // reaches a pipe the socket has never found empty (ZeroMQ signals a reader it saw asleep):
  // every socket is read once whenever the list is built.
  std::vector<zmq::pollitem_t> items;
  bool more = false;  // the ROUTER or a link has messages that no descriptor may signal
  bool look_at_all = false;  // read every socket this round
  auto next_maintenance = std::chrono::steady_clock::now();
  while (!io_.stop.load(std::memory_order_relaxed)) {
    const auto now = std::chrono::steady_clock::now();
    if (now >= next_maintenance) {
      next_maintenance = now + std::chrono::milliseconds(options_.maintenance_interval_ms);
      Maintain();
      // Its sends (answers to parked requests, readmitted pushes, pieces to backups) may have
      // taken the signal of a message that arrived since the last round's checks.
      look_at_all = true;
    }
    if (repl_.links.TakeChanged()) {
      items.clear();
      for (zmq::socket_t* s : {&router_, &replies_, &edge_.monitor}) {
        items.push_back({nullptr, s->get(zmq::sockopt::fd), ZMQ_POLLIN, 0});
      }
      for (auto& [server, link] : repl_.links.links()) {
        items.push_back({nullptr, link.dealer.get(zmq::sockopt::fd), ZMQ_POLLIN, 0});
      }
      look_at_all = true;
    }
    // While pushes wait for backups, poll often enough to send again what was not answered.
    const auto wait = more || look_at_all    ? std::chrono::milliseconds(0)
                      : repl_.queue.waiting() == 0 ? std::chrono::milliseconds(100)
                                              : std::chrono::milliseconds(20);
    try {
      // A wait that times out reads every socket too: were a signal ever missed, a message
      // would wait one timeout, not until the next one arrives.
      if (zmq::poll(items.data(), items.size(), wait) == 0 && wait.count() > 0) look_at_all = true;
    } catch (const zmq::error_t& e) {
      if (e.num() != EINTR) LOG(ERROR) << "poll failed: " << e.what();
      look_at_all = true;
    }
    if (look_at_all) {
      look_at_all = false;
      for (auto& item : items) item.revents = ZMQ_POLLIN;
    }
    if (items[1].revents & ZMQ_POLLIN) ForwardReplies();
    if (items[2].revents & ZMQ_POLLIN) DrainRouterEvents();  // before the requests they admit
    if (!repl_.links.empty()) {
      DrainBackupReplies();  // answers free the queue before new requests join it
    }
    // Also without links: a piece no link took is sent again, or failed once orphaned.
    ResendReplication();
    if (more || (items[0].revents & ZMQ_POLLIN)) ReceiveBurst();
    if (fence_.changed()) OnMapChanged();
    FlushStagedServingReads();  // pushes readmitted outside a burst
    more = Readable(router_);
    if (std::exchange(polled_during_log_write_, false)) look_at_all = true;
    for (auto& [server, link] : repl_.links.links()) more = more || Readable(link.dealer);
  }
}

void ServerImpl::ReceiveBurst() {
  // Bound the burst so replies keep flowing under load.
  for (int i = 0; i < 256; ++i) {
    std::vector<zmq::message_t> parts;
    if (!TryReceive(router_, &parts)) break;
    HandleMessage(std::move(parts));
  }
  FlushStagedServingReads();  // the burst's pushes: one log write
}

void ServerImpl::Maintain() {
  (void)fence_.Current();  // notices a new map while no request comes (OnMapChanged)
  if (fence_.changed()) OnMapChanged();
  if (migration_.parked_now() > 0) ExpireImportParked();
  if (cut_.Expired(std::chrono::steady_clock::now())) AbortExpiredCut();
  if (!repl_.park.empty()) ExpireReplicas();
  if (!repl_.park.empty()) ReadmitReplicas();
  if (!map_wait_.empty()) ExpireMapWait();
  CloseUnusedLinks();
  FlushStagedServingReads();  // the marks below count only what is in the log
  // The log is needed only past the mark every lane has committed.
  uint64_t upto = log_->last_seq();
  for (auto& l : lanes_) upto = std::min(upto, l->committed_seq());
  log_->TruncateTo(upto);
  edge_.peers.Sweep(std::chrono::steady_clock::now() - std::chrono::seconds(60));
  auto p = std::make_shared<Pending>();
  p->silent = true;
  // Every push logged so far is queued ahead of this task on each lane (lanes run in order),
  // so the task completes the lane's log mark up to the last sequence number.
  std::vector<LanePart> parts;
  ServerMetrics* m = metrics_.get();
  for (uint32_t l = 0; l < lanes_.size(); ++l) {
    parts.push_back(
        LanePart{l, [m](Lane& lane) {
                   Status s = lane.store().Maintain(ApplyContext{lane.NextStep(), NowSeconds()});
                   if (!s.ok()) {
                     LOG(WARNING) << "lane " << lane.index() << " maintenance: " << s.ToString();
                   }
                   m->PublishLane(lane.index(), lane.store().stats(), lane.store().TableStats(),
                                  lane.store().dirty_bytes(),
                                  lane.back_pressure_waits(), lane.committed_seq());
                   return Status::OK();
                 }});
  }
  RunParts(p, std::move(parts), /*writes=*/true, log_->last_seq(), /*may_inline=*/false);
  PublishIoMetrics();
}

// The I/O thread's state into metrics_ (each maintenance pass).
void ServerImpl::PublishIoMetrics() {
  const uint32_t job_workers = consistency_.job_workers();
  metrics_->PublishIo({
      .tables = tables_.size(),
      .connections = edge_.connections.open(),
      .parked = consistency_.parked_now(),
      .stalled_peers = edge_.peers.stalled_count(),
      .min_clock = job_workers ? consistency_.MinClock(job_workers) : 0,
      .max_clock = consistency_.MaxClock(),
      .max_push_clock = cut_.max_push_clock(),
      .log_last_seq = log_->last_seq(),
      .log_truncated_to = log_->truncated(),
      .refused_connections = counts_.refused_connections,
      .dropped_replies = counts_.dropped_replies,
      .throttled_requests = counts_.throttled_requests,
      .retried_pushes = counts_.retried_pushes,
      .push_keys = counts_.push_keys,
      .pull_keys = counts_.pull_keys,
      .unknown_client_pushes = counts_.unknown_client_pushes,
      .push_marks_in_memory = dedup_.size(),
      .push_marks_spilled = dedup_.spilled(),
      .idle_connections_displaced = edge_.connections.idle_displaced(),
      .replica_held_expired = repl_.park.expired(),
      .replica_refused_ahead = repl_.park.refused_ahead(),
      .restore_queued_batches_max = restore_credits_.out_max(),
      .restore_back_pressure_waits = restore_credits_.waits(),
      .checkpoint_pending = cut_.pending(),
      .table_names = tables_.Names(),
      .engine = engine_->EngineStats(),
  });
}

void ServerImpl::ForwardReplies() {
  for (std::vector<zmq::message_t> parts; TryReceive(replies_, &parts);) {
    SendToPeer(parts);
  }
}

// False when the reply was not queued (the peer is gone, or its queue is full: then the
// peer is marked stalled).
bool ServerImpl::SendToPeer(std::vector<zmq::message_t>& parts) {
  try {
    if (zmq::send_multipart(router_, parts, zmq::send_flags::dontwait)) return true;
    // Its send queue is at --send_hwm: the peer does not read its replies (edge_ops.cc).
    ++counts_.dropped_replies;
    edge_.peers.MarkStalled(parts[0].to_string_view(), std::chrono::steady_clock::now());
  } catch (const zmq::error_t& e) {
    // The peer is gone: nothing else to tell it.
    VLOG(1) << "dropping reply: " << e.what();
  }
  return false;
}

bool ServerImpl::ReplyError(zmq::message_t identity, const Header& req, const Status& s) {
  ++counts_.errors;
  Header h;
  h.request_id = req.request_id;
  // Echo the op only when it is one this build knows (the reply must decode on the peer).
  h.op = static_cast<uint8_t>(req.op) <= kMaxOp ? req.op : Op::kInvalid;
  h.table_id = req.table_id;
  h.status = s.code() == StatusCode::kOk ? StatusCode::kInternal : s.code();
  h.message = s.message();
  h.map_version = fence_.ReplyVersion();  // a client told its map is stale learns the server's
  std::string env;
  EncodeHeader(h, &env);
  NoteInlineReply(req, false, env.size());
  std::vector<zmq::message_t> parts;
  parts.push_back(std::move(identity));
  parts.emplace_back(env.data(), env.size());
  return SendToPeer(parts);
}

// Counts a reply sent by ReplyOk/ReplyError (`bytes` in all) to request `req`; the first
// reply to the request being dispatched completes it in the metrics, before it is sent (a
// client that reads the reply and then the metrics finds it counted).
void ServerImpl::NoteInlineReply(const Header& req, bool ok, size_t bytes) {
  metrics_->Sent(bytes);
  if (inline_answer_.active && !inline_answer_.answered &&
      req.request_id == inline_answer_.request_id) {
    inline_answer_.answered = true;
    metrics_->Completed(inline_answer_.decoded ? req.op : Op::kInvalid, ok,
                        inline_answer_.received);
  }
}

void ServerImpl::ReplyOk(zmq::message_t identity, const Header& req, Header h,
                         const std::string* data) {
  h.request_id = req.request_id;
  h.op = req.op;
  h.table_id = req.table_id;
  h.status = StatusCode::kOk;
  std::string env;
  EncodeHeader(h, &env);
  std::vector<zmq::message_t> parts;
  parts.push_back(std::move(identity));
  parts.emplace_back(env.data(), env.size());
  if (data != nullptr) parts.emplace_back(data->data(), data->size());
  NoteInlineReply(req, true, env.size() + (data != nullptr ? data->size() : 0));
  SendToPeer(parts);
}

void ServerImpl::HandleMessage(std::vector<zmq::message_t> parts) {
  ++counts_.requests;
  if (parts.size() < 2) return;  // ROUTER always adds the identity; nothing to answer.
  auto p = std::make_shared<Pending>();
  p->received = std::chrono::steady_clock::now();
  // A reply sent here, on the I/O thread, completes the request in the metrics
  // (NoteInlineReply; the lanes count the replies they send).
  inline_answer_ = {.active = true, .received = p->received};
  Receive(p, parts);
  inline_answer_.active = false;
}

// HandleMessage's work: decode, admit, dispatch.
void ServerImpl::Receive(const std::shared_ptr<Pending>& p, std::vector<zmq::message_t>& parts) {
  size_t bytes = 0;
  for (size_t i = 1; i < parts.size(); ++i) bytes += parts[i].size();
  // The connection it came on (the identity frame does not always carry it).
  const int fd = zmq_msg_get(parts[1].handle(), ZMQ_SRCFD);
  p->identity = std::move(parts[0]);
  Status s = DecodeHeader(parts[1].data(), parts[1].size(), &p->header);
  metrics_->Received(s.ok() ? &p->header.op : nullptr, bytes);
  inline_answer_.request_id = p->header.request_id;
  inline_answer_.decoded = s.ok();
  if (!s.ok()) {
    ReplyError(std::move(p->identity), p->header, s);
    return;
  }
  p->metrics = metrics_.get();
  // Peer and admin ops only from senders with those rights (access_internal.h).
  s = Authorize(p->header, RightsOfMessage(access_, parts[1]), options_.rank, access_);
  if (!s.ok()) {
    ReplyError(std::move(p->identity), p->header, s);
    return;
  }
  if (!Admitted(p, fd)) return;  // refused (connections, limits, in flight) or throttled
  for (size_t i = 2; i < parts.size(); ++i) p->frames.push_back(std::move(parts[i]));
  s = Dispatch(p);
  if (!s.ok()) ReplyError(std::move(p->identity), p->header, s);
}

// A reply this thread sent for `p` (SendReply) found the peer's queue full: counts it and
// marks the peer stalled (edge_ops.cc).
void ServerImpl::NoteDroppedReply(Pending& p) {
  // Replies via SendToPeer (errors, lanes' replies) are noted there.
  if (!p.reply_dropped.exchange(false, std::memory_order_relaxed)) return;
  ++counts_.dropped_replies;
  edge_.peers.MarkStalled(p.identity.to_string_view(), std::chrono::steady_clock::now());
}

Status ServerImpl::Dispatch(const std::shared_ptr<Pending>& p) {
  const Header& h = p->header;
  switch (h.op) {
    case Op::kPing: {
      Header r;
      r.num_workers = options_.num_servers;
      r.worker_id = options_.rank;
      ReplyOk(std::move(p->identity), h, r);
      return Status::OK();
    }
    case Op::kCreateTable:
      return CreateTable(p);
    case Op::kGetTable:
      return GetTable(p);
    case Op::kSparsePull:
    case Op::kSparsePush:
    case Op::kSparsePushPull:
    case Op::kDensePull:
    case Op::kDensePush:
      return DataOp(p);
    case Op::kClock:
      return ClockOp(p);
    case Op::kBarrier:
      return BarrierOp(p);
    case Op::kPutMeta:
    case Op::kGetMeta:
      return MetaOp(p);
    case Op::kStats:
      return StatsOp(p);
    case Op::kCheckpoint:
      return CheckpointOp(p);
    case Op::kRestore:
      return RestoreOp(p);
    case Op::kExport:
      return ExportOp(p);
    case Op::kSlotExport:
      return SlotExportOp(p);
    case Op::kSlotImport:
      return SlotImportOp(p);
    case Op::kSlotDrop:
      return SlotDropOp(p);
    case Op::kDropTable:
      return DropTable(p);
    case Op::kInvalid:
      break;
  }
  return Status::InvalidArgument("unsupported op " + std::to_string(static_cast<int>(h.op)));
}

// Dispatch of the data ops (sparse and dense pulls and pushes): the origin key; a client's push
// ahead of this server's map waits for it (HeldForMap), after the pushes that may go now;
// then ServeData.
Status ServerImpl::DataOp(const std::shared_ptr<Pending>& p) {
  KeyByOrigin(*p);
  if (!map_wait_.empty()) ReadmitMapWait();  // those the map serves now go first
  if (HeldForMap(p)) return Status::OK();
  return ServeData(p);
}

// A primary's forwarded push to its backup checks (CheckReplica, ParkedReplica), a client's
// request to the map version check; then Sparse or Dense.
Status ServerImpl::ServeData(const std::shared_ptr<Pending>& p) {
  const Header& h = p->header;
  const bool dense = h.op == Op::kDensePull || h.op == Op::kDensePush;
  Status s;
  if (h.replica_from != 0) {
    // A primary's forwarded push (Admitted refused other ops with replica_from): validated
    // and fenced by the primary and backup of its slots or dense part before it may wait.
    s = ValidateForwarded(*p);
    if (s.ok() && ParkedReplica(p)) return Status::OK();
  } else {
    // Fencing first: a refused request is neither validated further, logged nor applied.
    s = CheckMapVersion(h);
  }
  if (s.ok()) s = dense ? Dense(p) : Sparse(p);
  // A push refused other than Unavailable is not sent again under its number (a stale map
  // gets it a new one): a gap its earlier refusal left is closed (PushDedup::kBlocked). One
  // that comes again under its number (ResentUnderItsNumber: counted in another server's
  // sequence and refused for its map version, or forwarded by a primary fenced off here)
  // leaves a gap: its later pushes wait for it.
  if (!s.ok() && IsPush(h.op) && s.code() != StatusCode::kUnavailable) {
    if (ResentUnderItsNumber(h, s)) {
      dedup_.Refused(h.client_id, h.client_seq);
    } else {
      dedup_.ClearGap(h.client_id, h.client_seq);
    }
  }
  return s;
}

Status ServerImpl::ExpectFrames(const Pending& p, size_t n) {
  if (p.frames.size() != n) {
    return Status::InvalidArgument(std::string(OpName(p.header.op)) + " expects " +
                                   std::to_string(n) + " data frame(s), got " +
                                   std::to_string(p.frames.size()));
  }
  return Status::OK();
}

Status ServerImpl::CheckBudget(uint64_t count, uint64_t floats_per_item, bool with_keys) {
  const uint64_t per = floats_per_item * 4 + (with_keys ? 8 : 0);
  if (per != 0 && count > options_.max_request_bytes / per) {
    return Status::ResourceExhausted("request of " + std::to_string(count) + " items x " +
                                     std::to_string(per) +
                                     " bytes exceeds the server's per-request limit of " +
                                     std::to_string(options_.max_request_bytes) + " bytes");
  }
  return Status::OK();
}

// Sends every parked request through the gates again.
void ServerImpl::Readmit(std::vector<std::shared_ptr<Pending>> parked) {
  const bool outer = !readmitting_;
  readmitting_ = true;
  for (auto& p : parked) {
    const uint64_t client = p->header.client_id;
    const bool last_of_client = push_order_.Unpark(*p);
    if (Parked(p)) continue;
    const Status s = Resubmit(p);
    if (!s.ok()) {
      // Nothing of it was logged: its number goes back, and so do those held behind it.
      if (last_of_client) ReleaseHeld(client, &s);
      GiveBackSeq(p->header, /*resend=*/s.code() == StatusCode::kUnavailable ||
                                 ResentUnderItsNumber(p->header, s));
      ReplyError(std::move(p->identity), p->header, s);
      continue;
    }
    if (last_of_client) ReleaseHeld(client, nullptr);  // logged (staged) first: they follow
  }
  if (outer) readmitting_ = false;
}

}  // namespace tessera::internal
