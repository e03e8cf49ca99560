// EtcdClient against a real etcd with authentication enabled (a root user and a user "tessera"
// with readwrite on /t/): calls, leases and watches with a token, wrong or missing
// credentials, and tokens that etcd forgets (expiry, restart) renewed without the caller noticing.
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <vector>

#include "ps/coord/coordinator_url.h"
#include "ps/coord/etcd_http_internal.h"
#include "ps/coord/etcd_json_internal.h"
#include "ps/coord/membership.h"
#include "tests/cluster_fixture.h"
#include "tests/elastic/etcd_fixture.h"

namespace tessera::testing {
namespace {

using nlohmann::json;
using std::chrono::seconds;

constexpr char kPassword[] = "tessera-pw-1";

class EtcdAuthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!EtcdProcess::Available()) GTEST_SKIP() << EtcdProcess::SkipMessage();
    // Simple tokens that etcd forgets after 2 s without use.
    etcd_.set_extra_args({"--auth-token=simple", "--auth-token-ttl=2"});
    Status s = etcd_.Start();
    ASSERT_TRUE(s.ok()) << s.ToString();
    EnableAuth();
  }

  void Admin(const char* path, const json& body) {
    auto r = internal::PostJson(etcd_.options(), path, body);
    ASSERT_TRUE(r.ok()) << path << ": " << r.status().ToString();
  }

  // What `etcdctl user add root; role add tessera; role grant-permission --prefix tessera
  // readwrite /t/; user add tessera; user grant-role tessera tessera; auth enable` does.
  void EnableAuth() {
    Admin("/v3/auth/user/add", {{"name", "root"}, {"password", "root-pw"}});
    Admin("/v3/auth/role/add", {{"name", "root"}});
    Admin("/v3/auth/user/grant", {{"user", "root"}, {"role", "root"}});
    Admin("/v3/auth/role/add", {{"name", "tessera"}});
    Admin("/v3/auth/role/grant",
          {{"name", "tessera"},
           {"perm",
            {{"permType", "READWRITE"},
             {"key", internal::Base64("/t/")},
             {"range_end", internal::Base64(EtcdClient::PrefixEnd("/t/"))}}}});
    Admin("/v3/auth/user/add", {{"name", "tessera"}, {"password", kPassword}});
    Admin("/v3/auth/user/grant", {{"user", "tessera"}, {"role", "tessera"}});
    Admin("/v3/auth/enable", json::object());
  }

  std::unique_ptr<EtcdClient> Client(const std::string& user, const std::string& password) {
    EtcdOptions o = etcd_.options();
    o.user = user;
    o.password = password;
    auto c = EtcdClient::Create(o);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? std::move(*c) : nullptr;
  }

  EtcdProcess etcd_;
};

struct Seen {
  std::mutex mu;
  std::vector<std::string> values;
  WatchCallback callback() {
    return [this](const WatchBatch& b) {
      std::lock_guard<std::mutex> lock(mu);
      for (const WatchEvent& e : b.events) values.push_back(e.kv.value);
    };
  }
  size_t size() {
    std::lock_guard<std::mutex> lock(mu);
    return values.size();
  }
};

