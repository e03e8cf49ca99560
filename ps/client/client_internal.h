// Internals of the client library, shared by its .cc files: the record of one call, the
// messages the I/O thread sends, and ClientImpl (connections, I/O thread, request building).
// Not a public header: only ps/client/*.cc include it.
#pragma once

#include <absl/container/flat_hash_map.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "ps/client/client.h"
#include "ps/codec.h"
#include "ps/curve.h"
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

// One request for the I/O thread to send (one server's part of a call).
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

// A call that completed before anything was sent (bad arguments, nothing to do).
std::shared_ptr<Call> CompletedCall(Status s);

// The state behind a Client: one DEALER socket (and its monitor) per server, served by one I/O
// thread that sends queued requests, matches replies to calls and expires late ones. Calls are
// built on the caller's thread (client.cc) and handed over through Send(); the I/O side is in
// client_io.cc. Thread-safe as Client is: public members may be used from any thread.
class ClientImpl {
 public:
  explicit ClientImpl(const ClientOptions& o);
  ~ClientImpl();

  // Connects to every server and waits until each answers a ping (connect_timeout_ms).
  Status Start();

  // ---------------------------------------------------------------- calls (client.cc)
  Header BaseHeader(Op op) const;
  Handle SparseCall(Op op, const Table& t, std::span<const uint64_t> keys,
                    std::span<const float> grads, float* out);
  Handle DenseCall(Op op, const Table& t, uint64_t offset, uint64_t length,
                   std::span<const float> grads, float* out);
  // Sends `h` to `servers` and waits; returns the first error or the header of the last reply
  // to arrive (with its data frame, if any, in *data; a PutMeta sends *data instead).
  Result<Header> Blocking(Header h, std::vector<uint32_t> servers, Deadline deadline,
                          std::string* data = nullptr, Deadline request_deadline = Deadline());
  std::vector<uint32_t> AllServers() const;
  Handle ClockCall(int64_t value);

  // ---------------------------------------------------------------- hand-over (client_io.cc)
  Outgoing MakeOutgoing(uint32_t server, Header h, std::vector<zmq::message_t> data,
                        std::shared_ptr<Call> call, Deadline deadline);
  Deadline RequestDeadline() const { return DeadlineAfterMs(options_.request_timeout_ms); }
  void Send(const std::shared_ptr<Call>& call, std::vector<Outgoing> out);
  static Status WaitCall(Call& c, Deadline deadline);

  const ClientOptions options_;
  const SlotMap slot_map_;
  std::atomic<int64_t> clock_{0};

 private:
  struct ServerConn {
    zmq::socket_t dealer;
    zmq::socket_t monitor;
    bool connected = false;
    bool ever_connected = false;
  };

  // Opens server i's DEALER socket and its monitor and starts connecting (part of Start).
  Status ConnectServer(uint32_t i, const CurveKeyPair& mine);
  void Wake();

  // ---------------------------------------------------------------- I/O thread (client_io.cc)
  void IoLoop();
  void SendOne(Outgoing& o);
  void ReceiveFrom(uint32_t server);
  void MonitorEvent(uint32_t server);
  void FailServer(uint32_t server, const Status& st);
  void ExpireRequests(Clock::time_point now);
  static void PartDone(const std::shared_ptr<Call>& c, const Status& s);

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
}  // namespace tessera
