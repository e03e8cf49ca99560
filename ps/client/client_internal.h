// Internals of the client library, shared by its .cc files: the record of one call, the
// messages the I/O thread sends, and ClientImpl (connections, I/O thread, request building).
// Not a public header: only ps/client/*.cc include it.
#pragma once

#include <absl/container/flat_hash_map.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <optional>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "ps/client/client.h"
#include "ps/codec.h"
#include "ps/curve.h"
#include "ps/mutex.h"
#include "ps/routing.h"

namespace tessera {
namespace internal {

// The eventfd of the calling thread's WakeFd (below), the one WaitCall polls.
int ThisThreadWakeFd();

// One asynchronous call, possibly fanned out to several servers.
struct Call {
  // Runs on the I/O side (under io_mu_) for each OK reply part; may write into the caller's
  // buffers.
  // `rows`: null when the reply answers the whole part; else the positions, in the part's key
  // order, of the keys it answers (a part split after a stale-map refusal, Reroute).
  std::function<Status(uint32_t server, const std::vector<uint32_t>* rows, const Header& h,
                       std::vector<zmq::message_t>& frames)>
      on_reply;
  // Runs on the I/O side once, after every part succeeded.
  std::function<void()> on_done;
  uint32_t remaining = 0;  // I/O side
  Status first_error;      // I/O side
  // Pushes: a push is all-or-nothing per server, not across them. When some parts fail for
  // good after others were applied, the call's error names the applied ones (PartDone), so
  // the caller knows that sending the whole push again would apply those twice.
  enum class PushKind : uint8_t { kNone, kSparse, kDense };
  PushKind push = PushKind::kNone;
  std::string applied_parts;  // I/O side: "server 2, server 0" or "part 1 on server 2, ..."
  uint32_t failed_parts = 0;  // I/O side

  // Client::Cancel: the I/O side runs on_reply and on_done holding write_mu and skips them
  // once `cancelled` is set (under write_mu), so after Cancel nothing writes into the
  // caller's buffers.
  std::mutex write_mu;
  std::atomic<bool> cancelled{false};

