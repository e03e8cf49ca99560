// The client's I/O side: connections to the servers, the I/O thread that sends requests,
// matches replies to calls, notices lost connections and expires late requests.
#include <sys/eventfd.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <zmq_addon.hpp>

#include "ps/client/client_internal.h"

namespace tessera {
namespace internal {
namespace {

zmq::message_t EnvelopeFrame(const Header& h) {
  std::string env;
  EncodeHeader(h, &env);
  return zmq::message_t(env.data(), env.size());
}

}  // namespace

ClientImpl::ClientImpl(const ClientOptions& o)
    : options_(o), slot_map_(SlotMap::Uniform(static_cast<uint32_t>(o.servers.size()))) {}

ClientImpl::~ClientImpl() {
  stop_.store(true);
  Wake();
  if (io_.joinable()) io_.join();
  if (event_fd_ >= 0) close(event_fd_);
}

Status ClientImpl::Start() {
  if (options_.servers.empty()) return Status::InvalidArgument("no server endpoints");
  if (options_.servers.size() > 65535) return Status::InvalidArgument("too many servers");
  if (options_.consistency.num_workers > 0 &&
      options_.worker_id >= options_.consistency.num_workers) {
    return Status::InvalidArgument("worker_id " + std::to_string(options_.worker_id) +
                                   " is not below num_workers " +
                                   std::to_string(options_.consistency.num_workers));
  }
  CurveKeyPair mine;
  if (!options_.curve_server_key.empty()) {
    if (options_.curve_server_key.size() != 40) {
      return Status::InvalidArgument("a CurveZMQ public key has 40 Z85 characters, got " +
                                     std::to_string(options_.curve_server_key.size()));
    }
    TESSERA_ASSIGN_OR_RETURN(mine, GenerateCurveKeyPair());
  }
  event_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (event_fd_ < 0) return Status::Internal("eventfd failed");
  const size_t n = options_.servers.size();
  servers_.resize(n);
  for (uint32_t i = 0; i < n; ++i) {
    TESSERA_RETURN_IF_ERROR(ConnectServer(i, mine));
  }
  io_ = std::thread([this] { IoLoop(); });
  // Wait until every server answers a ping.
  const Deadline until = DeadlineAfterMs(options_.connect_timeout_ms);
  for (uint32_t i = 0; i < n; ++i) {
    Status last;
    for (;;) {
      Header h;
      h.op = Op::kPing;
      auto call = std::make_shared<Call>();
      std::vector<Outgoing> ping;
      ping.push_back(MakeOutgoing(i, h, {}, call, DeadlineAfterMs(1000)));
      Send(call, std::move(ping));
      last = WaitCall(*call, NoDeadline());
      if (last.ok() || Clock::now() >= until) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (!last.ok()) {
      return Status::Unavailable(
          "server " + std::to_string(i) + " (" + options_.servers[i] + ") did not answer within " +
          std::to_string(options_.connect_timeout_ms) + " ms: " + last.ToString());
    }
  }
  return Status::OK();
}

Status ClientImpl::ConnectServer(uint32_t i, const CurveKeyPair& mine) {
  ServerConn& s = servers_[i];
  s.dealer = zmq::socket_t(ctx_, zmq::socket_type::dealer);
  s.dealer.set(zmq::sockopt::linger, 0);
  s.dealer.set(zmq::sockopt::sndhwm, 0);
  s.dealer.set(zmq::sockopt::rcvhwm, 0);
  s.dealer.set(zmq::sockopt::immediate, 1);
  s.dealer.set(zmq::sockopt::reconnect_ivl, 100);
  s.dealer.set(zmq::sockopt::reconnect_ivl_max, 1000);
  if (!options_.curve_server_key.empty()) {
    try {
      s.dealer.set(zmq::sockopt::curve_serverkey, options_.curve_server_key);
      s.dealer.set(zmq::sockopt::curve_publickey, mine.public_key);
      s.dealer.set(zmq::sockopt::curve_secretkey, mine.secret_key);
    } catch (const zmq::error_t& e) {
      return Status::InvalidArgument(std::string("CurveZMQ: ") + e.what());
    }
  }
  const std::string mon = "inproc://tessera-client-mon-" +
                          std::to_string(reinterpret_cast<uintptr_t>(this)) + "-" +
                          std::to_string(i);
  if (zmq_socket_monitor(s.dealer.handle(), mon.c_str(),
                         ZMQ_EVENT_CONNECTED | ZMQ_EVENT_DISCONNECTED) != 0) {
    return Status::Internal("zmq_socket_monitor failed");
  }
  s.monitor = zmq::socket_t(ctx_, zmq::socket_type::pair);
  s.monitor.set(zmq::sockopt::linger, 0);
  s.monitor.connect(mon);
  try {
    s.dealer.connect(options_.servers[i]);
  } catch (const zmq::error_t& e) {
    return Status::InvalidArgument("bad endpoint '" + options_.servers[i] + "': " + e.what());
  }
  return Status::OK();
}

Outgoing ClientImpl::MakeOutgoing(uint32_t server, Header h, std::vector<zmq::message_t> data,
                                  std::shared_ptr<Call> call, Deadline deadline) {
  Outgoing o;
  o.server = server;
  o.request_id = next_id_.fetch_add(1) + 1;
  h.request_id = o.request_id;
  o.parts.reserve(data.size() + 1);
  o.parts.push_back(EnvelopeFrame(h));
  for (auto& d : data) o.parts.push_back(std::move(d));
  o.call = std::move(call);
  o.deadline = deadline;
  return o;
}

void ClientImpl::Send(const std::shared_ptr<Call>& call, std::vector<Outgoing> out) {
  if (call) call->remaining = static_cast<uint32_t>(out.size());
  {
    std::lock_guard<std::mutex> l(queue_mu_);
    for (auto& o : out) queue_.push_back(std::move(o));
  }
  Wake();
}

Status ClientImpl::WaitCall(Call& c, Deadline deadline) {
  // Spin briefly first: a small request's reply often arrives within tens of microseconds,
  // sooner than a futex sleep and wake-up.
  for (int i = 0; i < 200 && !c.done_flag.load(std::memory_order_acquire); ++i) {
    std::this_thread::yield();
  }
  std::unique_lock<std::mutex> l(c.mu);
  if (!c.cv.wait_until(l, deadline, [&] { return c.done; })) {
    return Status::DeadlineExceeded("call not complete by the deadline");
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
  const size_t n = servers_.size();
  std::vector<zmq::pollitem_t> items(1 + 2 * n);
  items[0] = {nullptr, event_fd_, ZMQ_POLLIN, 0};
  for (size_t i = 0; i < n; ++i) {
    items[1 + i] = {servers_[i].dealer.handle(), 0, ZMQ_POLLIN, 0};
    items[1 + n + i] = {servers_[i].monitor.handle(), 0, ZMQ_POLLIN, 0};
  }
  auto next_timeout_check = Clock::now();
  std::vector<Outgoing> batch;
  while (!stop_.load()) {
    try {
      zmq::poll(items.data(), items.size(), std::chrono::milliseconds(20));
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) continue;
      break;
    }
    if (items[0].revents & ZMQ_POLLIN) {
      uint64_t v;
      ssize_t r = read(event_fd_, &v, sizeof(v));
      (void)r;
    }
    {
      std::lock_guard<std::mutex> l(queue_mu_);
      batch.swap(queue_);
    }
    for (auto& o : batch) SendOne(o);
    batch.clear();
    for (size_t i = 0; i < n; ++i) {
      if (items[1 + i].revents & ZMQ_POLLIN) ReceiveFrom(static_cast<uint32_t>(i));
    }
    for (size_t i = 0; i < n; ++i) {
      if (items[1 + n + i].revents & ZMQ_POLLIN) MonitorEvent(static_cast<uint32_t>(i));
    }
    const auto now = Clock::now();
    if (now >= next_timeout_check) {
      next_timeout_check = now + std::chrono::milliseconds(20);
      ExpireRequests(now);
    }
  }
  // Fail whatever is still pending.
  {
    std::lock_guard<std::mutex> l(queue_mu_);
    batch.swap(queue_);
  }
  for (auto& o : batch) {
    if (o.call) PartDone(o.call, Status::Cancelled("client destroyed"));
  }
  auto left = std::move(in_flight_);
  for (auto& [id, f] : left) PartDone(f.call, Status::Cancelled("client destroyed"));
  for (auto& s : servers_) {
    s.dealer.close();
    s.monitor.close();
  }
}

void ClientImpl::SendOne(Outgoing& o) {
  ServerConn& s = servers_[o.server];
  bool sent = false;
  try {
    sent = zmq::send_multipart(s.dealer, o.parts, zmq::send_flags::dontwait).has_value();
  } catch (const zmq::error_t&) {
    sent = false;
  }
  if (!sent) {
    if (o.call) {
      PartDone(o.call, Status::Unavailable("server " + std::to_string(o.server) + " (" +
                                           options_.servers[o.server] + ") is not connected"));
    }
    return;
  }
  if (o.call) in_flight_.emplace(o.request_id, InFlight{o.call, o.server, o.deadline});
}

void ClientImpl::ReceiveFrom(uint32_t server) {
  for (;;) {
    std::vector<zmq::message_t> parts;
    std::optional<size_t> got;
    try {
      got = zmq::recv_multipart(servers_[server].dealer, std::back_inserter(parts),
                                zmq::recv_flags::dontwait);
    } catch (const zmq::error_t&) {
      return;
    }
    if (!got) return;
    if (parts.empty()) continue;
    Header h;
    Status s = DecodeHeader(parts[0].data(), parts[0].size(), &h);
    auto it = in_flight_.find(h.request_id);
    if (it == in_flight_.end()) continue;  // late reply of a failed call, or unparsable
    InFlight f = std::move(it->second);
    in_flight_.erase(it);
    if (s.ok() && h.status != StatusCode::kOk) {
      s = Status(h.status, h.message).WithContext("server " + std::to_string(server));
    }
    if (s.ok() && f.call->on_reply) {
      parts.erase(parts.begin());
      s = f.call->on_reply(server, h, parts);
    }
    PartDone(f.call, s);
  }
}

void ClientImpl::MonitorEvent(uint32_t server) {
  for (;;) {
    std::vector<zmq::message_t> parts;
    std::optional<size_t> got;
    try {
      got = zmq::recv_multipart(servers_[server].monitor, std::back_inserter(parts),
                                zmq::recv_flags::dontwait);
    } catch (const zmq::error_t&) {
      return;
    }
    if (!got || parts.empty() || parts[0].size() < 6) return;
    uint16_t event;
    std::memcpy(&event, parts[0].data(), sizeof(event));
    ServerConn& s = servers_[server];
    if (event == ZMQ_EVENT_CONNECTED) {
      const bool reconnect = s.ever_connected;
      s.connected = s.ever_connected = true;
      const int64_t c = clock_.load();
      if (reconnect && c > 0) {
        // A restarted server lost the clocks it held in memory: tell it ours again.
        Header h = BaseHeader(Op::kClock);
        h.clock = c;
        Outgoing o = MakeOutgoing(server, h, {}, nullptr, Deadline::max());
        SendOne(o);
      }
    } else if (event == ZMQ_EVENT_DISCONNECTED) {
      s.connected = false;
      FailServer(server,
                 Status::Unavailable("lost the connection to server " + std::to_string(server) +
                                     " (" + options_.servers[server] + ")"));
    }
  }
}

void ClientImpl::FailServer(uint32_t server, const Status& st) {
  std::vector<std::shared_ptr<Call>> failed;
  for (auto it = in_flight_.begin(); it != in_flight_.end();) {
    if (it->second.server == server) {
      failed.push_back(std::move(it->second.call));
      in_flight_.erase(it++);
    } else {
      ++it;
    }
  }
  for (auto& c : failed) PartDone(c, st);
}

void ClientImpl::ExpireRequests(Clock::time_point now) {
  std::vector<std::pair<std::shared_ptr<Call>, uint32_t>> expired;
  for (auto it = in_flight_.begin(); it != in_flight_.end();) {
    if (it->second.deadline <= now) {
      expired.emplace_back(std::move(it->second.call), it->second.server);
      in_flight_.erase(it++);
    } else {
      ++it;
    }
  }
  for (auto& [c, s] : expired) {
    PartDone(c, Status::Unavailable("no reply from server " + std::to_string(s) + " (" +
                                    options_.servers[s] + ") in time"));
  }
}

void ClientImpl::PartDone(const std::shared_ptr<Call>& c, const Status& s) {
  if (!s.ok() && c->first_error.ok()) c->first_error = s;
  if (c->remaining > 0) --c->remaining;
  if (c->remaining != 0) return;
  if (c->first_error.ok() && c->on_done) c->on_done();
  c->on_reply = nullptr;
  c->on_done = nullptr;
  {
    std::lock_guard<std::mutex> l(c->mu);
    c->status = c->first_error;
    c->done = true;
    c->done_flag.store(true, std::memory_order_release);
  }
  c->cv.notify_all();
}

}  // namespace internal
}  // namespace tessera
