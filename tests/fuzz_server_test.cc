// Fuzz soak (ctest label `fuzz`, opt-in): for 15 s, requests of every op (plausible ones, ones
// with flipped envelope bytes, random data frames; random worker ids, clocks, staleness bounds
// and worker counts) go over one real socket to an in-process server, pipelined. Checked:
//  - every reply decodes, and its request id (and op) is that of a request in flight: a reply
//    to nothing, or a second reply to one request, fails the test;
//  - every request is answered exactly once by the end. Requests that wait by design (reads
//    parked by the staleness bound, barrier arrivals, a checkpoint waiting for its cut, pushes
//    parked behind that cut) are released at the end (Release): every worker's clock is moved
//    to kMaxClock, a pending checkpoint is aborted, each open barrier is completed (by an
//    arrival of worker 0 in a job of 1);
//  - OK replies carry the data frames the op promises (sizes from the request), error replies
//    none and a message;
//  - the server then serves a regular client.
// The only requests allowed to stay unanswered: a barrier arrival replaced by a later arrival
// of the same worker at the same barrier (Consistency::Arrive drops the earlier one; Release's
// arrivals replace worker 0's). Not sent
// at all: staleness-bounded reads of a job of more than kReleaseWorkers workers (they would
// wait for workers the test never clocks).
#include <glog/logging.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <set>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "ps/client/client.h"
#include "ps/codec.h"
#include "ps/limits.h"
#include "ps/server/server.h"

namespace tessera {
namespace {

constexpr auto kSendFor = std::chrono::seconds(15);
constexpr auto kDrainFor = std::chrono::seconds(30);
constexpr uint32_t kWorkers = 3;          // worker ids of generated requests
constexpr uint32_t kReleaseWorkers = 64;  // workers whose clocks Release() moves
constexpr size_t kMaxInFlight = 200;      // below the server's per-peer limit (1024)

std::string Env(const Header& h) {
  std::string s;
  EncodeHeader(h, &s);
  return s;
}

bool IsRead(Op op) {
  return op == Op::kSparsePull || op == Op::kSparsePushPull || op == Op::kDensePull;
}

// The op a reply to `req` carries: the request's when this build knows it (ReplyError).
Op EchoedOp(const Header& req) {
  return static_cast<uint8_t>(req.op) <= kMaxOp ? req.op : Op::kInvalid;
}

// A request sent and not yet answered.
struct InFlight {
  Header req;                      // as the server decodes it (default if it cannot)
  bool decoded = false;            // the envelope decodes without error
  bool may_go_unanswered = false;  // a barrier arrival replaced by a later one
};

// The peer's side of the conversation: what is in flight, matched against every reply.
class Ledger {
 public:
  uint64_t Add(const Header& req, bool decoded) {
    const uint64_t serial = next_serial_++;
    by_serial_[serial] = InFlight{req, decoded, false};
    by_id_.emplace(req.request_id, serial);
    ++sent_[static_cast<uint8_t>(req.op)];
    if (decoded && req.op == Op::kBarrier && req.num_workers > 0 &&
        ValidateRequestLimits(req).ok()) {
      // A second arrival of the same worker replaces the first (which may get no reply).
      auto [it, fresh] = barrier_last_.try_emplace({req.name, req.worker_id}, serial);
      if (!fresh) {
        auto old = by_serial_.find(it->second);
        if (old != by_serial_.end()) old->second.may_go_unanswered = true;
        it->second = serial;
      }
    }
    return serial;
  }

  // Matches a reply; a failure message when it answers nothing in flight or is malformed.
  std::string Match(const Header& r, const std::vector<zmq::message_t>& data) {
    auto [lo, hi] = by_id_.equal_range(r.request_id);
    for (auto it = lo; it != hi; ++it) {
      auto f = by_serial_.find(it->second);
      if (EchoedOp(f->second.req) != r.op) continue;
      const Header req = f->second.req;
      by_serial_.erase(f);
      by_id_.erase(it);
      ++answered_[static_cast<uint8_t>(req.op)];
      return r.status == StatusCode::kOk ? CheckOk(req, r, data) : CheckError(r, data);
    }
    return "reply with request id " + std::to_string(r.request_id) + " and op " +
           std::string(OpName(r.op)) + " answers no request in flight (" +
           StatusCodeName(r.status).data() + ": " + r.message + ")";
  }

