// Bad input over a real socket: every malformed request gets an error reply that says what was
// wrong, and the server keeps serving everyone else.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "ps/client/client.h"
#include "ps/codec.h"
#include "ps/routing.h"
#include "tests/cluster_fixture.h"
#include "tests/raw_peer.h"

namespace tessera {
namespace {

using testing::LocalCluster;
using testing::LocalClusterOptions;
using testing::Bytes;

// A raw DEALER that speaks bytes to one server.
class RawPeer {
 public:
  explicit RawPeer(const std::string& endpoint) : sock_(ctx_, zmq::socket_type::dealer) {
    sock_.set(zmq::sockopt::linger, 0);
    sock_.set(zmq::sockopt::rcvtimeo, 10000);
    sock_.connect(endpoint);
  }
  // Sends the frames; returns the reply envelope (decoded) and its data frames.
  Header Call(std::vector<std::string> frames, std::vector<zmq::message_t>* data = nullptr) {
    std::vector<zmq::message_t> parts;
    for (auto& f : frames) parts.emplace_back(f.data(), f.size());
    zmq::send_multipart(sock_, parts);
    std::vector<zmq::message_t> reply;
    auto n = zmq::recv_multipart(sock_, std::back_inserter(reply));
    Header h;
    h.status = StatusCode::kInternal;
    h.message = "no reply";
    if (!n || reply.empty()) return h;
    Status s = DecodeHeader(reply[0].data(), reply[0].size(), &h);
    EXPECT_TRUE(s.ok()) << "reply envelope did not decode: " << s.ToString();
    if (data) {
      data->clear();
      for (size_t i = 1; i < reply.size(); ++i) data->push_back(std::move(reply[i]));
    }
    return h;
  }

 private:
  zmq::context_t ctx_;
  zmq::socket_t sock_;
};

std::string Env(Header h) {
  std::string s;
  EncodeHeader(h, &s);
  return s;
}

// Server `rank`'s "errors" counter: requests the I/O thread answered with an error.
int64_t ErrorsCounter(Client& client, uint32_t rank) {
  auto stats = client.ServerStats(rank);
  if (!stats.ok()) return -1;
  const std::string& t = *stats;
  for (size_t pos = 0; pos < t.size(); pos = t.find('\n', pos) + 1) {
    if (t.compare(pos, 7, "errors ") == 0) return std::strtoll(t.c_str() + pos + 7, nullptr, 10);
    if (t.find('\n', pos) == std::string::npos) break;
  }
  return -1;
}

class BadInputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    LocalClusterOptions opts = testing::Servers(2);
    admin_root_ = ::testing::TempDir() + "bad_input_test_admin_" + std::to_string(::getpid());
    opts.extra_flags = {"--max_request_mb=64", "--admin_root=" + admin_root_};
    cluster_ = std::make_unique<LocalCluster>(opts);
    ASSERT_TRUE(cluster_->Start().ok());
    ClientOptions o;
    o.servers = cluster_->endpoints();
    auto c = Client::Create(o);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    client_ = std::move(c).value();
    auto t = client_->CreateTable(TableSpec::Sparse("emb", 4));
    ASSERT_TRUE(t.ok());
    table_ = *t;
    auto d = client_->CreateTable(TableSpec::Dense("dense", 100));
    ASSERT_TRUE(d.ok());
    dense_ = *d;
    // Three chunks: each server holds a part.
    auto big = client_->CreateTable(TableSpec::Dense("big", 3 * kDenseChunkFloats));
    ASSERT_TRUE(big.ok());
    big_ = *big;
    // A key that server 0 owns, and one it does not.
    for (uint64_t k = 0; own_key_ == kNone || other_key_ == kNone; ++k) {
      (SlotMap::Uniform(2).ServerOfKey(k) == 0 ? own_key_ : other_key_) = k;
    }
  }
  void TearDown() override { std::filesystem::remove_all(admin_root_); }

