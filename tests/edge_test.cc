// The hardened edge of a server, against real tessera-server processes: admin directories
// only under --admin_root (no escape by "..", absolute names, symbolic links or overlong
// names, and the server stays up), bounded consistency fields, restored rows of the wrong
// length refused, CurveZMQ key mismatches reported within a second, the connection and
// in-flight limits, and Client::Cancel leaving the caller's buffer alone.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <thread>

#include "ps/client/client.h"
#include "ps/client/export_reader.h"
#include "ps/curve.h"
#include "ps/limits.h"
#include "ps/record_file_internal.h"
#include "tests/cluster_fixture.h"
#include "tests/raw_peer.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using testing::LocalCluster;
using testing::LocalClusterOptions;
using testing::MsSince;
using testing::RawPeer;
using Steady = std::chrono::steady_clock;

// "Answered at once" in these tests means: well before the multi-second wait (a connect
// timeout, a retry loop, a scan over the job size) that the refused path would otherwise take.
// Generous on purpose, so that a loaded machine cannot turn it red; it is no speed claim.
constexpr double kAtOnceMs = 5000;

std::unique_ptr<Client> Connect(const LocalCluster& c, ClientOptions o = {}) {
  o.servers = c.endpoints();
  o.admin_root = c.admin_root();
  auto r = Client::Create(o);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? std::move(r).value() : nullptr;
}

Header Op1(Op op, const std::string& name = "") {
  Header h;
  h.op = op;
  h.name = name;
  return h;
}

// The server answers a ping: it is alive and serving.
void ExpectAlive(RawPeer& peer) {
  Header r = peer.Call(Op1(Op::kPing));
  EXPECT_EQ(r.status, StatusCode::kOk) << r.message;
}

bool Contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