  size_t awaited() const {
    size_t n = 0;
    for (auto& [s, f] : by_serial_) n += f.may_go_unanswered ? 0 : 1;
    return n;
  }
  // Names of the barriers with arrivals in flight.
  std::set<std::string> OpenBarriers() const {
    std::set<std::string> open;
    for (auto& [s, f] : by_serial_) {
      if (f.decoded && f.req.op == Op::kBarrier && !f.may_go_unanswered) open.insert(f.req.name);
    }
    return open;
  }
  std::string Unanswered() const {
    std::string out;
    for (auto& [s, f] : by_serial_) {
      if (f.may_go_unanswered) continue;
      out += " [id " + std::to_string(f.req.request_id) + " " + std::string(OpName(f.req.op)) +
             " worker " + std::to_string(f.req.worker_id) + " clock " +
             std::to_string(f.req.clock) + " staleness " + std::to_string(f.req.staleness) +
             " workers " + std::to_string(f.req.num_workers) + " name '" + f.req.name + "']";
    }
    return out;
  }
  uint64_t sent(Op op) const { return sent_[static_cast<uint8_t>(op)]; }
  uint64_t answered(Op op) const { return answered_[static_cast<uint8_t>(op)]; }

 private:
  static std::string CheckError(const Header& r, const std::vector<zmq::message_t>& data) {
    if (r.message.empty())
      return "an error reply to " + std::string(OpName(r.op)) + " says nothing";
    if (!data.empty()) return "an error reply to " + std::string(OpName(r.op)) + " has data";
    return "";
  }
  static std::string CheckOk(const Header& req, const Header& r,
                             const std::vector<zmq::message_t>& data) {
    uint64_t frames = 0, bytes = 0;
    switch (req.op) {
      case Op::kSparsePull:
      case Op::kSparsePushPull:
        frames = 1;
        bytes = req.count * req.dim * 4;
        break;
      case Op::kDensePull:
        frames = 1;
        bytes = req.count * 4;
        break;
      case Op::kGetMeta:
        frames = r.count;
        bytes = data.empty() ? 0 : data[0].size();
        break;
      case Op::kStats:
        frames = 1;
        bytes = data.empty() ? 0 : data[0].size();
        break;
      default:
        break;
    }
    if (data.size() != frames || (frames == 1 && data[0].size() != bytes)) {
      return "OK reply to " + std::string(OpName(req.op)) + " (id " +
             std::to_string(req.request_id) + ") has " + std::to_string(data.size()) +
             " data frame(s), expected " + std::to_string(frames) + " of " + std::to_string(bytes) +
             " bytes";
    }
    return "";
  }

  uint64_t next_serial_ = 1;
  std::map<uint64_t, InFlight> by_serial_;
  std::multimap<uint64_t, uint64_t> by_id_;  // request id -> serial
  std::map<std::pair<std::string, uint32_t>, uint64_t> barrier_last_;
  uint64_t sent_[256] = {}, answered_[256] = {};
};

class FuzzPeer {
 public:
  FuzzPeer(const std::string& endpoint, const std::string& admin_root, Table sparse, Table dense)
      : sock_(ctx_, zmq::socket_type::dealer),
        admin_root_(admin_root),
        sparse_(std::move(sparse)),
        dense_(std::move(dense)) {
    sock_.set(zmq::sockopt::linger, 0);
    sock_.connect(endpoint);
  }

  // Sends requests for `duration`, keeping at most kMaxInFlight awaited. When that many wait
  // and the server has gone quiet, they are parked by design: Release lets them go.
  void Run(std::chrono::steady_clock::duration duration) {
    const auto until = std::chrono::steady_clock::now() + duration;
    while (std::chrono::steady_clock::now() < until && failures_.size() < 10) {
      if (ledger_.awaited() >= kMaxInFlight) {
        if (Receive(std::chrono::milliseconds(1000)) == 0) Release();
        continue;
      }
      SendOne();
      (void)Receive(std::chrono::milliseconds(0));
    }
  }

  // Lets every waiting request go (see the top of the file).
  void Release() {
    Quiesce();
    for (uint32_t w = 0; w < kReleaseWorkers; ++w) {
      Header c = Base(Op::kClock);
      c.worker_id = w;
      c.num_workers = 0;
      c.clock = kMaxClock;
      Send(Env(c), {});
    }
    for (int i = 0; i < 4; ++i) {  // the checkpoints it names (ck0..ck3)
      Header abort = Base(Op::kCheckpoint);
      abort.count = 1;
      abort.name = "ck" + std::to_string(i);
      Send(Env(abort), {});
    }
    // A barrier of one worker, worker 0, completes every barrier it arrives at (an earlier
    // arrival of worker 0 there is replaced: the ledger notes it may go unanswered).
    Quiesce();
    for (const std::string& name : ledger_.OpenBarriers()) {
      Header b = Base(Op::kBarrier);
      b.name = name;
      b.worker_id = 0;
      b.num_workers = 1;
      Send(Env(b), {});
    }
  }