  Header Request(Op op) {
    Header h;
    h.request_id = ++next_id_;
    h.op = op;
    return h;
  }
  Header PullHeader(uint64_t count, uint32_t dim = 4) {
    Header h = testing::SparseHeader(Op::kSparsePull, table_.id, count, dim);
    h.request_id = ++next_id_;
    return h;
  }
  Header DenseHeader(Op op, uint64_t offset, uint64_t count) {
    Header h = Request(op);
    h.table_id = big_.id;
    h.elem_type = ElemType::kF32;
    h.offset = offset;
    h.count = count;
    return h;
  }

  // Sends a malformed request to server 0 and checks its one reply: the request id and op the
  // server could read from it (0 and Invalid when the envelope does not decode), `code`, a
  // message that contains `says`, no data frames.
  void ExpectError(RawPeer& peer, std::vector<std::string> frames, StatusCode code,
                   const std::string& says) {
    Header sent;
    (void)DecodeHeader(frames[0].data(), frames[0].size(), &sent);
    const uint64_t id = sent.request_id;
    const Op op = static_cast<uint8_t>(sent.op) <= kMaxOp ? sent.op : Op::kInvalid;
    std::vector<zmq::message_t> data;
    Header r = peer.Call(std::move(frames), &data);
    ++bad_requests_;
    EXPECT_EQ(r.status, code) << "request " << id << " (" << OpName(op) << "): " << r.message;
    EXPECT_NE(r.message.find(says), std::string::npos)
        << "message '" << r.message << "' does not say '" << says << "'";
    EXPECT_EQ(r.request_id, id) << "the reply to '" << says << "' carries another request id";
    EXPECT_EQ(r.op, op) << "the reply to '" << says << "' carries another op";
    EXPECT_TRUE(data.empty()) << "an error reply with data frames";
  }

  static constexpr uint64_t kNone = ~uint64_t{0};
  std::unique_ptr<LocalCluster> cluster_;
  std::unique_ptr<Client> client_;
  std::string admin_root_;
  Table table_, dense_, big_;
  uint64_t own_key_ = kNone, other_key_ = kNone;
  uint64_t next_id_ = 1000;
  int64_t bad_requests_ = 0;
};