  Mutex mu;
  std::condition_variable cv;
  bool done ABSL_GUARDED_BY(mu) = false;
  std::atomic<bool> done_flag{false};  // mirrors done, read without the lock by Wait
  Status status ABSL_GUARDED_BY(mu);   // final once done
  // The eventfd of a thread that waits for this call polling the sockets itself (-1: none);
  // whoever completes the call signals it, after done_flag and under mu. The waiter clears it
  // under mu before it returns, so the descriptor is never written after its thread ended
  // and closed it (and the number went to another file).
  std::atomic<int> waiter_fd{-1};
  void WakePoller() {
    const int fd = waiter_fd.load();
    // The waiter itself completing the call (its own receive) need not be woken.
    if (fd < 0 || fd == ThisThreadWakeFd()) return;
    uint64_t one = 1;
    ssize_t r = write(fd, &one, sizeof(one));
    (void)r;
  }
};

// A thread's own eventfd (closed when the thread ends), for WaitCall.
struct WakeFd {
  int fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  WakeFd() = default;
  WakeFd(const WakeFd&) = delete;
  WakeFd& operator=(const WakeFd&) = delete;
  ~WakeFd() {
    if (fd >= 0) close(fd);
  }
  static void Drain(int fd) {
    uint64_t v;
    ssize_t r = read(fd, &v, sizeof(v));
    (void)r;
  }
};

/// A random non-zero id: a client's, or one push numbering's (ClientImpl::RenumberPush).
uint64_t RandomClientId();

// One request to send (one server's part of a call).
struct Outgoing {
  uint32_t server;
  uint64_t request_id;
  std::vector<zmq::message_t> parts;  // envelope, then data frames
  std::shared_ptr<Call> call;         // null: fire and forget
  Deadline deadline;                  // of the current attempt
  // Retries: until when the request is sent again after a lost connection or a timeout
  // (Deadline::min(): never retried).
  Deadline give_up = Deadline::min();
  // Pushes: the envelope is encoded again with this client's id and the server's next push
  // sequence number when the request is first sent (on the I/O side, in send order).
  bool needs_seq = false;
  Header header;                 // data requests and clocks: the header, to encode again
  uint32_t part = 0;             // the server index the call's reply callback knows it by
  // Null: the whole part; else the positions (in the part's key order) of the keys this
  // request carries, after Reroute split the part among servers.
  std::shared_ptr<const std::vector<uint32_t>> rows;
  uint32_t reroutes = 0;         // stale-map refusals so far (for the error message)
  Clock::time_point not_before{};  // waiting for a map: not sent before this
  uint64_t send_order = 0;       // per server, assigned when first handed to SendOne
  Status last_error;             // why the last attempt failed
  // The request's op (every request; `header` is filled for data requests only): what to do
  // with it when its server is retired (ClientImpl::SendToRetired).
  Op op = Op::kInvalid;
  // Pushes (docs/wire-protocol.md, "Exactly-once pushes"): set once an attempt under the
  // current number went unanswered (it timed out, or its connection was lost while it was in
  // flight): that attempt may have been taken, and forwarded to a backup that logged it, so
  // the push keeps its number wherever it goes (ClientImpl::KeepNumberIfUnsettled).
  // `unanswered_server`, `unanswered_drops`: the server of the first such attempt and that
  // server's connection losses (ServerConn::drops) when it was sent.
  bool unanswered = false;
  uint32_t unanswered_server = 0;
  uint64_t unanswered_drops = 0;
  uint64_t sent_drops = 0;  // ServerConn::drops when the request was last transmitted
  bool retryable() const { return give_up != Deadline::min(); }
  // An attempt of this request got no answer (timed out, connection lost): notes it for a
  // push that has a number (Outgoing::unanswered).
  void NoteUnanswered() {
    if (!IsPush(op) || header.client_seq == 0 || unanswered) return;
    unanswered = true;
    unanswered_server = server;
    unanswered_drops = sent_drops;
  }
};

struct InFlight {
  std::shared_ptr<Call> call;
  uint32_t server;
  uint32_t part;
  Deadline deadline;
  std::optional<Outgoing> retained;  // retryable requests: what to send again
  std::shared_ptr<const std::vector<uint32_t>> rows;  // Outgoing::rows
};

// A call that completed before anything was sent (bad arguments, nothing to do).
std::shared_ptr<Call> CompletedCall(Status s);

// The envelope frame of `h`.
inline zmq::message_t EnvelopeFrame(const Header& h) {
  std::string env;
  EncodeHeader(h, &env);
  return zmq::message_t(env.data(), env.size());
}
// One message from `socket` without waiting into `parts`; false when none is there, or on an
// error (EINTR, a closed socket): the caller's next round looks again.
inline bool TryRecv(zmq::socket_t& socket, std::vector<zmq::message_t>* parts) {
  try {
    return zmq::recv_multipart(socket, std::back_inserter(*parts), zmq::recv_flags::dontwait)
        .has_value();
  } catch (const zmq::error_t&) {
    return false;
  }
}
// Ops that carry the cluster map version (and are fenced by it).
inline bool IsDataOp(Op op) {
  return op == Op::kSparsePull || op == Op::kDensePull || IsPush(op);
}

// The state behind a Client: one DEALER socket (and its monitor) per server, served by one I/O
// thread that sends queued requests, matches replies to calls and expires late ones. Calls are
// built on the caller's thread (client.cc) and handed over through Send(); the I/O side is in
// client_io.cc, the connections in client_conn.cc. Thread-safe as Client is: public members
// may be used from any thread.
class ClientImpl {
 public:
  // `map`: with a cluster map source, the map Create loaded (its addresses are o.servers).
  ClientImpl(const ClientOptions& o, std::unique_ptr<ClusterMapSource> source = nullptr,
             std::optional<RoutingMap> map = std::nullopt);
  ~ClientImpl();
  // The map calls are routed by (version 0: the static cluster). Any thread.
  std::shared_ptr<const RoutingMap> Routing() const;
  uint64_t stale_map_retries() const { return stale_map_retries_.load(); }

  // Connects to every server and waits until each answers a ping (connect_timeout_ms).
  Status Start();