  // Waits for every awaited reply, up to `budget`.
  void Drain(std::chrono::steady_clock::duration budget) {
    const auto until = std::chrono::steady_clock::now() + budget;
    while (ledger_.awaited() > 0 && std::chrono::steady_clock::now() < until) {
      (void)Receive(std::chrono::milliseconds(200));
    }
  }

  const Ledger& ledger() const { return ledger_; }
  const std::vector<std::string>& failures() const { return failures_; }
  uint64_t ok_replies() const { return ok_replies_; }
  uint64_t error_replies() const { return error_replies_; }
  uint64_t not_sent() const { return not_sent_; }
  uint64_t sent() const { return sent_; }

 private:
  Header Base(Op op) {
    Header h;
    h.op = op;
    h.request_id = ++next_id_;
    return h;
  }

  // A random op: data ops most often, admin ops (which write files) least; op 0 and ops this
  // build does not know now and then.
  Op PickOp() {
    static constexpr uint8_t kWeights[] = {1, 2, 2, 2, 4, 4, 4, 4, 4, 3, 2,
                                           2, 2, 1, 1, 1, 1, 1, 1, 1, 1};
    static_assert(std::size(kWeights) == kMaxOp + 1, "a weight for every op");
    uint32_t total = 1;  // unknown ops
    for (uint8_t w : kWeights) total += w;
    uint32_t pick = rng_() % total;
    for (uint8_t op = 0; op <= kMaxOp; ++op) {
      if (pick < kWeights[op]) return static_cast<Op>(op);
      pick -= kWeights[op];
    }
    return static_cast<Op>(kMaxOp + 1 + rng_() % (255 - kMaxOp));
  }

  // A plausible request of a random op, then perhaps flipped bytes and random frames.
  void SendOne() {
    Header h = Base(PickOp());
    if (h.op == Op::kInvalid) h.status = StatusCode::kInternal;  // else it does not decode
    const bool dense_op = h.op == Op::kDensePull || h.op == Op::kDensePush;
    const Table& t = dense_op ? dense_ : sparse_;
    h.table_id = rng_() % 8 == 0 ? rng_() : t.id;
    h.elem_type = rng_() % 6 == 0        ? static_cast<ElemType>(rng_() % 4)
                  : h.op == Op::kPutMeta ? ElemType::kBytes
                                         : ElemType::kF32;
    h.count = rng_() % 10 == 0 ? rng_() : rng_() % 200;
    h.dim = rng_() % 8 == 0 ? static_cast<uint32_t>(rng_() % 16) : t.spec.dim;
    h.offset = dense_op ? rng_() % (t.spec.length + 100) : 0;
    // Random consistency: a job of 0..kWorkers workers, this one among them, at a random
    // clock, bulk-synchronous, bounded or asynchronous.
    h.num_workers = rng_() % (kWorkers + 1);
    h.worker_id = h.num_workers > 0 ? rng_() % h.num_workers : rng_() % kWorkers;
    h.clock = static_cast<int64_t>(rng_() % 12) - (rng_() % 16 == 0 ? 3 : 0);
    h.staleness = static_cast<int32_t>(rng_() % 5) - 1;
    switch (h.op) {
      case Op::kGetTable:
        h.name = rng_() % 2 ? sparse_.spec.name : "nope";
        break;
      case Op::kBarrier:
        h.name = "b" + std::to_string(rng_() % 3);
        break;
      case Op::kPutMeta:
      case Op::kGetMeta:
        h.name = "m" + std::to_string(rng_() % 4);
        h.count = 1;
        break;
      case Op::kCheckpoint:
        h.name = "ck" + std::to_string(rng_() % 4);
        h.count = rng_() % 4 == 0 ? 1 : 0;  // sometimes an abort
        break;
      case Op::kRestore:
        h.name = "ck" + std::to_string(rng_() % 4);
        break;
      case Op::kExport: {
        const uint64_t v = 1 + rng_() % 4;
        h.name = "ex/v" + std::to_string(v);
        h.count = rng_() % 2;  // a delta on version v - 1
        h.offset = v - 1;
        break;
      }
      case Op::kCreateTable:
        if (rng_() % 4) {
          h.spec = rng_() % 2 ? sparse_.spec
                              : TableSpec::Sparse("t" + std::to_string(rng_() % 4), 1 + rng_() % 8);
        }
        break;
      case Op::kDropTable:
        // Tables the fuzz made, or none: never the two the test's client reads at the end.
        h.name = rng_() % 4 ? "t" + std::to_string(rng_() % 4) : "nope";
        break;
      default:
        break;
    }
    if (rng_() % 10 == 0 && h.op != Op::kDropTable) {
      h.name = std::string(rng_() % 40, static_cast<char>('a' + rng_() % 26));
    }
    std::string env = Env(h);
    if (rng_() % 3 == 0) {
      const int flips = 1 + rng_() % 4;
      for (int f = 0; f < flips; ++f) env[rng_() % env.size()] = static_cast<char>(rng_());
    }
    Send(env, Frames(h));
  }

