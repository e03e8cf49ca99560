// The parts of tessera_coord that need no etcd: the --coordinator URL, the cluster map record
// and its JSON, and the gateway's JSON conventions. tests/elastic/ runs the rest against etcd.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>

#include "ps/coord/cluster_map.h"
#include "ps/coord/coordinator_url.h"
#include "ps/coord/etcd_json_internal.h"

namespace tessera {
namespace {

TEST(CoordinatorUrl, ParsesHostPortAndPrefix) {
  auto u = CoordinatorUrl::Parse("etcd://127.0.0.1:2379/tessera/job-1");
  ASSERT_TRUE(u.ok()) << u.status().ToString();
  EXPECT_EQ(u->host, "127.0.0.1");
  EXPECT_EQ(u->port, 2379);
  EXPECT_EQ(u->prefix, "/tessera/job-1");
  EXPECT_EQ(u->ToString(), "etcd://127.0.0.1:2379/tessera/job-1");
  auto l = CoordinatorUrl::Parse("etcd://localhost:1/a");
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_EQ(l->etcd_options(250).timeout_ms, 250);
}

TEST(CoordinatorUrl, RefusesMalformedUrlsSayingWhy) {
  const std::pair<const char*, const char*> cases[] = {
      {"http://127.0.0.1:2379/p", "scheme"},
      {"etcd://127.0.0.1:2379", "no /PREFIX"},
      {"etcd://127.0.0.1/p", "no :PORT"},
      {"etcd://:2379/p", "empty host"},
      {"etcd://127.0.0.1:0/p", "port"},
      {"etcd://127.0.0.1:65536/p", "port"},
      {"etcd://127.0.0.1:23x9/p", "port"},
      {"etcd://127.0.0.1:2379/", "empty PREFIX"},
      {"etcd://127.0.0.1:2379/a//b", "1..128"},
      {"etcd://127.0.0.1:2379/a/", "ends with '/'"},
      {"etcd://127.0.0.1:2379/a/../b", "not allowed"},
      {"etcd://127.0.0.1:2379/a b", "outside"},
      {"etcd://us er@h:1/p", "USER"},
      {"etcd://@h:1/p", "USER"},
      {"", "scheme"},
  };
  for (const auto& [url, why] : cases) {
    auto r = CoordinatorUrl::Parse(url);
    ASSERT_FALSE(r.ok()) << url;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << url;
    EXPECT_NE(r.status().message().find(why), std::string::npos)
        << url << " -> " << r.status().ToString();
    EXPECT_NE(r.status().message().find("etcd://HOST:PORT/PREFIX"), std::string::npos);
  }
}

// A file holding `text` in the test's temporary directory; its path.
std::string WriteFile(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "/" + name;
  FILE* f = std::fopen(path.c_str(), "w");
  EXPECT_NE(f, nullptr) << path;
  if (f != nullptr) {
    std::fputs(text.c_str(), f);
    std::fclose(f);
  }
  return path;
}

TEST(CoordinatorUrl, UserReadsThePasswordFileTheEnvironmentNames) {
  ::unsetenv(kEtcdPasswordFileEnv);
  auto unset = CoordinatorUrl::Parse("etcd://tessera@127.0.0.1:2379/job");
  ASSERT_FALSE(unset.ok());
  EXPECT_EQ(unset.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(unset.status().message().find(kEtcdPasswordFileEnv), std::string::npos)
      << unset.status().ToString();

  ::setenv(kEtcdPasswordFileEnv, WriteFile("etcd-pw", "s3cret\n").c_str(), 1);
  auto u = CoordinatorUrl::Parse("etcd://tessera@127.0.0.1:2379/job");
  ASSERT_TRUE(u.ok()) << u.status().ToString();
  EXPECT_EQ(u->user, "tessera");
  EXPECT_EQ(u->password, "s3cret");  // the trailing newline dropped
  EXPECT_EQ(u->host, "127.0.0.1");
  EXPECT_EQ(u->ToString(), "etcd://tessera@127.0.0.1:2379/job");
  EXPECT_EQ(u->etcd_options().user, "tessera");
  EXPECT_EQ(u->etcd_options().password, "s3cret");
  // Without a user the file is not read.
  EXPECT_TRUE(CoordinatorUrl::Parse("etcd://127.0.0.1:2379/job")->password.empty());

  const std::pair<std::string, const char*> bad[] = {
      {WriteFile("etcd-pw-empty", "\n"), "is empty"},
      {WriteFile("etcd-pw-big", std::string(5000, 'x')), "etcd password file"},
      {::testing::TempDir() + "/etcd-pw-missing", "etcd password file"},
      {::testing::TempDir(), "etcd password file"},  // a directory
  };
  for (const auto& [path, why] : bad) {
    ::setenv(kEtcdPasswordFileEnv, path.c_str(), 1);
    auto r = CoordinatorUrl::Parse("etcd://tessera@127.0.0.1:2379/job");
    ASSERT_FALSE(r.ok()) << path;
    EXPECT_NE(r.status().message().find(why), std::string::npos) << r.status().ToString();
  }
  ::unsetenv(kEtcdPasswordFileEnv);
}

ClusterMap ThreeServers() {
  return ClusterMap::Uniform({{"s0", "tcp://127.0.0.1:7000"},
                              {"s1", "tcp://127.0.0.1:7001"},
                              {"s2", "tcp://127.0.0.1:7002"}});
}

TEST(ClusterMap, UniformMatchesSlotMapUniform) {
  ClusterMap m = ThreeServers();
  ASSERT_TRUE(m.Validate().ok()) << m.Validate().ToString();
  auto routing = m.PrimaryMap();
  ASSERT_TRUE(routing.ok());
  EXPECT_EQ(routing->owners(), SlotMap::Uniform(3).owners());
  EXPECT_EQ(routing->num_servers(), 3u);
}

TEST(ClusterMap, RecordRoundTripsAndIsCompact) {
  ClusterMap m = ThreeServers();
  m.version = 7;
  for (uint32_t s = 0; s < kNumSlots; ++s)
    m.backup[s] = static_cast<uint16_t>((m.primary[s] + 1) % 3);
  m.primary[5] = 2;  // a lone slot moved: two more runs
  m.backup[5] = ClusterMap::kNoServer;
  auto text = EncodeClusterMap(m);
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  EXPECT_LT(text->size(), 400u) << *text;  // runs, not 16384 numbers
  auto back = DecodeClusterMap(*text);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, m);
}

TEST(ClusterMap, ValidateNamesTheBadSlot) {
  ClusterMap m = ThreeServers();
  m.backup[100] = m.primary[100];
  Status s = m.Validate();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("slot 100"), std::string::npos) << s.ToString();
  m = ThreeServers();
  m.servers[1].address.clear();  // retired, yet slots still point at it
  EXPECT_NE(m.Validate().message().find("primary 1"), std::string::npos);
  m = ThreeServers();
  m.version = 0;
  EXPECT_FALSE(m.Validate().ok());
  EXPECT_FALSE(EncodeClusterMap(m).ok());
}

// Resharding fields: importing sources and dense_servers round-trip; a record written before
// them decodes with nothing importing and dense tables over every server; bad values refused.
TEST(ClusterMap, ImportingAndDenseServersRoundTripAndAreChecked) {
  ClusterMap m = ThreeServers();
  m.version = 4;
  m.dense_servers = 2;
  for (uint32_t s = 100; s < 200; ++s) {
    m.importing[s] = m.primary[s];
    m.primary[s] = 2;
  }
  auto text = EncodeClusterMap(m);
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  auto back = DecodeClusterMap(*text);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, m);
  EXPECT_EQ(back->importing[150], 0);
  EXPECT_EQ(back->importing[250], ClusterMap::kNoServer);