  // ---------------------------------------------------------------- calls (client.cc)
  Header BaseHeader(Op op) const;
  uint64_t client_id() const { return client_id_; }
  // `key_owner` / `grad_owner`, when set, keep `keys` / `grads` alive: a call whose frames
  // are the caller's buffers whole (strictly increasing keys, one server) points into them.
  Handle SparseCall(Op op, const Table& t, std::span<const uint64_t> keys,
                    std::span<const float> grads, float* out,
                    std::shared_ptr<const void> key_owner = nullptr,
                    std::shared_ptr<const void> grad_owner = nullptr);
  // `owner`, when set, keeps `grads` alive: the push's messages point into it (no copy).
  Handle DenseCall(Op op, const Table& t, uint64_t offset, uint64_t length,
                   std::span<const float> grads, float* out,
                   std::shared_ptr<const void> owner = nullptr);
  // Sends `h` to `servers` and waits; returns the first error or the header of the last reply
  // to arrive (with its data frame, if any, in *data; a PutMeta sends *data instead).
  Result<Header> Blocking(Header h, std::vector<uint32_t> servers, Deadline deadline,
                          std::string* data = nullptr, Deadline request_deadline = Deadline());
  // Sends `h` with data frames `frames` to each of `servers` and waits; the first error, or
  // the header of the last reply (its data frame, if any, in *reply).
  Result<Header> SendAndWait(Header h, const std::vector<uint32_t>& servers,
                             const std::vector<std::string_view>& frames, Deadline deadline,
                             std::string* reply, Deadline request_deadline = Deadline());
  std::vector<uint32_t> AllServers() const;
  // The server that holds the job's barriers and answers GetTable and GetMeta: the lowest id
  // of the map with an address (0 with a static cluster; after a fail-over of 0, the next).
  uint32_t CoordServer() const;
  // Where PutMeta writes: every server of the map for a client that follows one (so that the
  // next coordinating server has the records when one dies), server 0 with a static cluster.
  std::vector<uint32_t> MetaServers() const;
  Handle ClockCall(int64_t value);

  // ---------------------------------------------------------------- hand-over (client_io.cc)
  // `give_up`: the latest time a retry may be sent (Deadline(): retry_for_ms from now); ops
  // that are never retried ignore it.
  Outgoing MakeOutgoing(uint32_t server, Header h, std::vector<zmq::message_t> data,
                        std::shared_ptr<Call> call, Deadline deadline,
                        Deadline give_up = Deadline());
  Deadline RequestDeadline() const { return DeadlineAfterMs(options_.request_timeout_ms); }
  void Send(const std::shared_ptr<Call>& call, std::vector<Outgoing> out);
  // Waits for `c`; the waiting thread receives replies itself while the sockets are free.
  Status WaitCall(Call& c, Deadline deadline);
  // Waits for `c` on its condition variable.
  static Status WaitCallBlocked(Call& c, Deadline deadline);
  // WaitCall's end: a polling waiter leaves (to sleep on its call when `sleep`), waking the
  // I/O thread when it must read for others.
  Status LeavePolling(Call& c, Deadline deadline, size_t in_flight_left, bool sleep);
  // A request of a call Client::Cancel ended, not sent (again): completes its part as
  // Cancelled and returns true. Nobody waits for it, and a zero-copy push's caller may be
  // writing its floats again.
  bool DroppedAsCancelled(const Outgoing& o);
  // LeavePolling's end, also for a thread that counted itself a poller and then did not poll:
  // stops counting it a poller and, with `sleep`, counts it a sleeper while it waits on its
  // call's condition variable (the last poller leaving wakes the I/O thread if needed).
  Status StopPolling(Call& c, Deadline deadline, bool sleep);
  // IoLoop, under io_mu_: what the I/O thread polls into *items: its eventfd, every monitor
  // and the DEALERs that waiting callers do not poll (the returned count of items: what it
  // polls standing down), then the DEALERs they do. An id without sockets has none.
  size_t CollectPollItems(std::vector<zmq::pollitem_t>* items) const;
  // IoLoop: whether to stand down this round (sets io_standing_down_).
  bool StandDown();
  // A waiting caller polls the sockets of the first this many servers opened (the I/O thread
  // polls all of them).
  static constexpr size_t kMaxPolledServers = 64;

  const ClientOptions options_;
  std::atomic<int64_t> clock_{0};
  std::atomic<float> lr_scale_{1.0f};  // Header::lr_scale of pushes