TEST_F(EtcdAuthTest, RightPasswordPutsGetsLeasesAndWatches) {
  auto client = Client("tessera", kPassword);
  ASSERT_NE(client, nullptr);
  Seen seen;
  WatchOptions w;
  w.key = "/t/";
  w.prefix = true;
  auto watch = client->Watch(w, seen.callback());
  ASSERT_TRUE(watch.ok()) << watch.status().ToString();
  ASSERT_TRUE(WaitFor([&] { return (*watch)->connects() == 1; }, seconds(30)))
      << (*watch)->last_error().ToString();

  auto lease = client->GrantLease(30);
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  ASSERT_TRUE(client->Put("/t/a", "1", lease->id).ok());
  ASSERT_TRUE(client->Put("/t/b", "2").ok());
  auto a = client->Get("/t/a");
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_TRUE(a->has_value());
  EXPECT_EQ((*a)->lease, lease->id);
  auto ttl = client->KeepAlive(lease->id);
  ASSERT_TRUE(ttl.ok()) << ttl.status().ToString();
  EXPECT_GT(*ttl, 0);
  ASSERT_EQ(client->GetPrefix("/t/")->kvs.size(), 2u);
  ASSERT_TRUE(WaitFor([&] { return seen.size() >= 2; }, seconds(30)))
      << (*watch)->last_error().ToString();
  EXPECT_EQ(seen.values[0], "1");
  EXPECT_EQ(seen.values[1], "2");
  ASSERT_TRUE(client->RevokeLease(lease->id).ok());
  EXPECT_FALSE(client->Get("/t/a")->has_value());
  // The role covers /t/ only: etcd checks the token's user.
  auto outside = client->Put("/u", "x");
  ASSERT_FALSE(outside.ok());
  EXPECT_NE(outside.status().message().find("permission denied"), std::string::npos)
      << outside.status().ToString();
  EXPECT_EQ(client->authentications(), 1);
}

TEST_F(EtcdAuthTest, WrongPasswordFailsWithAClearError) {
  auto client = Client("tessera", "not-the-password");
  ASSERT_NE(client, nullptr);
  auto r = client->Put("/t/a", "1");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().ToString();
  EXPECT_NE(r.status().message().find("etcd authentication failed for user tessera"),
            std::string::npos)
      << r.status().ToString();
  EXPECT_EQ(r.status().message().find("not-the-password"), std::string::npos);
  // A watch says the same and does not deliver.
  Seen seen;
  WatchOptions w;
  w.key = "/t/a";
  auto watch = client->Watch(w, seen.callback());
  ASSERT_TRUE(watch.ok());
  ASSERT_TRUE(WaitFor(
      [&] {
        return (*watch)->last_error().message().find("authentication failed") != std::string::npos;
      },
      seconds(30)));
  EXPECT_EQ((*watch)->connects(), 0);
}

TEST_F(EtcdAuthTest, NoUserFailsWithAClearError) {
  auto client = Client("", "");
  ASSERT_NE(client, nullptr);
  auto r = client->Get("/t/a");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().ToString();
  EXPECT_NE(r.status().message().find("no etcd user was given"), std::string::npos)
      << r.status().ToString();
  EtcdOptions o = etcd_.options();
  o.password = "x";
  EXPECT_FALSE(EtcdClient::Create(o).ok());  // a password needs a user
}

TEST_F(EtcdAuthTest, ForgottenTokensAreRenewed) {
  auto client = Client("tessera", kPassword);
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->Put("/t/a", "1").ok());
  ASSERT_EQ(client->authentications(), 1);
  // Idle past --auth-token-ttl: etcd drops the token; the next call gets a new one.
  std::this_thread::sleep_for(seconds(4));
  auto r = client->Put("/t/a", "2");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(client->authentications(), 2);

  // A password change (to the same one) invalidates every token of the user at once, and a
  // restart of etcd then breaks the watch's stream: the watch and the calls go on. (A restart
  // alone forgets no token: etcd replays the authentications from its log.)
  Seen seen;
  WatchOptions w;
  w.key = "/t/a";
  w.reconnect_backoff_ms = 50;
  auto watch = client->Watch(w, seen.callback());
  ASSERT_TRUE(watch.ok());
  ASSERT_TRUE(WaitFor([&] { return (*watch)->connects() == 1; }, seconds(30)));
  const int64_t before = client->authentications();
  auto root = internal::PostJson(etcd_.options(), "/v3/auth/authenticate",
                                 {{"name", "root"}, {"password", "root-pw"}});
  ASSERT_TRUE(root.ok()) << root.status().ToString();
  auto changed = internal::PostJson(etcd_.options(), "/v3/auth/user/changepw",
                                    {{"name", "tessera"}, {"password", kPassword}},
                                    (*root)["token"].get<std::string>());
  ASSERT_TRUE(changed.ok()) << changed.status().ToString();
  ASSERT_TRUE(etcd_.Restart().ok());
  // The watch gets its own new token (no call ran since the restart).
  ASSERT_TRUE(WaitFor([&] { return (*watch)->connects() >= 2; }, seconds(30)))
      << (*watch)->last_error().ToString();
  EXPECT_EQ(client->authentications(), before + 1);
  auto lease = client->GrantLease(30);
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  ASSERT_TRUE(client->Put("/t/a", "3", lease->id).ok());
  ASSERT_TRUE(WaitFor([&] { return seen.size() >= 1; }, seconds(30)))
      << (*watch)->last_error().ToString();
  EXPECT_EQ(seen.values.back(), "3");
  EXPECT_EQ(client->authentications(), before + 1);  // the calls used the watch's token
}

