#include <gtest/gtest.h>

#include "ps/server/access_internal.h"

namespace tessera::internal {
namespace {

Header Request(Op op, uint32_t replica_from = 0) {
  Header h;
  h.op = op;
  h.replica_from = replica_from;
  return h;
}

TEST(AccessPolicy, LoopbackAddresses) {
  for (const char* a : {"127.0.0.1", "127.1.2.3", "::1", "::ffff:127.0.0.1"}) {
    EXPECT_TRUE(IsLoopbackAddress(a)) << a;
  }
  for (const char* a : {"10.0.0.1", "192.168.1.127", "::ffff:10.1.2.3", "fe80::1", "", "1.127.0.0",
                        "::11", "0.0.0.0"}) {
    EXPECT_FALSE(IsLoopbackAddress(a)) << a;
  }
}

TEST(AccessPolicy, WithoutCurveOnlyLoopbackIsTrustedUnlessAllowed) {
  const AccessPolicy plain;
  const Rights local = RightsOf(plain, nullptr, "127.0.0.1");
  EXPECT_TRUE(local.peer && local.admin);
  const Rights remote = RightsOf(plain, nullptr, "10.1.2.3");
  EXPECT_FALSE(remote.peer || remote.admin);
  // No address at all (a transport that gives none): not trusted.
  const Rights unknown = RightsOf(plain, nullptr, nullptr);
  EXPECT_FALSE(unknown.peer || unknown.admin);
  // A User-Id means nothing without CurveZMQ (nobody checked a key).
  EXPECT_FALSE(RightsOf(plain, "admin", "10.1.2.3").admin);
  const Rights allowed =
      RightsOf(AccessPolicy{.allow_remote_admin = true}, nullptr, "10.1.2.3");
  EXPECT_TRUE(allowed.peer && allowed.admin);
  const Rights ipc = RightsOf(AccessPolicy{.local_endpoint = true}, nullptr, nullptr);
  EXPECT_TRUE(ipc.peer && ipc.admin);
}

TEST(AccessPolicy, WithCurveTheKeyClassDecidesNotTheAddress) {
  const AccessPolicy curve{.curve = true, .allow_remote_admin = true};
  const Rights client = RightsOf(curve, "client", "127.0.0.1");
  EXPECT_FALSE(client.peer || client.admin);
  const Rights none = RightsOf(curve, nullptr, "127.0.0.1");
  EXPECT_FALSE(none.peer || none.admin);
  const Rights peer = RightsOf(curve, "peer", "10.0.0.1");
  EXPECT_TRUE(peer.peer);
  EXPECT_FALSE(peer.admin);
  const Rights admin = RightsOf(curve, "admin", "10.0.0.1");
  EXPECT_TRUE(admin.admin);
  EXPECT_FALSE(admin.peer);
}

TEST(AccessPolicy, AuthorizeKeepsPeerAndAdminOpsToTheirRights) {
  const AccessPolicy curve{.curve = true};
  const Rights client, peer{.peer = true}, admin{.admin = true};
  for (Op op : {Op::kPing, Op::kCreateTable, Op::kGetTable, Op::kSparsePull, Op::kSparsePush,
                Op::kSparsePushPull, Op::kDensePull, Op::kDensePush, Op::kClock, Op::kBarrier,
                Op::kPutMeta, Op::kGetMeta, Op::kStats}) {
    EXPECT_TRUE(Authorize(Request(op), client, 0, curve).ok()) << OpName(op);
  }
  // Forwarded pushes: only a peer (an admin is no server).
  for (Op op : {Op::kSparsePush, Op::kDensePush}) {
    const Status s = Authorize(Request(op, 2), client, 3, curve);
    EXPECT_EQ(s.code(), StatusCode::kPermissionDenied) << s.ToString();
    EXPECT_NE(s.message().find("server 3 refuses a forwarded"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("replica_from 2"), std::string::npos) << s.message();
    EXPECT_EQ(Authorize(Request(op, 2), admin, 3, curve).code(), StatusCode::kPermissionDenied);
    EXPECT_TRUE(Authorize(Request(op, 2), peer, 3, curve).ok());
  }
  // Slot moves: a peer's controller or an operator's tessera-ctl.
  for (Op op : {Op::kSlotExport, Op::kSlotImport, Op::kSlotDrop}) {
    const Status s = Authorize(Request(op), client, 0, curve);
    EXPECT_EQ(s.code(), StatusCode::kPermissionDenied) << OpName(op);
    EXPECT_NE(s.message().find("--admin_clients"), std::string::npos) << s.message();
    EXPECT_TRUE(Authorize(Request(op), peer, 0, curve).ok()) << OpName(op);
    EXPECT_TRUE(Authorize(Request(op), admin, 0, curve).ok()) << OpName(op);
  }
  // Checkpoints (and their aborts), restores and exports: operators only.
  for (Op op : {Op::kCheckpoint, Op::kRestore, Op::kExport}) {
    EXPECT_EQ(Authorize(Request(op), client, 0, curve).code(), StatusCode::kPermissionDenied);
    EXPECT_EQ(Authorize(Request(op), peer, 0, curve).code(), StatusCode::kPermissionDenied);
    EXPECT_TRUE(Authorize(Request(op), admin, 0, curve).ok()) << OpName(op);
  }
  // Without CurveZMQ the refusal says how to get the right.
  const Status plain = Authorize(Request(Op::kCheckpoint), client, 0, AccessPolicy{});
  EXPECT_NE(plain.message().find("loopback"), std::string::npos) << plain.message();
  EXPECT_NE(plain.message().find("--allow_remote_admin_without_curve"), std::string::npos);
}

}  // namespace
}  // namespace tessera::internal