 private:
  friend struct ClientTestAccess;
  struct ServerConn {
    std::string address;
    // Opened only once the id has an address (OpenSockets): closed for a retired id.
    zmq::socket_t dealer;
    zmq::socket_t monitor;
    bool polled = false;  // the DEALER's descriptor is in polled_fds_ (waiting callers poll it)
    bool connected = false;
    bool ever_connected = false;
    // Connected anew to an id given back (ReviveServers) and not yet reported connected: a
    // request sent now could go down the old connection, still being closed, and be lost
    // until its timeout; retryable ones wait in `retry` for the connection (SendOne).
    bool reconnecting = false;
    // Handshake failures in a row (monitor events); once they show an encryption or key
    // mismatch, handshake_error fails calls to this server at once (cleared by a success).
    uint32_t handshake_failures = 0;
    Status handshake_error;
    // Retries: requests waiting to be sent again, in send order; while any wait, new
    // retryable requests queue behind them so the server sees them in order.
    std::deque<Outgoing> retry;
    Clock::time_point retry_at{};
    int64_t backoff_ms = 100;
    uint64_t next_send_order = 0;
    uint64_t push_seq = 0;  // the last push sequence number given out
    // Connection losses seen (ZMQ_EVENT_DISCONNECTED): a server process that restarted was
    // reached over a new connection, so an attempt sent before the count moved may have
    // been taken by a process that is gone.
    uint64_t drops = 0;
    // The id this server's push numbering runs under: 0 for the client's own id, another
    // random one after the server refused the numbering (RenumberPush) or its id was given
    // back after a retirement (ReviveServers).
    uint64_t push_client = 0;
    // The cluster map version that retired this id (its address emptied; 0: live). Nothing
    // is sent to a retired id again: SendOne hands such requests to SendToRetired.
    uint64_t retired_by = 0;
  };

  // A newer map from the source: routes by it from now on (Wake()s the I/O thread). A map
  // that changes the server list is not followed: map_error_ says why.
  // (ReviveServers: `ids`, which `m` gives an address again, connected anew; the caller holds
  // io_mu_.)
  Status ReviveServers(const RoutingMap& m, const std::vector<size_t>& ids);
  // The id `s`'s pushes are numbered under now (ServerConn::push_client, else the client's).
  uint64_t NumberingOf(const ServerConn& s) const {
    return s.push_client != 0 ? s.push_client : client_id_;
  }
  // Starts a new numbering of `s`'s pushes: a new random id, numbered from 1.
  static void NewNumbering(ServerConn& s) {
    s.push_client = RandomClientId();
    s.push_seq = 0;
  }
  // Sends the client's clock to `server` (newly connected; the caller holds clock_mu_ and
  // io_mu_, so a Clock() meanwhile cannot overtake it).
  void SendClockTo(uint32_t server);
  void InstallMap(const Result<RoutingMap>& m);
  // I/O thread: a data request refused as stale (the server is at `server_version`): waits
  // for a map at least that new (asking the refresher), then is routed again.
  void StaleMapRetry(Outgoing o, uint64_t server_version, const Status& why);
  // StaleMapRetry's first step for a push refused as stale by o.server, numbered there
  // (client_origin 0): keeps its number, as counted in o.server's sequence (client_origin =
  // o.server + 1), unless the refusal proves that no attempt of it was taken anywhere. A
  // refusal says only that the refusing process did not take that attempt; it proves more
  // when every attempt was answered, or when the one that was not went to the same server
  // over the same connection (no drop since: the same process, which refused it as stale
  // because it is at a newer map than the push's, so it refused every attempt of it). A push
  // kept so starts a new numbering for o.server's later pushes.
  void KeepNumberIfUnsettled(Outgoing& o, uint64_t server_version);
  // I/O thread: sends what waits for a map once the map is there.
  void DrainMapWaiters(Clock::time_point now);
  // Routes `o` by the current map and sends it (a push under a new sequence number); a
  // sparse request whose keys now belong to several servers is split (SplitAndReroute).
  void Reroute(Outgoing o, const RoutingMap& map);
  // One request per server for the `n` keys of sparse request `o`, each with the positions of
  // its keys in o's part (Outgoing::rows); the call waits for every piece.
  void SplitAndReroute(Outgoing o, const RoutingMap& map, const uint64_t* keys, uint64_t n);
  // Sends `o`, routed to o.server, at `map`'s version: a new request id, and a push under a
  // new sequence number, unless it counts in another server's sequence (client_origin, set
  // by RetireServers), whose (client_id, client_seq, client_origin) it keeps. Fails `o` when
  // `map` routes it to a retired id.
  void SendRouted(Outgoing o, const RoutingMap& map);
  // I/O thread, after InstallMap moved installed_version_: for each id the current map
  // retired (address emptied) by a fail-over, i.e. whose slots of the previous map it handled
  // (retired_map_) went to their backups, marks it retired and routes again, by that map,
  // what was sent or waits to be sent again to it (in flight with `retained`, the retry
  // queue), in send order; pushes keep their number, counted in the retired server's sequence
  // (client_origin), since its backup, now the new owner, may hold them already. What may not
  // go elsewhere fails. An id retired by a scale-down (its slots were moved away by copies,
  // in earlier versions) is left as before: it still runs and answers what it was sent (a
  // push it applied is answered as a retry there, not applied again by the new owner).
  void RetireServers();
  // True when `map` gives every slot `server` was the primary of in `before` to that slot's
  // backup in `before` (and it was the primary of at least one): a promotion, not a move.
  static bool FailedOver(const RoutingMap& before, const RoutingMap& map, uint32_t server);
  // `o`, addressed to retired id o.server: a sparse data request is routed by the current
  // map, a clock is done (the server is gone: nothing waits there for it); a dense request
  // fails (FailedPrecondition: dense tables are not replicated), anything else Unavailable.
  void SendToRetired(Outgoing o);
  // Why `o` may not be sent to retired id `server` (retired by map version `version`).
  Status RetiredError(const Outgoing& o, uint32_t server, uint64_t version) const;
  void RefreshLoop();