  // Data frames: right for the op most of the time, else of random count and size.
  std::vector<std::string> Frames(const Header& h) {
    const uint64_t count = std::min<uint64_t>(h.count, 4096);
    std::string keys(count * 8, '\0');
    for (uint64_t i = 0; i < count; ++i) {
      const uint64_t k = rng_() % 1000;
      std::memcpy(keys.data() + i * 8, &k, 8);
    }
    std::vector<float> grads(h.op == Op::kDensePush ? count : count * std::min(h.dim, 64u));
    for (auto& g : grads) g = static_cast<float>(rng_() % 100) / 100.0f - 0.5f;
    const std::string values(reinterpret_cast<const char*>(grads.data()), grads.size() * 4);
    if (rng_() % 4 != 0) {
      switch (h.op) {
        case Op::kSparsePull:
          return {keys};
        case Op::kSparsePush:
        case Op::kSparsePushPull:
          return {keys, values};
        case Op::kDensePush:
          return {values};
        case Op::kPutMeta:
          return {std::string(rng_() % 100, 'v')};
        default:
          return {};
      }
    }
    std::vector<std::string> frames(rng_() % 4);
    for (auto& f : frames) {
      f.resize(rng_() % 3 == 0 ? count * 8 : rng_() % 4096);
      for (auto& c : f) c = static_cast<char>(rng_() % 3 == 0 ? 0x7f : rng_());
    }
    return frames;
  }

  void Send(const std::string& env, const std::vector<std::string>& frames) {
    Header as_sent;  // what the server decodes; its reply carries this request id
    const Status s = DecodeHeader(env.data(), env.size(), &as_sent);
    const bool gated = s.ok() && IsRead(as_sent.op) && as_sent.staleness >= 0 &&
                       as_sent.num_workers > kReleaseWorkers && as_sent.num_workers <= kMaxWorkers;
    if (gated) {  // would wait for workers this test never clocks
      ++not_sent_;
      return;
    }
    std::vector<zmq::message_t> parts;
    parts.emplace_back(env.data(), env.size());
    for (const auto& f : frames) parts.emplace_back(f.data(), f.size());
    if (!zmq::send_multipart(sock_, parts)) {
      failures_.push_back("could not send");
      return;
    }
    ++sent_;
    ledger_.Add(as_sent, s.ok());
    if (s.ok() && as_sent.op == Op::kCheckpoint && as_sent.count != 1) {
      checkpoints_[as_sent.request_id] = as_sent.name;
    }
  }

  // Reads replies until none arrives for `wait`; returns how many it read.
  int Receive(std::chrono::milliseconds wait) {
    for (int got = 0;; ++got) {
      zmq::pollitem_t item{sock_.handle(), 0, ZMQ_POLLIN, 0};
      zmq::poll(&item, 1, wait);
      if (!(item.revents & ZMQ_POLLIN)) return got;
      std::vector<zmq::message_t> reply;
      (void)zmq::recv_multipart(sock_, std::back_inserter(reply));
      Header r;
      Status s = DecodeHeader(reply[0].data(), reply[0].size(), &r);
      if (!s.ok()) {
        failures_.push_back("a reply that does not decode: " + s.ToString());
        continue;
      }
      reply.erase(reply.begin());
      std::string bad = ledger_.Match(r, reply);
      if (!bad.empty()) failures_.push_back(bad);
      (r.status == StatusCode::kOk ? ok_replies_ : error_replies_)++;
      if (r.status == StatusCode::kOk && r.op == Op::kCheckpoint) MarkCheckpoint(r.request_id);
      wait = std::chrono::milliseconds(0);
    }
  }

