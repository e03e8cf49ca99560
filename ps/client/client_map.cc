// The client's side of a cluster map (docs/elasticity.md): the map calls are routed by, its
// updates from the source (watch, and reloads after a stale-map refusal), the rerouting of
// requests a server refused as stale, and of requests to a server a map retired (fail-over:
// its backup was promoted). The I/O thread runs StaleMapRetry, DrainMapWaiters, Reroute and
// RetireServers; the source's thread and the refresher run InstallMap.
#include <algorithm>
#include <chrono>
#include <cstring>

#include "ps/client/client_internal.h"

namespace tessera {
namespace internal {
namespace {

// A refused request waits this long for a server that is behind the client's map.
constexpr int64_t kServerBehindWaitMs = 50;

}  // namespace

std::shared_ptr<const RoutingMap> ClientImpl::Routing() const {
  MutexLock l(map_mu_);
  return routing_;
}

void ClientImpl::InstallMap(const Result<RoutingMap>& m) {
  if (!m.ok()) return;  // the watch goes on; a refused request waits for a reload or gives up
  // Lock order: clock_mu_, io_mu_, map_mu_ (the I/O thread takes map_mu_ under io_mu_).
  MutexLock clock(clock_mu_);
  std::unique_lock<std::mutex> io(io_mu_);
  if (stop_.load()) return;
  std::vector<size_t> revived;  // retired ids the map gives an address again
  {
    MutexLock l(map_mu_);
    if (m->version <= routing_->version) return;
    // A map may add servers (new ids at the end), retire ids (their address emptied) and give
    // a retired id an address again (its server restarted under its old --rank); it may not
    // give a live id another address, nor move dense tables.
    const auto& known = routing_->addresses;
    std::string why;
    if (m->addresses.size() < known.size()) {
      why = "has " + std::to_string(m->addresses.size()) + " servers, fewer than the " +
            std::to_string(known.size()) + " ids known (ids are never removed)";
    }
    for (size_t i = 0; why.empty() && i < known.size(); ++i) {
      if (known[i].empty() && !m->addresses[i].empty()) {
        if (retired_version_ != routing_->version) {
          // The map this client routes by retired it, and the I/O thread has not handled that
          // yet (what was in flight there): this map waits for the next reload.
          refresh_wanted_ = std::max(refresh_wanted_, m->version);
          refresh_cv_.notify_all();
          return;
        }
        revived.push_back(i);
      }
      if (!m->addresses[i].empty() && !known[i].empty() && m->addresses[i] != known[i]) {
        why = "gives server " + std::to_string(i) + " the address " + m->addresses[i] +
              " instead of " + known[i];
      }
    }
    const uint32_t dense =
        m->dense_servers != 0 ? m->dense_servers : static_cast<uint32_t>(m->addresses.size());
    if (why.empty() && dense != dense_servers_) {
      why = "spreads dense tables over " + std::to_string(dense) + " servers instead of " +
            std::to_string(dense_servers_);
    }
    if (!why.empty()) {
      map_error_ = Status::FailedPrecondition("cluster map version " +
                                              std::to_string(m->version) + " " + why +
                                              ": not followed; create a new client");
      return;
    }
  }
  Status connected = ConnectNewServers(*m);
  if (connected.ok()) connected = ReviveServers(*m, revived);
  ReceiveSentTo();
  MutexLock l(map_mu_);
  if (!connected.ok()) {
    map_error_ = connected.WithContext("cluster map version " + std::to_string(m->version));
    return;
  }
  routing_ = std::make_shared<const RoutingMap>(*m);
  // The I/O thread handles the ids it retires (RetireServers): what is in flight there is
  // the I/O side's, and rerouting it sends.
  installed_version_.store(m->version);
  io.unlock();
  Wake();
}

Status ClientImpl::ConnectNewServers(const RoutingMap& m) {
  // The caller holds clock_mu_ and io_mu_.
  for (size_t i = servers_.size(); i < m.addresses.size(); ++i) {
    TESSERA_RETURN_IF_ERROR(ConnectServer(m.addresses[i]));
    if (m.addresses[i].empty()) continue;  // retired before this client knew it
    SendClockTo(static_cast<uint32_t>(i));
  }
  return Status::OK();
}

void ClientImpl::SendClockTo(uint32_t server) {
  Header h = BaseHeader(Op::kClock);
  h.clock = clock_.load();
  Outgoing o = MakeOutgoing(server, h, {}, nullptr, RequestDeadline());
  SendOne(o);
}

Status ClientImpl::ReviveServers(const RoutingMap& m, const std::vector<size_t>& ids) {
  // The caller holds clock_mu_ and io_mu_. Each id (retired by a fail-over or a scale-down, or
  // known only retired) is connected to its new address, its clock sent, and its pushes get a
  // new numbering (a new id to number them under; the first push of a numbering is new
  // everywhere). Numbered on, they would share a dedup key with the pushes of the id's last
  // stay that were sent again elsewhere under their numbers (client_origin): the new owner of
  // those slots, when it backs up the new process, would take this process's later numbers
  // forwarded to it ahead of such a resend still on its way, and answer the resend as a
  // retry, applied nowhere (ReplicatedRandomFaults.FailOverRebuildAndScale lost an
  // acknowledged push so).
  for (size_t i : ids) {
    ServerConn& s = servers_[i];
    if (!s.dealer) {  // known only retired: no sockets yet
      TESSERA_RETURN_IF_ERROR(OpenSockets(static_cast<uint32_t>(i), m.addresses[i]));
    } else {
      try {
        if (!s.address.empty()) s.dealer.disconnect(s.address);
      } catch (const zmq::error_t&) {  // disconnected when a fail-over retired it
      }
      try {
        s.dealer.connect(m.addresses[i]);
      } catch (const zmq::error_t& e) {
        return Status::InvalidArgument("bad endpoint '" + m.addresses[i] + "': " + e.what());
      }
    }
    s.address = m.addresses[i];
    s.retired_by = 0;
    s.connected = false;
    s.reconnecting = true;
    NewNumbering(s);
    SendClockTo(static_cast<uint32_t>(i));
  }
  return Status::OK();
}

void ClientImpl::RefreshLoop() {
  MutexLock l(map_mu_);
  for (;;) {
    while (!refresh_stop_ && refresh_wanted_ <= routing_->version) refresh_cv_.wait(l.native());
    if (refresh_stop_) return;
    l.Unlock();
    // The watch normally brings the map first; this read covers a watch that is late or
    // broken. Paced, so that a server ahead of etcd's answers does not spin the loop.
    Result<RoutingMap> m = source_->Load();
    InstallMap(m);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    l.Lock();
  }
}

void ClientImpl::KeepNumberIfUnsettled(Outgoing& o, uint64_t server_version) {
  Header& h = o.header;
  if (!IsPush(h.op) || h.client_seq == 0 || h.client_origin != 0 || !o.unanswered) return;
  const bool same_process = o.unanswered_server == o.server &&
                            servers_[o.server].drops == o.unanswered_drops &&
                            server_version > h.map_version;
  if (same_process) return;  // applied nowhere: a new number (SendRouted)
  // An attempt may have been taken by a process of o.server that is gone (or, refused by a
  // server behind the push's map, may still be taken when it catches up), and forwarded to
  // the slots' backup, which logged it under (client_id, o.server + 1, client_seq): the
  // same triple is answered as a retry wherever that backup's log is, or applied once.
  h.client_origin = o.server + 1;
  // And the later pushes to o.server go under a new numbering: one of this numbering, taken
  // there (by a new process) and forwarded to a backup that comes to own this push's keys,
  // would put that backup's mark for the triple's (client_id, origin) above this push, which
  // would then be answered there as a retry and applied nowhere.
  ServerConn& s = servers_[o.server];
  if (h.client_id == NumberingOf(s)) NewNumbering(s);
}

void ClientImpl::StaleMapRetry(Outgoing o, uint64_t server_version, const Status& why) {
  const auto now = Clock::now();
  if (DroppedAsCancelled(o)) return;
  KeepNumberIfUnsettled(o, server_version);
  // A server behind the request's version catches up by itself (its watch, or its poll for a
  // first map), and a client behind the server's waits for that version before it routes the
  // request again: each reroute goes by a newer map than the attempt before, so a backup
  // rebuild or a slot move stepping the map through many versions in a second or two (24 in a
  // rebuild of 10,923 slots) is progress. Both are bounded by retry_for_ms alone.
  ++o.reroutes;
  if (now >= o.give_up) {
    if (o.call) {
      PartDone(o.call, Status::FailedPrecondition(
                           why.message() + " (still refused when retry_for_ms ran out, after " +
                           "routing it again " + std::to_string(o.reroutes - 1) + " times)"));
    }
    return;
  }
  ++stale_map_retries_;
  o.last_error = why;
  if (server_version > o.header.map_version) {
    // The client's map is older: wait for the server's version (the watch brings it; the
    // refresher reads it when the watch is late).
    {
      MutexLock l(map_mu_);
      refresh_wanted_ = std::max(refresh_wanted_, server_version);
    }
    refresh_cv_.notify_all();
    o.not_before = now;
    // The map may be here already (the refusal read by a waiting caller's thread): only the
    // I/O thread routes it again (DrainMapWaiters), and it may be standing down.
    Wake();
  } else {
    // The server is behind the client's map: give its watch a moment.
    o.not_before = now + std::chrono::milliseconds(kServerBehindWaitMs);
  }
  o.header.map_version = server_version;  // the least version to route it by
  map_waiters_.push_back(std::move(o));
}

void ClientImpl::DrainMapWaiters(Clock::time_point now) {
  std::shared_ptr<const RoutingMap> map;
  Status map_error;
  {
    MutexLock l(map_mu_);
    map = routing_;
    map_error = map_error_;
  }
  std::deque<Outgoing> waiting = std::move(map_waiters_);
  map_waiters_.clear();
  for (auto& o : waiting) {
    if (now >= o.give_up) {
      if (o.call) {
        PartDone(o.call, Status::FailedPrecondition(
                             o.last_error.message() + " (no cluster map of version " +
                             std::to_string(o.header.map_version) + " arrived in time" +
                             (map_error.ok() ? "" : ": " + map_error.message()) + ")"));
      }
    } else if (now < o.not_before || map->version < o.header.map_version) {
      map_waiters_.push_back(std::move(o));
    } else {
      Reroute(std::move(o), *map);
    }
  }
}

void ClientImpl::Reroute(Outgoing o, const RoutingMap& map) {
  Header& h = o.header;
  if (h.op == Op::kDensePull || h.op == Op::kDensePush) {
    // Dense ranges are placed by the number of servers, which a map this client follows
    // does not change: the part's server again, unless a fail-over gave the part to its
    // backup.
    o.server = map.DenseOwner(o.part);
  } else {
    // The keys frame: every key must now belong to one server.
    const auto* keys = static_cast<const uint64_t*>(o.parts[1].data());
    std::vector<uint64_t> copy;
    if (reinterpret_cast<uintptr_t>(keys) % alignof(uint64_t) != 0) {
      copy.resize(o.parts[1].size() / 8);
      std::memcpy(copy.data(), o.parts[1].data(), o.parts[1].size());
      keys = copy.data();
    }
    const uint64_t n = o.parts[1].size() / 8;
    const uint32_t to = n > 0 ? map.primary.ServerOfKey(keys[0]) : o.server;
    for (uint64_t i = 1; i < n; ++i) {
      if (map.primary.ServerOfKey(keys[i]) != to) {
        // The keys belong to several servers now: one request per server, each carrying its
        // keys' positions so that the replies land where the whole part's would have.
        SplitAndReroute(std::move(o), map, keys, n);
        return;
      }
    }
    o.server = to;
  }
  SendRouted(std::move(o), map);
}

void ClientImpl::SplitAndReroute(Outgoing o, const RoutingMap& map, const uint64_t* keys,
                                 uint64_t n) {
  const bool push = IsPush(o.header.op);
  const uint32_t dim = o.header.dim;
  std::vector<std::vector<uint32_t>> by_server(map.primary.num_servers());
  for (uint64_t i = 0; i < n; ++i) {
    by_server[map.primary.ServerOfKey(keys[i])].push_back(static_cast<uint32_t>(i));
  }
  const char* values = push ? static_cast<const char*>(o.parts[2].data()) : nullptr;
  const size_t row_bytes = size_t{dim} * sizeof(float);
  uint32_t pieces = 0;
  for (const auto& v : by_server) pieces += v.empty() ? 0 : 1;
  if (o.call) o.call->remaining += pieces - 1;  // the part becomes `pieces` parts
  for (uint32_t s = 0; s < by_server.size(); ++s) {
    const std::vector<uint32_t>& idx = by_server[s];
    if (idx.empty()) continue;
    Outgoing piece;
    piece.server = s;
    piece.call = o.call;
    piece.give_up = o.give_up;
    piece.header = o.header;
    piece.header.count = idx.size();
    piece.part = o.part;
    piece.op = o.op;
    piece.reroutes = o.reroutes;
    piece.last_error = o.last_error;
    auto rows = std::make_shared<std::vector<uint32_t>>(idx.size());
    zmq::message_t key_frame(idx.size() * sizeof(uint64_t));
    zmq::message_t value_frame(push ? idx.size() * row_bytes : 0);
    for (size_t k = 0; k < idx.size(); ++k) {
      (*rows)[k] = o.rows ? (*o.rows)[idx[k]] : idx[k];
      std::memcpy(static_cast<char*>(key_frame.data()) + k * sizeof(uint64_t), keys + idx[k],
                  sizeof(uint64_t));
      if (push) {
        std::memcpy(static_cast<char*>(value_frame.data()) + k * row_bytes,
                    values + size_t{idx[k]} * row_bytes, row_bytes);
      }
    }
    piece.rows = std::move(rows);
    piece.parts.emplace_back();  // the envelope, encoded by SendRouted
    piece.parts.push_back(std::move(key_frame));
    if (push) piece.parts.push_back(std::move(value_frame));
    SendRouted(std::move(piece), map);
  }
}

void ClientImpl::SendRouted(Outgoing o, const RoutingMap& map) {
  Header& h = o.header;
  h.map_version = map.version;
  o.request_id = next_id_.fetch_add(1) + 1;
  h.request_id = o.request_id;
  if (servers_[o.server].retired_by != 0 ||
      (o.server < map.addresses.size() && map.addresses[o.server].empty())) {
    // A dense range of a retired server (it has no other place), or a map that routes keys
    // to a retired id: nothing may be sent there again.
    const uint64_t by = servers_[o.server].retired_by;
    if (o.call) PartDone(o.call, RetiredError(o, o.server, by != 0 ? by : map.version));
    return;
  }
  if (IsPush(h.op) && h.client_origin != 0) {
    // Counted in a retired server's sequence: the new owner may hold it from that server's
    // replication (under client_id, origin, client_seq). A new number would make it apply
    // twice; the same one is answered as a retry there or applied once.
    o.needs_seq = false;
    o.parts[0] = EnvelopeFrame(h);
  } else if (IsPush(h.op)) {
    // The refused push applied nothing anywhere (KeepNumberIfUnsettled gave it an origin
    // otherwise): a new sequence number on the server it goes to now (its old number may be
    // below pushes of this client the server has taken since).
    h.client_id = 0;
    h.client_seq = 0;
    o.needs_seq = true;
    o.unanswered = false;  // no attempt under the new number yet
  } else {
    o.parts[0] = EnvelopeFrame(h);
  }
  // A request that is never retried (SendToRetired of a fresh one) has one attempt.
  const Deadline attempt =
      Clock::now() + std::chrono::milliseconds(options_.request_timeout_ms);
  o.deadline = o.retryable() ? std::min(o.give_up, attempt) : attempt;
  SendOne(o);
}

bool ClientImpl::FailedOver(const RoutingMap& before, const RoutingMap& map, uint32_t server) {
  if (before.backup.empty()) return false;
  const std::vector<uint16_t>& was = before.primary.owners();
  const std::vector<uint16_t>& now = map.primary.owners();
  bool owned = false;
  for (size_t slot = 0; slot < was.size() && slot < now.size(); ++slot) {
    if (was[slot] != server) continue;
    owned = true;
    if (before.backup[slot] == RoutingMap::kNoBackup || now[slot] != before.backup[slot]) {
      return false;
    }
  }
  return owned;
}

void ClientImpl::RetireServers() {
  const std::shared_ptr<const RoutingMap> map = Routing();
  const std::shared_ptr<const RoutingMap> before = retired_map_ ? retired_map_ : map;
  retired_version_ = map->version;
  retired_map_ = map;
  std::vector<uint32_t> retired;
  for (uint32_t i = 0; i < servers_.size() && i < map->addresses.size(); ++i) {
    if (servers_[i].retired_by == 0 && map->addresses[i].empty() &&
        FailedOver(*before, *map, i)) {
      servers_[i].retired_by = map->version;  // first: nothing below is routed back to it
      retired.push_back(i);
    }
  }
  for (uint32_t i : retired) {
    ServerConn& s = servers_[i];
    std::vector<Outgoing> moved(std::make_move_iterator(s.retry.begin()),
                                std::make_move_iterator(s.retry.end()));
    s.retry.clear();
    for (auto& f : TakeInFlight(i)) {
      if (f.retained) {
        moved.push_back(std::move(*f.retained));
      } else {
        PartDone(f.call, Status::Unavailable(
                             "server " + std::to_string(i) + " (" + Address(i) +
                             ") was retired by cluster map version " +
                             std::to_string(map->version) +
                             " while a request was in flight to it; the request is not retried "
                             "(ClientOptions::retry_for_ms is 0, or the op is never retried), "
                             "so a push may or may not have been applied"));
      }
    }
    // In the server's send order: the new owner dedups the pushes counted in i's sequence by
    // their numbers, and must see them in the order the retired server would have.
    std::stable_sort(moved.begin(), moved.end(), [](const Outgoing& a, const Outgoing& b) {
      return a.send_order < b.send_order;
    });
    // Stop ZeroMQ reconnecting to (and queueing for) an address the cluster gave up.
    try {
      if (!s.address.empty()) s.dealer.disconnect(s.address);
    } catch (const zmq::error_t&) {
    }
    for (auto& o : moved) SendToRetired(std::move(o));
  }
  // Waiters for a newer map that a retired id refused are left to DrainMapWaiters: they were
  // refused (nothing applied), so a push goes under a new number, and they route by this map
  // (or a newer one), which gives none of their keys to a retired id.
}

void ClientImpl::SendToRetired(Outgoing o) {
  const uint32_t server = o.server;
  const uint64_t version = servers_[server].retired_by;
  if (DroppedAsCancelled(o)) return;
  if (o.op == Op::kClock) {
    // A clock gates reads on the server it goes to, and a retired server serves none: failing
    // it would fail a worker's Clock() for a server the job no longer uses.
    if (o.call) PartDone(o.call, Status::OK());
    return;
  }
  if (source_ != nullptr && (o.op == Op::kPutMeta || o.op == Op::kCreateTable ||
                            o.op == Op::kDropTable)) {
    // Sent to every server of the map (MetaServers, AllServers): the others hold it.
    if (o.call) PartDone(o.call, Status::OK());
    return;
  }
  if (source_ != nullptr &&
      (o.op == Op::kBarrier || o.op == Op::kGetMeta || o.op == Op::kGetTable)) {
    // The next coordinating server (CoordServer) has every table and metadata record; a
    // barrier starts again there (arrivals are counted per worker, and every worker waiting
    // on the retired server arrives there again).
    // The envelope is sent as it was (these ops are not fenced by the map version); the
    // attempt gets at least a request timeout (a barrier keeps its caller's deadline).
    const uint32_t coord = CoordServer();
    if (servers_[coord].retired_by == 0) {
      o.server = coord;
      const Deadline attempt =
          Clock::now() + std::chrono::milliseconds(options_.request_timeout_ms);
      o.deadline = std::max(o.deadline, o.retryable() ? std::min(o.give_up, attempt) : attempt);
      SendOne(o);
      return;
    }
  }
  const bool sparse =
      o.op == Op::kSparsePull || o.op == Op::kSparsePush || o.op == Op::kSparsePushPull;
  const bool dense = o.op == Op::kDensePull || o.op == Op::kDensePush;
  bool movable = sparse && source_ != nullptr;
  if (dense && source_ != nullptr) {
    // A dense part goes to its backup when the map promoted it (replicated dense parts).
    const std::shared_ptr<const RoutingMap> map = Routing();
    const uint32_t to = map->DenseOwner(o.part);
    movable = to != server && to < map->addresses.size() && !map->addresses[to].empty();
  }
  if (!movable) {
    if (o.call) PartDone(o.call, RetiredError(o, server, version));
    return;
  }
  if (o.retryable() && Clock::now() >= o.give_up) {
    if (o.call) {
      PartDone(o.call, Status::Unavailable(
                           RetiredError(o, server, version).message() + " (" +
                           o.last_error.message() + "; gave up after retrying for " +
                           std::to_string(options_.retry_for_ms) + " ms)"));
    }
    return;
  }
  if (IsPush(o.op) && o.header.client_seq != 0 && o.header.client_origin == 0) {
    // Sent to it under its sequence number, and maybe applied there and replicated to the
    // slots' backup, the new owner, which knows it under (client_id, origin, client_seq):
    // the same triple is answered there as a retry, or applied once. (A fresh request has no
    // number yet and takes one from the server it goes to; a push already counted in another
    // retired server's sequence keeps that one: its backup forwarded it under it too.)
    o.header.client_origin = server + 1;
  }
  Reroute(std::move(o), *Routing());
}

Status ClientImpl::RetiredError(const Outgoing& o, uint32_t server, uint64_t version) const {
  const std::string who = "server " + std::to_string(server) + " (" + Address(server) +
                          ") was retired by cluster map version " + std::to_string(version);
  if (o.op == Op::kDensePull || o.op == Op::kDensePush) {
    const bool replicated = !Routing()->dense_backup.empty();
    return Status::FailedPrecondition(
        who + (replicated ? "; its dense part " + std::to_string(o.part) + " had no live backup"
                          : "; dense tables are not replicated") +
        ": elements [" + std::to_string(o.header.offset) + ", " +
        std::to_string(o.header.offset + o.header.count) + ") of dense table " +
        std::to_string(o.header.table_id) + " were there");
  }
  return Status::Unavailable(who + ": " + std::string(OpName(o.op)) + " is not sent to it");
}

}  // namespace internal
}  // namespace tessera