TEST_F(BadInputTest, EveryMalformedRequestIsAnsweredWithWhatWasWrong) {
  RawPeer peer(cluster_->endpoints()[0]);
  const int64_t errors_before = ErrorsCounter(*client_, 0);
  ASSERT_GE(errors_before, 0) << "server 0's stats have no errors counter";
  const std::string keys1 = Bytes(std::vector<uint64_t>{own_key_});

  // Envelopes that do not decode.
  ExpectError(peer, {"garbage that is not a flatbuffer"}, StatusCode::kInvalidArgument,
              "verification");
  ExpectError(peer, {std::string(kMaxEnvelopeBytes + 10, 'x')}, StatusCode::kInvalidArgument,
              "exceeds the limit");
  ExpectError(peer, {std::string()}, StatusCode::kInvalidArgument, "empty envelope");
  Header v = PullHeader(1);
  v.version = kProtocolVersion + 1;
  ExpectError(peer, {Env(v), keys1}, StatusCode::kFailedPrecondition, "protocol version");
  Header unknown_op = Request(static_cast<Op>(kMaxOp + 1));
  ExpectError(peer, {Env(unknown_op)}, StatusCode::kInvalidArgument,
              "unknown op " + std::to_string(kMaxOp + 1));
  Header bad_elem = PullHeader(1);
  bad_elem.elem_type = static_cast<ElemType>(9);
  ExpectError(peer, {Env(bad_elem), keys1}, StatusCode::kInvalidArgument, "element type 9");
  Header bad_status = Request(Op::kPing);
  bad_status.status = static_cast<StatusCode>(40);
  ExpectError(peer, {Env(bad_status)}, StatusCode::kInvalidArgument, "unknown status code");
  // Sparse: truncated and extra frames, size mismatches.
  ExpectError(peer, {Env(PullHeader(1))}, StatusCode::kInvalidArgument, "expects 1 data frame");
  ExpectError(peer, {Env(PullHeader(1)), keys1, keys1}, StatusCode::kInvalidArgument, "got 2");
  ExpectError(peer, {Env(PullHeader(2)), keys1}, StatusCode::kInvalidArgument,
              "keys frame has 8 bytes, envelope implies 16");
  ExpectError(peer, {Env(PullHeader(1)), keys1.substr(0, 7)}, StatusCode::kInvalidArgument,
              "keys frame has 7 bytes");
  // Wrong element type, wrong dim, unknown table, wrong kind.
  Header et = PullHeader(1);
  et.elem_type = ElemType::kU64;
  ExpectError(peer, {Env(et), keys1}, StatusCode::kInvalidArgument, "element type");
  ExpectError(peer, {Env(PullHeader(1, 8)), keys1}, StatusCode::kInvalidArgument,
              "table 'emb' has dim 4, request says 8");
  Header unk = PullHeader(1);
  unk.table_id = 42;
  ExpectError(peer, {Env(unk), keys1}, StatusCode::kNotFound, "unknown table id 42");
  Header kind = PullHeader(1);
  kind.table_id = dense_.id;
  ExpectError(peer, {Env(kind), keys1}, StatusCode::kInvalidArgument, "is dense");
  // Absurd counts: more memory than the server's per-request limit.
  ExpectError(peer, {Env(PullHeader(uint64_t{1} << 40)), keys1}, StatusCode::kResourceExhausted,
              "per-request limit");
  ExpectError(peer, {Env(PullHeader(~uint64_t{0})), keys1}, StatusCode::kResourceExhausted,
              "per-request limit");
  // A key this server does not own.
  ExpectError(peer, {Env(PullHeader(1)), Bytes(std::vector<uint64_t>{other_key_})},
              StatusCode::kFailedPrecondition, "belongs to server 1");
  // Non-finite gradients.
  Header push = PullHeader(1);
  push.op = Op::kSparsePush;
  ExpectError(peer, {Env(push), keys1, Bytes(std::vector<float>{1, NAN, 0, 0})},
              StatusCode::kInvalidArgument, "not finite");
  push.request_id = ++next_id_;
  ExpectError(peer, {Env(push), keys1, Bytes(std::vector<float>{1, 2, 3})},
              StatusCode::kInvalidArgument, "values frame has 12 bytes, envelope implies 16");
  // Dense: outside the table, not this server's part, zero length, frames, type, finiteness.
  const DenseRange mine = DenseRangeOfServer(big_.id, big_.spec.length, 0, 2);
  ASSERT_LT(mine.begin, mine.end);
  Header dr = Request(Op::kDensePull);
  dr.table_id = dense_.id;
  dr.offset = 90;
  dr.count = 20;
  ExpectError(peer, {Env(dr)}, StatusCode::kInvalidArgument, "outside table 'dense'");
  const uint64_t foreign = mine.begin > 0 ? 0 : mine.end;
  ExpectError(peer, {Env(DenseHeader(Op::kDensePull, foreign, 1))}, StatusCode::kFailedPrecondition,
              "served by server 1, not server 0");
  ExpectError(peer, {Env(DenseHeader(Op::kDensePull, mine.begin, 0))}, StatusCode::kInvalidArgument,
              "zero elements");
  const std::string two_floats = Bytes(std::vector<float>{1, 2});
  ExpectError(peer, {Env(DenseHeader(Op::kDensePush, mine.begin, 2))}, StatusCode::kInvalidArgument,
              "DensePush expects 1 data frame(s), got 0");
  Header dense_u64 = DenseHeader(Op::kDensePush, mine.begin, 2);
  dense_u64.elem_type = ElemType::kU64;
  ExpectError(peer, {Env(dense_u64), two_floats}, StatusCode::kInvalidArgument,
              "dense values must be F32");
  ExpectError(peer, {Env(DenseHeader(Op::kDensePush, mine.begin, 3)), two_floats},
              StatusCode::kInvalidArgument, "values frame has 8 bytes, envelope implies 12");
  ExpectError(
      peer,
      {Env(DenseHeader(Op::kDensePush, mine.begin, 2)), Bytes(std::vector<float>{0, INFINITY})},
      StatusCode::kInvalidArgument,
      "dense gradient element " + std::to_string(mine.begin + 1) + " is not finite");
  // Bad table specs, unknown tables.
  Header ct = Request(Op::kCreateTable);
  ExpectError(peer, {Env(ct)}, StatusCode::kInvalidArgument, "without a spec");
  ct.spec = TableSpec::Sparse("bad", 0);
  ExpectError(peer, {Env(ct)}, StatusCode::kInvalidArgument, "dim must be in");
  ct.spec = TableSpec::Sparse("emb", 16);
  ExpectError(peer, {Env(ct)}, StatusCode::kAlreadyExists, "dim: 4 vs 16");
  Header gt = Request(Op::kGetTable);
  gt.name = "nope";
  ExpectError(peer, {Env(gt)}, StatusCode::kNotFound, "no table named 'nope'");
  // Clocks, barriers, metadata records.
  Header clock = Request(Op::kClock);
  clock.clock = -5;
  ExpectError(peer, {Env(clock)}, StatusCode::kInvalidArgument, "clock");
  Header barrier = Request(Op::kBarrier);
  barrier.name = "start";
  ExpectError(peer, {Env(barrier)}, StatusCode::kInvalidArgument, "barrier with zero workers");
  barrier.request_id = ++next_id_;
  barrier.name.clear();
  barrier.num_workers = 2;
  ExpectError(peer, {Env(barrier)}, StatusCode::kInvalidArgument, "name");
  Header meta = Request(Op::kGetMeta);
  ExpectError(peer, {Env(meta)}, StatusCode::kInvalidArgument, "1..1024 bytes");
  meta.request_id = ++next_id_;
  meta.name = std::string(2000, 'm');
  ExpectError(peer, {Env(meta)}, StatusCode::kInvalidArgument, "1024");
  Header put = Request(Op::kPutMeta);
  put.name = "m";
  put.elem_type = ElemType::kBytes;
  put.count = 1;
  ExpectError(peer, {Env(put)}, StatusCode::kInvalidArgument, "PutMeta expects 1 data frame(s)");
  put.request_id = ++next_id_;
  ExpectError(peer, {Env(put), std::string((1 << 20) + 1, 'v')}, StatusCode::kResourceExhausted,
              "limited to 1 MiB");
  // Admin ops.
  ExpectError(peer, {Env(Request(Op::kCheckpoint))}, StatusCode::kInvalidArgument,
              "checkpoint without a directory");
  ExpectError(peer, {Env(Request(Op::kExport))}, StatusCode::kInvalidArgument,
              "export without a directory");
  Header restore = Request(Op::kRestore);
  restore.name = "never-written";
  ExpectError(peer, {Env(restore)}, StatusCode::kNotFound, "no complete checkpoint");

  // A reply carries the request id it answers.
  Header ping = Request(Op::kPing);
  ping.request_id = 987654321;
  Header pong = peer.Call({Env(ping)});
  EXPECT_EQ(pong.status, StatusCode::kOk);
  EXPECT_EQ(pong.request_id, 987654321u);
  // A well-formed raw pull still works on the same connection.
  std::vector<zmq::message_t> data;
  Header ok = peer.Call({Env(PullHeader(1)), keys1}, &data);
  EXPECT_EQ(ok.status, StatusCode::kOk) << ok.message;
  ASSERT_EQ(data.size(), 1u);
  EXPECT_EQ(data[0].size(), 16u);

  // Server 0 counted each bad request as an error, and only those.
  EXPECT_EQ(ErrorsCounter(*client_, 0) - errors_before, bad_requests_)
      << "server 0's errors counter does not match the " << bad_requests_
      << " malformed requests it answered";
  // The server kept serving everyone: the regular client works on both servers.
  std::vector<uint64_t> keys = {own_key_, other_key_, 1, 2, 3};
  std::vector<float> out(keys.size() * 4);
  EXPECT_TRUE(client_->Wait(client_->Pull(table_, keys, out.data())).ok());
}

