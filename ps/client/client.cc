#include "ps/client.h"

#include <absl/container/flat_hash_map.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <thread>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "ps/codec.h"
#include "ps/curve.h"
#include "ps/export_reader.h"
#include "ps/routing.h"

namespace tessera {
namespace internal {

// One asynchronous call, possibly fanned out to several servers.
struct Call {
  // Runs on the I/O thread for each OK reply part; may write into the caller's buffers.
  std::function<Status(uint32_t server, const Header& h, std::vector<zmq::message_t>& frames)>
      on_reply;
  // Runs on the I/O thread once, after every part succeeded.
  std::function<void()> on_done;
  uint32_t remaining = 0;  // I/O thread only
  Status first_error;      // I/O thread only

  std::mutex mu;
  std::condition_variable cv;
  bool done = false;                   // guarded by mu
  std::atomic<bool> done_flag{false};  // mirrors done, for a lock-free spin in Wait
  Status status;                       // guarded by mu; final once done
};

namespace {

struct Outgoing {
  uint32_t server;
  uint64_t request_id;
  std::vector<zmq::message_t> parts;
  std::shared_ptr<Call> call;  // null: fire and forget
  Deadline deadline;
};

struct InFlight {
  std::shared_ptr<Call> call;
  uint32_t server;
  Deadline deadline;
};

std::shared_ptr<Call> CompletedCall(Status s) {
  auto c = std::make_shared<Call>();
  c->done = true;
  c->done_flag.store(true);
  c->status = std::move(s);
  return c;
}

zmq::message_t EnvelopeFrame(const Header& h) {
  std::string env;
  EncodeHeader(h, &env);
  return zmq::message_t(env.data(), env.size());
}

}  // namespace

class ClientImpl {
 public:
  explicit ClientImpl(const ClientOptions& o)
      : options_(o), slot_map_(SlotMap::Uniform(static_cast<uint32_t>(o.servers.size()))) {}

  ~ClientImpl() {
    stop_.store(true);
    Wake();
    if (io_.joinable()) io_.join();
    if (event_fd_ >= 0) close(event_fd_);
  }

  Status Start() {
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
    for (size_t i = 0; i < n; ++i) {
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
        return Status::Unavailable("server " + std::to_string(i) + " (" + options_.servers[i] +
                                   ") did not answer within " +
                                   std::to_string(options_.connect_timeout_ms) +
                                   " ms: " + last.ToString());
      }
    }
    return Status::OK();
  }

  // ---------------------------------------------------------------- calls
  Header BaseHeader(Op op) const {
    Header h;
    h.op = op;
    h.worker_id = options_.worker_id;
    h.clock = clock_.load();
    h.staleness = options_.consistency.staleness;
    h.num_workers = options_.consistency.num_workers;
    return h;
  }