  auto old = DecodeClusterMap(
      R"({"format":1,"version":3,"servers":[{"id":"a","address":"x"},{"id":"b","address":"y"}],)"
      R"("primary":[[8192,0],[8192,1]],"backup":[[16384,-1]]})");
  ASSERT_TRUE(old.ok()) << old.status().ToString();
  EXPECT_EQ(old->dense_servers, 2u);
  EXPECT_EQ(old->importing, std::vector<uint16_t>(kNumSlots, ClusterMap::kNoServer));

  ClusterMap bad = m;
  bad.importing[150] = bad.primary[150];  // a slot importing from itself, with no backup
  EXPECT_NE(bad.Validate().message().find("importing from its primary 2"), std::string::npos)
      << bad.Validate().ToString();
  bad.backup[150] = 0;  // a backup rebuild: the backup is filled from the primary
  EXPECT_TRUE(bad.Validate().ok()) << bad.Validate().ToString();
  bad.importing[150] = 7;
  EXPECT_NE(bad.Validate().message().find("importing from 7"), std::string::npos)
      << bad.Validate().ToString();
  bad = m;
  bad.dense_servers = 4;
  EXPECT_NE(bad.Validate().message().find("dense_servers 4"), std::string::npos);
  bad = ThreeServers();
  bad.dense_servers = 2;
  for (uint32_t s = 0; s < kNumSlots; ++s)
    bad.primary[s] = bad.primary[s] == 1 ? 2 : bad.primary[s];
  bad.servers[1].address.clear();  // a failed dense server, retired by a fail-over: valid
  EXPECT_TRUE(bad.Validate().ok()) << bad.Validate().ToString();
}

