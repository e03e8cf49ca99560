// Dense parts move (docs/elasticity.md, "Moving dense parts"): `tessera-ctl scale` drains a
// server of the first map, which serves a part of every dense table, by flipping the part to a
// kept server (`dense_importing` naming the old one), copying its chunks and optimizer state,
// and marking them in; the new primary holds the part's requests meanwhile. Real
// tessera-server processes, a real etcd, and the BSP loop of reshard_fixture.h compared bit for
// bit with a fixed cluster of two.
#include <atomic>
#include <chrono>
#include <thread>

#include "tests/elastic/reshard_fixture.h"

namespace tessera::testing {
namespace {

using std::chrono::seconds;

// A map of all three servers: server 2 serves dense part 2 of every dense table.
class DenseMoveTest : public ReshardTest {
 protected:
  void SetUp() override { StartCluster("", {"--drain_on_stop"}, /*map_servers=*/3); }

  // The server of each dense part.
  static std::vector<uint16_t> DensePrimaries(const ClusterMap& m) {
    std::vector<uint16_t> out;
    for (uint16_t part = 0; part < m.dense_servers; ++part) {
      out.push_back(m.DensePrimary(part));
    }
    return out;
  }
  // Flips dense part 2 from server 2 to server 0 by hand (one CAS, as MoveDense writes it);
  // the map written.
  ClusterMap FlipPartTwoToServerZero() {
    SlotMapStore store(client_.get(), "/" + std::string(kPrefix));
    auto m = store.Load();
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    if (!m.ok()) return ClusterMap();
    ClusterMap next = *m;
    next.dense_primary = {0, 1, 0};
    next.dense_importing = {ClusterMap::kNoServer, ClusterMap::kNoServer, 2};
    next.version = m->version + 1;
    Status s = store.CompareAndSwap(m->version, next);
    EXPECT_TRUE(s.ok()) << s.ToString();
    return next;
  }

