// Online resharding (docs/elasticity.md): `tessera-ctl scale` moves slots between real
// tessera-server processes that follow the cluster map in a real etcd, while a BSP training
// loop goes on. The loop's parameters must end bit-identical to the same loop on a fixed
// 2-server cluster: no push lost, none applied twice, optimizer state and step counts moved
// with the rows.
#include <chrono>
#include <thread>

#include "tests/elastic/reshard_fixture.h"

namespace tessera::testing {
namespace {

using std::chrono::seconds;

// The run: the server tier goes 2 -> 3 -> 2 while the loop trains; the result is
// bit-identical to the same number of steps on a fixed 2-server cluster.
TEST_F(ReshardTest, TwoToThreeToTwoWhileTrainingIsBitIdenticalToAFixedCluster) {
  auto client = TrainingClient();
  ASSERT_NE(client, nullptr);
  Trainer trainer(*client);
  ClusterMap up;
  const uint64_t steps = TrainThroughTwoToThreeToTwo(trainer, *client, &up);
  ASSERT_FALSE(HasFailure());
  ExpectSameAsFixedCluster(trainer, steps, "after 2 -> 3 -> 2");
}

class ReplicatedReshardTest : public ReshardTest {
 protected:
  // A short lease: the fail-over at the end comes 2 s after the kill.
  void SetUp() override { StartCluster("--replication=2", {"--coordinator_ttl_s=2"}); }
};

// Every slot backed up by a server of `servers` other than its primary, each of them backing up
// its share (within 1%).
void ExpectBackedUpEvenly(const ClusterMap& m, const std::vector<uint16_t>& servers,
                          const std::string& what) {
  std::map<uint16_t, uint32_t> count;
  for (uint32_t slot = 0; slot < kNumSlots; ++slot) {
    ASSERT_NE(m.backup[slot], ClusterMap::kNoServer) << what << ": slot " << slot;
    ASSERT_NE(m.backup[slot], m.primary[slot]) << what << ": slot " << slot;
    ASSERT_EQ(m.importing[slot], ClusterMap::kNoServer) << what << ": slot " << slot;
    ++count[m.backup[slot]];
  }
  for (uint16_t id : servers) {
    EXPECT_NEAR(count[id], kNumSlots / servers.size(), kNumSlots / 100)
        << what << ": server " << id << " backs up " << count[id] << " slots";
  }
  EXPECT_EQ(count.size(), servers.size()) << what;
}

// The same run with --replication=2: each batch of a move keeps or regains one backup per
// slot, the loop ends bit-identical to a fixed cluster, and the backups left are exact: after
// kill -9 of server 0 its backups (all on server 1), promoted, read the same floats.
TEST_F(ReplicatedReshardTest, TwoToThreeToTwoKeepsEverySlotBackedUpAndExact) {
  auto client = TrainingClient();
  ASSERT_NE(client, nullptr);
  Trainer trainer(*client);
  ClusterMap up;
  const uint64_t steps = TrainThroughTwoToThreeToTwo(trainer, *client, &up);
  ASSERT_FALSE(HasFailure());
  ExpectBackedUpEvenly(up, {0, 1, 2}, "after scale 3");
  ExpectBackedUpEvenly(LoadMap(), {0, 1}, "after scale 2");
  const Params fixed = ExpectSameAsFixedCluster(trainer, steps, "after 2 -> 3 -> 2");

  ExpectExactAfterKillingServerZero(trainer, fixed, 1);
}

// A dead server replaced while the loop trains: kill -9 of server 1 leaves server 0 alone with
// every slot and dense part and nothing to back them up; `scale 2` then brings in server 2
// (registered, not in the map: the replacement, under the next id): half the slots and one
// dense part move to it, and every slot and dense part has a backup again. The loop ends bit-identical to a fixed
// cluster, and after kill -9 of server 0 the promoted copies on server 2 read the same.
TEST_F(ReplicatedReshardTest, ADeadServerIsReplacedWhileTrainingAndEverythingIsBackedUpAgain) {
  auto client = TrainingClient();
  ASSERT_NE(client, nullptr);
  Trainer trainer(*client);
  std::string out;
  const uint64_t step = TrainThroughTheLossOfServerOne(trainer, /*restart=*/false, &out);
  ASSERT_FALSE(HasFailure());
  std::printf("replaced server 1 by server 2 in %llu steps: %s",
              static_cast<unsigned long long>(step), out.c_str());
  const ClusterMap m = LoadMap();
  ExpectBackedUpEvenly(m, {0, 2}, "after scale 2");
  // Both dense parts were on server 0 after the fail-over; the scale gave one to server 2,
  // and each part a backup on the other server.
  EXPECT_EQ(m.dense_primary, (std::vector<uint16_t>{0, 2}));
  EXPECT_EQ(m.dense_backup, (std::vector<uint16_t>{2, 0}));
  const Params fixed =
      ExpectSameAsFixedCluster(trainer, step, "through the loss and replacement of server 1");
  ExpectExactAfterKillingServerZero(trainer, fixed, 2);
}

// A server restarted under its old id (a StatefulSet pod keeps its ordinal and its volume):
// kill -9 of server 1 is failed over and its id retired; the same process restarted on its
// data dir registers again, and `scale 2` gives the id back its address and its share of the
// slots while the loop trains. Clients connect to it again; the loop ends bit-identical to a
// fixed cluster, and after kill -9 of server 0 the rows read from server 1 are still exact.
TEST_F(ReplicatedReshardTest, AServerRestartedUnderItsIdIsTakenBackWhileTraining) {
  auto client = TrainingClient();
  ASSERT_NE(client, nullptr);
  Trainer trainer(*client);
  std::string out;
  const uint64_t step = TrainThroughTheLossOfServerOne(trainer, /*restart=*/true, &out);
  ASSERT_FALSE(HasFailure());
  std::printf("server 1 taken back in %llu steps: %s", static_cast<unsigned long long>(step),
              out.c_str());
  const ClusterMap m = LoadMap();
  EXPECT_FALSE(m.servers[1].address.empty());
  EXPECT_TRUE(m.servers.size() < 3 || m.servers[2].address.empty()) << "server 2 was not asked for";
  ExpectBackedUpEvenly(m, {0, 1}, "after scale 2");
  EXPECT_GT(Stat(1, "push_keys"), 0) << "the restarted server 1 took no push";
  const Params fixed =
      ExpectSameAsFixedCluster(trainer, step, "through the restart of server 1 under its id");
  ExpectExactAfterKillingServerZero(trainer, fixed, 1);
}

class AutoJoinTest : public ReshardTest {
 protected:
  void SetUp() override {
    StartCluster("--replication=2", {"--coordinator_ttl_s=2", "--auto_join"});
  }
};

// --auto_join: server 2, registered under the next unused id of a map of two, is taken in by
// the lowest live server (a scale to three, no tessera-ctl) while the loop trains; the loop
// ends bit-identical to a fixed cluster of two.
TEST_F(AutoJoinTest, AServerRegisteredUnderTheNextIdIsTakenInWhileTraining) {
  auto client = TrainingClient();
  ASSERT_NE(client, nullptr);
  Trainer trainer(*client);
  auto joined = [&] {
    const ClusterMap m = LoadMap();
    if (m.servers.size() < 3 || m.servers[2].address.empty()) return false;
    uint32_t on2 = 0;
    for (uint32_t slot = 0; slot < kNumSlots; ++slot) {
      if (m.importing[slot] != ClusterMap::kNoServer || m.backup[slot] == ClusterMap::kNoServer) {
        return false;
      }
      on2 += m.primary[slot] == 2;
    }
    return on2 >= kNumSlots / 3;
  };
  uint64_t step = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (; step < 30 || !joined(); ++step) {
    ASSERT_TRUE(WithinScaleWait(t0)) << "server 2 was not taken in";
    Status s = trainer.Step(step);
    ASSERT_TRUE(s.ok()) << "step " << step << ": " << s.ToString();
  }
  std::printf("server 2 taken in within %llu steps\n", static_cast<unsigned long long>(step));
  ExpectBackedUpEvenly(LoadMap(), {0, 1, 2}, "after the join");
  EXPECT_GT(Stat(2, "push_keys"), 0);
  ExpectSameAsFixedCluster(trainer, step, "through the join of server 2");
}

// An id a scale-down retired (its server drained, still registered: a StatefulSet pod that
// stays, or comes back under its ordinal) is given its address back by the next scale-up
// instead of a new id; clients that retired it connect to it again, and the loop ends
// bit-identical to a fixed cluster.
TEST_F(ReshardTest, AnIdRetiredByAScaleDownIsTakenBackByTheNextScaleUp) {
  auto client = TrainingClient();
  ASSERT_NE(client, nullptr);
  Trainer trainer(*client);
  uint64_t step = 0;
  auto train = [&](int n) {
    for (int i = 0; i < n; ++i, ++step) {
      Status s = trainer.Step(step);
      ASSERT_TRUE(s.ok()) << "step " << step << ": " << s.ToString();
    }
  };
  std::string out;
  train(10);
  ASSERT_EQ(Scale(3, &out), 0) << out;
  train(5);
  ASSERT_EQ(Scale(2, &out), 0) << out;
  ASSERT_TRUE(Retired(2));
  train(5);
  const int64_t before = Stat(2, "push_keys");
  ASSERT_EQ(Scale(3, &out), 0) << out;
  train(10);
  const ClusterMap m = LoadMap();
  EXPECT_EQ(m.servers.size(), 3u) << "a new id was added instead";
  EXPECT_FALSE(Retired(2));
  EXPECT_EQ(std::count(m.primary.begin(), m.primary.end(), 2), kNumSlots / 3);
  EXPECT_GT(Stat(2, "push_keys"), before) << "server 2 took no push after it was taken back";
  ExpectSameAsFixedCluster(trainer, step, "through 2 -> 3 -> 2 -> 3");
}

class DrainTest : public ReshardTest {
 protected:
  void SetUp() override { StartCluster("", {"--drain_on_stop"}); }
};

// --drain_on_stop: SIGTERM of the map's highest server (what kubectl scale down of a
// StatefulSet sends) moves its slots to the others before it exits, while the loop trains
// (without a backup, a server leaving undrained would take its rows with it); the loop ends
// bit-identical to a fixed cluster of two.
TEST_F(DrainTest, ASigtermedHighestServerDrainsItselfWhileTraining) {
  auto client = TrainingClient();
  ASSERT_NE(client, nullptr);
  Trainer trainer(*client);
  uint64_t step = 0;
  auto train = [&] {
    Status s = trainer.Step(step++);
    EXPECT_TRUE(s.ok()) << "step " << step - 1 << ": " << s.ToString();
  };
  std::string out;
  for (int i = 0; i < 10; ++i) train();
  ASSERT_EQ(Scale(3, &out), 0) << out;
  for (int i = 0; i < 5; ++i) train();
  EXPECT_EQ(TrainWhileStopping(trainer, &step, 2), 0);
  ASSERT_TRUE(Retired(2));
  for (int i = 0; i < 5; ++i) train();
  const std::string line = DrainedLine(2);
  ASSERT_FALSE(line.empty());
  std::printf("%s\n", line.c_str());
  ExpectSameAsFixedCluster(trainer, step, "through 2 -> 3 and a drain on SIGTERM");
}

// The training job itself (tessera-worker --coordinator, BSP) rides through 2 -> 3 -> 2: it
// keeps training while slots move, server 2 serves its share meanwhile, and the job ends well.
TEST_F(ReshardTest, WorkerTrainsThroughTwoToThreeToTwo) {
  ChildProcess worker;
  ASSERT_TRUE(worker.Start({TESSERA_WORKER_BINARY, "--coordinator=" + url_, "--job=reshard",
                            "--consistency=bsp", "--train_samples=2000000",
                            "--test_samples=2000", "--batch_size=128", "--max_steps=4000",
                            "--synthetic_max_cardinality=20000", "--bottom_mlp=8",
                            "--top_mlp=8", "--request_timeout_ms=10000", "--retry_for_ms=60000",
                            "--out_dir=" + cluster_->dir()},
                           cluster_->dir() + "/worker.log"));
  ASSERT_TRUE(WaitFor([&] { return Stat(0, "pushes") > 20 && Stat(1, "pushes") > 20; },
                      seconds(60)))
      << worker.Output();
  std::string up, down;
  ASSERT_EQ(Scale(3, &up), 0) << up;
  const int64_t before = Stat(2, "pushes");
  ASSERT_TRUE(WaitFor([&] { return Stat(2, "pushes") > before + 20; }, seconds(60)))
      << "server 2 took no pushes after the scale: " << worker.Output();
  ASSERT_EQ(Scale(2, &down), 0) << down;
  ASSERT_TRUE(worker.Running())
      << "the worker ended before the tier was back at 2 servers; raise --max_steps: "
      << worker.Output();
  ASSERT_EQ(worker.Wait(600), 0) << worker.Output();
  EXPECT_NE(worker.Output().find("4000 steps"), std::string::npos) << worker.Output();
  std::printf("scale 3: %sscale 2: %s", up.c_str(), down.c_str());
}

// The resharding ops refuse what they must, say why, change nothing, and the server goes on
// serving; tessera-ctl scale says what is missing.
TEST_F(ReshardTest, SlotOpsRefuseBadRequestsAndScaleNamesAMissingServer) {
  using Step = Client::SlotImportStep;
  const std::vector<uint32_t> owned = {0, 1, 2};  // server 0's at v1
  // Server 0 still owns these: nothing to export or drop.
  auto e = admin_->ExportSlots(0, 1, owned, {});
  EXPECT_EQ(e.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(e.status().message().find("has not been given up"), std::string::npos)
      << e.status().ToString();
  EXPECT_EQ(admin_->DropSlots(0, 1, owned).code(), StatusCode::kFailedPrecondition);
  // A version the server has not seen: Unavailable, to be asked again.
  EXPECT_EQ(admin_->ExportSlots(1, 9, owned, {}).status().code(), StatusCode::kUnavailable);
  // Not importing anything: rows and done are refused.
  for (Step step : {Step::kRows, Step::kDone}) {
    Status s = admin_->ImportSlots(1, 1, owned, step, "");
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
    EXPECT_NE(s.message().find("is not being copied to server 1"), std::string::npos)
        << s.ToString();
  }
  // The specs only (no slots) are fine, and damaged rows are not.
  auto specs = admin_->ExportSlots(0, 1, {}, {});
  ASSERT_TRUE(specs.ok()) << specs.status().ToString();
  EXPECT_TRUE(admin_->ImportSlots(2, 0, {}, Step::kRows, *specs).ok());
  EXPECT_EQ(admin_->ImportSlots(2, 0, {}, Step::kRows, "R1234").code(), StatusCode::kCorruption);

  // Malformed frames: a slots frame that is not u32s, a slot past the last, a bad step.
  RawPeer peer(cluster_->endpoints()[1]);
  Header h;
  h.op = Op::kSlotExport;
  h.map_version = 1;
  Header r = peer.Call(h, {std::string(5, '\0')});
  EXPECT_EQ(r.status, StatusCode::kInvalidArgument) << r.message;
  const uint32_t past = kNumSlots;
  r = peer.Call(h, {std::string(reinterpret_cast<const char*>(&past), 4)});
  EXPECT_EQ(r.status, StatusCode::kInvalidArgument) << r.message;
  EXPECT_NE(r.message.find("16384"), std::string::npos) << r.message;
  r = peer.Call(h, {});
  EXPECT_EQ(r.status, StatusCode::kInvalidArgument) << r.message;
  h.op = Op::kSlotImport;
  h.count = 7;
  r = peer.Call(h, {std::string()});
  EXPECT_EQ(r.status, StatusCode::kInvalidArgument) << r.message;

  // A server that follows no map refuses them all.
  LocalCluster plain(Servers(1));
  ASSERT_TRUE(plain.Start().ok());
  RawPeer plain_peer(plain.endpoints()[0]);
  h.op = Op::kSlotExport;
  h.count = 0;
  r = plain_peer.Call(h, {std::string()});
  EXPECT_EQ(r.status, StatusCode::kFailedPrecondition) << r.message;
  EXPECT_NE(r.message.find("follows no cluster map"), std::string::npos) << r.message;

  // The servers still serve.
  auto source = EtcdClusterMapSource::Create(*CoordinatorUrl::Parse(url_));
  ASSERT_TRUE(source.ok());
  auto client = Client::Create(TrainingOptions(), std::move(*source));
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  Trainer trainer(**client);
  ASSERT_TRUE(trainer.Step(0).ok());

  // Four servers need server id 3 registered: the command says how to start it, and nothing
  // moved (the map is still at version 1).
  std::string out;
  EXPECT_EQ(Scale(4, &out), 1) << out;
  EXPECT_NE(out.find("--rank=3"), std::string::npos) << out;
  std::string show;
  ASSERT_EQ(RunCommand({TESSERA_CTL_BINARY, "map", "show", "--coordinator=" + url_}, &show), 0);
  EXPECT_NE(show.find("version 1\n"), std::string::npos) << show;
  EXPECT_EQ(Scale(0, &out), 2) << out;
}

// A slot marked in (SlotImport done) takes pushes on its new owner: a controller that runs the
// move again (it died before settling) gets AlreadyExists instead of copying the old rows over
// them, also after the new owner restarts; the next scale settles the move without a copy.
TEST_F(ReshardTest, ASlotMarkedInIsNeverCopiedOverAndAScaleSettlesIt) {
  using Step = Client::SlotImportStep;
  SlotMapStore store(client_.get(), "/" + std::string(kPrefix));
  auto m = store.Load();
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  const uint32_t slot = 0;  // server 0's at v1
  ClusterMap next = *m;
  next.version = 2;
  next.primary[slot] = 1;
  next.importing[slot] = 0;
  ASSERT_TRUE(store.CompareAndSwap(1, next).ok());
  ASSERT_TRUE(WaitFor([&] { return Stat(0, "map_version") == 2 && Stat(1, "map_version") == 2; },
                      seconds(30)));
  const std::vector<uint32_t> slots = {slot};
  auto rows = admin_->ExportSlots(0, 2, slots, {});
  ASSERT_TRUE(rows.ok()) << rows.status().ToString();
  ASSERT_TRUE(admin_->ImportSlots(1, 2, slots, Step::kRows, *rows).ok());
  ASSERT_TRUE(admin_->ImportSlots(1, 2, slots, Step::kDone).ok());
  Status again = admin_->ImportSlots(1, 2, slots, Step::kRows, *rows);
  EXPECT_EQ(again.code(), StatusCode::kAlreadyExists) << again.ToString();
  // Still so after a restart of the new owner (its RocksDB keeps the mark).
  EXPECT_EQ(cluster_->Stop(1), 0);
  ASSERT_TRUE(cluster_->Restart(1).ok());
  ASSERT_TRUE(WaitFor([&] { return Stat(1, "map_version") == 2; }, seconds(30)));
  again = admin_->ImportSlots(1, 2, slots, Step::kRows, *rows);
  EXPECT_EQ(again.code(), StatusCode::kAlreadyExists) << again.ToString();
  // scale 2 finds the flipped slot, skips its copy, settles it (importing cleared) and drops
  // it from server 0.
  std::string out;
  ASSERT_EQ(Scale(2, &out), 0) << out;
  auto settled = store.Load();
  ASSERT_TRUE(settled.ok());
  EXPECT_EQ(settled->importing[slot], ClusterMap::kNoServer);
  EXPECT_EQ(settled->primary[slot], 1);
}

// The job's metadata records (Client::PutMeta goes to every server of the map) reach a server
// a scale adds: the records written before it joined are copied to it with the table specs,
// replacing what its data dir holds from an earlier stay, but not a record a client wrote to
// this server process itself (newer than the copy).
TEST_F(ReshardTest, AJoiningServerLearnsTheJobsRecords) {
  auto client = TrainingClient();
  ASSERT_NE(client, nullptr);
  auto on = [&](uint32_t i, const std::string& name) -> std::string {
    ClientOptions o;
    o.servers = {cluster_->endpoints()[i]};
    auto c = Client::Create(o);
    if (!c.ok()) return c.status().ToString();
    auto v = (*c)->GetMeta(name);
    if (!v.ok()) return v.status().ToString();
    return v->has_value() ? **v : "<absent>";
  };
  // Scales, then waits for the client to follow the map (its PutMeta goes to the servers of
  // the map it has).
  auto scale = [&](uint32_t n) {
    std::string out;
    ASSERT_EQ(Scale(n, &out), 0) << out;
    const uint64_t v = LoadMap().version;
    ASSERT_TRUE(WaitFor([&] { return client->cluster_map_version() >= v; }, seconds(30)));
  };
  ASSERT_TRUE(client->PutMeta("job/position", "v1").ok());
  ASSERT_NO_FATAL_FAILURE(scale(3));
  EXPECT_EQ(on(2, "job/position"), "v1");
  ASSERT_TRUE(client->PutMeta("job/position", "v2").ok());
  EXPECT_EQ(on(2, "job/position"), "v2");

  // Retired, its data dir keeps v2; the job writes on.
  ASSERT_NO_FATAL_FAILURE(scale(2));
  ASSERT_TRUE(Retired(2));
  ASSERT_TRUE(client->PutMeta("job/position", "v3").ok());
  ASSERT_TRUE(client->PutMeta("job/other", "o1").ok());
  EXPECT_EQ(on(2, "job/position"), "v2");
  EXPECT_EQ(on(2, "job/other"), "<absent>");
  // Restarted on its data dir (SIGTERM deregisters: it registers again at once), it takes a
  // write of its own, then rejoins: v3 replaces its old v2, its own write stays.
  EXPECT_EQ(cluster_->Stop(2, 60), 0);
  ASSERT_TRUE(cluster_->Restart(2).ok());
  {
    ClientOptions o;
    o.servers = {cluster_->endpoints()[2]};
    auto direct = Client::Create(o);
    ASSERT_TRUE(direct.ok());
    ASSERT_TRUE((*direct)->PutMeta("job/other", "its own").ok());
  }
  ASSERT_NO_FATAL_FAILURE(scale(3));
  EXPECT_FALSE(Retired(2));
  EXPECT_EQ(on(2, "job/position"), "v3");
  EXPECT_EQ(on(2, "job/other"), "its own");
  EXPECT_EQ(on(0, "job/other"), "o1");
}

}  // namespace
}  // namespace tessera::testing