// tessera-server --coordinator=etcd://tessera@...: the password from the file
// $TESSERA_ETCD_PASSWORD_FILE names; the server registers, serves, and deregisters on SIGTERM;
// tessera-ctl map init/show work as the same user and fail clearly with a wrong password.
TEST_F(EtcdAuthTest, ServerRegistersAsAnEtcdUser) {
  const std::string file = ::testing::TempDir() + "/etcd-password";
  FILE* f = std::fopen(file.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fprintf(f, "%s\n", kPassword);
  std::fclose(f);
  ::setenv(kEtcdPasswordFileEnv, file.c_str(), 1);  // the servers inherit it
  const std::string url =
      "etcd://tessera@127.0.0.1:" + std::to_string(etcd_.client_port()) + "/t/job";
  LocalClusterOptions o = Servers(1);
  o.extra_flags = {"--coordinator=" + url, "--coordinator_ttl_s=2"};
  LocalCluster cluster(o);
  Status started = cluster.Start();
  ASSERT_TRUE(started.ok()) << started.ToString();
  // tessera-ctl reads the same variable: it creates and shows the map as user tessera.
  std::string out;
  EXPECT_EQ(RunCommand({TESSERA_CTL_BINARY, "--coordinator=" + url, "map", "init",
                        "--servers=" + cluster.endpoints()[0]},
                       &out),
            0)
      << out;
  EXPECT_EQ(RunCommand({TESSERA_CTL_BINARY, "--coordinator=" + url, "map", "show"}, &out), 0)
      << out;
  EXPECT_NE(out.find(cluster.endpoints()[0]), std::string::npos) << out;
  // A wrong password: the clear error, at once.
  f = std::fopen(file.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fprintf(f, "wrong\n");
  std::fclose(f);
  EXPECT_NE(RunCommand({TESSERA_CTL_BINARY, "--coordinator=" + url, "map", "show"}, &out), 0);
  EXPECT_NE(out.find("etcd authentication failed for user tessera"), std::string::npos) << out;
  ::unsetenv(kEtcdPasswordFileEnv);
  auto client = Client("tessera", kPassword);
  ASSERT_NE(client, nullptr);
  auto members = ListMembers(*client, "/t/job");
  ASSERT_TRUE(members.ok()) << members.status().ToString();
  ASSERT_EQ(members->size(), 1u);
  EXPECT_EQ((*members)[0].id, "server-0");
  EXPECT_EQ((*members)[0].address, cluster.endpoints()[0]);
  auto admin = AdminClient(cluster.endpoints());
  ASSERT_NE(admin, nullptr);
  auto stats = admin->ServerStats(0);
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  EXPECT_EQ(cluster.Stop(0), 0);
  auto after = ListMembers(*client, "/t/job");
  ASSERT_TRUE(after.ok()) << after.status().ToString();
  EXPECT_TRUE(after->empty());
}

}  // namespace
}  // namespace tessera::testing