  static bool NothingImporting(const ClusterMap& m) {
    return std::all_of(m.dense_importing.begin(), m.dense_importing.end(),
                       [](uint16_t s) { return s == ClusterMap::kNoServer; }) &&
           std::all_of(m.importing.begin(), m.importing.end(),
                       [](uint16_t s) { return s == ClusterMap::kNoServer; });
  }
};

// The steps of one move by hand: while the map names server 0 the new primary of part 2 and
// server 2 its source, server 0 holds a push for the part, server 2 refuses the part's
// requests and exports it (no other server does), and once the chunks are in and marked so,
// the held push applies on top of them. A repeated copy is refused, also after a restart.
TEST_F(DenseMoveTest, TheNewPrimaryHoldsThePartsRequestsUntilItsCopyIsIn) {
  auto client = TrainingClient();
  ASSERT_NE(client, nullptr);
  OptimizerSpec sgd;
  sgd.learning_rate = 1.0f;
  constexpr uint64_t kLength = 3 * kDenseChunkFloats;
  auto dense = client->CreateTable(TableSpec::Dense("w", kLength, sgd));
  ASSERT_TRUE(dense.ok()) << dense.status().ToString();
  const DenseRange part2 = DenseRangeOfServer(dense->id, kLength, 2, 3);
  ASSERT_LT(part2.begin, part2.end);
  const uint64_t n = part2.end - part2.begin;
  ASSERT_TRUE(client->Wait(client->DensePush(*dense, part2.begin, std::vector<float>(n, 1.0f))).ok());

  const uint64_t v = FlipPartTwoToServerZero().version;
  ASSERT_FALSE(HasFailure());
  ASSERT_TRUE(WaitFor(
      [&] {
        return Stat(0, "map_version") == static_cast<int64_t>(v) &&
               Stat(2, "map_version") == static_cast<int64_t>(v);
      },
      seconds(30)));

  Header push;
  push.op = Op::kDensePush;
  push.table_id = dense->id;
  push.elem_type = ElemType::kF32;
  push.offset = part2.begin;
  push.count = 8;
  push.map_version = v;
  RawPeer at_new(cluster_->endpoints()[0]);
  ASSERT_TRUE(at_new.Send(push, {Bytes(std::vector<float>(8, 3.0f))}));
  auto answer = [&](int timeout_ms) -> std::optional<Header> {
    at_new.socket().set(zmq::sockopt::rcvtimeo, timeout_ms);
    std::vector<zmq::message_t> reply;
    if (!zmq::recv_multipart(at_new.socket(), std::back_inserter(reply)).has_value()) {
      return std::nullopt;
    }
    Header r;
    EXPECT_TRUE(DecodeHeader(reply[0].data(), reply[0].size(), &r).ok());
    return r;
  };
  EXPECT_FALSE(answer(500).has_value()) << "a push for a dense part moving in was answered";
  EXPECT_GE(Stat(0, "import_parked_now"), 1);
  std::string show;
  EXPECT_EQ(RunCommand({TESSERA_CTL_BINARY, "map", "show", "--coordinator=" + url_}, &show), 0);
  EXPECT_NE(show.find("dense_parts primary 0,1,0 backup -1,-1,-1 copying_from -1,-1,2\n"),
            std::string::npos)
      << show;

  // The old primary refuses the part at the new version.
  RawPeer at_old(cluster_->endpoints()[2]);
  Header pull = push;
  pull.op = Op::kDensePull;
  const Header refused = at_old.Call(pull);
  EXPECT_EQ(refused.status, StatusCode::kFailedPrecondition) << refused.message;
  EXPECT_NE(refused.message.find("served by server 0"), std::string::npos) << refused.message;

  const std::vector<uint32_t> parts = {2};
  Client::SlotExportRequest how;
  how.dense_parts = true;  // and not backup_fill: a part moving away
  auto wrong = admin_->ExportSlots(1, v, parts, how);
  EXPECT_EQ(wrong.status().code(), StatusCode::kFailedPrecondition) << wrong.status().ToString();
  EXPECT_NE(wrong.status().message().find("not moving away from server 1"), std::string::npos)
      << wrong.status().ToString();
  auto rows = admin_->ExportSlots(2, v, parts, how);
  ASSERT_TRUE(rows.ok()) << rows.status().ToString();
  ASSERT_TRUE(admin_->ImportSlots(0, v, parts, Client::SlotImportStep::kDenseRows, *rows).ok());
  EXPECT_FALSE(answer(300).has_value()) << "answered before the copy was marked in";
  ASSERT_TRUE(admin_->ImportSlots(0, v, parts, Client::SlotImportStep::kDenseDone).ok());
  auto held = answer(30000);
  ASSERT_TRUE(held.has_value());
  EXPECT_EQ(held->status, StatusCode::kOk) << held->message;

  // The copy (-1 everywhere) with the held push (-3 on 8 elements) on top, read from server 0.
  std::vector<float> w(n);
  ASSERT_TRUE(client->Wait(client->DensePull(*dense, part2.begin, n, w.data())).ok());
  for (uint64_t i = 0; i < n; ++i) {
    ASSERT_EQ(w[i], i < 8 ? -4.0f : -1.0f) << "element " << part2.begin + i;
  }
  Status again = admin_->ImportSlots(0, v, parts, Client::SlotImportStep::kDenseRows, *rows);
  EXPECT_EQ(again.code(), StatusCode::kAlreadyExists) << again.ToString();
  // Marked in survives a restart: the server took pushes for the part since. (SIGTERM: it
  // deregisters, so it can register again at once; not the highest id, it does not drain.)
  EXPECT_EQ(cluster_->Stop(0, 60), 0);
  ASSERT_TRUE(cluster_->Restart(0).ok());
  ASSERT_TRUE(WaitFor([&] { return Stat(0, "map_version") == static_cast<int64_t>(v); },
                      seconds(30)));
  again = admin_->ImportSlots(0, v, parts, Client::SlotImportStep::kDenseRows, *rows);
  EXPECT_EQ(again.code(), StatusCode::kAlreadyExists) << again.ToString();

  // `scale 2` settles the move without copying again, and retires server 2.
  std::string out;
  ASSERT_EQ(Scale(2, &out), 0) << out;
  const ClusterMap after = LoadMap();
  EXPECT_TRUE(NothingImporting(after));
  EXPECT_EQ(DensePrimaries(after), (std::vector<uint16_t>{0, 1, 0}));
  EXPECT_TRUE(Retired(2));
  EXPECT_EQ(RunCommand({TESSERA_CTL_BINARY, "map", "show", "--coordinator=" + url_}, &show), 0);
  EXPECT_NE(show.find("dense_parts primary 0,1,0 backup -1,-1,-1\n"), std::string::npos) << show;
  ASSERT_TRUE(client->Wait(client->DensePull(*dense, part2.begin, n, w.data())).ok());
  EXPECT_EQ(w[0], -4.0f);
  EXPECT_EQ(w[n - 1], -1.0f);
}

// A dense pull that the staleness gate holds on the part's old primary while the part moves
// is fenced again when the gate releases it: refused there (it is no longer the part's
// server), and the client reads the new primary, pushes made there included.
TEST_F(DenseMoveTest, APullParkedOnTheOldPrimaryIsFencedAgainWhenItRuns) {
  auto client_of = [&](uint32_t worker) -> std::unique_ptr<Client> {
    ClientOptions o = TrainingOptions();
    o.consistency = {.num_workers = 2, .staleness = 0};
    o.worker_id = worker;
    auto source = EtcdClusterMapSource::Create(*CoordinatorUrl::Parse(url_));
    if (!source.ok()) return nullptr;
    auto c = Client::Create(o, std::move(*source));
    return c.ok() ? std::move(*c) : nullptr;
  };
  auto fast = client_of(0), slow = client_of(1);
  auto watching = TrainingClient();
  ASSERT_TRUE(fast != nullptr && slow != nullptr && watching != nullptr);
  OptimizerSpec sgd;
  sgd.learning_rate = 1.0f;
  constexpr uint64_t kLength = 3 * kDenseChunkFloats;
  auto dense = watching->CreateTable(TableSpec::Dense("w", kLength, sgd));
  ASSERT_TRUE(dense.ok()) << dense.status().ToString();
  const DenseRange part2 = DenseRangeOfServer(dense->id, kLength, 2, 3);
  const uint64_t n = part2.end - part2.begin;
  ASSERT_TRUE(
      watching->Wait(watching->DensePush(*dense, part2.begin, std::vector<float>(n, 1.0f))).ok());
  ASSERT_TRUE(fast->Wait(fast->SetClock(2)).ok());
  ASSERT_TRUE(slow->Wait(slow->SetClock(0)).ok());
  std::vector<float> out(n, -999.0f);
  Handle pull = fast->DensePull(*dense, part2.begin, n, out.data());  // waits on server 2
  ASSERT_EQ(fast->Wait(pull, DeadlineAfterMs(300)).code(), StatusCode::kDeadlineExceeded);

  // Part 2 moves to server 0 (by hand: flip, copy, done, settle), which then takes a push.
  ClusterMap next = FlipPartTwoToServerZero();
  ASSERT_FALSE(HasFailure());
  const uint64_t v = next.version;
  const std::vector<uint32_t> parts = {2};
  Client::SlotExportRequest how;
  how.dense_parts = true;
  Result<std::string> rows = Status::Unavailable("not asked yet");
  ASSERT_TRUE(WaitFor(
      [&] {
        rows = admin_->ExportSlots(2, v, parts, how);
        return rows.status().code() != StatusCode::kUnavailable;
      },
      seconds(30)));
  ASSERT_TRUE(rows.ok()) << rows.status().ToString();
  ASSERT_TRUE(WaitFor([&] { return Stat(0, "map_version") == static_cast<int64_t>(v); },
                      seconds(30)));
  ASSERT_TRUE(admin_->ImportSlots(0, v, parts, Client::SlotImportStep::kDenseRows, *rows).ok());
  ASSERT_TRUE(admin_->ImportSlots(0, v, parts, Client::SlotImportStep::kDenseDone).ok());
  next.dense_importing.clear();
  next.version = v + 1;
  SlotMapStore store(client_.get(), "/" + std::string(kPrefix));
  ASSERT_TRUE(store.CompareAndSwap(v, next).ok());
  ASSERT_TRUE(WaitFor([&] { return watching->cluster_map_version() == v + 1; }, seconds(30)));
  ASSERT_TRUE(
      watching->Wait(watching->DensePush(*dense, part2.begin, std::vector<float>(n, 3.0f))).ok());

  // Worker 1 catches up: server 2 releases the pull and refuses it; server 0 answers it.
  ASSERT_TRUE(slow->Wait(slow->SetClock(2)).ok());
  Status s = fast->Wait(pull, DeadlineAfterMs(30000));
  ASSERT_TRUE(s.ok()) << s.ToString();
  for (uint64_t i = 0; i < n; ++i) ASSERT_EQ(out[i], -4.0f) << "element " << part2.begin + i;
  EXPECT_GE(fast->stale_map_retries(), 1u);
}

// SIGTERM of server 2 with --drain_on_stop while the loop trains: its slots and its dense part
// move to servers 0 and 1, it exits 0 and its id is retired; the loop ends bit-identical to a
// fixed cluster of two (dense tables are updated element by element, so the parts' layout does
// not change a float).
TEST_F(DenseMoveTest, ADensePartsServerDrainsItselfWhileTraining) {
  auto client = TrainingClient();
  ASSERT_NE(client, nullptr);
  Trainer trainer(*client);
  uint64_t step = 0;
  auto train = [&] {
    Status s = trainer.Step(step++);
    EXPECT_TRUE(s.ok()) << "step " << step - 1 << ": " << s.ToString();
  };
  for (int i = 0; i < 10; ++i) train();
  EXPECT_EQ(TrainWhileStopping(trainer, &step, 2), 0);
  ASSERT_TRUE(Retired(2));
  const ClusterMap m = LoadMap();
  EXPECT_EQ(DensePrimaries(m), (std::vector<uint16_t>{0, 1, 0}));
  EXPECT_TRUE(NothingImporting(m));
  for (int i = 0; i < 5; ++i) train();
  const std::string line = DrainedLine(2);
  ASSERT_FALSE(line.empty());
  std::printf("%s\n  requests held for a copy on server 0: %lld\n", line.c_str(),
              static_cast<long long>(Stat(0, "import_parked_total")));
  EXPECT_NE(line.find("1 dense parts moved"), std::string::npos) << line;
  ExpectSameAsFixedCluster(trainer, step, "through a drain of a dense part's server");
}

class ReplicatedDenseMoveTest : public DenseMoveTest {
 protected:
  void SetUp() override {
    StartCluster("--replication=2", {"--coordinator_ttl_s=2"}, /*map_servers=*/3);
  }
};

// A replicated map of three scaled to two while the loop trains: server 2's dense part goes
// to its backup (server 0), and every dense part and slot has a backup on the other kept
// server afterwards; the loop is bit-identical to a fixed cluster of two, also when read from
// server 1 after kill -9 of server 0.
TEST_F(ReplicatedDenseMoveTest, ThreeToTwoKeepsEveryDensePartBackedUpAndExact) {
  auto client = TrainingClient();
  ASSERT_NE(client, nullptr);
  Trainer trainer(*client);
  std::atomic<bool> scaled{false};
  int rc = -1;
  std::string out;
  uint64_t step = 0;
  std::thread scaler;
  const auto t0 = std::chrono::steady_clock::now();
  for (; step < 20 || !scaled.load(); ++step) {
    Status s = WithinScaleWait(t0) ? trainer.Step(step)
                                   : Status::DeadlineExceeded("the scale did not finish in time");
    if (!s.ok()) {
      ADD_FAILURE() << "step " << step << ": " << s.ToString();
      break;
    }
    if (step == 10) {
      scaler = std::thread([&] {
        rc = Scale(2, &out);
        scaled = true;
      });
    }
  }
  if (scaler.joinable()) scaler.join();
  ASSERT_EQ(rc, 0) << out;
  std::printf("scale 2: %s", out.c_str());
  EXPECT_NE(out.find("1 dense parts moved"), std::string::npos) << out;
  const ClusterMap m = LoadMap();
  EXPECT_TRUE(Retired(2));
  EXPECT_TRUE(NothingImporting(m));
  EXPECT_EQ(DensePrimaries(m), (std::vector<uint16_t>{0, 1, 0}));
  ASSERT_EQ(m.dense_backup.size(), 3u);
  for (uint16_t part = 0; part < 3; ++part) {
    EXPECT_EQ(m.dense_backup[part], 1 - DensePrimaries(m)[part]) << "dense part " << part;
  }
  for (uint32_t slot = 0; slot < kNumSlots; ++slot) {
    ASSERT_NE(m.backup[slot], ClusterMap::kNoServer) << "slot " << slot;
  }
  const Params fixed = ExpectSameAsFixedCluster(trainer, step, "after 3 -> 2");
  ExpectExactAfterKillingServerZero(trainer, fixed, 1);
}

}  // namespace
}  // namespace tessera::testing