  // Reads replies until the server has been quiet for a moment.
  void Quiesce() { (void)Receive(std::chrono::milliseconds(300)); }

  // What Client::Checkpoint writes once every server answered, so that Restore finds it.
  void MarkCheckpoint(uint64_t id) {
    auto it = checkpoints_.find(id);
    if (it == checkpoints_.end() || it->second.rfind("ck", 0) != 0 || it->second.size() != 3) {
      return;  // only the names this test generates
    }
    std::ofstream(admin_root_ + "/" + it->second + "/CHECKPOINT") << "tessera checkpoint\n";
  }

  zmq::context_t ctx_;
  zmq::socket_t sock_;
  const std::string admin_root_;
  const Table sparse_, dense_;
  std::mt19937_64 rng_{20261129};
  uint64_t next_id_ = 0;
  Ledger ledger_;
  std::map<uint64_t, std::string> checkpoints_;
  std::vector<std::string> failures_;
  uint64_t ok_replies_ = 0, error_replies_ = 0, not_sent_ = 0, sent_ = 0;
};

TEST(FuzzServerTest, EveryRequestOfEveryOpIsAnsweredOnceWithItsId) {
  FLAGS_minloglevel = 1;  // the in-process server logs every checkpoint and restore at INFO
  const std::string admin_root =
      ::testing::TempDir() + "fuzz_server_test_" + std::to_string(::getpid());
  std::filesystem::remove_all(admin_root);
  ServerOptions so;
  so.listen = "tcp://127.0.0.1:*";
  so.lanes = 2;
  so.max_request_bytes = 8 << 20;
  so.admin_root = admin_root;
  auto server = Server::Create(so);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  ClientOptions co;
  co.servers = {(*server)->endpoint()};
  auto client = Client::Create(co);
  ASSERT_TRUE(client.ok());
  auto& c = **client;
  auto sparse = c.CreateTable(TableSpec::Sparse("s", 4));
  auto dense = c.CreateTable(TableSpec::Dense("d", 50000));
  ASSERT_TRUE(sparse.ok() && dense.ok());

  FuzzPeer peer((*server)->endpoint(), admin_root, *sparse, *dense);
  peer.Run(kSendFor);
  peer.Release();
  peer.Drain(kDrainFor);

  for (const auto& f : peer.failures()) ADD_FAILURE() << f;
  EXPECT_EQ(peer.ledger().awaited(), 0u)
      << "requests without a reply after the release:" << peer.ledger().Unanswered();
  for (uint8_t op = 1; op <= kMaxOp; ++op) {
    EXPECT_GT(peer.ledger().answered(static_cast<Op>(op)), 0u)
        << "op " << OpName(static_cast<Op>(op)) << " sent "
        << peer.ledger().sent(static_cast<Op>(op)) << " times, never answered";
  }
  EXPECT_GT(peer.error_replies(), 0u);
  EXPECT_GT(peer.ok_replies(), 0u) << "some requests are valid and succeed";
  // The server still serves a regular client correctly.
  std::vector<uint64_t> keys = {1, 2, 3};
  std::vector<float> out(12);
  EXPECT_TRUE(c.Wait(c.Pull(*sparse, keys, out.data()), DeadlineAfterMs(5000)).ok());
  std::string per_op;
  for (uint8_t op = 1; op <= kMaxOp; ++op) {
    per_op += " " + std::string(OpName(static_cast<Op>(op))) + " " +
              std::to_string(peer.ledger().answered(static_cast<Op>(op))) + "/" +
              std::to_string(peer.ledger().sent(static_cast<Op>(op)));
  }
  std::printf("fuzz: answered/sent by op:%s\n", per_op.c_str());
  std::printf(
      "fuzz: %llu requests sent (%llu not sent: reads that would wait forever), %llu OK and "
      "%llu error replies\n",
      static_cast<unsigned long long>(peer.sent()),
      static_cast<unsigned long long>(peer.not_sent()),
      static_cast<unsigned long long>(peer.ok_replies()),
      static_cast<unsigned long long>(peer.error_replies()));
  std::filesystem::remove_all(admin_root);
}

}  // namespace
}  // namespace tessera
