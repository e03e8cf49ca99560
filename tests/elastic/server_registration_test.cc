// tessera-server --coordinator: real server processes register in a real etcd, leave it on
// SIGTERM at once and after their TTL on kill -9; a malformed URL or an absent etcd stops the
// start with a message.
#include <chrono>
#include <fstream>
#include <iterator>

#include "ps/coord/membership.h"
#include "ps/coord/slot_map_store.h"
#include "tests/cluster_fixture.h"
#include "tests/elastic/etcd_fixture.h"

namespace tessera::testing {
namespace {

using std::chrono::seconds;

std::vector<std::string> Ids(EtcdClient& etcd, const std::string& prefix) {
  std::vector<std::string> ids;
  auto members = ListMembers(etcd, prefix);
  if (members.ok()) {
    for (const Member& m : *members) ids.push_back(m.id);
  }
  return ids;
}

TEST_F(EtcdTest, ServersRegisterAndLeave) {
  LocalClusterOptions o = Servers(2);
  o.extra_flags = {"--coordinator=" + etcd_.url("tessera/job"), "--coordinator_ttl_s=2"};
  LocalCluster cluster(o);
  Status started = cluster.Start();
  ASSERT_TRUE(started.ok()) << started.ToString();
  // Registered before the ready line that Start waited for.
  auto members = ListMembers(*client_, "/tessera/job");
  ASSERT_TRUE(members.ok()) << members.status().ToString();
  ASSERT_EQ(members->size(), 2u);
  EXPECT_EQ((*members)[0].id, "server-0");
  EXPECT_EQ((*members)[0].address, cluster.endpoints()[0]);
  EXPECT_EQ((*members)[1].id, "server-1");
  EXPECT_EQ((*members)[1].address, cluster.endpoints()[1]);

  // SIGTERM: deregistered before the process exits.
  EXPECT_EQ(cluster.Stop(0), 0);
  EXPECT_EQ(Ids(*client_, "/tessera/job"), std::vector<std::string>{"server-1"});

  // kill -9: gone when its lease runs out.
  cluster.Kill(1);
  const auto killed = std::chrono::steady_clock::now();
  ASSERT_TRUE(WaitFor([&] { return Ids(*client_, "/tessera/job").empty(); }, seconds(30)));
  std::printf("killed tessera-server left the members after %.0f ms (TTL 2 s)\n", MsSince(killed));

  // A restarted server registers again under its id.
  ASSERT_TRUE(cluster.Restart(0).ok());
  EXPECT_EQ(Ids(*client_, "/tessera/job"), std::vector<std::string>{"server-0"});
}

// A server whose lease is lost (revoked here: what an expiry under load or a pause looks like
// to it) registers again under a new lease and the same id, so the fail-over watchers see it
// again; it keeps serving meanwhile.
TEST_F(EtcdTest, AServerWhoseLeaseIsLostRegistersAgain) {
  LocalClusterOptions o = Servers(1);
  o.extra_flags = {"--coordinator=" + etcd_.url("tessera/job"), "--coordinator_ttl_s=2"};
  LocalCluster cluster(o);
  Status started = cluster.Start();
  ASSERT_TRUE(started.ok()) << started.ToString();
  auto lease_of_server = [&]() -> int64_t {
    auto members = ListMembers(*client_, "/tessera/job");
    if (!members.ok() || members->size() != 1 || (*members)[0].id != "server-0") return 0;
    return (*members)[0].lease;
  };
  for (int round = 0; round < 2; ++round) {
    const int64_t lease = lease_of_server();
    ASSERT_NE(lease, 0);
    ASSERT_TRUE(client_->RevokeLease(lease).ok());
    ASSERT_TRUE(WaitFor(
        [&] {
          const int64_t now = lease_of_server();
          return now != 0 && now != lease;
        },
        seconds(30)))
        << "server-0 never registered again after losing lease " << lease << " (round "
        << round << ")";
  }
  auto members = ListMembers(*client_, "/tessera/job");
  ASSERT_TRUE(members.ok());
  EXPECT_EQ((*members)[0].address, cluster.endpoints()[0]);
  // SIGTERM: the registration made again is the one deregistered.
  EXPECT_EQ(cluster.Stop(0), 0);
  EXPECT_TRUE(Ids(*client_, "/tessera/job").empty());
}

// A server whose id a fail-over retired while its lease was lost registers again and says
// loudly that it owns no slots until a scale takes it in again.
TEST_F(EtcdTest, AServerRetiredWhileItsLeaseWasLostSaysSo) {
  LocalClusterOptions o = Servers(2);
  o.extra_flags = {"--coordinator=" + etcd_.url("tessera/job"), "--coordinator_ttl_s=2"};
  LocalCluster cluster(o);
  Status started = cluster.Start();
  ASSERT_TRUE(started.ok()) << started.ToString();
  // The map a fail-over leaves: server 0 retired, everything on server 1.
  ClusterMap map = ClusterMap::Uniform({{"server-0", ""}, {"server-1", cluster.endpoints()[1]}});
  map.primary.assign(kNumSlots, 1);
  map.dense_servers = 1;
  map.dense_primary = {1};
  ASSERT_TRUE(SlotMapStore(client_.get(), "/tessera/job").Create(map).ok());
  auto members = ListMembers(*client_, "/tessera/job");
  ASSERT_TRUE(members.ok() && members->size() == 2) << members.status().ToString();
  const int64_t lease = (*members)[0].lease;
  ASSERT_TRUE(client_->RevokeLease(lease).ok());
  std::string log;
  ASSERT_TRUE(WaitFor(
      [&] {
        std::ifstream in(cluster.log_path(0));
        log.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
        return log.find("server 0 was retired from the cluster map (version 1) while its lease "
                        "was lost") != std::string::npos;
      },
      seconds(30)))
      << log;
  EXPECT_NE(log.find("registered again as server-0"), std::string::npos) << log;
  EXPECT_EQ(Ids(*client_, "/tessera/job"), (std::vector<std::string>{"server-0", "server-1"}));
}

TEST(ServerCoordinatorFlag, MalformedUrlExits2SayingWhy) {
  std::string out;
  const int rc = RunCommand(
      {TESSERA_SERVER_BINARY, "--cluster=tcp://127.0.0.1:1", "--coordinator=etcd://127.0.0.1:2379"},
      &out);
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("--coordinator"), std::string::npos) << out;
  EXPECT_NE(out.find("no /PREFIX"), std::string::npos) << out;
}

TEST(ServerCoordinatorFlag, AbsentEtcdExits1SayingWhy) {
  const uint16_t nothing = PickFreePort();
  const std::string endpoint = "tcp://127.0.0.1:" + std::to_string(PickFreePort());
  std::string out;
  const auto start = std::chrono::steady_clock::now();
  const int rc = RunCommand({TESSERA_SERVER_BINARY, "--cluster=" + endpoint,
                             "--coordinator=etcd://127.0.0.1:" + std::to_string(nothing) + "/p"},
                            &out);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("cannot register"), std::string::npos) << out;
  EXPECT_NE(out.find("etcd 127.0.0.1:" + std::to_string(nothing)), std::string::npos) << out;
  EXPECT_EQ(out.find("tessera-server ready"), std::string::npos) << out;
  std::printf("absent etcd: exit %d after %.0f ms\n", rc, MsSince(start));
}

}  // namespace
}  // namespace tessera::testing