  // Under io_mu_: adds server id servers_.size() with `address`; unless it is "" (a retired
  // id), opens its sockets (OpenSockets). Nothing is added on an error.
  Status ConnectServer(const std::string& address);
  // Under io_mu_: opens a DEALER socket to `address` for server `i` (which has none) and its
  // monitor, starts connecting, and publishes its descriptor to waiting callers.
  // ResourceExhausted when descriptors (or ZeroMQ's socket limit) run out.
  Status OpenSockets(uint32_t i, const std::string& address);
  // Under io_mu_: connects to the servers map `m` adds after the ones connected so far, and
  // sends each the worker's clock first (so that a read gated by staleness is not parked
  // there for a clock sent before the server was known). Holds clock_mu_.
  Status ConnectNewServers(const RoutingMap& m);
  // Data endpoint of server `i` (any thread that holds io_mu_).
  const std::string& Address(uint32_t i) const { return servers_[i].address; }
  void Wake();

  // ---------------------------------------------------------------- I/O thread (client_io.cc)
  void IoLoop();
  // The I/O thread's end (under io_mu_): fails whatever is queued, waiting or in flight with
  // Cancelled, and closes the sockets.
  void CancelEverything();
  void SendOne(Outgoing& o);
  // Sends `o` now; registers it in flight. False when the socket refused it.
  bool Transmit(Outgoing& o);
  // Queues `o` to be sent again (in send order), or fails its call when it may not retry.
  void RetryOrFail(Outgoing o, const Status& why, bool server_down);
  // Push `o` was refused Aborted: the server does not know its numbering (its marks were
  // lost or expired), and applied nothing. The first such refusal of a numbering starts a new
  // one (a new random id, numbers from 1); `o` is sent again under it, as a new send.
  void RenumberPush(uint32_t server, Outgoing o, const Status& why);
  // Sends what waits in server's retry queue once it is due and the server is connected.
  void DrainRetries(uint32_t server, Clock::time_point now);
  // Under io_mu_: sends what callers queued, in queue order.
  void SendQueued();
  // Under io_mu_: receives what every server's socket holds.
  void ReceiveReady();
  // Under io_mu_: receives what the sockets sent to since the last call hold (a send may take
  // the notification of a reply that arrived meanwhile).
  void ReceiveSentTo();
  void ReceiveFrom(uint32_t server);
  void MonitorEvent(uint32_t server);
  // A handshake with `server` failed (monitor event `event`, value `value`).
  void HandshakeFailed(uint32_t server, uint16_t event, uint32_t value);
  void FailServer(uint32_t server, const Status& st);
  // Removes and returns the requests in flight to `server` (FailServer, RetireServers).
  std::vector<InFlight> TakeInFlight(uint32_t server);
  void ExpireRequests(Clock::time_point now);
  static void PartDone(const std::shared_ptr<Call>& c, const Status& s);

