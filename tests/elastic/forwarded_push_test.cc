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

}  // namespace
}  // namespace tessera::testing
