// The server's edge: the ROUTER's bounds (high-water marks, handshake time), its socket
// monitor counting connections, the admission of every request (connection limit, envelope
// limits, per-peer in-flight limit, peers that do not read their replies) and the admin root
// under which checkpoints, restores and exports resolve their directories.
#include <arpa/inet.h>
#include <glog/logging.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <zmq_addon.hpp>

#include "ps/admin_path.h"
#include "ps/limits.h"
#include "ps/server/server_impl_internal.h"

namespace tessera::internal {
namespace {

// The IP address (without port) of the peer of TCP connection `fd`; empty when it cannot be
// read (not TCP, or already closed: its DISCONNECTED event follows).
std::string PeerAddress(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return {};
  char text[INET6_ADDRSTRLEN] = {};
  const void* ip = nullptr;
  if (addr.ss_family == AF_INET) {
    ip = &reinterpret_cast<const sockaddr_in*>(&addr)->sin_addr;
  } else if (addr.ss_family == AF_INET6) {
    ip = &reinterpret_cast<const sockaddr_in6*>(&addr)->sin6_addr;
  } else {
    return {};
  }
  return inet_ntop(addr.ss_family, ip, text, sizeof(text)) != nullptr ? std::string(text)
                                                                       : std::string();
}

}  // namespace

// High-water marks, handshake limit and the socket monitor of the ROUTER (before bind);
// resolves the admin root.
Status ServerImpl::ConfigureRouterBounds() {
  router_.set(zmq::sockopt::sndhwm, static_cast<int>(options_.send_hwm));
  router_.set(zmq::sockopt::rcvhwm, static_cast<int>(options_.recv_hwm));
  // A full send queue is reported (EAGAIN) instead of dropping the reply silently, so a
  // client that does not read is noticed and throttled (Admitted).
  router_.set(zmq::sockopt::router_mandatory, 1);
  // A connection that never completes the ZMTP (or CurveZMQ) handshake is closed.
  router_.set(zmq::sockopt::handshake_ivl, 10000);
  // Heartbeats: a peer that stops answering them (a half-open connection: its host or network
  // went away without a FIN) is closed after a minute, and its place freed. A live peer's
  // ZeroMQ answers them by itself, busy or idle.
  router_.set(zmq::sockopt::heartbeat_ivl, 10000);
  router_.set(zmq::sockopt::heartbeat_timeout, 60000);
  const std::string mon =
      "inproc://tessera-router-mon-" + std::to_string(reinterpret_cast<uintptr_t>(this));
  if (zmq_socket_monitor(router_.handle(), mon.c_str(),
                         ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED) != 0) {
    return Status::Internal("zmq_socket_monitor on the server socket failed");
  }
  edge_.monitor.set(zmq::sockopt::linger, 0);
  edge_.monitor.connect(mon);
  if (!options_.admin_root.empty()) {
    TESSERA_ASSIGN_OR_RETURN(edge_.admin_root, CanonicalAdminRoot(options_.admin_root));
  }
  return Status::OK();
}

// Feeds the ROUTER monitor's accepted/disconnected events to connections_.
void ServerImpl::DrainRouterEvents() {
  for (;;) {
    std::vector<zmq::message_t> parts;
    std::optional<size_t> got;
    try {
      got = zmq::recv_multipart(edge_.monitor, std::back_inserter(parts),
                                zmq::recv_flags::dontwait);
    } catch (const zmq::error_t&) {
      return;
    }
    if (!got) return;
    if (parts.empty() || parts[0].size() < 6) continue;
    uint16_t event;
    uint32_t fd;
    std::memcpy(&event, parts[0].data(), sizeof(event));
    std::memcpy(&fd, static_cast<const char*>(parts[0].data()) + 2, sizeof(fd));
    if (event == ZMQ_EVENT_ACCEPTED) {
      const int conn = static_cast<int>(fd);
      edge_.connections.Accepted(conn, std::chrono::steady_clock::now(),
                                 edge_.connections.max_per_source() != 0 ? PeerAddress(conn)
                                                                         : std::string());
      if (!edge_.connections.admitted(conn)) {
        ++counts_.refused_connections;
        LOG_EVERY_N(WARNING, 100) << "connection refused: " << edge_.connections.open()
                                  << " open, --max_connections=" << edge_.connections.max_connections()
                                  << ", --max_connections_per_ip="
                                  << edge_.connections.max_per_source();
      }
    } else if (event == ZMQ_EVENT_DISCONNECTED) {
      edge_.connections.Closed(static_cast<int>(fd));
    }
  }
}

// Admits a decoded request that came on connection `fd` (-1: unknown), or answers it with
// the reason it is refused (connection limit, envelope limits, in-flight limit) or drops it
// (its peer does not read replies). True when it may be dispatched.
bool ServerImpl::Admitted(const std::shared_ptr<Pending>& p, int fd) {
  const auto now = std::chrono::steady_clock::now();
  // The connection is active (it may take an idle one's place).
  if (fd >= 0 && !edge_.connections.Active(fd, now)) {
    DrainRouterEvents();  // the monitor may not have told us about closed ones yet
  }
  if (fd >= 0 && !edge_.connections.admitted(fd)) {
    const auto& conns = edge_.connections;
    const std::string source = conns.source(fd);
    ReplyError(std::move(p->identity), p->header,
               Status::ResourceExhausted(
                   "server " + std::to_string(options_.rank) + " refuses the connection: " +
                   (conns.over_source_limit(fd)
                        ? std::to_string(conns.admitted_from(source)) + " connections from " +
                              (source.empty() ? "its (unknown) address" : source) +
                              " are served and the limit per address " +
                              "(--max_connections_per_ip) is " +
                              std::to_string(conns.max_per_source())
                        : std::to_string(conns.open()) + " connections are open and its limit " +
                              "(--max_connections) is " + std::to_string(conns.max_connections()))));
    return false;
  }
  Status s = ValidateRequestLimits(p->header);
  if (!s.ok()) {
    ReplyError(std::move(p->identity), p->header, s);
    return false;
  }
  // A primary's forwarded pushes are bounded by its own queue, and a refusal here would let a
  // later one of the same client in first (the dedup takes numbers in order): not throttled.
  // Only pushes are forwarded: any other op with replica_from would skip the limits.
  if (p->header.replica_from != 0) {
    const Op op = p->header.op;
    if (op == Op::kSparsePush || op == Op::kDensePush) return true;
    ReplyError(std::move(p->identity), p->header,
               Status::InvalidArgument("a replicated request must be a SparsePush or a "
                                       "DensePush, got " + std::string(OpName(op))));
    return false;
  }
  const std::string_view peer(static_cast<const char*>(p->identity.data()), p->identity.size());
  if (edge_.peers.stalled(peer)) {
    // Its replies were not read: refuse without serving. Queuing the refusal succeeds once
    // the client reads again; until then its requests are dropped unanswered.
    const std::string id(peer);
    if (ReplyError(std::move(p->identity), p->header,
                   Status::ResourceExhausted(
                       "replies to this client were not read (the server's send queue for it "
                       "reached --send_hwm): request refused, read the replies"))) {
      edge_.peers.ClearStalled(id);
    } else {
      ++counts_.throttled_requests;
    }
    return false;
  }
  // A Clock is answered at once and is what releases the requests the staleness gate parked
  // (and the pushes of their clients held behind them), which keep their slots meanwhile: it
  // takes no slot, so that a peer at its limit can still move the gate.
  if (p->header.op == Op::kClock) return true;
  auto slot = edge_.peers.Admit(peer, now);
  if (!slot.ok()) {
    ReplyError(std::move(p->identity), p->header, slot.status());
    return false;
  }
  p->admission = std::move(slot).value();
  return true;
}

// `name` resolved under --admin_root; FailedPrecondition when admin ops are disabled.
Result<std::string> ServerImpl::AdminPath(std::string_view name) const {
  if (edge_.admin_root.empty()) {
    return Status::FailedPrecondition(
        "checkpoint, restore and export are disabled on server " + std::to_string(options_.rank) +
        ": start it with --admin_root=DIR (directories are then named relative to DIR)");
  }
  return ResolveAdminPath(edge_.admin_root, name);
}

}  // namespace tessera::internal