// Dense replication: dense_primary and dense_backup round-trip; a record without them (every
// record written before them) decodes with both empty and encodes back byte for byte.
TEST(ClusterMap, DensePartsRoundTripAndOlderRecordsAreUnchanged) {
  auto m = ClusterMap::Replicated({{"s0", "tcp://127.0.0.1:7000"},
                                   {"s1", "tcp://127.0.0.1:7001"},
                                   {"s2", "tcp://127.0.0.1:7002"}},
                                  2);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  m->version = 5;
  m->dense_primary[0] = 1;  // part 0 failed over to its backup
  m->dense_backup[0] = ClusterMap::kNoServer;
  auto text = EncodeClusterMap(*m);
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  EXPECT_NE(text->find(R"("dense_primary":[1,1,2])"), std::string::npos) << *text;
  EXPECT_NE(text->find(R"("dense_backup":[-1,2,0])"), std::string::npos) << *text;
  auto back = DecodeClusterMap(*text);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, *m);

  auto plain = EncodeClusterMap(ThreeServers());
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->find("dense_primary"), std::string::npos) << *plain;
  EXPECT_EQ(plain->find("dense_backup"), std::string::npos) << *plain;
  const std::string old =
      R"({"backup":[[16384,-1]],"dense_servers":2,"format":1,"importing":[[16384,-1]],)"
      R"("primary":[[8192,0],[8192,1]],"servers":[{"address":"x","id":"a"},)"
      R"({"address":"y","id":"b"}],"version":3})";
  auto decoded = DecodeClusterMap(old);
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  EXPECT_TRUE(decoded->dense_primary.empty());
  EXPECT_TRUE(decoded->dense_backup.empty());
  auto again = EncodeClusterMap(*decoded);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(*again, old);

  // Damaged dense lists: not ids, -1 as a primary, the wrong number of parts.
  const std::string head =
      R"({"format":1,"version":1,"servers":[{"id":"a","address":"x"},{"id":"b","address":"y"}],)"
      R"("primary":[[16384,0]],"backup":[[16384,-1]],"dense_servers":2,)";
  for (const char* tail :
       {R"("dense_primary":[0,"1"]})", R"("dense_primary":[0,-1]})", R"("dense_primary":{}})",
        R"("dense_backup":[1,-2]})", R"("dense_backup":[1,70000]})", R"("dense_primary":[0]})",
        R"("dense_backup":[1,0,1]})"}) {
    EXPECT_EQ(DecodeClusterMap(head + tail).status().code(), StatusCode::kCorruption) << tail;
  }
  auto good = DecodeClusterMap(head + R"("dense_primary":[1,0],"dense_backup":[-1,1]})");
  ASSERT_TRUE(good.ok()) << good.status().ToString();
  EXPECT_EQ(good->dense_backup, (std::vector<uint16_t>{ClusterMap::kNoServer, 1}));
}

