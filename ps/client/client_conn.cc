// The client's connections: connecting to the servers (and waiting for each to answer), the
// sockets' monitor events (connected, lost, handshake failures) and what a lost server means
// for the requests in flight to it.
#include <algorithm>
#include <cstring>
#include <zmq_addon.hpp>

#include "ps/client/client_internal.h"
#include "ps/limits.h"

namespace tessera {
namespace internal {
namespace {

// The key pair a client with ClientOptions::curve_server_key presents: its own
// (curve_client_secret_key) or a fresh one.
Result<CurveKeyPair> ClientCurveKeys(const ClientOptions& o) {
  if (o.curve_server_key.size() != 40) {
    return Status::InvalidArgument("a CurveZMQ public key has 40 Z85 characters, got " +
                                   std::to_string(o.curve_server_key.size()));
  }
  if (o.curve_client_secret_key.empty()) return GenerateCurveKeyPair();
  auto pub = CurvePublicKey(o.curve_client_secret_key);
  if (!pub.ok()) {
    return Status::InvalidArgument("ClientOptions::curve_client_secret_key: " +
                                   pub.status().message());
  }
  return CurveKeyPair{*pub, o.curve_client_secret_key};
}

}  // namespace

Status ClientImpl::Start() {
  if (options_.servers.empty()) return Status::InvalidArgument("no server endpoints");
  if (source_ == nullptr && std::count(options_.servers.begin(), options_.servers.end(), "") > 0)
    return Status::InvalidArgument("an empty server endpoint");
  if (options_.servers.size() > 65535) return Status::InvalidArgument("too many servers");
  if (options_.consistency.num_workers > 0 &&
      options_.worker_id >= options_.consistency.num_workers) {
    return Status::InvalidArgument("worker_id " + std::to_string(options_.worker_id) +
                                   " is not below num_workers " +
                                   std::to_string(options_.consistency.num_workers));
  }
  if (options_.consistency.num_workers > kMaxWorkers || options_.consistency.staleness < -1 ||
      options_.consistency.staleness > kMaxStaleness) {
    return Status::InvalidArgument("consistency: num_workers must be at most " +
                                   std::to_string(kMaxWorkers) + " and staleness in [-1, " +
                                   std::to_string(kMaxStaleness) + "], got " +
                                   std::to_string(options_.consistency.num_workers) + " and " +
                                   std::to_string(options_.consistency.staleness));
  }
  if (!options_.curve_server_key.empty()) {
    TESSERA_ASSIGN_OR_RETURN(curve_mine_, ClientCurveKeys(options_));
  }
  event_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (event_fd_ < 0) return Status::Internal("eventfd failed");
  const size_t n = options_.servers.size();
  {
    std::lock_guard<std::mutex> io(io_mu_);
    for (uint32_t i = 0; i < n; ++i) TESSERA_RETURN_IF_ERROR(ConnectServer(options_.servers[i]));
    if (source_ != nullptr) {
      // Ids the first map retired already: nothing is sent there (a dense range of one fails
      // at once); later maps are compared with this one (RetireServers).
      retired_map_ = Routing();
      for (uint32_t i = 0; i < n; ++i) {
        if (options_.servers[i].empty()) servers_[i].retired_by = retired_map_->version;
      }
      retired_version_ = retired_map_->version;
    }
  }
  io_ = std::thread([this] { IoLoop(); });
  // Wait until every server answers a ping.
  const Deadline until = DeadlineAfterMs(options_.connect_timeout_ms);
  for (uint32_t i = 0; i < n; ++i) {
    if (options_.servers[i].empty()) continue;  // a retired id of a cluster map
    Status last;
    for (;;) {
      Header h;
      h.op = Op::kPing;
      auto call = std::make_shared<Call>();
      std::vector<Outgoing> ping;
      ping.push_back(MakeOutgoing(i, h, {}, call, DeadlineAfterMs(1000)));
      Send(call, std::move(ping));
      last = WaitCall(*call, NoDeadline());
      // Only "not there yet" is worth waiting for; a refusal or a key mismatch is final.
      if (last.ok() || last.code() != StatusCode::kUnavailable || Clock::now() >= until) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (!last.ok() && last.code() != StatusCode::kUnavailable) return last;
    if (!last.ok()) {
      return Status::Unavailable(
          "server " + std::to_string(i) + " (" + options_.servers[i] + ") did not answer within " +
          std::to_string(options_.connect_timeout_ms) + " ms: " + last.ToString());
    }
  }
  if (source_) {
    refresher_ = std::thread([this] { RefreshLoop(); });
    TESSERA_RETURN_IF_ERROR(source_->Watch([this](const Result<RoutingMap>& m) { InstallMap(m); }));
  }
  return Status::OK();
}

Status ClientImpl::ConnectServer(const std::string& address) {
  // Appended only once it is set up: a failure leaves no half-made server id behind. A retired
  // id ("") gets no sockets (a map may list thousands of them); ReviveServers opens them when
  // a later map gives the id an address.
  const uint32_t i = static_cast<uint32_t>(servers_.size());
  servers_.emplace_back();
  servers_.back().address = address;
  if (address.empty()) return Status::OK();
  Status s = OpenSockets(i, address);
  if (!s.ok()) servers_.pop_back();
  return s;
}

namespace {
// A ZeroMQ error while opening server `who`'s sockets: ResourceExhausted when descriptors or
// ZeroMQ's socket limit ran out, else `code`.
Status SocketError(const zmq::error_t& e, const std::string& who, StatusCode code) {
  if (e.num() == EMFILE || e.num() == ENFILE) {
    return Status::ResourceExhausted(
        "cannot open a socket to " + who + ": " + e.what() +
        " (the process's descriptor limit, ulimit -n, or ZeroMQ's socket limit ran out)");
  }
  return Status(code, "cannot open a socket to " + who + ": " + e.what());
}
}  // namespace

Status ClientImpl::OpenSockets(uint32_t i, const std::string& address) {
  const std::string who = "server " + std::to_string(i) + " (" + address + ")";
  zmq::socket_t dealer;
  zmq::socket_t monitor;
  try {
    dealer = zmq::socket_t(ctx_, zmq::socket_type::dealer);
    dealer.set(zmq::sockopt::linger, 0);
    dealer.set(zmq::sockopt::sndhwm, 0);
    dealer.set(zmq::sockopt::rcvhwm, 0);
    dealer.set(zmq::sockopt::immediate, 1);
    dealer.set(zmq::sockopt::reconnect_ivl, 100);
    dealer.set(zmq::sockopt::reconnect_ivl_max, 1000);
  } catch (const zmq::error_t& e) {
    return SocketError(e, who, StatusCode::kInternal);
  }
  if (!options_.curve_server_key.empty()) {
    try {
      dealer.set(zmq::sockopt::curve_serverkey, options_.curve_server_key);
      dealer.set(zmq::sockopt::curve_publickey, curve_mine_.public_key);
      dealer.set(zmq::sockopt::curve_secretkey, curve_mine_.secret_key);
    } catch (const zmq::error_t& e) {
      return Status::InvalidArgument(std::string("CurveZMQ: ") + e.what());
    }
  }
  const std::string mon = "inproc://tessera-client-mon-" +
                          std::to_string(reinterpret_cast<uintptr_t>(this)) + "-" +
                          std::to_string(i);
  if (zmq_socket_monitor(dealer.handle(), mon.c_str(),
                         ZMQ_EVENT_CONNECTED | ZMQ_EVENT_DISCONNECTED |
                             ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |
                             ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                             ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) != 0) {
    return SocketError(zmq::error_t(), who + " (its monitor)", StatusCode::kInternal);
  }
  try {
    monitor = zmq::socket_t(ctx_, zmq::socket_type::pair);
    monitor.set(zmq::sockopt::linger, 0);
    monitor.connect(mon);
  } catch (const zmq::error_t& e) {
    return SocketError(e, who + " (its monitor)", StatusCode::kInternal);
  }
  try {
    dealer.connect(address);
  } catch (const zmq::error_t& e) {
    if (e.num() == EMFILE || e.num() == ENFILE) return SocketError(e, who, StatusCode::kInternal);
    return Status::InvalidArgument("bad endpoint '" + address + "': " + e.what());
  }
  ServerConn& s = servers_[i];
  const int fd = dealer.get(zmq::sockopt::fd);
  s.dealer = std::move(dealer);
  s.monitor = std::move(monitor);
  ++open_sockets_;
  // Waiting callers poll the first kMaxPolledServers DEALERs opened (entries are only
  // appended: a caller reads them without io_mu_); the I/O thread polls the others.
  const size_t polled = polled_n_.load(std::memory_order_relaxed);
  if (polled < kMaxPolledServers) {
    polled_fds_[polled] = {nullptr, fd, ZMQ_POLLIN, 0};
    polled_n_.store(polled + 1, std::memory_order_release);
    s.polled = true;
  }
  return Status::OK();
}

void ClientImpl::MonitorEvent(uint32_t server) {
  for (;;) {
    std::vector<zmq::message_t> parts;
    if (!servers_[server].monitor ||
        !TryRecv(servers_[server].monitor, &parts) || parts.empty() || parts[0].size() < 6) {
      return;
    }
    uint16_t event;
    std::memcpy(&event, parts[0].data(), sizeof(event));
    ServerConn& s = servers_[server];
    if (event == ZMQ_EVENT_CONNECTED) {
      const bool reconnect = s.ever_connected;
      s.connected = s.ever_connected = true;
      s.reconnecting = false;
      const int64_t c = clock_.load();
      if (reconnect && c > 0) {
        // A restarted server lost the clocks it held in memory: tell it ours again, after
        // the requests waiting to be sent again (they are older: a retried Clock of an
        // earlier value must not come last).
        Header h = BaseHeader(Op::kClock);
        h.clock = c;
        Outgoing o = MakeOutgoing(server, h, {}, nullptr, Deadline::max());
        SendOne(o);
      }
    } else if (event == ZMQ_EVENT_DISCONNECTED) {
      s.connected = false;
      ++s.drops;
      FailServer(server,
                 Status::Unavailable("lost the connection to server " + std::to_string(server) +
                                     " (" + Address(server) + ")"));
    } else if (event == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) {
      s.handshake_failures = 0;
      s.handshake_error = Status::OK();
    } else {
      uint32_t value;
      std::memcpy(&value, static_cast<const char*>(parts[0].data()) + 2, sizeof(value));
      HandshakeFailed(server, event, value);
    }
  }
}

void ClientImpl::HandshakeFailed(uint32_t server, uint16_t event, uint32_t value) {
  ServerConn& s = servers_[server];
  ++s.handshake_failures;
  const std::string who =
      "server " + std::to_string(server) + " (" + Address(server) + ")";
  const bool have_key = !options_.curve_server_key.empty();
  std::string why;
  if (event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL &&
      value == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH && have_key) {
    why = who +
          " does not use CurveZMQ encryption, but this client has a server key "
          "(ClientOptions::curve_server_key / --curve_server_key_file): remove it, or start the "
          "servers with --curve_secret_key_file";
  } else if (event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL &&
             value == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH) {
    why = who +
          " requires CurveZMQ encryption: set ClientOptions::curve_server_key "
          "(--curve_server_key_file) to the servers' public key";
  } else if (event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH && value >= 400 && value < 500) {
    // The server's ZAP handler refused this client's own key (status 400).
    why = who + " refused this client's CurveZMQ key (ZAP status " + std::to_string(value) +
          "): its public key is not in the server's --authorized_clients or --admin_clients; "
          "set ClientOptions::curve_client_secret_key (--curve_client_key_file) to a listed key";
  } else if (event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL ||
             event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) {
    why = "the CurveZMQ encryption handshake with " + who + " failed (" +
          (event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH ? "authentication" : "protocol error") +
          "): check that ClientOptions::curve_server_key (--curve_server_key_file) is the "
          "public key of the servers' --curve_secret_key_file";
  } else if (s.handshake_failures >= 2 && have_key) {
    // The server closed the connection during the handshake, twice in a row: with CurveZMQ
    // that is what a server does with a HELLO sealed for another key (or, sometimes, what a
    // server without encryption does before this side saw the mechanism mismatch).
    why = who +
          " closed the connection during the CurveZMQ encryption handshake: "
          "ClientOptions::curve_server_key (--curve_server_key_file) is not the public key of "
          "the servers' --curve_secret_key_file, or the servers do not use encryption";
  } else if (s.handshake_failures >= 2) {
    why = who +
          " closed the connection during the handshake: if the servers use CurveZMQ "
          "encryption, set ClientOptions::curve_server_key (--curve_server_key_file) to their "
          "public key; else check that it is a Tessera server";
  }
  if (why.empty() || !s.handshake_error.ok()) return;
  s.handshake_error = Status::FailedPrecondition(why);
  // What waits to be sent there again would only wait for the retry limit.
  std::deque<Outgoing> waiting = std::move(s.retry);
  s.retry.clear();
  for (auto& o : waiting) {
    if (o.call) PartDone(o.call, s.handshake_error);
  }
}

std::vector<InFlight> ClientImpl::TakeInFlight(uint32_t server) {
  std::vector<InFlight> taken;
  for (auto it = in_flight_.begin(); it != in_flight_.end();) {
    if (it->second.server == server) {
      taken.push_back(std::move(it->second));
      in_flight_.erase(it++);
    } else {
      ++it;
    }
  }
  return taken;
}

void ClientImpl::FailServer(uint32_t server, const Status& st) {
  for (auto& f : TakeInFlight(server)) {
    if (f.retained) {
      f.retained->NoteUnanswered();
      RetryOrFail(std::move(*f.retained), st, /*server_down=*/true);
    } else {
      PartDone(f.call, st);
    }
  }
}

}  // namespace internal
}  // namespace tessera