TEST(EdgeTest, AdminOpsAreOffWithoutAnAdminRoot) {
  LocalClusterOptions o = testing::Servers(1);
  o.extra_flags = {"--admin_root="};  // the last flag wins: no admin root
  LocalCluster cluster(o);
  ASSERT_TRUE(cluster.Start().ok());
  auto c = Connect(cluster);
  ASSERT_NE(c, nullptr);
  Status s = c->Restore("ckpt");
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  EXPECT_TRUE(Contains(s.message(), "--admin_root")) << s.ToString();
  EXPECT_EQ(c->Checkpoint("ckpt").status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(c->Export("exports", false).status().code(), StatusCode::kFailedPrecondition);
  // The client needs its own view of the root for the files it writes.
  ClientOptions no_root;
  no_root.servers = cluster.endpoints();
  auto bare = Client::Create(no_root);
  ASSERT_TRUE(bare.ok());
  Status b = (*bare)->Checkpoint("ckpt").status();
  EXPECT_EQ(b.code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(b.message(), "ClientOptions::admin_root")) << b.ToString();
}

TEST(EdgeTest, PathEscapesAreRefusedAndTheServerStaysUp) {
  LocalCluster cluster(testing::Servers(1));
  ASSERT_TRUE(cluster.Start().ok());
  // A directory outside the root that looks like a complete checkpoint, and a link to it.
  const std::string outside = cluster.dir() + "/outside";
  fs::create_directories(outside + "/ckpt");
  std::ofstream(outside + "/ckpt/CHECKPOINT") << "tessera checkpoint\n";
  fs::create_directories(cluster.admin_root());
  fs::create_symlink(outside, cluster.admin_root() + "/link");

  RawPeer peer(cluster.endpoints()[0]);
  struct Case {
    Op op;
    std::string name;
    StatusCode want;
    std::string says;
  };
  const std::vector<Case> cases = {
      {Op::kRestore, "../outside/ckpt", StatusCode::kInvalidArgument, "'..'"},
      {Op::kRestore, "a/../../outside/ckpt", StatusCode::kInvalidArgument, "'..'"},
      {Op::kRestore, outside + "/ckpt", StatusCode::kInvalidArgument, "absolute"},
      {Op::kRestore, "link/ckpt", StatusCode::kInvalidArgument, "outside the admin root"},
      {Op::kCheckpoint, "link/new", StatusCode::kInvalidArgument, "outside the admin root"},
      {Op::kExport, "link/exports/v1", StatusCode::kInvalidArgument, "outside the admin root"},
      {Op::kExport, "/tmp/exports/v1", StatusCode::kInvalidArgument, "absolute"},
      {Op::kRestore, std::string(5000, 'a'), StatusCode::kInvalidArgument, "bytes"},
      {Op::kCheckpoint, std::string(5000, '/'), StatusCode::kInvalidArgument, "bytes"},
  };
  for (const Case& c : cases) {
    const auto t0 = Steady::now();
    Header r = peer.Call(Op1(c.op, c.name));
    EXPECT_LT(MsSince(t0), kAtOnceMs);
    EXPECT_EQ(r.status, c.want) << OpName(c.op) << " " << c.name.substr(0, 60) << ": " << r.message;
    EXPECT_TRUE(Contains(r.message, c.says)) << r.message;
    ExpectAlive(peer);
  }
  // Under the name limit, but a component longer than the file system allows: an error
  // reply from the non-throwing filesystem calls, not an abort.
  for (Op op : {Op::kRestore, Op::kCheckpoint, Op::kExport}) {
    Header r = peer.Call(Op1(op, std::string(300, 'b') + "/x"));
    EXPECT_NE(r.status, StatusCode::kOk) << OpName(op);
    ExpectAlive(peer);
  }
  EXPECT_FALSE(fs::exists(outside + "/new")) << "a checkpoint was written outside the root";
  // The client refuses the same names before sending anything.
  auto c = Connect(cluster);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->Checkpoint("../x").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(c->Restore("/etc").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(c->Export("a/../..", false).status().code(), StatusCode::kInvalidArgument);
  // And a name inside the root works.
  auto t = c->CreateTable(TableSpec::Sparse("emb", 4));
  ASSERT_TRUE(t.ok());
  auto cut = c->Checkpoint("inside/ckpt");
  ASSERT_TRUE(cut.ok()) << cut.status().ToString();
  EXPECT_TRUE(fs::exists(cluster.admin_root() + "/inside/ckpt/CHECKPOINT"));
  EXPECT_TRUE(fs::exists(cluster.admin_root() + "/inside/ckpt/server-0/manifest"));
}

TEST(EdgeTest, ConsistencyFieldsAreBoundedAndRefusedQuickly) {
  LocalCluster cluster(testing::Servers(1));
  ASSERT_TRUE(cluster.Start().ok());
  auto c = Connect(cluster);
  ASSERT_NE(c, nullptr);
  auto t = c->CreateTable(TableSpec::Sparse("emb", 4));
  ASSERT_TRUE(t.ok());
  RawPeer peer(cluster.endpoints()[0]);
  const std::string key(8, '\0');
  auto pull = [&](uint32_t workers, uint32_t worker, int64_t clock, int32_t staleness) {
    Header h = Op1(Op::kSparsePull);
    h.table_id = t->id;
    h.elem_type = ElemType::kF32;
    h.count = 1;
    h.dim = 4;
    h.num_workers = workers;
    h.worker_id = worker;
    h.clock = clock;
    h.staleness = staleness;
    const auto t0 = Steady::now();
    Header r = peer.Call(h, {key});
    EXPECT_LT(MsSince(t0), kAtOnceMs) << "num_workers " << workers;
    return r;
  };
  Header r = pull(0xFFFFFFFFu, 0, 10, 0);
  EXPECT_EQ(r.status, StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(r.message, "num_workers 4294967295")) << r.message;
  EXPECT_EQ(pull(4, 4, 1, 0).status, StatusCode::kInvalidArgument);    // worker id
  EXPECT_EQ(pull(0, 0, -5, -1).status, StatusCode::kInvalidArgument);  // negative clock
  EXPECT_EQ(pull(0, 0, kMaxClock + 1, -1).status, StatusCode::kInvalidArgument);
  EXPECT_EQ(pull(2, 0, 1, -7).status, StatusCode::kInvalidArgument);  // staleness
  EXPECT_EQ(pull(0, 0, 0, -1).status, StatusCode::kOk);
  Header clock = Op1(Op::kClock);
  clock.num_workers = 0xFFFFFFFFu;
  clock.clock = 1;
  EXPECT_EQ(peer.Call(clock).status, StatusCode::kInvalidArgument);
  clock.num_workers = 0;
  clock.worker_id = 1u << 30;  // would grow the clock table
  EXPECT_EQ(peer.Call(clock).status, StatusCode::kInvalidArgument);
  Header barrier = Op1(Op::kBarrier, std::string(kMaxBarrierNameBytes + 1, 'b'));
  barrier.num_workers = 2;
  EXPECT_EQ(peer.Call(barrier).status, StatusCode::kInvalidArgument);
  // The largest job allowed: its clock and the stats that compute the slowest worker's clock
  // cost the clocks held, not the job size.
  clock.worker_id = 0;
  clock.num_workers = kMaxWorkers;
  EXPECT_EQ(peer.Call(clock).status, StatusCode::kOk);
  const auto t0 = Steady::now();
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(c->ServerStats(0).ok());
  EXPECT_LT(MsSince(t0), kAtOnceMs);
  EXPECT_EQ(pull(kMaxWorkers, 0, 5, 1000).status, StatusCode::kOk);
  ExpectAlive(peer);
  // The client refuses such options before connecting.
  ClientOptions big;
  big.servers = cluster.endpoints();
  big.consistency.num_workers = kMaxWorkers + 1;
  EXPECT_EQ(Client::Create(big).status().code(), StatusCode::kInvalidArgument);
}

// Rewrites every lane file under `dir` through `edit`, which may change each record.
void RewriteLanes(const std::string& dir, const std::function<void(internal::Record&)>& edit) {
  for (auto& e : fs::recursive_directory_iterator(dir)) {
    if (e.path().filename().string().rfind("lane-", 0) != 0) continue;
    std::vector<internal::Record> records;
    ASSERT_TRUE(internal::ReadRecordFile(e.path().string(), [&](const internal::Record& r) {
                  records.push_back(r);
                  return Status::OK();
                }).ok());
    internal::RecordWriter w(e.path().string());
    for (auto& r : records) {
      edit(r);
      w.Put(r.kind, r.table_id, r.key, r.meta, r.row.data(), static_cast<uint32_t>(r.row.size()));
    }
    ASSERT_TRUE(w.Finish().ok());
  }
}

TEST(EdgeTest, RestoredRowsOfTheWrongLengthAreCorruption) {
  LocalCluster a(testing::Servers(1));
  ASSERT_TRUE(a.Start().ok());
  auto ca = Connect(a);
  ASSERT_NE(ca, nullptr);
  OptimizerSpec adagrad{.kind = OptimizerKind::kAdagrad, .learning_rate = 0.1f};
  auto emb = ca->CreateTable(TableSpec::Sparse("emb", 8, adagrad));
  auto mlp = ca->CreateTable(TableSpec::Dense("mlp", 40000, adagrad));
  ASSERT_TRUE(emb.ok() && mlp.ok());
  std::vector<uint64_t> keys(100);
  for (uint64_t k = 0; k < keys.size(); ++k) keys[k] = k * 7919;
  ASSERT_TRUE(ca->Wait(ca->Push(*emb, keys, std::vector<float>(keys.size() * 8, 0.5f))).ok());
  ASSERT_TRUE(ca->Wait(ca->DensePush(*mlp, 0, std::vector<float>(40000, 0.25f))).ok());
  ASSERT_TRUE(ca->Checkpoint("good").ok());
  ASSERT_TRUE(ca->Export("exports", false).ok());
  const std::string root = a.admin_root();
  for (const char* name : {"short", "long", "chunk"}) {
    fs::copy(root + "/good", root + "/" + name, fs::copy_options::recursive);
  }
  bool cut_one = false;
  RewriteLanes(root + "/short", [&](internal::Record& r) {
    if (r.kind == internal::Record::kSparseRow && !cut_one) {
      r.row.resize(3);  // value and state should be 16 floats
      cut_one = true;
    }
  });
  ASSERT_TRUE(cut_one);
  RewriteLanes(root + "/long", [&](internal::Record& r) {
    if (r.kind == internal::Record::kDenseChunk) r.row.push_back(1.0f);
  });
  RewriteLanes(root + "/chunk", [&](internal::Record& r) {
    if (r.kind == internal::Record::kDenseChunk) r.key = uint64_t{1} << 52;  // wraps if scaled
  });

  LocalClusterOptions bo = testing::Servers(2);
  bo.admin_root = root;
  LocalCluster b(bo);
  ASSERT_TRUE(b.Start().ok());
  auto cb = Connect(b);
  ASSERT_NE(cb, nullptr);
  Status s = cb->Restore("short");
  EXPECT_EQ(s.code(), StatusCode::kCorruption) << s.ToString();
  EXPECT_TRUE(Contains(s.message(), "has 3 floats")) << s.ToString();
  s = cb->Restore("long");
  EXPECT_EQ(s.code(), StatusCode::kCorruption) << s.ToString();
  EXPECT_TRUE(Contains(s.message(), "floats")) << s.ToString();
  s = cb->Restore("chunk");
  EXPECT_EQ(s.code(), StatusCode::kCorruption) << s.ToString();
  EXPECT_TRUE(Contains(s.message(), "chunk index")) << s.ToString();
  // Still serving, and the intact checkpoint restores.
  for (uint32_t r = 0; r < 2; ++r) EXPECT_TRUE(cb->ServerStats(r).ok());
  s = cb->Restore("good");
  EXPECT_TRUE(s.ok()) << s.ToString();
  std::vector<float> got(keys.size() * 8);
  ASSERT_TRUE(cb->Wait(cb->Pull(*emb, keys, got.data())).ok());

  // The export reader checks the same: a dense chunk index beyond the tensor.
  const std::string exp = root + "/exports";
  ASSERT_TRUE(ExportReader::Open(exp).ok());
  RewriteLanes(exp + "/v1", [&](internal::Record& r) {
    if (r.kind == internal::Record::kDenseChunk) r.key = uint64_t{1} << 52;
  });
  auto reader = ExportReader::Open(exp);
  EXPECT_EQ(reader.status().code(), StatusCode::kCorruption) << reader.status().ToString();
}

// A key file for --curve_secret_key_file, removed with the test.
class KeyFile {
 public:
  explicit KeyFile(const std::string& secret)
      : path_((fs::temp_directory_path() /
               ("tessera-edge-key-" + std::to_string(getpid()) + "-" + std::to_string(++n_)))
                  .string()) {
    Write(secret);
  }
  ~KeyFile() {
    std::error_code ec;
    fs::remove(path_, ec);
  }
  void Write(const std::string& secret) { std::ofstream(path_) << secret << "\n"; }
  const std::string& path() const { return path_; }

 private:
  static inline int n_ = 0;
  std::string path_;
};

// Create() with `key` against `cluster`: must fail at once (not after its 10 s connect
// timeout), naming the keys.
void ExpectFastKeyError(const LocalCluster& cluster, const std::string& key,
                        const std::string& says) {
  ClientOptions o;
  o.servers = cluster.endpoints();
  o.curve_server_key = key;
  o.connect_timeout_ms = 10000;
  const auto t0 = Steady::now();
  auto c = Client::Create(o);
  const double ms = MsSince(t0);
  ASSERT_FALSE(c.ok());
  EXPECT_LT(ms, kAtOnceMs) << c.status().ToString();
  EXPECT_EQ(c.status().code(), StatusCode::kFailedPrecondition) << c.status().ToString();
  EXPECT_TRUE(Contains(c.status().message(), "CurveZMQ")) << c.status().ToString();
  EXPECT_TRUE(Contains(c.status().message(), says)) << c.status().ToString();
}

TEST(EdgeTest, CurveKeyMismatchesAreReportedAtOnce) {
  auto server_keys = GenerateCurveKeyPair();
  auto other_keys = GenerateCurveKeyPair();
  if (!server_keys.ok()) GTEST_SKIP() << "libzmq without CurveZMQ";
  ASSERT_TRUE(other_keys.ok());
  KeyFile key(server_keys->secret_key);
  LocalClusterOptions o = testing::Servers(1);
  o.extra_flags = {"--curve_secret_key_file=" + key.path()};
  LocalCluster curve(o);
  ASSERT_TRUE(curve.Start().ok());
  ExpectFastKeyError(curve, "", "curve_server_key");                      // no key
  ExpectFastKeyError(curve, other_keys->public_key, "curve_server_key");  // wrong key
  // The right key works; then the server comes back with another key pair: calls to it fail
  // within a second, naming the key, instead of waiting out timeouts and retries.
  ClientOptions right;
  right.servers = curve.endpoints();
  right.curve_server_key = server_keys->public_key;
  auto c = Client::Create(right);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  auto t = (*c)->CreateTable(TableSpec::Sparse("emb", 4));
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  key.Write(other_keys->secret_key);
  ASSERT_TRUE(curve.Restart(0).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  std::vector<uint64_t> keys = {1, 2, 3};
  std::vector<float> out(12);
  const auto t0 = Steady::now();
  Status s = (*c)->Wait((*c)->Pull(*t, keys, out.data()), DeadlineAfterMs(10000));
  EXPECT_LT(MsSince(t0), kAtOnceMs) << s.ToString();
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  EXPECT_TRUE(Contains(s.message(), "curve_server_key")) << s.ToString();

  // A client with a key against a server without encryption.
  LocalCluster plain(testing::Servers(1));
  ASSERT_TRUE(plain.Start().ok());
  // (Either side may notice first: "does not use CurveZMQ", or the server closed the
  // connection, "... or the servers do not use encryption".)
  ExpectFastKeyError(plain, server_keys->public_key, "curve_server_key");
}

// A server started with `flag` serves two clients; a third is refused at once with
// ResourceExhausted, its message naming each of `says`; the admitted ones are served, and when
// one closes a new client gets its place.
void AThirdClientWaitsForAPlace(const std::string& flag, const std::vector<std::string>& says) {
  LocalClusterOptions o = testing::Servers(1);
  o.extra_flags = {flag};
  LocalCluster cluster(o);
  ASSERT_TRUE(cluster.Start().ok());
  auto c1 = Connect(cluster);
  auto c2 = Connect(cluster);
  ASSERT_TRUE(c1 && c2);
  ClientOptions co;
  co.servers = cluster.endpoints();
  const auto t0 = Steady::now();
  auto c3 = Client::Create(co);
  ASSERT_FALSE(c3.ok());
  EXPECT_LT(MsSince(t0), kAtOnceMs);
  EXPECT_EQ(c3.status().code(), StatusCode::kResourceExhausted) << c3.status().ToString();
  for (const std::string& part : says) {
    EXPECT_TRUE(Contains(c3.status().message(), part)) << c3.status().ToString();
  }
  EXPECT_TRUE(c1->ServerStats(0).ok());
  c2.reset();
  Result<std::unique_ptr<Client>> c4 = Status::Unavailable("not yet");
  for (int i = 0; i < 50 && !c4.ok(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    c4 = Client::Create(co);
  }
  ASSERT_TRUE(c4.ok()) << c4.status().ToString();
  auto st = (*c4)->ServerStats(0);
  ASSERT_TRUE(st.ok());
  EXPECT_TRUE(Contains(*st, "refused_connections ")) << *st;
}

TEST(EdgeTest, ConnectionsBeyondTheLimitAreRefusedClearly) {
  AThirdClientWaitsForAPlace("--max_connections=2", {"--max_connections"});
}

// Issue 35 item 4: --max_connections_per_ip bounds the connections one address is served on
// (every client here comes from 127.0.0.1).
TEST(EdgeTest, ConnectionsOfOneAddressAreBounded) {
  AThirdClientWaitsForAPlace("--max_connections_per_ip=2",
                             {"--max_connections_per_ip", "127.0.0.1"});
}

// Issue 35: connections that finish the handshake and never send do not lock clients out:
// once idle for --idle_connection_timeout_s, one gives its place to a new client. Before, every
// new client was refused for as long as they stayed open.
TEST(EdgeTest, IdleConnectionsGiveTheirPlaceToANewClient) {
  LocalClusterOptions o = testing::Servers(1);
  o.extra_flags = {"--max_connections=4", "--idle_connection_timeout_s=1"};
  LocalCluster cluster(o);
  ASSERT_TRUE(cluster.Start().ok());
  auto admin = Connect(cluster);
  ASSERT_NE(admin, nullptr);
  zmq::context_t ctx;
  std::vector<zmq::socket_t> idle;
  for (int i = 0; i < 3; ++i) {
    idle.emplace_back(ctx, zmq::socket_type::dealer);
    idle.back().set(zmq::sockopt::linger, 0);
    idle.back().connect(cluster.endpoints()[0]);
  }
  auto open_connections = [&] {
    auto st = admin->ServerStats(0);
    return st.ok() && Contains(*st, "\nconnections 4\n");
  };
  for (int i = 0; i < 500 && !open_connections(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(open_connections());
  // The idle ones (and the admin client, between its calls) pass the timeout.
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  ClientOptions co;
  co.servers = cluster.endpoints();
  auto fresh = Client::Create(co);
  ASSERT_TRUE(fresh.ok()) << fresh.status().ToString();
  auto st = (*fresh)->ServerStats(0);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_TRUE(Contains(*st, "idle_connections_displaced 1\n")) << *st;
}

// A client whose pulls wait for a worker that never clocks (bulk-synchronous, clock 10).
std::unique_ptr<Client> ParkingClient(const LocalCluster& cluster) {
  ClientOptions o;
  o.worker_id = 0;
  o.consistency = {.num_workers = 2, .staleness = 0};
  auto c = Connect(cluster, o);
  if (c) {
    EXPECT_TRUE(c->Wait(c->SetClock(10)).ok());
  }
  return c;
}

// Lets the parked pulls run: worker 1 reaches clock 10.
void ReleaseParked(const LocalCluster& cluster) {
  ClientOptions o;
  o.worker_id = 1;
  o.consistency = {.num_workers = 2, .staleness = 0};
  auto c = Connect(cluster, o);
  ASSERT_NE(c, nullptr);
  ASSERT_TRUE(c->Wait(c->SetClock(10)).ok());
}

TEST(EdgeTest, InFlightRequestsPerClientAreLimited) {
  LocalClusterOptions o = testing::Servers(1);
  o.extra_flags = {"--max_in_flight_per_peer=4"};
  LocalCluster cluster(o);
  ASSERT_TRUE(cluster.Start().ok());
  auto c = ParkingClient(cluster);
  ASSERT_NE(c, nullptr);
  auto t = c->CreateTable(TableSpec::Sparse("emb", 4));
  ASSERT_TRUE(t.ok());
  std::vector<uint64_t> keys = {1, 2};
  std::vector<std::vector<float>> outs(5, std::vector<float>(8));
  std::vector<Handle> parked;
  for (int i = 0; i < 4; ++i) parked.push_back(c->Pull(*t, keys, outs[i].data()));
  // Until the server holds all four (another client asks: this one's slots are taken).
  auto watcher = Connect(cluster);
  ASSERT_NE(watcher, nullptr);
  for (int i = 0; i < 600; ++i) {
    auto st = watcher->ServerStats(0);
    if (st.ok() && Contains(*st, "parked_now 4\n")) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  // Refused at once, not parked: the four before it stay parked until ReleaseParked below,
  // so a fifth that parked too would end in DeadlineExceeded, not ResourceExhausted.
  Status fifth = c->Wait(c->Pull(*t, keys, outs[4].data()), DeadlineAfterMs(5000));
  EXPECT_EQ(fifth.code(), StatusCode::kResourceExhausted) << fifth.ToString();
  EXPECT_TRUE(Contains(fifth.message(), "--max_in_flight_per_peer")) << fifth.ToString();
  ReleaseParked(cluster);
  for (auto& h : parked) EXPECT_TRUE(c->Wait(h, DeadlineAfterMs(10000)).ok());
  // Slots are given back: the client is served again.
  EXPECT_TRUE(c->Wait(c->Pull(*t, keys, outs[4].data()), DeadlineAfterMs(10000)).ok());
}

constexpr float kSentinel = -12345.0f;

bool AllSentinel(const std::vector<float>& v) {
  for (float x : v) {
    if (x != kSentinel) return false;
  }
  return true;
}

TEST(EdgeTest, CancelLeavesTheCallersBufferAlone) {
  LocalCluster cluster(testing::Servers(2));
  ASSERT_TRUE(cluster.Start().ok());
  auto c = ParkingClient(cluster);
  ASSERT_NE(c, nullptr);
  auto t = c->CreateTable(TableSpec::Sparse("emb", 16,
                                            {.kind = OptimizerKind::kSgd, .learning_rate = 0.1f},
                                            {InitializerKind::kUniform, 1.0f, 2.0f, 3}));
  ASSERT_TRUE(t.ok());
  // A pull that waits (parked) past the caller's deadline, then is cancelled; its reply comes
  // once the other worker clocks, and must not land in the buffer.
  std::vector<uint64_t> keys(1000);
  for (uint64_t k = 0; k < keys.size(); ++k) keys[k] = k % 700;  // duplicates too
  std::vector<float> out(keys.size() * 16, kSentinel);
  Handle h = c->Pull(*t, keys, out.data());
  EXPECT_EQ(c->Wait(h, DeadlineAfterMs(200)).code(), StatusCode::kDeadlineExceeded);
  c->Cancel(h);
  EXPECT_EQ(c->Wait(h).code(), StatusCode::kCancelled);
  ReleaseParked(cluster);
  // The parked pull is answered now: wait until both servers have no parked request.
  for (uint32_t r = 0; r < 2; ++r) {
    for (int i = 0; i < 100; ++i) {
      auto st = c->ServerStats(r);
      ASSERT_TRUE(st.ok());
      if (Contains(*st, "\nparked_now 0\n")) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_TRUE(AllSentinel(out)) << "a cancelled pull wrote into the caller's buffer";
  EXPECT_EQ(c->Wait(h).code(), StatusCode::kCancelled);

  // Cancel at random moments of calls in flight (no parking): after Cancel returns the
  // buffer is the caller's; it overwrites it and nothing touches it afterwards.
  ClientOptions async_opts;
  auto a = Connect(cluster, async_opts);
  ASSERT_NE(a, nullptr);
  std::mt19937 rng(7);
  std::vector<std::vector<float>> bufs(60, std::vector<float>(keys.size() * 16));
  int cancelled_in_flight = 0;
  for (auto& buf : bufs) {
    Handle p = a->Pull(*t, keys, buf.data());
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 600));
    a->Cancel(p);
    std::fill(buf.begin(), buf.end(), kSentinel);
    cancelled_in_flight += a->Wait(p).code() == StatusCode::kCancelled;
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  for (auto& buf : bufs) ASSERT_TRUE(AllSentinel(buf));
  std::printf("cancelled %d of %zu pulls in flight\n", cancelled_in_flight, bufs.size());
  // Cancel after completion changes nothing.
  std::vector<float> done(keys.size() * 16);
  Handle d = a->Pull(*t, keys, done.data());
  ASSERT_TRUE(a->Wait(d).ok());
  a->Cancel(d);
  EXPECT_TRUE(a->Wait(d).ok());
  EXPECT_GE(done[0], 1.0f);
}

// A push cancelled while it waits to be sent again (its server is down) is dropped, never
// sent: after the restart the table holds nothing of it, and the client lets go of a
// zero-copy push's floats. (It was sent once the server was back.)
TEST(EdgeTest, ACancelledPushWaitingForItsServerIsNeverSent) {
  LocalClusterOptions options = testing::Servers(1);
  options.with_data_dirs = true;  // the table survives the restart
  LocalCluster cluster(options);
  ASSERT_TRUE(cluster.Start().ok());
  ClientOptions o;
  o.retry_for_ms = 60000;
  auto c = Connect(cluster, o);
  ASSERT_NE(c, nullptr);
  auto d = c->CreateTable(
      TableSpec::Dense("d", 1000, {.kind = OptimizerKind::kSgd, .learning_rate = 1.0f}));
  ASSERT_TRUE(d.ok());
  cluster.Kill(0);
  // Once the client's connection is gone, a send fails and the push waits in the retry queue
  // (sooner, it waits in flight; either way the cancel must keep it from the server).
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  auto grads = std::make_shared<std::vector<float>>(1000, 1.0f);
  Handle zero_copy = c->DensePush(*d, 0, std::shared_ptr<const std::vector<float>>(grads));
  Handle copied = c->DensePush(*d, 0, std::vector<float>(1000, 10.0f));
  c->Cancel(zero_copy);
  c->Cancel(copied);
  EXPECT_EQ(c->Wait(zero_copy).code(), StatusCode::kCancelled);
  EXPECT_EQ(c->Wait(copied).code(), StatusCode::kCancelled);
  ASSERT_TRUE(cluster.Restart(0).ok());
  // Sent after the retries queued before it: it reads what they did.
  std::vector<float> out(1000, kSentinel);
  ASSERT_TRUE(c->Wait(c->DensePull(*d, 0, 1000, out.data()), DeadlineAfterMs(60000)).ok());
  EXPECT_EQ(out[0], 0.0f) << "a cancelled push was applied";
  EXPECT_EQ(out[999], 0.0f);
  const auto until = Steady::now() + std::chrono::seconds(30);
  while (grads.use_count() > 1 && Steady::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(grads.use_count(), 1) << "the client still holds the cancelled push's floats";
}

// A name too long for a request is refused by the client at once, as the server would refuse
// it. (Past the envelope's 64 KiB the server's refusal carried no request id, and the call
// waited out its retries, then failed as Unavailable.)
TEST(EdgeTest, ANameTooLongIsRefusedByTheClient) {
  LocalCluster cluster(testing::Servers(1));
  ASSERT_TRUE(cluster.Start().ok());
  ClientOptions o;
  o.request_timeout_ms = 500;
  o.retry_for_ms = 1000;
  auto c = Connect(cluster, o);
  ASSERT_NE(c, nullptr);
  for (size_t n : {size_t{2000}, size_t{70000}}) {
    auto got = c->GetMeta(std::string(n, 'm'));
    EXPECT_EQ(got.status().code(), StatusCode::kInvalidArgument) << n << ": "
                                                                 << got.status().ToString();
    EXPECT_NE(got.status().message().find("1024"), std::string::npos)
        << got.status().ToString();
  }
}

}  // namespace
}  // namespace tessera