  zmq::context_t ctx_;
  // Held by the thread doing socket I/O: the I/O thread, or a caller's thread that sends its
  // own request (Send). Guards the sockets and the state marked "I/O side" below.
  Mutex io_mu_ ABSL_ACQUIRED_BEFORE(map_mu_);
  // I/O side. A deque: a server a new map adds is appended while references to the others
  // stay valid.
  std::deque<ServerConn> servers_;
  // The DEALER sockets' ZMQ_FD of the first kMaxPolledServers servers opened (ids without an
  // address have none), for waiting callers (which read them without io_mu_): an entry is
  // written before polled_n_ counts it, and never changes after.
  std::array<zmq::pollitem_t, kMaxPolledServers> polled_fds_{};
  std::atomic<size_t> polled_n_{0};
  size_t open_sockets_ = 0;  // I/O side: servers with sockets (the I/O thread polls them)
  // The I/O thread's stand-down (IoLoop): set by WaitCall when it leaves fewer than
  // kUnwatchedInFlight requests in flight, taken by the I/O thread at each round;
  // io_standing_down_ while it polls standing down.
  std::atomic<bool> settled_wait_{false};
  std::atomic<bool> io_standing_down_{false};
  // Callers in WaitCall's polling loop, and callers asleep on their call's condition variable
  // because the sockets were taken and enough others polled (WaitCall). While some sleep and
  // none polls, the I/O thread does not stand down.
  std::atomic<uint32_t> polling_waiters_{0};
  std::atomic<uint32_t> sleeping_waiters_{0};
  static constexpr uint32_t kMaxPollingWaiters = 2;
  // Requests in flight past which a caller that sends wakes the standing-down I/O thread
  // (below it, their replies wait for a caller's Wait or the thread's next round, 20 ms).
  static constexpr size_t kUnwatchedInFlight = 16;
  CurveKeyPair curve_mine_;  // this client's CurveZMQ key pair (when the servers use Curve)
  // Held while a clock is sent to every server and while new servers are connected (and
  // sent the clock): a clock never misses a server the map just added.
  Mutex clock_mu_ ABSL_ACQUIRED_BEFORE(io_mu_);
  uint32_t dense_servers_ = 0;  // dense tables are spread over servers 0 .. dense_servers_-1
  std::vector<uint32_t> sent_to_;            // I/O side: servers sent to (ReceiveSentTo)
  int event_fd_ = -1;
  std::thread io_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> next_id_{0};
  const uint64_t client_id_;  // random, non-zero: the id pushes carry for exactly-once
  Mutex queue_mu_;
  std::vector<Outgoing> queue_ ABSL_GUARDED_BY(queue_mu_);
  absl::flat_hash_map<uint64_t, InFlight> in_flight_;  // I/O side

  // The cluster map: routing_ is what calls route by; the source's watch and the refresher
  // replace it with newer versions.
  // Lock order: clock_mu_, io_mu_, map_mu_ (the I/O thread takes map_mu_ under io_mu_).
  mutable Mutex map_mu_;
  std::shared_ptr<const RoutingMap> routing_ ABSL_GUARDED_BY(map_mu_);
  Status map_error_ ABSL_GUARDED_BY(map_mu_);
  std::condition_variable refresh_cv_;
  uint64_t refresh_wanted_ ABSL_GUARDED_BY(map_mu_) = 0;  // a version the refresher should load
  bool refresh_stop_ ABSL_GUARDED_BY(map_mu_) = false;
  std::thread refresher_;
  std::unique_ptr<ClusterMapSource> source_;  // destroyed first (~ClientImpl)
  std::deque<Outgoing> map_waiters_;          // I/O side
  // The version of the last map InstallMap installed; the I/O thread compares it with
  // retired_version_ (I/O side: the version whose retired ids RetireServers handled) to
  // notice a map that may retire ids without taking map_mu_ in every round.
  std::atomic<uint64_t> installed_version_{0};
  uint64_t retired_version_ = 0;
  // I/O side: the map RetireServers last handled (the previous map of the next one).
  std::shared_ptr<const RoutingMap> retired_map_;
  std::atomic<uint64_t> stale_map_retries_{0};
};

// What tests read of a client's internals: its waiting threads (cluster_test).
struct ClientTestAccess {
  static uint32_t PollingWaiters(const Client& c) { return c.impl_->polling_waiters_.load(); }
  static uint32_t SleepingWaiters(const Client& c) { return c.impl_->sleeping_waiters_.load(); }
};

}  // namespace internal
}  // namespace tessera
