// Forwarded pushes that no primary sent (docs/elasticity.md, "Replication and fail-over"):
// three real tessera-server processes with --coordinator in a real etcd and a map made by
// `tessera-ctl map init --replication=2` (server 2 backs up server 1). A plain DEALER sends
// server 2 envelopes that claim to come from server 1: each is checked before it may wait,
// its sender gets a clear error, and server 1's clients push and pull on as before.
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "ps/client/client.h"
#include "tests/cluster_fixture.h"
#include "tests/elastic/etcd_fixture.h"
#include "tests/elastic/replicated_cluster.h"
#include "tests/raw_peer.h"

namespace tessera::testing {
namespace {

using std::chrono::seconds;

class ForwardedPushTest : public ReplicatedClusterTest {
 protected:
  ForwardedPushTest() : ReplicatedClusterTest("tessera/fwdpush") {}

  // Pushes `grads` (every key) to `keys` through the client and checks that each row then
  // reads `-total` (SGD, lr 1, zeros initializer).
  void PushAndRead(Client& c, const Table& t, const std::vector<uint64_t>& keys, float grad,
                   float total) {
    const std::vector<float> g(keys.size() * kDim, grad);
    Status s = c.Wait(c.Push(t, keys, g));
    ASSERT_TRUE(s.ok()) << "a push to primary 1 after the forged message: " << s.ToString();
    std::vector<float> out(keys.size() * kDim, -999.0f);
    s = c.Wait(c.Pull(t, keys, out.data()));
    ASSERT_TRUE(s.ok()) << "a pull from primary 1 after the forged message: " << s.ToString();
    for (size_t i = 0; i < out.size(); ++i) {
      ASSERT_EQ(out[i], -total) << "key " << keys[i / kDim];
    }
  }
};

// Issue 35, item 1: one SparsePush with replica_from=2 (server 1), map_version=UINT64_MAX,
// count=0 and no data frames, sent to server 1's backup, parked there for good: every push
// of server 1 then waited behind it. It is refused now, and a well-formed one of a map
// version etcd never held is refused once the backup has read the map again.
TEST_F(ForwardedPushTest, AForgedForwardedPushIsRefusedAndThePrimaryServesOn) {
  auto c = CoordinatorClient();
  ASSERT_NE(c, nullptr);
  const Table t = Sparse(*c, "emb");
  const std::vector<uint64_t> keys = KeysOf(1, 50);  // server 1's slots, backed up by 2
  PushAndRead(*c, t, keys, 1.0f, 1.0f);

  RawPeer forger(cluster_->endpoints()[2], /*reply_timeout_ms=*/20000);
  Header h = SparseHeader(Op::kSparsePush, t.id, /*count=*/0, kDim);
  h.replica_from = 2;  // server 1 + 1
  h.map_version = UINT64_MAX;
  Header r = forger.Call(h);
  EXPECT_EQ(r.status, StatusCode::kInvalidArgument) << r.message;
  EXPECT_NE(r.message.find("forwarded SparsePush of zero items"), std::string::npos) << r.message;
  PushAndRead(*c, t, keys, 1.0f, 2.0f);

  // Well formed, of a map version etcd never held: refused after the backup read the map
  // again (the primary's pushes meanwhile wait behind it at most that long).
  Header ahead = SparseHeader(Op::kSparsePush, t.id, keys.size(), kDim);
  ahead.replica_from = 2;
  ahead.map_version = UINT64_MAX;
  ahead.client_id = 4242;
  ahead.client_origin = 2;
  ahead.client_seq = 1;
  const std::vector<float> big(keys.size() * kDim, 1000.0f);
  ASSERT_TRUE(forger.Send(ahead, {Bytes(keys), Bytes(big)}));
  PushAndRead(*c, t, keys, 1.0f, 3.0f);  // sent while it may still be held
  std::vector<zmq::message_t> reply;
  ASSERT_TRUE(zmq::recv_multipart(forger.socket(), std::back_inserter(reply)).has_value())
      << "the forged push of a future map was never answered";
  ASSERT_TRUE(DecodeHeader(reply[0].data(), reply[0].size(), &r).ok());
  EXPECT_EQ(r.status, StatusCode::kFailedPrecondition) << r.message;
  EXPECT_NE(r.message.find("newest map stored is version 1"), std::string::npos) << r.message;

  // Frames that do not match the envelope, and a sender that is the backup itself.
  Header bad = ahead;
  bad.map_version = 1;
  r = forger.Call(bad, {Bytes(keys)});
  EXPECT_EQ(r.status, StatusCode::kInvalidArgument) << r.message;
  bad.replica_from = 3;  // server 2, to itself
  r = forger.Call(bad, {Bytes(keys), Bytes(big)});
  EXPECT_EQ(r.status, StatusCode::kInvalidArgument) << r.message;

  // The same of a DensePush: zero elements, no frame.
  OptimizerSpec sgd;
  sgd.learning_rate = 1.0f;
  auto dense = c->CreateTable(TableSpec::Dense("mlp", 3000, sgd));
  ASSERT_TRUE(dense.ok()) << dense.status().ToString();
  Header d;
  d.op = Op::kDensePush;
  d.table_id = dense->id;
  d.elem_type = ElemType::kF32;
  d.replica_from = 2;
  d.map_version = UINT64_MAX;
  r = forger.Call(d);
  EXPECT_EQ(r.status, StatusCode::kInvalidArgument) << r.message;
  EXPECT_NE(r.message.find("forwarded DensePush of zero items"), std::string::npos) << r.message;

  PushAndRead(*c, t, keys, 1.0f, 4.0f);  // none of the forged values was applied
  const std::vector<float> dg(3000, 2.0f);
  Status s = c->Wait(c->DensePush(*dense, 0, dg));
  ASSERT_TRUE(s.ok()) << s.ToString();
  std::vector<float> dout(3000, -999.0f);
  s = c->Wait(c->DensePull(*dense, 0, dout.size(), dout.data()));
  ASSERT_TRUE(s.ok()) << s.ToString();
  for (size_t i = 0; i < dout.size(); ++i) ASSERT_EQ(dout[i], -2.0f) << "dense element " << i;
  EXPECT_EQ(ServerStat(2, "replica_parked_now"), 0);
  EXPECT_EQ(ServerStat(2, "replica_refused_ahead"), 1);
}

// A primary cut off by a fail-over resumes and forwards the pushes it still held to its old
// backup, now the slots' primary, which fences them off (FailedPrecondition). Its client
// sends each of them again there under the same number, with that primary as the origin;
// the client's later pushes of that numbering must wait for it. They were taken first once
// (the refusal closed the gap a resend leaves), the mark went above the refused number, and
// its resend was answered as a retry and applied nowhere: an acknowledged push lost (issue
// 35's random fault test, ReplicatedRandomFaults.FailOverRebuildAndScale). Here server 2
// stands for the new primary: a push forwarded by "server 0" for server 2's slots, then the
// client's pushes of server 0's numbering (client_origin 1) in the wrong order.
TEST_F(ForwardedPushTest, AFencedOffForwardedPushKeepsItsNumberForTheClientsResend) {
  auto c = CoordinatorClient();
  ASSERT_NE(c, nullptr);
  const Table t = Sparse(*c, "emb");
  const std::vector<uint64_t> all = KeysOf(2, 8);  // server 2's slots at version 1
  const std::vector<uint64_t> first(all.begin(), all.begin() + 4);
  const std::vector<uint64_t> second(all.begin() + 4, all.end());
  const std::vector<float> ones(first.size() * kDim, 1.0f);
  constexpr uint64_t kClient = 0x7e55e7a;
  RawPeer peer(cluster_->endpoints()[2]);
  auto push = [&](const std::vector<uint64_t>& keys, uint64_t seq, uint16_t replica_from) {
    Header h = SparseHeader(Op::kSparsePush, t.id, keys.size(), kDim);
    h.map_version = 1;
    h.client_id = kClient;
    h.client_origin = 1;  // counted in server 0's sequence
    h.client_seq = seq;
    h.replica_from = replica_from;
    return peer.Call(h, {Bytes(keys), Bytes(ones)});
  };
  // Push 5 of server 0's numbering, forwarded by server 0, which is not the primary here.
  Header r = push(first, 5, /*replica_from=*/1);
  ASSERT_EQ(r.status, StatusCode::kFailedPrecondition) << r.message;
  EXPECT_NE(r.message.find("replication refused"), std::string::npos) << r.message;
  // The client's push 6 comes before its resend of 5: it waits (Unavailable, not taken).
  r = push(second, 6, /*replica_from=*/0);
  EXPECT_EQ(r.status, StatusCode::kUnavailable) << r.message;
  // Then 5 and 6 in order: each applied once.
  r = push(first, 5, 0);
  ASSERT_EQ(r.status, StatusCode::kOk) << r.message;
  r = push(second, 6, 0);
  ASSERT_EQ(r.status, StatusCode::kOk) << r.message;
  std::vector<float> out(all.size() * kDim, -999.0f);
  const Status s = c->Wait(c->Pull(t, all, out.data()));
  ASSERT_TRUE(s.ok()) << s.ToString();
  for (size_t i = 0; i < out.size(); ++i) {
    EXPECT_EQ(out[i], -1.0f) << "key " << all[i / kDim] << " (push " << (i / kDim < 4 ? 5 : 6)
                             << ")";
  }
}

}  // namespace
}  // namespace tessera::testing