// The replication factor is kept with the map: a replicated map that a double failure left
// without any backup is still replicated, after a round trip through its record; a record
// written before the field is read by its backups.
TEST(ClusterMap, ReplicationIsKeptWhenNoBackupIsLeft) {
  auto m = ClusterMap::Replicated({{"s0", "tcp://127.0.0.1:7000"},
                                   {"s1", "tcp://127.0.0.1:7001"},
                                   {"s2", "tcp://127.0.0.1:7002"}},
                                  2);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->replication, 2u);
  m->backup.assign(kNumSlots, ClusterMap::kNoServer);
  m->dense_primary.clear();
  m->dense_backup.clear();
  EXPECT_TRUE(m->Replicated());
  auto text = EncodeClusterMap(*m);
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  EXPECT_NE(text->find(R"("replication":2)"), std::string::npos) << *text;
  auto back = DecodeClusterMap(*text);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, *m);
  EXPECT_TRUE(back->Replicated());
  EXPECT_FALSE(ThreeServers().Replicated());
  EXPECT_EQ(EncodeClusterMap(ThreeServers())->find("replication"), std::string::npos);

  const std::string head =
      R"({"format":1,"version":1,"servers":[{"id":"a","address":"x"},{"id":"b","address":"y"}],)"
      R"("primary":[[16384,0]],)";
  auto old = DecodeClusterMap(head + R"("backup":[[16383,-1],[1,1]]})");
  ASSERT_TRUE(old.ok()) << old.status().ToString();
  EXPECT_EQ(old->replication, 2u);
  auto plain = DecodeClusterMap(head + R"("backup":[[16384,-1]]})");
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  EXPECT_EQ(plain->replication, 1u);
  for (const char* bad : {R"("replication":3})", R"("replication":0})", R"("replication":"2"})"}) {
    EXPECT_EQ(DecodeClusterMap(head + R"("backup":[[16384,-1]],)" + bad).status().code(),
              StatusCode::kCorruption)
        << bad;
  }
}

TEST(ClusterMap, ValidateChecksDensePartsNamingThePart) {
  auto replicated = ClusterMap::Replicated({{"s0", "tcp://127.0.0.1:7000"},
                                            {"s1", "tcp://127.0.0.1:7001"},
                                            {"s2", "tcp://127.0.0.1:7002"}},
                                           2);
  ASSERT_TRUE(replicated.ok());
  const ClusterMap m = *replicated;
  ASSERT_TRUE(m.Validate().ok()) << m.Validate().ToString();
  const auto refused = [](const ClusterMap& bad, const std::string& why) {
    Status s = bad.Validate();
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << why;
    EXPECT_NE(s.message().find(why), std::string::npos) << s.ToString();
  };
  ClusterMap bad = m;
  bad.dense_primary.pop_back();
  refused(bad, "2 dense primaries, 3 dense backups and 0 dense importing entries, not 0 or 3");
  bad = m;
  bad.dense_backup.push_back(0);
  refused(bad, "3 dense primaries, 4 dense backups");
  bad = m;
  bad.dense_importing = {ClusterMap::kNoServer, 2, ClusterMap::kNoServer};  // part 1 moves from 2
  EXPECT_TRUE(bad.Validate().ok()) << bad.Validate().ToString();
  EXPECT_EQ(*DecodeClusterMap(*EncodeClusterMap(bad)), bad);
  bad.dense_importing[1] = 3;  // from no such server
  refused(bad, "dense part 1: moving from 3, which is not a server with an address");
  bad.servers.push_back({"s3", ""});  // from a retired one
  refused(bad, "dense part 1: moving from 3, which is not a server with an address");
  bad = m;
  bad.dense_importing = {ClusterMap::kNoServer, 1, ClusterMap::kNoServer};
  // A backup rebuild of part 1: valid, and it round-trips.
  EXPECT_TRUE(bad.Validate().ok()) << bad.Validate().ToString();
  EXPECT_EQ(*DecodeClusterMap(*EncodeClusterMap(bad)), bad);
  bad.dense_backup[1] = ClusterMap::kNoServer;  // filling no backup
  refused(bad, "dense part 1: importing from its primary 1 without a backup to fill");
  bad = m;
  bad.dense_primary[1] = 3;  // no such server
  refused(bad, "dense part 1: primary 3 is not a server with an address");
  bad = m;
  bad.dense_primary[2] = ClusterMap::kNoServer;
  refused(bad, "dense part 2: primary 65535");
  bad = m;
  bad.dense_backup[2] = 2;  // its own primary
  refused(bad, "dense part 2: backup 2 is not another server with an address");
  bad = m;
  bad.dense_backup[0] = 9;
  refused(bad, "dense part 0: backup 9");
  bad = m;
  bad.dense_primary.clear();  // part p on server p: its backup is still not p
  bad.dense_backup[1] = 1;
  refused(bad, "dense part 1: backup 1");
  // A retired server can be neither: slots moved off server 2, which is then retired.
  bad = m;
  for (uint32_t s = 0; s < kNumSlots; ++s) {
    if (bad.primary[s] == 2) bad.primary[s] = 0;
    bad.backup[s] = ClusterMap::kNoServer;
  }
  bad.servers[2].address.clear();
  bad.dense_backup = {1, 0, 0};
  bad.dense_primary = {0, 1, 1};
  ASSERT_TRUE(bad.Validate().ok()) << bad.Validate().ToString();
  bad.dense_primary[2] = 2;
  refused(bad, "dense part 2: primary 2");
  bad.dense_primary[2] = 1;
  bad.dense_backup[1] = 2;
  refused(bad, "dense part 1: backup 2");
  // Without dense lists a retired dense server is valid (a record of before them).
  bad.dense_primary.clear();
  bad.dense_backup.clear();
  EXPECT_TRUE(bad.Validate().ok()) << bad.Validate().ToString();
  // Empty lists with any dense_servers; kNoServer backups everywhere.
  ClusterMap none = m;
  none.dense_backup.assign(3, ClusterMap::kNoServer);
  EXPECT_TRUE(none.Validate().ok()) << none.Validate().ToString();
}

