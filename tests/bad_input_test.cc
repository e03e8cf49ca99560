// Bad input over a real socket: every malformed request gets an error reply that says what was
// wrong, and the server keeps serving everyone else.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "ps/client/client.h"
#include "ps/codec.h"
#include "ps/routing.h"
#include "tests/cluster_fixture.h"

namespace tessera {
namespace {

using testing::LocalCluster;
using testing::LocalClusterOptions;

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

template <typename T>
std::string Bytes(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

class BadInputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    LocalClusterOptions opts = testing::Servers(2);
    opts.extra_flags = {"--max_request_mb=64"};
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
    // A key that server 0 owns, and one it does not.
    for (uint64_t k = 0; own_key_ == kNone || other_key_ == kNone; ++k) {
      (SlotMap::Uniform(2).ServerOfKey(k) == 0 ? own_key_ : other_key_) = k;
    }
  }

  Header PullHeader(uint64_t count, uint32_t dim = 4) {
    Header h;
    h.request_id = 1;
    h.op = Op::kSparsePull;
    h.table_id = table_.id;
    h.elem_type = ElemType::kF32;
    h.count = count;
    h.dim = dim;
    return h;
  }

  void ExpectError(RawPeer& peer, std::vector<std::string> frames, StatusCode code,
                   const std::string& says) {
    Header r = peer.Call(std::move(frames));
    EXPECT_EQ(r.status, code) << r.message;
    EXPECT_NE(r.message.find(says), std::string::npos)
        << "message '" << r.message << "' does not say '" << says << "'";
  }

  static constexpr uint64_t kNone = ~uint64_t{0};
  std::unique_ptr<LocalCluster> cluster_;
  std::unique_ptr<Client> client_;
  Table table_, dense_;
  uint64_t own_key_ = kNone, other_key_ = kNone;
};

TEST_F(BadInputTest, EveryMalformedRequestIsAnsweredWithWhatWasWrong) {
  RawPeer peer(cluster_->endpoints()[0]);
  const std::string keys1 = Bytes(std::vector<uint64_t>{own_key_});

  ExpectError(peer, {"garbage that is not a flatbuffer"}, StatusCode::kInvalidArgument,
              "verification");
  ExpectError(peer, {std::string(kMaxEnvelopeBytes + 10, 'x')}, StatusCode::kInvalidArgument,
              "exceeds the limit");
  Header v = PullHeader(1);
  v.version = kProtocolVersion + 1;
  ExpectError(peer, {Env(v), keys1}, StatusCode::kFailedPrecondition, "protocol version");
  // Truncated and extra frames, size mismatches.
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
  ExpectError(peer, {Env(push), keys1, Bytes(std::vector<float>{1, 2, 3})},
              StatusCode::kInvalidArgument, "values frame has 12 bytes, envelope implies 16");
  // Dense range outside the table, or not this server's.
  Header dr;
  dr.request_id = 3;
  dr.op = Op::kDensePull;
  dr.table_id = dense_.id;
  dr.offset = 90;
  dr.count = 20;
  ExpectError(peer, {Env(dr)}, StatusCode::kInvalidArgument, "outside table 'dense'");
  // Bad table specs.
  Header ct;
  ct.op = Op::kCreateTable;
  ExpectError(peer, {Env(ct)}, StatusCode::kInvalidArgument, "without a spec");
  ct.spec = TableSpec::Sparse("bad", 0);
  ExpectError(peer, {Env(ct)}, StatusCode::kInvalidArgument, "dim must be in");
  ct.spec = TableSpec::Sparse("emb", 16);
  ExpectError(peer, {Env(ct)}, StatusCode::kAlreadyExists, "dim: 4 vs 16");
  // A reply carries the request id it answers.
  Header ping;
  ping.op = Op::kPing;
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

  // The server kept serving everyone: the regular client works on both servers.
  std::vector<uint64_t> keys = {own_key_, other_key_, 1, 2, 3};
  std::vector<float> out(keys.size() * 4);
  EXPECT_TRUE(client_->Wait(client_->Pull(table_, keys, out.data())).ok());
  auto stats = client_->ServerStats(0);
  ASSERT_TRUE(stats.ok());
  EXPECT_NE(stats->find("errors "), std::string::npos);
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

}  // namespace
}  // namespace tessera
