// The client's side of a cluster map (docs/elasticity.md): the map calls are routed by, its
// updates from the source (watch, and reloads after a stale-map refusal), and the rerouting
// of requests a server refused as stale. The I/O thread runs StaleMapRetry, DrainMapWaiters
// and Reroute; the source's thread and the refresher run InstallMap.
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
  std::lock_guard<std::mutex> l(map_mu_);
  return routing_;
}

void ClientImpl::InstallMap(const Result<RoutingMap>& m) {
  if (!m.ok()) return;  // the watch goes on; a refused request waits for a reload or gives up
  // Lock order: clock_mu_, io_mu_, map_mu_ (the I/O thread takes map_mu_ under io_mu_).
  std::lock_guard<std::mutex> clock(clock_mu_);
  std::unique_lock<std::mutex> io(io_mu_);
  if (stop_.load()) return;
  {
    std::lock_guard<std::mutex> l(map_mu_);
    if (m->version <= routing_->version) return;
    // A map may add servers (new ids at the end) and retire ids (their address emptied); it
    // may not give a known id another address, nor move dense tables.
    const auto& known = routing_->addresses;
    std::string why;
    if (m->addresses.size() < known.size()) {
      why = "has " + std::to_string(m->addresses.size()) + " servers, fewer than the " +
            std::to_string(known.size()) + " ids known (ids are never removed)";
    }
    for (size_t i = 0; why.empty() && i < known.size(); ++i) {
      if (!m->addresses[i].empty() && m->addresses[i] != known[i]) {
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
  ReceiveSentTo();
  std::lock_guard<std::mutex> l(map_mu_);
  if (!connected.ok()) {
    map_error_ = connected.WithContext("cluster map version " + std::to_string(m->version));
    return;
  }
  routing_ = std::make_shared<const RoutingMap>(*m);
  io.unlock();
  Wake();
}

Status ClientImpl::ConnectNewServers(const RoutingMap& m) {
  // The caller holds clock_mu_ and io_mu_.
  const int64_t clock = clock_.load();
  for (size_t i = servers_.size(); i < m.addresses.size(); ++i) {
    TESSERA_RETURN_IF_ERROR(ConnectServer(m.addresses[i]));
    if (m.addresses[i].empty()) continue;  // retired before this client knew it
    Header h = BaseHeader(Op::kClock);
    h.clock = clock;
    Outgoing o = MakeOutgoing(static_cast<uint32_t>(i), h, {}, nullptr, RequestDeadline());
    SendOne(o);
  }
  return Status::OK();
}

void ClientImpl::RefreshLoop() {
  std::unique_lock<std::mutex> l(map_mu_);
  for (;;) {
    refresh_cv_.wait(l, [this] { return refresh_stop_ || refresh_wanted_ > routing_->version; });
    if (refresh_stop_) return;
    l.unlock();
    // The watch normally brings the map first; this read covers a watch that is late or
    // broken. Paced, so that a server ahead of etcd's answers does not spin the loop.
    Result<RoutingMap> m = source_->Load();
    InstallMap(m);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    l.lock();
  }
}

void ClientImpl::StaleMapRetry(Outgoing o, uint64_t server_version, const Status& why) {
  const auto now = Clock::now();
  if (o.call && o.call->cancelled.load()) {
    PartDone(o.call, Status::Cancelled("call cancelled"));
    return;
  }
  // A server behind the request's version catches up by itself (its watch, or its poll for a
  // first map): waiting for it is bounded by the retry limit only. Refusals that make the
  // client load a newer map are counted.
  if (server_version > o.header.map_version) ++o.stale_retries;
  if (o.stale_retries > Client::kMaxStaleMapRetries || now >= o.give_up) {
    if (o.call) {
      PartDone(o.call, Status::FailedPrecondition(
                           why.message() + " (gave up after routing it again " +
                           std::to_string(std::min(o.stale_retries,
                                                   Client::kMaxStaleMapRetries)) +
                           " times)"));
    }
    return;
  }
  ++stale_map_retries_;
  o.last_error = why;
  if (server_version > o.header.map_version) {
    // The client's map is older: wait for the server's version (the watch brings it; the
    // refresher reads it when the watch is late).
    {
      std::lock_guard<std::mutex> l(map_mu_);
      refresh_wanted_ = std::max(refresh_wanted_, server_version);
    }
    refresh_cv_.notify_all();
    o.not_before = now;
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
    std::lock_guard<std::mutex> l(map_mu_);
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
    // does not change: the same server again.
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
    piece.stale_retries = o.stale_retries;
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
  h.client_id = 0;
  h.client_seq = 0;
  o.request_id = next_id_.fetch_add(1) + 1;
  h.request_id = o.request_id;
  if (IsPush(h.op)) {
    // The refused push applied nothing: a new sequence number on the server it goes to now
    // (its old number may be below pushes of this client the server has taken since).
    o.needs_seq = true;
  } else {
    o.parts[0] = EnvelopeFrame(h);
  }
  o.deadline = std::min(o.give_up, Clock::now() + std::chrono::milliseconds(
                                                      options_.request_timeout_ms));
  SendOne(o);
}

}  // namespace internal
}  // namespace tessera