  Outgoing MakeOutgoing(uint32_t server, Header h, std::vector<zmq::message_t> data,
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

  Deadline RequestDeadline() const { return DeadlineAfterMs(options_.request_timeout_ms); }

  void Send(const std::shared_ptr<Call>& call, std::vector<Outgoing> out) {
    if (call) call->remaining = static_cast<uint32_t>(out.size());
    {
      std::lock_guard<std::mutex> l(queue_mu_);
      for (auto& o : out) queue_.push_back(std::move(o));
    }
    Wake();
  }

  static Status WaitCall(Call& c, Deadline deadline) {
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

  Handle SparseCall(Op op, const Table& t, std::span<const uint64_t> keys,
                    std::span<const float> grads, float* out) {
    if (t.spec.kind != TableKind::kSparse || t.id == 0) {
      return Handle(CompletedCall(
          Status::InvalidArgument("table '" + t.spec.name + "' is not a sparse table")));
    }
    const uint32_t dim = t.spec.dim;
    const bool push = op != Op::kSparsePull, pull = op != Op::kSparsePush;
    if (push && grads.size() != keys.size() * dim) {
      return Handle(CompletedCall(Status::InvalidArgument(
          "table '" + t.spec.name + "': " + std::to_string(keys.size()) + " keys x dim " +
          std::to_string(dim) + " need " + std::to_string(keys.size() * dim) +
          " gradient floats, got " + std::to_string(grads.size()))));
    }
    if (pull && out == nullptr && !keys.empty()) {
      return Handle(CompletedCall(Status::InvalidArgument("null output buffer")));
    }
    if (keys.empty()) return Handle(CompletedCall(Status::OK()));

    const size_t n = keys.size();
    const uint32_t S = slot_map_.num_servers();
    // Dedupe: unique index of every key, in first-seen order.
    auto plan = std::make_shared<SparsePlan>();
    plan->unique_of.resize(n);
    plan->unique_keys.reserve(n);
    {
      // One map per calling thread, cleared (not freed) between calls: no page faults for a
      // fresh allocation on every request.
      thread_local absl::flat_hash_map<uint64_t, uint32_t> index;
      index.clear();
      index.reserve(n);
      for (size_t i = 0; i < n; ++i) {
        auto [it, inserted] =
            index.try_emplace(keys[i], static_cast<uint32_t>(plan->unique_keys.size()));
        if (inserted) plan->unique_keys.push_back(keys[i]);
        plan->unique_of[i] = it->second;
      }
    }
    const size_t U = plan->unique_keys.size();
    const bool has_dups = U != n;
    // Route unique keys to servers.
    std::vector<uint32_t> count(S, 0), server_of(U), pos(U);
    for (size_t u = 0; u < U; ++u) {
      const uint32_t s = slot_map_.ServerOfKey(plan->unique_keys[u]);
      server_of[u] = s;
      pos[u] = count[s]++;
    }
    plan->members.resize(S);
    std::vector<zmq::message_t> key_msgs(S), grad_msgs(S);
    for (uint32_t s = 0; s < S; ++s) {
      if (count[s] == 0) continue;
      plan->members[s].resize(count[s]);
      key_msgs[s] = zmq::message_t(size_t{count[s]} * 8);
      if (push) grad_msgs[s] = zmq::message_t(size_t{count[s]} * dim * 4);
    }
    for (size_t u = 0; u < U; ++u) {
      const uint32_t s = server_of[u];
      plan->members[s][pos[u]] = static_cast<uint32_t>(u);
      static_cast<uint64_t*>(key_msgs[s].data())[pos[u]] = plan->unique_keys[u];
    }
    if (push) {
      if (!has_dups) {
        for (size_t i = 0; i < n; ++i) {
          float* dst = static_cast<float*>(grad_msgs[server_of[i]].data()) + size_t{pos[i]} * dim;
          std::memcpy(dst, grads.data() + i * dim, sizeof(float) * dim);
        }
      } else {
        for (uint32_t s = 0; s < S; ++s) {
          if (count[s]) std::memset(grad_msgs[s].data(), 0, grad_msgs[s].size());
        }
        for (size_t i = 0; i < n; ++i) {
          const uint32_t u = plan->unique_of[i];
          float* dst = static_cast<float*>(grad_msgs[server_of[u]].data()) + size_t{pos[u]} * dim;
          const float* src = grads.data() + i * dim;
          for (uint32_t j = 0; j < dim; ++j) dst[j] += src[j];
        }
      }
    }
    auto call = std::make_shared<Call>();
    if (pull) {
      // Without duplicates unique index == caller index: write straight into `out`.
      float* dst = out;
      if (has_dups) {
        plan->unique_values.resize(U * dim);
        dst = plan->unique_values.data();
      }
      call->on_reply = [plan, dst, dim, name = t.spec.name](
                           uint32_t s, const Header& h,
                           std::vector<zmq::message_t>& frames) -> Status {
        const auto& m = plan->members[s];
        if (frames.size() != 1 || frames[0].size() != m.size() * dim * sizeof(float) ||
            h.count != m.size()) {
          return Status::Internal("malformed pull reply from server " + std::to_string(s) +
                                  " for table '" + name + "'");
        }
        const float* src = static_cast<const float*>(frames[0].data());
        std::vector<float> aligned;
        if (reinterpret_cast<uintptr_t>(src) % alignof(float) != 0) {
          aligned.resize(m.size() * dim);
          std::memcpy(aligned.data(), frames[0].data(), frames[0].size());
          src = aligned.data();
        }
        for (size_t k = 0; k < m.size(); ++k) {
          std::memcpy(dst + size_t{m[k]} * dim, src + k * dim, sizeof(float) * dim);
        }
        return Status::OK();
      };
      if (has_dups) {
        call->on_done = [plan, out, dim, n] {
          for (size_t i = 0; i < n; ++i) {
            std::memcpy(out + i * dim,
                        plan->unique_values.data() + size_t{plan->unique_of[i]} * dim,
                        sizeof(float) * dim);
          }
        };
      }
    }
    std::vector<Outgoing> msgs;
    const Deadline deadline = RequestDeadline();
    for (uint32_t s = 0; s < S; ++s) {
      if (count[s] == 0) continue;
      Header h = BaseHeader(op);
      h.table_id = t.id;
      h.elem_type = ElemType::kF32;
      h.count = count[s];
      h.dim = dim;
      std::vector<zmq::message_t> data;
      data.push_back(std::move(key_msgs[s]));
      if (push) data.push_back(std::move(grad_msgs[s]));
      msgs.push_back(MakeOutgoing(s, h, std::move(data), call, deadline));
    }
    Send(call, std::move(msgs));
    return Handle(call);
  }

  Handle DenseCall(Op op, const Table& t, uint64_t offset, uint64_t length,
                   std::span<const float> grads, float* out) {
    if (t.spec.kind != TableKind::kDense || t.id == 0) {
      return Handle(CompletedCall(
          Status::InvalidArgument("table '" + t.spec.name + "' is not a dense table")));
    }
    if (length == 0 || offset > t.spec.length || length > t.spec.length - offset) {
      return Handle(CompletedCall(Status::InvalidArgument(
          "dense range [" + std::to_string(offset) + ", " + std::to_string(offset + length) +
          ") outside table '" + t.spec.name + "' of length " + std::to_string(t.spec.length))));
    }
    const bool push = op == Op::kDensePush;
    if (!push && out == nullptr) {
      return Handle(CompletedCall(Status::InvalidArgument("null output buffer")));
    }
    auto call = std::make_shared<Call>();
    const uint32_t S = slot_map_.num_servers();
    std::vector<Outgoing> msgs;
    auto starts = std::make_shared<std::vector<uint64_t>>(S, 0);
    const Deadline deadline = RequestDeadline();
    for (uint32_t s = 0; s < S; ++s) {
      const DenseRange r = DenseRangeOfServer(t.id, t.spec.length, s, S);
      const uint64_t b = std::max(offset, r.begin), e = std::min(offset + length, r.end);
      if (b >= e) continue;
      Header h = BaseHeader(op);
      h.table_id = t.id;
      h.elem_type = ElemType::kF32;
      h.offset = b;
      h.count = e - b;
      (*starts)[s] = b - offset;
      std::vector<zmq::message_t> data;
      if (push) data.emplace_back(grads.data() + (b - offset), (e - b) * sizeof(float));
      msgs.push_back(MakeOutgoing(s, h, std::move(data), call, deadline));
    }
    if (!push) {
      call->on_reply = [starts, out, name = t.spec.name](
                           uint32_t s, const Header& h,
                           std::vector<zmq::message_t>& frames) -> Status {
        if (frames.size() != 1 || frames[0].size() != h.count * sizeof(float)) {
          return Status::Internal("malformed dense reply from server " + std::to_string(s) +
                                  " for table '" + name + "'");
        }
        std::memcpy(out + (*starts)[s], frames[0].data(), frames[0].size());
        return Status::OK();
      };
    }
    Send(call, std::move(msgs));
    return Handle(call);
  }

  // Sends `h` to every server (or one) and waits; returns the first error or the last reply
  // header of server `keep` (with its data frame, if any, in *data).
  Result<Header> Blocking(Header h, std::vector<uint32_t> servers, Deadline deadline,
                          std::string* data = nullptr, Deadline request_deadline = Deadline()) {
    auto call = std::make_shared<Call>();
    auto reply = std::make_shared<std::pair<Header, std::string>>();
    call->on_reply = [reply](uint32_t, const Header& rh,
                             std::vector<zmq::message_t>& frames) -> Status {
      reply->first = rh;
      if (!frames.empty()) reply->second = frames[0].to_string();
      return Status::OK();
    };
    if (request_deadline == Deadline()) request_deadline = std::min(deadline, RequestDeadline());
    std::vector<Outgoing> msgs;
    for (uint32_t s : servers) {
      std::vector<zmq::message_t> frames;
      if (data != nullptr && h.op == Op::kPutMeta) frames.emplace_back(data->data(), data->size());
      msgs.push_back(MakeOutgoing(s, h, std::move(frames), call, request_deadline));
    }
    Send(call, std::move(msgs));
    TESSERA_RETURN_IF_ERROR(WaitCall(*call, deadline));
    if (data != nullptr && h.op != Op::kPutMeta) *data = std::move(reply->second);
    return reply->first;
  }

  std::vector<uint32_t> AllServers() const {
    std::vector<uint32_t> v(servers_.size());
    for (uint32_t i = 0; i < v.size(); ++i) v[i] = i;
    return v;
  }

  Handle ClockCall(int64_t value) {
    clock_.store(value);
    auto call = std::make_shared<Call>();
    std::vector<Outgoing> msgs;
    const Deadline deadline = RequestDeadline();
    for (uint32_t s = 0; s < servers_.size(); ++s) {
      Header h = BaseHeader(Op::kClock);
      h.clock = value;
      msgs.push_back(MakeOutgoing(s, h, {}, call, deadline));
    }
    Send(call, std::move(msgs));
    return Handle(call);
  }

  const ClientOptions options_;
  const SlotMap slot_map_;
  std::atomic<int64_t> clock_{0};

 private:
  struct SparsePlan {
    std::vector<uint32_t> unique_of;  // caller index -> unique index
    std::vector<uint64_t> unique_keys;
    std::vector<std::vector<uint32_t>> members;  // per server: unique indices in sent order
    std::vector<float> unique_values;            // pulls with duplicates only
  };

  struct ServerConn {
    zmq::socket_t dealer;
    zmq::socket_t monitor;
    bool connected = false;
    bool ever_connected = false;
  };

  void Wake() {
    uint64_t one = 1;
    if (event_fd_ >= 0) {
      ssize_t r = write(event_fd_, &one, sizeof(one));
      (void)r;
    }
  }

  // ---------------------------------------------------------------- I/O thread
  void IoLoop() {
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

  void SendOne(Outgoing& o) {
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

  void ReceiveFrom(uint32_t server) {
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

  void MonitorEvent(uint32_t server) {
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

  void FailServer(uint32_t server, const Status& st) {
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

  void ExpireRequests(Clock::time_point now) {
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

  static void PartDone(const std::shared_ptr<Call>& c, const Status& s) {
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

  zmq::context_t ctx_;
  std::vector<ServerConn> servers_;  // sockets used by the I/O thread only (after Start)
  int event_fd_ = -1;
  std::thread io_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> next_id_{0};
  std::mutex queue_mu_;
  std::vector<Outgoing> queue_;                        // guarded by queue_mu_
  absl::flat_hash_map<uint64_t, InFlight> in_flight_;  // I/O thread only
};

}  // namespace internal

// ---------------------------------------------------------------- Client
Result<std::unique_ptr<Client>> Client::Create(const ClientOptions& options) {
  auto impl = std::make_unique<internal::ClientImpl>(options);
  TESSERA_RETURN_IF_ERROR(impl->Start());
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

Client::Client(std::unique_ptr<internal::ClientImpl> impl) : impl_(std::move(impl)) {}
Client::~Client() = default;

Result<Table> Client::CreateTable(const TableSpec& spec, Deadline deadline) {
  TESSERA_RETURN_IF_ERROR(ValidateTableSpec(spec));
  Header h = impl_->BaseHeader(Op::kCreateTable);
  h.spec = spec;
  TESSERA_ASSIGN_OR_RETURN(Header r, impl_->Blocking(h, impl_->AllServers(), deadline));
  (void)r;
  return Table{TableIdForName(spec.name), spec};
}

Result<Table> Client::GetTable(const std::string& name, Deadline deadline) {
  Header h = impl_->BaseHeader(Op::kGetTable);
  h.name = name;
  TESSERA_ASSIGN_OR_RETURN(Header r, impl_->Blocking(h, {0}, deadline));
  if (!r.spec) return Status::Internal("GetTable reply without a spec");
  return Table{r.table_id, *r.spec};
}

Handle Client::Pull(const Table& table, std::span<const uint64_t> keys, float* out) {
  return impl_->SparseCall(Op::kSparsePull, table, keys, {}, out);
}
Handle Client::Push(const Table& table, std::span<const uint64_t> keys,
                    std::span<const float> grads) {
  return impl_->SparseCall(Op::kSparsePush, table, keys, grads, nullptr);
}
Handle Client::PushPull(const Table& table, std::span<const uint64_t> keys,
                        std::span<const float> grads, float* out) {
  return impl_->SparseCall(Op::kSparsePushPull, table, keys, grads, out);
}
Handle Client::DensePull(const Table& table, uint64_t offset, uint64_t length, float* out) {
  return impl_->DenseCall(Op::kDensePull, table, offset, length, {}, out);
}
Handle Client::DensePush(const Table& table, uint64_t offset, std::span<const float> grads) {
  return impl_->DenseCall(Op::kDensePush, table, offset, grads.size(), grads, nullptr);
}

Handle Client::Clock() { return impl_->ClockCall(impl_->clock_.load() + 1); }
int64_t Client::clock() const { return impl_->clock_.load(); }
Handle Client::SetClock(int64_t clock) { return impl_->ClockCall(clock); }

Status Client::Barrier(const std::string& name, Deadline deadline) {
  if (impl_->options_.consistency.num_workers == 0) {
    return Status::FailedPrecondition("Barrier needs consistency.num_workers > 0");
  }
  Header h = impl_->BaseHeader(Op::kBarrier);
  h.name = name;
  // The barrier waits as long as the caller allows, not the per-request timeout.
  return impl_->Blocking(h, {0}, deadline, nullptr, deadline).status();
}

Status Client::PutMeta(const std::string& name, std::string_view value, Deadline deadline) {
  Header h = impl_->BaseHeader(Op::kPutMeta);
  h.name = name;
  h.elem_type = ElemType::kBytes;
  h.count = 1;
  std::string data(value);
  return impl_->Blocking(h, {0}, deadline, &data).status();
}

Result<std::optional<std::string>> Client::GetMeta(const std::string& name, Deadline deadline) {
  Header h = impl_->BaseHeader(Op::kGetMeta);
  h.name = name;
  std::string data;
  TESSERA_ASSIGN_OR_RETURN(Header r, impl_->Blocking(h, {0}, deadline, &data));
  if (r.count == 0) return std::optional<std::string>();
  return std::optional<std::string>(std::move(data));
}

Result<std::string> Client::ServerStats(uint32_t rank, Deadline deadline) {
  if (rank >= num_servers()) return Status::InvalidArgument("no server " + std::to_string(rank));
  std::string text;
  TESSERA_ASSIGN_OR_RETURN(Header r,
                           impl_->Blocking(impl_->BaseHeader(Op::kStats), {rank}, deadline, &text));
  (void)r;
  return text;
}

namespace {
// Reads "name value" from a stats text; 0 when absent.
int64_t StatValue(const std::string& text, const std::string& name) {
  const std::string needle = name + " ";
  size_t pos = 0;
  while ((pos = text.find(needle, pos)) != std::string::npos) {
    if (pos == 0 || text[pos - 1] == '\n') {
      return std::strtoll(text.c_str() + pos + needle.size(), nullptr, 10);
    }
    pos += needle.size();
  }
  return 0;
}
}  // namespace

Result<int64_t> Client::Checkpoint(const std::string& dir, Deadline deadline) {
  if (dir.empty()) return Status::InvalidArgument("checkpoint directory is empty");
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Status::IOError("cannot create '" + dir + "': " + ec.message());
  if (std::filesystem::exists(dir + "/CHECKPOINT")) {
    return Status::AlreadyExists("'" + dir + "' already holds a checkpoint");
  }
  int64_t cut = -1;
  bool taken = false;
  for (int attempt = 0; attempt < 20 && !taken; ++attempt) {
    // Where the job is: the cut goes after the steps every server has seen pushed.
    uint32_t workers = 0;
    int64_t max_clock = 0, max_push = -1;
    for (uint32_t r = 0; r < num_servers(); ++r) {
      TESSERA_ASSIGN_OR_RETURN(std::string st, ServerStats(r, deadline));
      workers = std::max<uint32_t>(workers, static_cast<uint32_t>(StatValue(st, "job_workers")));
      max_clock = std::max(max_clock, StatValue(st, "max_clock"));
      max_push = std::max(max_push, StatValue(st, "max_push_clock"));
    }
    cut = std::max(max_clock - 1, max_push) + attempt;
    Header h = impl_->BaseHeader(Op::kCheckpoint);
    h.name = dir;
    h.clock = cut;
    h.num_workers = workers;
    auto r = impl_->Blocking(h, impl_->AllServers(), deadline, nullptr, deadline);
    if (r.ok()) {
      taken = true;
      break;
    }
    // Abort everywhere before trying again (or giving up).
    Header abort = impl_->BaseHeader(Op::kCheckpoint);
    abort.count = 1;
    (void)impl_->Blocking(abort, impl_->AllServers(), DeadlineAfterMs(10000)).status();
    if (r.status().code() != StatusCode::kFailedPrecondition ||
        r.status().message().find("already passed") == std::string::npos) {
      return r.status();
    }
  }
  if (!taken) return Status::Unavailable("the job kept running past every proposed cut");
  std::ofstream marker(dir + "/CHECKPOINT");
  marker << "tessera checkpoint\nservers " << num_servers() << "\ncut_clock " << cut << "\n";
  marker.close();
  if (!marker) return Status::IOError("cannot write '" + dir + "/CHECKPOINT'");
  return cut;
}

Result<uint64_t> Client::Export(const std::string& root, bool delta, Deadline deadline) {
  if (root.empty()) return Status::InvalidArgument("export directory is empty");
  std::error_code ec;
  std::filesystem::create_directories(root, ec);
  if (ec) return Status::IOError("cannot create '" + root + "': " + ec.message());
  TESSERA_ASSIGN_OR_RETURN(uint64_t latest, LatestExportVersion(root));
  if (delta && latest == 0) {
    return Status::FailedPrecondition("a delta export needs a previous export in '" + root + "'");
  }
  const uint64_t version = latest + 1;
  const std::string dir = root + "/v" + std::to_string(version);
  Header h = impl_->BaseHeader(Op::kExport);
  h.name = dir;
  h.count = delta ? 1 : 0;
  h.offset = delta ? latest : 0;  // the base version
  TESSERA_RETURN_IF_ERROR(
      impl_->Blocking(h, impl_->AllServers(), deadline, nullptr, deadline).status());
  {
    std::ofstream marker(dir + "/EXPORT");
    marker << "tessera export\nversion " << version << "\nkind " << (delta ? "delta" : "full")
           << "\nbase " << (delta ? latest : 0) << "\nservers " << num_servers() << "\n";
    if (!marker) return Status::IOError("cannot write '" + dir + "/EXPORT'");
  }
  // Readers follow LATEST; replace it atomically.
  {
    std::ofstream l(root + "/LATEST.tmp");
    l << version << "\n";
    if (!l) return Status::IOError("cannot write '" + root + "/LATEST.tmp'");
  }
  std::filesystem::rename(root + "/LATEST.tmp", root + "/LATEST", ec);
  if (ec) return Status::IOError("cannot update '" + root + "/LATEST': " + ec.message());
  return version;
}

Status Client::Restore(const std::string& dir, Deadline deadline) {
  Header h = impl_->BaseHeader(Op::kRestore);
  h.name = dir;
  return impl_->Blocking(h, impl_->AllServers(), deadline, nullptr, deadline).status();
}

Status Client::Wait(const Handle& handle, Deadline deadline) {
  if (!handle.valid()) return Status::InvalidArgument("invalid handle");
  return internal::ClientImpl::WaitCall(*handle.call_, deadline);
}

uint32_t Client::num_servers() const { return impl_->slot_map_.num_servers(); }
const ClientOptions& Client::options() const { return impl_->options_; }

}  // namespace tessera
