// The client's I/O side: the I/O thread that sends requests, matches replies to calls,
// retries and expires late requests, and the callers' own sends and waits (client_conn.cc: the
// connections).
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <random>
#include <cstring>
#include <zmq_addon.hpp>

#include "ps/client/client_internal.h"
#include "ps/limits.h"

namespace tessera {
namespace internal {
namespace {

// Ops a client sends again after a lost connection or a timeout. Checkpoint, restore, export
// and the resharding ops are operator actions with their own attempts: they fail instead.
bool Retryable(Op op) {
  return op != Op::kCheckpoint && op != Op::kRestore && op != Op::kExport && op != Op::kPing &&
         op != Op::kSlotExport && op != Op::kSlotImport && op != Op::kSlotDrop;
}

constexpr int64_t kMinBackoffMs = 100;
constexpr int64_t kMaxBackoffMs = 2000;

}  // namespace

Outgoing ClientImpl::MakeOutgoing(uint32_t server, Header h, std::vector<zmq::message_t> data,
                                  std::shared_ptr<Call> call, Deadline deadline,
                                  Deadline give_up) {
  Outgoing o;
  o.server = server;
  o.request_id = next_id_.fetch_add(1) + 1;
  h.request_id = o.request_id;
  o.parts.reserve(data.size() + 1);
  o.part = server;
  o.op = h.op;
  // Data requests: to be routed again after a stale-map refusal; clocks: sent again with the
  // clock of the moment (Transmit).
  if (IsDataOp(h.op) || h.op == Op::kClock) o.header = h;
  if (IsPush(h.op)) {
    // Encoded when first sent, with its sequence number.
    o.needs_seq = true;
    o.header = h;
    o.parts.emplace_back();
  } else {
    o.parts.push_back(EnvelopeFrame(h));
  }
  for (auto& d : data) o.parts.push_back(std::move(d));
  o.call = std::move(call);
  o.deadline = deadline;
  if (options_.retry_for_ms > 0 && Retryable(h.op)) {
    const Deadline limit = DeadlineAfterMs(options_.retry_for_ms);
    o.give_up = give_up == Deadline() ? limit : std::min(give_up, limit);
  }
  return o;
}

void ClientImpl::Send(const std::shared_ptr<Call>& call, std::vector<Outgoing> out) {
  if (call) call->remaining = static_cast<uint32_t>(out.size());
  {
    MutexLock l(queue_mu_);
    for (auto& o : out) queue_.push_back(std::move(o));
  }
  // The caller's thread sends when no other thread does socket I/O at the moment: no hop
  // through the I/O thread (a wake-up and a context switch per request, which under CPU
  // contention cost a time slice each). Otherwise the I/O thread sends it, in queue order.
  std::unique_lock<std::mutex> io(io_mu_, std::try_to_lock);
  if (!io.owns_lock() || stop_.load()) {
    if (io.owns_lock()) io.unlock();
    Wake();
    return;
  }
  SendQueued();
  // The sends may have taken the sockets' pending notifications (their file descriptors
  // signal once): receive what is there now, else nobody would be woken for it.
  ReceiveSentTo();
  // Calls issued and not waited for: past a few, the I/O thread reads their replies (see
  // IoLoop); a caller that waits next reads them itself.
  if (io_standing_down_.load() && in_flight_.size() >= kUnwatchedInFlight) {
    Wake();
  }
}

void ClientImpl::ReceiveSentTo() {
  // Receiving may send again (a request routed anew after a stale-map refusal).
  std::vector<uint32_t> now;
  while (!sent_to_.empty()) {
    now.swap(sent_to_);
    for (uint32_t i : now) ReceiveFrom(i);
    now.clear();
  }
}

void ClientImpl::SendQueued() {
  std::vector<Outgoing> batch;
  {
    MutexLock l(queue_mu_);
    batch.swap(queue_);
  }
  for (auto& o : batch) SendOne(o);
}

void ClientImpl::ReceiveReady() {
  for (uint32_t i = 0; i < servers_.size(); ++i) ReceiveFrom(i);
  ReceiveSentTo();
}

namespace {
thread_local WakeFd t_wake;  // this thread's, for WaitCall; closed when the thread ends
}  // namespace

int ThisThreadWakeFd() { return t_wake.fd; }

Status ClientImpl::WaitCall(Call& c, Deadline deadline) {
  // The waiting thread receives the replies itself (for every call, not only its own): the
  // reply wakes the thread that waits for it, not the I/O thread that would then wake this
  // one (a second wake-up on the critical path, and under CPU contention a second wait for a
  // core). It polls the sockets and its own eventfd: whichever thread completes the call (the
  // I/O thread, another waiter) signals that eventfd, since it took the socket's
  // notification. Up to kMaxPollingWaiters threads poll; another one that finds the sockets
  // taken sleeps on its call, and the pollers read for it: with many threads waiting, a reply
  // wakes the pollers and the thread it completes, not every waiter. The last poller to leave
  // while some sleep hands the sockets to the I/O thread (IoLoop does not stand down then).
  WakeFd& me = t_wake;
  if (stop_.load()) return WaitCallBlocked(c, deadline);
  // (A signal left from an earlier call, written after its last poll, costs one more round
  // below; draining here would cost every call a read.)
  // One polling waiter per call; another thread waiting for the same call sleeps on its
  // condition variable, counted as a sleeper (so is a thread without an eventfd).
  int none = -1;
  polling_waiters_.fetch_add(1);
  if (me.fd < 0 || !c.waiter_fd.compare_exchange_strong(none, me.fd)) {
    return StopPolling(c, deadline, /*sleep=*/true);
  }
  zmq::pollitem_t items[kMaxPolledServers + 1];
  size_t n = 0;
  // The DEALERs' descriptors (again when a map added servers while this thread waits).
  auto collect = [&] {
    n = polled_n_.load(std::memory_order_acquire);
    std::copy(polled_fds_.begin(), polled_fds_.begin() + n, items);
    items[n] = {nullptr, me.fd, ZMQ_POLLIN, 0};
  };
  collect();
  std::unique_lock<std::mutex> io(io_mu_, std::defer_lock);
  // Requests left in flight by this thread's last receive, if it completed the call (else
  // unknown: SIZE_MAX).
  size_t in_flight_left = SIZE_MAX;
  bool sleep = false;
  while (!c.done_flag.load()) {
    if (!io.try_lock()) {
      if (polling_waiters_.load() > kMaxPollingWaiters) {
        sleep = true;
        break;
      }
      io.lock();  // another thread's receive in progress: it may complete this call too
    }
    if (stop_.load()) {
      io.unlock();
      break;  // the I/O thread closes the sockets
    }
    ReceiveReady();
    in_flight_left = in_flight_.size();
    io.unlock();
    if (c.done_flag.load()) break;
    in_flight_left = SIZE_MAX;
    const auto now = Clock::now();
    if (now >= deadline) break;
    if (polled_n_.load(std::memory_order_acquire) != n) collect();
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now);
    try {
      zmq::poll(items, n + 1,
                std::min(left + std::chrono::milliseconds(1), std::chrono::milliseconds(20)));
    } catch (const zmq::error_t&) {
      sleep = true;  // EINTR or worse: the condition variable below waits instead
      break;
    }
    if (items[n].revents & ZMQ_POLLIN) WakeFd::Drain(me.fd);
  }
  return LeavePolling(c, deadline, in_flight_left, sleep);
}

Status ClientImpl::LeavePolling(Call& c, Deadline deadline, size_t in_flight_left, bool sleep) {
  if (in_flight_left < kUnwatchedInFlight) {
    // A caller that waits likely waits again soon (a loop of synchronous calls, or a window
    // of N in flight): it reads the replies then, and the I/O thread stands down meanwhile.
    settled_wait_.store(true);
  } else if (!sleep && (in_flight_left != SIZE_MAX || !c.done_flag.load()) &&
             io_standing_down_.load()) {
    Wake();  // many replies to read, or this call's own: the I/O thread polls the sockets
  }
  {
    MutexLock l(c.mu);  // see Call::waiter_fd
    c.waiter_fd.store(-1);
  }
  return StopPolling(c, deadline, sleep);
}

Status ClientImpl::StopPolling(Call& c, Deadline deadline, bool sleep) {
  sleep = sleep && !c.done_flag.load();
  if (sleep) sleeping_waiters_.fetch_add(1);
  // Each count changes before the other is read, and IoLoop sets io_standing_down_ before it
  // reads them: a handover is seen by this thread (which wakes the I/O thread) or by IoLoop.
  if (polling_waiters_.fetch_sub(1) == 1 && sleeping_waiters_.load() > 0 &&
      io_standing_down_.load()) {
    Wake();
  }
  const Status s = WaitCallBlocked(c, deadline);
  if (sleep) sleeping_waiters_.fetch_sub(1);
  return s;
}

Status ClientImpl::WaitCallBlocked(Call& c, Deadline deadline) {
  MutexLock l(c.mu);
  // c.cv.wait_until(l, deadline, done), spelled out so the analysis sees c.mu held.
  while (!c.done) {
    if (c.cv.wait_until(l.native(), deadline) == std::cv_status::timeout) {
      if (c.done) break;
      return Status::DeadlineExceeded("call not complete by the deadline");
    }
  }
  return c.status;
}

void ClientImpl::Wake() {
  uint64_t one = 1;
  if (event_fd_ >= 0) {
    ssize_t r = write(event_fd_, &one, sizeof(one));
    (void)r;
  }
}

// ---------------------------------------------------------------- I/O thread
void ClientImpl::IoLoop() {
  // Polls the sockets' notification descriptors (ZMQ_FD) without holding io_mu_, so that a
  // caller's thread may send meanwhile; every socket operation happens under io_mu_. A
  // descriptor signals only that the socket's state may have changed: each round checks the
  // sockets themselves (ReceiveReady, MonitorEvent read until nothing is left).
  //
  // While callers wait (a WaitCall since the last round left under kUnwatchedInFlight in
  // flight), this thread stands down until its next round: it polls only what callers do not
  // (its eventfd, the monitors, the DEALERs past kMaxPolledServers), so a reply wakes one
  // thread, not two that then contend for io_mu_ and, on a busy machine, for a core. A waiter
  // that leaves many in flight, a caller that sends many without waiting, or the last poller
  // leaving while waiters sleep on their calls wakes it (WaitCall, Send, StandDown). Calls
  // nobody waits for are read at its next round.
  size_t n = 0;
  size_t n_open = 0;  // open_sockets_ when the items were collected
  size_t n_standing_down = 0;  // the first this many items: what the thread polls standing down
  std::vector<zmq::pollitem_t> items;
  // The descriptors of every server's monitor and DEALER (again when a map added or revived
  // servers); a retired id without sockets has none.
  auto collect = [&] {
    n = servers_.size();
    n_open = open_sockets_;
    n_standing_down = CollectPollItems(&items);
  };
  {
    std::lock_guard<std::mutex> io(io_mu_);
    collect();
  }
  auto next_timeout_check = Clock::now();
  std::unique_lock<std::mutex> io(io_mu_, std::defer_lock);
  while (!stop_.load()) {
    // A caller that polled since the last round likely waits again soon (a loop of calls):
    // standing down until the next round covers the moments between its waits too.
    const bool stand_down = StandDown();
    try {
      zmq::poll(items.data(), stand_down ? n_standing_down : items.size(),
                std::chrono::milliseconds(20));
    } catch (const zmq::error_t& e) {
      io_standing_down_.store(false);
      if (e.num() == EINTR) continue;
      break;
    }
    io_standing_down_.store(false);
    if (items[0].revents & ZMQ_POLLIN) {
      uint64_t v;
      ssize_t r = read(event_fd_, &v, sizeof(v));
      (void)r;
    }
    io.lock();
    // A new map may have retired ids: their requests go elsewhere before anything else is
    // sent (DrainMapWaiters below then routes by the same map).
    if (installed_version_.load() != retired_version_) RetireServers();
    SendQueued();
    ReceiveReady();
    for (size_t i = 0; i < n; ++i) MonitorEvent(static_cast<uint32_t>(i));
    const auto now = Clock::now();
    if (now >= next_timeout_check) {
      next_timeout_check = now + std::chrono::milliseconds(20);
      ExpireRequests(now);
    }
    for (size_t i = 0; i < n; ++i) {
      if (!servers_[i].retry.empty()) DrainRetries(static_cast<uint32_t>(i), now);
    }
    if (!map_waiters_.empty()) DrainMapWaiters(now);
    // What the sends above did may have consumed a socket's notification.
    ReceiveSentTo();
    if (servers_.size() != n || open_sockets_ != n_open) collect();
    io.unlock();
  }
  io.lock();
  CancelEverything();
}

size_t ClientImpl::CollectPollItems(std::vector<zmq::pollitem_t>* items) const {
  items->clear();
  items->push_back({nullptr, event_fd_, ZMQ_POLLIN, 0});
  for (const ServerConn& s : servers_) {
    if (s.monitor) items->push_back({nullptr, s.monitor.get(zmq::sockopt::fd), ZMQ_POLLIN, 0});
  }
  for (const ServerConn& s : servers_) {
    if (s.dealer && !s.polled) {
      items->push_back({nullptr, s.dealer.get(zmq::sockopt::fd), ZMQ_POLLIN, 0});
    }
  }
  const size_t standing_down = items->size();
  for (const ServerConn& s : servers_) {
    if (s.polled) items->push_back({nullptr, s.dealer.get(zmq::sockopt::fd), ZMQ_POLLIN, 0});
  }
  return standing_down;
}

bool ClientImpl::StandDown() {
  if (!settled_wait_.exchange(false)) {
    io_standing_down_.store(false);
    return false;
  }
  // Set before the waiter counts are read (see LeavePolling).
  io_standing_down_.store(true);
  if (sleeping_waiters_.load() > 0 && polling_waiters_.load() == 0) {
    io_standing_down_.store(false);
    return false;
  }
  return true;
}

void ClientImpl::CancelEverything() {
  std::vector<Outgoing> batch;
  for (auto& o : map_waiters_) {
    if (o.call) PartDone(o.call, Status::Cancelled("client destroyed"));
  }
  map_waiters_.clear();
  // Fail whatever is still pending.
  {
    MutexLock l(queue_mu_);
    batch.swap(queue_);
  }
  for (auto& o : batch) {
    if (o.call) PartDone(o.call, Status::Cancelled("client destroyed"));
  }
  for (auto& s : servers_) {
    for (auto& o : s.retry) {
      if (o.call) PartDone(o.call, Status::Cancelled("client destroyed"));
    }
    s.retry.clear();
  }
  auto left = std::move(in_flight_);
  for (auto& [id, f] : left) PartDone(f.call, Status::Cancelled("client destroyed"));
  for (auto& s : servers_) {
    if (s.dealer) s.dealer.close();
    if (s.monitor) s.monitor.close();
  }
}

bool ClientImpl::DroppedAsCancelled(const Outgoing& o) {
  if (!o.call || !o.call->cancelled.load()) return false;
  PartDone(o.call, Status::Cancelled("call cancelled"));
  return true;
}

void ClientImpl::SendOne(Outgoing& o) {
  if (DroppedAsCancelled(o)) return;
  ServerConn& s = servers_[o.server];
  if (s.retired_by != 0) {  // built by an older map, or a clock: never queued for a gone id
    SendToRetired(std::move(o));
    return;
  }
  o.send_order = ++s.next_send_order;
  if (o.needs_seq) {
    // Sequence numbers follow the send order: the server sees a client's pushes in order.
    o.header.client_id = NumberingOf(s);
    o.header.client_seq = ++s.push_seq;
    o.parts[0] = EnvelopeFrame(o.header);
    o.needs_seq = false;
  }
  if (o.retryable() && !s.retry.empty()) {
    s.retry.push_back(std::move(o));  // behind the requests waiting to be sent again
    return;
  }
  // Known to be down, and no retries: ZeroMQ would queue the request for a reconnect that no
  // event reports, and it would wait for its deadline. An id given back waits for its new
  // connection (DrainRetries): sent at once, a push went down the old one, still closing, and
  // waited one request timeout (30 s by default) under load.
  const bool down = s.ever_connected && !s.connected;
  const bool wait_for_connection = s.reconnecting && o.retryable();
  if (!wait_for_connection && !(down && !o.retryable()) && Transmit(o)) return;
  if (!s.handshake_error.ok()) {  // a key mismatch does not heal by retrying
    if (o.call) PartDone(o.call, s.handshake_error);
    return;
  }
  const Status why = Status::Unavailable("server " + std::to_string(o.server) + " (" +
                                         Address(o.server) + ") is not connected");
  RetryOrFail(std::move(o), why, /*server_down=*/true);
}

bool ClientImpl::Transmit(Outgoing& o) {
  ServerConn& s = servers_[o.server];
  if (o.op == Op::kClock && o.header.clock != clock_.load()) {
    // A clock sent again (after a timeout or a reconnect) carries the worker's clock now: its
    // old value, arriving after a newer one, would move the server's clock back.
    o.header.clock = clock_.load();
    o.parts[0] = EnvelopeFrame(o.header);
  }
  bool sent = false;
  // A retryable request keeps its frames to send them again: the wire gets copies that share
  // the buffers (zmq_msg_copy counts references; nothing is copied for large frames).
  std::vector<zmq::message_t> copies;
  std::vector<zmq::message_t>* wire = &o.parts;
  if (o.retryable()) {
    copies.resize(o.parts.size());
    for (size_t i = 0; i < o.parts.size(); ++i) copies[i].copy(o.parts[i]);
    wire = &copies;
  }
  if (!s.dealer) return false;  // a retired id without sockets
  o.sent_drops = s.drops;
  try {
    sent = zmq::send_multipart(s.dealer, *wire, zmq::send_flags::dontwait).has_value();
  } catch (const zmq::error_t&) {
    sent = false;
  }
  if (!sent) return false;
  if (std::find(sent_to_.begin(), sent_to_.end(), o.server) == sent_to_.end()) {
    sent_to_.push_back(o.server);
  }
  if (o.call) {
    const uint64_t id = o.request_id;
    InFlight f{o.call, o.server, o.part, o.deadline, std::nullopt, o.rows};
    if (o.retryable()) f.retained = std::move(o);
    in_flight_.emplace(id, std::move(f));
  }
  return true;
}

void ClientImpl::RetryOrFail(Outgoing o, const Status& why, bool server_down) {
  if (DroppedAsCancelled(o)) return;
  const auto now = Clock::now();
  if (!o.retryable() || now >= o.give_up) {
    if (o.call) {
      Status s = why;
      if (o.retryable()) {
        s = Status::Unavailable(why.message() + " (gave up after retrying for " +
                                std::to_string(options_.retry_for_ms) + " ms)");
      }
      PartDone(o.call, s);
    }
    return;
  }
  ServerConn& s = servers_[o.server];
  o.last_error = why;
  // Keep the queue in send order: requests that were in flight are older than queued ones.
  auto pos = std::upper_bound(
      s.retry.begin(), s.retry.end(), o.send_order,
      [](uint64_t order, const Outgoing& q) { return order < q.send_order; });
  s.retry.insert(pos, std::move(o));
  const auto at = server_down ? now + std::chrono::milliseconds(s.backoff_ms) : now;
  if (s.retry.size() == 1 || at < s.retry_at) s.retry_at = at;
}

void ClientImpl::RenumberPush(uint32_t server, Outgoing o, const Status& why) {
  if (DroppedAsCancelled(o)) return;
  ServerConn& s = servers_[server];
  const uint64_t numbering = NumberingOf(s);
  const auto now = Clock::now();
  // Counted in another server's sequence, or the first push of a numbering: never refused so
  // by a server that follows the protocol. And a push past its retry time ends here.
  if (o.header.client_origin != 0 ||
      (o.header.client_id == numbering && o.header.client_seq <= 1) || now >= o.give_up) {
    if (o.call) PartDone(o.call, why);
    return;
  }
  if (o.header.client_id == numbering) {
    // The pushes of the old numbering still on their way are refused the same way (the
    // server knows it nowhere) and each is sent again under the new one when its answer comes.
    NewNumbering(s);
  }
  o.header.client_id = 0;
  o.header.client_seq = 0;
  o.needs_seq = true;
  o.deadline = std::min(o.give_up, now + std::chrono::milliseconds(options_.request_timeout_ms));
  SendOne(o);  // a new send order and number: behind what waits, ahead of what comes later
}

void ClientImpl::DrainRetries(uint32_t server, Clock::time_point now) {
  ServerConn& s = servers_[server];
  for (auto it = s.retry.begin(); it != s.retry.end();) {
    if (now >= it->give_up) {
      Outgoing o = std::move(*it);
      it = s.retry.erase(it);
      const Status why = o.last_error;
      RetryOrFail(std::move(o), why, /*server_down=*/true);
    } else {
      ++it;
    }
  }
  if (s.retry.empty() || now < s.retry_at || !s.connected) return;
  while (!s.retry.empty()) {
    Outgoing o = std::move(s.retry.front());
    s.retry.pop_front();
    if (DroppedAsCancelled(o)) continue;
    o.deadline = std::min(o.give_up, now + std::chrono::milliseconds(options_.request_timeout_ms));
    if (!Transmit(o)) {
      s.retry.push_front(std::move(o));
      s.retry_at = now + std::chrono::milliseconds(s.backoff_ms);
      s.backoff_ms = std::min(kMaxBackoffMs, s.backoff_ms * 2);
      return;
    }
  }
  s.backoff_ms = kMinBackoffMs;
}

void ClientImpl::ReceiveFrom(uint32_t server) {
  for (;;) {
    std::vector<zmq::message_t> parts;
    if (!servers_[server].dealer || !TryRecv(servers_[server].dealer, &parts)) return;
    if (parts.empty()) continue;
    Header h;
    Status s = DecodeHeader(parts[0].data(), parts[0].size(), &h);
    auto it = in_flight_.find(h.request_id);
    if (it == in_flight_.end()) continue;  // late reply of a failed call, or unparsable
    InFlight f = std::move(it->second);
    in_flight_.erase(it);
    if (s.ok() && h.status != StatusCode::kOk) {
      s = Status(h.status, h.message).WithContext("server " + std::to_string(server));
      if (h.status == StatusCode::kFailedPrecondition && source_ && f.retained &&
          IsDataOp(f.retained->header.op) && h.map_version != f.retained->header.map_version) {
        // Fencing: the server follows another map version; nothing of the request applied.
        // (Every error reply of a following server carries its version, 0 while it has none
        // yet; at the request's own version the refusal is not about the map, and is reported
        // as it is.)
        StaleMapRetry(std::move(*f.retained), h.map_version, s);
        continue;
      }
      if (h.status == StatusCode::kAborted && f.retained && IsPush(f.retained->header.op)) {
        RenumberPush(server, std::move(*f.retained), s);
        continue;
      }
      if (h.status == StatusCode::kUnavailable && f.retained) {
        // The server asks for a retry (a push whose original still waits to be applied).
        RetryOrFail(std::move(*f.retained), s, /*server_down=*/true);
        continue;
      }
    }
    if (s.ok() && f.call->on_reply) {
      parts.erase(parts.begin());
      std::lock_guard<std::mutex> g(f.call->write_mu);  // Client::Cancel waits for the copy
      s = f.call->cancelled.load() ? Status::Cancelled("call cancelled")
                                   : f.call->on_reply(f.part, f.rows.get(), h, parts);
    }
    if (s.ok() && f.call->push != Call::PushKind::kNone) {
      std::string& a = f.call->applied_parts;
      a += a.empty() ? "" : ", ";
      if (f.call->push == Call::PushKind::kDense) {
        // A part goes as chunk requests (dense_chunk_bytes): name the chunk's range too.
        a += "part " + std::to_string(f.part);
        if (f.retained) {
          const Header& rh = f.retained->header;
          a += " [" + std::to_string(rh.offset) + ", " + std::to_string(rh.offset + rh.count) + ")";
        }
        a += " on ";
      }
      a += "server " + std::to_string(server);
    }
    PartDone(f.call, s);
  }
}

void ClientImpl::ExpireRequests(Clock::time_point now) {
  std::vector<InFlight> expired;
  for (auto it = in_flight_.begin(); it != in_flight_.end();) {
    if (it->second.deadline <= now) {
      expired.push_back(std::move(it->second));
      in_flight_.erase(it++);
    } else {
      ++it;
    }
  }
  for (auto& f : expired) {
    Status st = Status::Unavailable("no reply from server " + std::to_string(f.server) + " (" +
                                    Address(f.server) + ") in time");
    if (f.retained) {
      f.retained->NoteUnanswered();
      RetryOrFail(std::move(*f.retained), st, /*server_down=*/false);
    } else {
      PartDone(f.call, st);
    }
  }
}

void ClientImpl::PartDone(const std::shared_ptr<Call>& c, const Status& s) {
  if (!s.ok() && c->first_error.ok()) c->first_error = s;
  if (!s.ok()) ++c->failed_parts;
  if (c->remaining > 0) --c->remaining;
  if (c->remaining != 0) return;
  if (!c->first_error.ok() && !c->applied_parts.empty() &&
      c->first_error.code() != StatusCode::kCancelled) {
    // Some parts were applied and stay applied: say which, so that the caller does not take
    // the error for "nothing applied" (a whole resend would apply those parts again).
    c->first_error = Status(
        c->first_error.code(),
        c->first_error.message() + " [push partly applied: " + std::to_string(c->failed_parts) +
            " part(s) failed as above; applied and acknowledged, so not to be sent again: " +
            c->applied_parts + "]");
  }
  if (c->first_error.ok() && c->on_done) {
    std::lock_guard<std::mutex> g(c->write_mu);
    if (!c->cancelled.load()) c->on_done();
  }
  c->on_reply = nullptr;
  c->on_done = nullptr;
  {
    MutexLock l(c->mu);
    if (!c->done) c->status = c->first_error;  // a cancelled call keeps its Cancelled
    c->done = true;
    c->done_flag.store(true);
    c->WakePoller();  // under mu: see Call::waiter_fd
  }
  c->cv.notify_all();
}

}  // namespace internal
}  // namespace tessera