TEST(ClusterMap, DecodeRefusesDamagedRecords) {
  auto good = EncodeClusterMap(ThreeServers());
  ASSERT_TRUE(good.ok());
  const std::string bad[] = {
      "",
      "[]",
      "{\"format\":2}",
      good->substr(0, good->size() / 2),
      R"({"format":1,"version":1,"servers":[{"id":"a","address":"x"}],"primary":[[16383,0]],"backup":[[16384,-1]]})",
      R"({"format":1,"version":1,"servers":[{"id":"a","address":"x"}],"primary":[[16384,1]],"backup":[[16384,-1]]})",
      R"({"format":1,"version":1,"servers":[{"id":"a","address":"x"}],"primary":[[16384,0],[1,0]],"backup":[[16384,-1]]})",
      R"({"format":1,"version":-1,"servers":[{"id":"a","address":"x"}],"primary":[[16384,0]],"backup":[[16384,-1]]})",
      R"({"format":1,"version":1,"servers":[{"id":"a"}],"primary":[[16384,0]],"backup":[[16384,-1]]})",
      R"({"format":1,"version":1,"servers":[{"id":"a","address":"x"}],"primary":[[0,0],[16384,0]],"backup":[[16384,-1]]})",
  };
  for (const std::string& text : bad) {
    auto r = DecodeClusterMap(text);
    EXPECT_EQ(r.status().code(), StatusCode::kCorruption) << text;
  }
  auto one = DecodeClusterMap(
      R"({"format":1,"version":1,"servers":[{"id":"a","address":"x"}],"primary":[[16384,0]],"backup":[[16384,-1]]})");
  ASSERT_TRUE(one.ok()) << one.status().ToString();
}

TEST(EtcdJson, Int64FieldsAreStringsAndAbsentMeansZero) {
  auto j = nlohmann::json::parse(R"({"a":"12345678901234","b":7,"c":"x1","d":true})");
  EXPECT_EQ(*internal::Int64Field(j, "a"), 12345678901234);
  EXPECT_EQ(*internal::Int64Field(j, "b"), 7);
  EXPECT_EQ(*internal::Int64Field(j, "missing"), 0);
  EXPECT_EQ(internal::Int64Field(j, "c").status().code(), StatusCode::kCorruption);
  EXPECT_EQ(internal::Int64Field(j, "d").status().code(), StatusCode::kCorruption);
}

TEST(EtcdJson, ErrorBodiesBecomeStatusWithEtcdsMessage) {
  Status s = internal::HttpError(
      404, R"({"error":"etcdserver: requested lease not found","code":5})", "etcd h:1 /p");
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_NE(s.message().find("requested lease not found"), std::string::npos);
  EXPECT_NE(s.message().find("etcd h:1 /p"), std::string::npos);
  Status html = internal::HttpError(502, "<html>bad gateway</html>", "etcd h:1 /p");
  EXPECT_EQ(html.code(), StatusCode::kInternal);
  EXPECT_NE(html.message().find("HTTP 502"), std::string::npos);
}

TEST(EtcdClient, PrefixEndIsTheNextKeyAfterThePrefix) {
  EXPECT_EQ(EtcdClient::PrefixEnd("/a/"), "/a0");
  EXPECT_EQ(EtcdClient::PrefixEnd(std::string("a\xff", 2)), "b");
  EXPECT_EQ(EtcdClient::PrefixEnd(""), std::string(1, '\0'));
}

}  // namespace
}  // namespace tessera