TEST_F(BadInputTest, OversizedFrameDropsOnlyThatPeer) {
  // A frame larger than the limit (64 MiB + slack) is cut off by ZeroMQ with its connection;
  // the server stays up for everyone else.
  {
    zmq::context_t ctx;
    zmq::socket_t s(ctx, zmq::socket_type::dealer);
    s.set(zmq::sockopt::linger, 2000);
    s.connect(cluster_->endpoints()[0]);
    std::string big(70u << 20, 'x');
    std::vector<zmq::message_t> parts;
    parts.emplace_back(Env(PullHeader(1)).data(), Env(PullHeader(1)).size());
    parts.emplace_back(big.data(), big.size());
    zmq::send_multipart(s, parts);
  }
  std::vector<uint64_t> keys = {own_key_, other_key_};
  std::vector<float> out(8);
  EXPECT_TRUE(client_->Wait(client_->Pull(table_, keys, out.data()), DeadlineAfterMs(10000)).ok());
}

// replica_from marks a primary's forwarded push, which skips the per-client limits: any other
// op carrying it is refused (it was served, skipping them).
TEST_F(BadInputTest, ReplicaFromOnAnythingButAPushIsRefused) {
  RawPeer peer(cluster_->endpoints()[0]);
  for (Op op : {Op::kStats, Op::kPing, Op::kGetMeta, Op::kSparsePull}) {
    Header h = op == Op::kSparsePull ? PullHeader(1) : Request(op);
    h.replica_from = 1;
    h.name = "m";
    std::string env;
    EncodeHeader(h, &env);
    std::vector<std::string> frames = {env};
    if (op == Op::kSparsePull) frames.push_back(testing::Bytes(std::vector<uint64_t>{own_key_}));
    std::vector<zmq::message_t> data;
    const Header r = peer.Call(std::move(frames), &data);
    EXPECT_EQ(r.status, StatusCode::kInvalidArgument) << OpName(op) << ": " << r.message;
    EXPECT_NE(r.message.find("replicated request must be"), std::string::npos) << r.message;
  }
  EXPECT_TRUE(client_->ServerStats(0).ok());
}

// tessera-server --rocksdb_table_options reaches the storage engine's check: a string RocksDB
// refuses, and one with a negative value (RocksDB would wrap it), stop the start with the
// option named (the engine's own cases: RocksDbTuningTest.BadTableOptionStringsAreRefusedClearly).
TEST(BadServerFlags, BadRocksDbTableOptionsStopTheStart) {
  const std::string dir =
      ::testing::TempDir() + "bad_table_options_" + std::to_string(::getpid());
  for (const char* bad : {"no_such_option=1", "write_buffer_size=-1"}) {
    std::string out;
    const int rc = testing::RunCommand(
        {TESSERA_SERVER_BINARY,
         "--cluster=tcp://127.0.0.1:" + std::to_string(testing::PickFreePort()), "--rank=0",
         "--data_dir=" + dir, std::string("--rocksdb_table_options=") + bad},
        &out);
    EXPECT_EQ(rc, 1) << bad << ": " << out;
    EXPECT_NE(out.find("cannot start: InvalidArgument: rocksdb_table_options '"),
              std::string::npos)
        << out;
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tessera
