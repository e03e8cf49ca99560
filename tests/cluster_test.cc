// Multi-process tests: real tessera-server processes on 127.0.0.1.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "ps/client/client.h"
#include "ps/client/client_internal.h"
#include "ps/curve.h"
#include "ps/initializer.h"
#include "tests/cluster_fixture.h"

namespace tessera {
namespace {

using testing::LocalCluster;
using testing::LocalClusterOptions;

std::unique_ptr<Client> Connect(const LocalCluster& c, ClientOptions o = {}) {
  o.servers = c.endpoints();
  auto r = Client::Create(o);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? std::move(r).value() : nullptr;
}

OptimizerSpec Sgd(float lr) {
  OptimizerSpec o;
  o.kind = OptimizerKind::kSgd;
  o.learning_rate = lr;
  return o;
}

// Starts `cluster` and connects `*c` to it. Call under ASSERT_NO_FATAL_FAILURE, as the next.
void StartAndConnect(LocalCluster& cluster, std::unique_ptr<Client>* c) {
  ASSERT_TRUE(cluster.Start().ok());
  *c = Connect(cluster);
  ASSERT_NE(*c, nullptr);
}

// StartAndConnect, then a dense table "d" of `length` floats (SGD, learning rate 1).
void StartWithDenseTable(LocalCluster& cluster, uint64_t length, std::unique_ptr<Client>* c,
                         Table* d) {
  ASSERT_NO_FATAL_FAILURE(StartAndConnect(cluster, c));
  auto t = (*c)->CreateTable(TableSpec::Dense("d", length, Sgd(1.0f)));
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  *d = *t;
}

// Expects each row of `out` (`dim` floats a key of `keys`) to hold the initializer's values of
// its key, less `moved` (exactly when `moved` is 0); reports the first row that does not.
void ExpectInitialRows(const InitializerSpec& init, const std::vector<uint64_t>& keys,
                       const std::vector<float>& out, uint32_t dim, float moved = 0) {
  std::vector<float> want(dim);
  for (size_t i = 0; i < keys.size(); ++i) {
    InitializeValues(init, keys[i], 0, dim, want.data());
    for (uint32_t j = 0; j < dim; ++j) {
      const float got = out[i * dim + j];
      if (moved == 0 ? got != want[j] : std::fabs(got - (want[j] - moved)) > 1e-6f) {
        ADD_FAILURE() << "key " << keys[i] << " element " << j << ": " << got << ", want "
                      << want[j] - moved;
        return;
      }
    }
  }
}

// Deterministic gradient of (client, step, key, element).
float GradOf(int client, int step, uint64_t key, uint32_t j) {
  const uint64_t h = uint64_t(client) * 131 + uint64_t(step) * 31 + key * 7 + j;
  return static_cast<float>(static_cast<int64_t>(h % 17) - 8) / 8.0f;
}

TEST(ClusterTest, ThreeServersFourClientsMatchReference) {
  LocalCluster cluster(testing::Servers(3));
  ASSERT_TRUE(cluster.Start().ok());
  auto admin = Connect(cluster);
  ASSERT_NE(admin, nullptr);
  const uint32_t dim = 8;
  const float lr = 0.05f;
  const InitializerSpec init{InitializerKind::kUniform, -0.1f, 0.1f, 1234};
  auto sparse = admin->CreateTable(TableSpec::Sparse("emb", dim, Sgd(lr), init));
  ASSERT_TRUE(sparse.ok()) << sparse.status().ToString();
  const uint64_t dense_len = 3 * 16384 + 1000;  // spans several chunks and all servers
  auto dense = admin->CreateTable(TableSpec::Dense("mlp", dense_len, Sgd(lr), init));
  ASSERT_TRUE(dense.ok()) << dense.status().ToString();

  const int kClients = 4, kSteps = 30, kKeysPerStep = 500;
  const uint64_t kKeySpace = 2000;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int c = 0; c < kClients; ++c) {
    threads.emplace_back([&, c] {
      auto client = Connect(cluster);
      if (!client) {
        ++failures;
        return;
      }
      std::mt19937_64 rng(c);
      std::vector<uint64_t> keys(kKeysPerStep);
      std::vector<float> grads(kKeysPerStep * dim), pulled(kKeysPerStep * dim);
      std::vector<float> dgrad(dense_len);
      for (int t = 0; t < kSteps; ++t) {
        for (int i = 0; i < kKeysPerStep; ++i) {
          keys[i] = rng() % kKeySpace;  // duplicates within a step are summed by the client
          for (uint32_t j = 0; j < dim; ++j) grads[i * dim + j] = GradOf(c, t, keys[i], j);
        }
        for (uint64_t e = 0; e < dense_len; ++e) dgrad[e] = GradOf(c, t, e, 0);
        auto pull = client->Pull(*sparse, keys, pulled.data());
        auto push = client->Push(*sparse, keys, grads);
        auto dpush = client->DensePush(*dense, 0, dgrad);
        for (auto* h : {&pull, &push, &dpush}) {
          Status s = client->Wait(*h, DeadlineAfterMs(30000));
          if (!s.ok()) {
            ADD_FAILURE() << s.ToString();
            ++failures;
            return;
          }
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_EQ(failures.load(), 0);

  // Reference: SGD sums every gradient (double precision, same draws).
  std::vector<double> ref(kKeySpace * dim, 0.0);
  std::vector<double> dref(dense_len, 0.0);
  for (uint64_t k = 0; k < kKeySpace; ++k) {
    std::vector<float> v(dim);
    InitializeValues(init, k, 0, dim, v.data());
    for (uint32_t j = 0; j < dim; ++j) ref[k * dim + j] = v[j];
  }
  {
    std::vector<float> v(dense_len);
    InitializeValues(init, 0, 0, dense_len, v.data());
    for (uint64_t e = 0; e < dense_len; ++e) dref[e] = v[e];
  }
  for (int c = 0; c < kClients; ++c) {
    std::mt19937_64 rng(c);
    for (int t = 0; t < kSteps; ++t) {
      for (int i = 0; i < kKeysPerStep; ++i) {
        uint64_t k = rng() % kKeySpace;
        for (uint32_t j = 0; j < dim; ++j) ref[k * dim + j] -= lr * GradOf(c, t, k, j);
      }
      for (uint64_t e = 0; e < dense_len; ++e) dref[e] -= lr * GradOf(c, t, e, 0);
    }
  }
  std::vector<uint64_t> all(kKeySpace);
  for (uint64_t k = 0; k < kKeySpace; ++k) all[k] = k;
  std::vector<float> got(kKeySpace * dim);
  ASSERT_TRUE(admin->Wait(admin->Pull(*sparse, all, got.data())).ok());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], ref[i], 1e-4) << "key " << i / dim << " element " << i % dim;
  }
  std::vector<float> dgot(dense_len);
  ASSERT_TRUE(admin->Wait(admin->DensePull(*dense, 0, dense_len, dgot.data())).ok());
  for (uint64_t e = 0; e < dense_len; ++e) ASSERT_NEAR(dgot[e], dref[e], 1e-4) << "element " << e;

  // Each server got a share of the keys.
  for (uint32_t r = 0; r < 3; ++r) {
    auto st = admin->ServerStats(r);
    ASSERT_TRUE(st.ok());
    EXPECT_EQ(st->find("push_keys 0\n"), std::string::npos) << *st;
  }
}

TEST(ClusterTest, TablesPullOrderAndInitializers) {
  LocalCluster cluster(testing::Servers(2));
  ASSERT_TRUE(cluster.Start().ok());
  auto c = Connect(cluster);
  ASSERT_NE(c, nullptr);
  const InitializerSpec init{InitializerKind::kNormal, 0.0f, 0.5f, 77};
  TableSpec spec = TableSpec::Sparse("emb", 4, Sgd(0.1f), init);
  auto t = c->CreateTable(spec);
  ASSERT_TRUE(t.ok());
  // Same spec: no-op. Another spec: AlreadyExists naming the difference.
  EXPECT_TRUE(c->CreateTable(spec).ok());
  TableSpec other = spec;
  other.dim = 8;
  Status s = c->CreateTable(other).status();
  EXPECT_EQ(s.code(), StatusCode::kAlreadyExists);
  EXPECT_NE(s.message().find("dim: 4 vs 8"), std::string::npos) << s.ToString();
  auto got = c->GetTable("emb");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->id, t->id);
  EXPECT_EQ(DescribeSpecDifference(got->spec, spec), "");
  EXPECT_EQ(c->GetTable("nope").status().code(), StatusCode::kNotFound);

  // Keys in any order with duplicates come back in the caller's order, with the value the
  // initializer gives (independent of the server).
  std::vector<uint64_t> keys = {5, 1ull << 60, 5, 99, 123456789, 99, 0, 5};
  std::vector<float> out(keys.size() * 4);
  ASSERT_TRUE(c->Wait(c->Pull(*t, keys, out.data())).ok());
  ExpectInitialRows(init, keys, out, 4);
  // PushPull: duplicates summed, values after the push returned.
  std::vector<uint64_t> pk = {7, 7, 8};
  std::vector<float> g = {1, 1, 1, 1, 2, 2, 2, 2, -1, -1, -1, -1};
  std::vector<float> after(12);
  ASSERT_TRUE(c->Wait(c->PushPull(*t, pk, g, after.data())).ok());
  float w7[4], w8[4];
  InitializeValues(init, 7, 0, 4, w7);
  InitializeValues(init, 8, 0, 4, w8);
  for (int j = 0; j < 4; ++j) {
    EXPECT_NEAR(after[j], w7[j] - 0.1f * 3, 1e-6);
    EXPECT_NEAR(after[4 + j], w7[j] - 0.1f * 3, 1e-6);
    EXPECT_NEAR(after[8 + j], w8[j] + 0.1f, 1e-6);
  }
  // Dense ranges.
  auto d = c->CreateTable(TableSpec::Dense("d", 40000, Sgd(1.0f)));
  ASSERT_TRUE(d.ok());
  std::vector<float> grad(20000, 0.5f), out2(40000);
  ASSERT_TRUE(c->Wait(c->DensePush(*d, 10000, grad)).ok());
  ASSERT_TRUE(c->Wait(c->DensePull(*d, 0, 40000, out2.data())).ok());
  for (int e = 0; e < 40000; ++e) {
    EXPECT_EQ(out2[e], (e >= 10000 && e < 30000) ? -0.5f : 0.0f) << e;
  }
  std::vector<float> part(3);
  ASSERT_TRUE(c->Wait(c->DensePull(*d, 29999, 3, part.data())).ok());
  EXPECT_EQ(part, (std::vector<float>{-0.5f, 0.0f, 0.0f}));
  // Client-side argument errors.
  EXPECT_EQ(c->Wait(c->Push(*t, pk, std::vector<float>(5))).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(c->Wait(c->DensePull(*d, 39999, 2, out2.data())).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(c->Wait(c->DensePull(*t, 0, 1, out2.data())).code(), StatusCode::kInvalidArgument);
  // Metadata records.
  ASSERT_TRUE(c->PutMeta("worker/0", "position=42").ok());
  auto m = c->GetMeta("worker/0");
  ASSERT_TRUE(m.ok());
  ASSERT_TRUE(m->has_value());
  EXPECT_EQ(**m, "position=42");
  auto none = c->GetMeta("worker/9");
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
}

TEST(ClusterTest, ZeroCopyDensePushAppliesAndLetsGoOfTheBuffer) {
  LocalCluster cluster(testing::Servers(2));
  std::unique_ptr<Client> c;
  Table d;
  ASSERT_NO_FATAL_FAILURE(StartWithDenseTable(cluster, 40000, &c, &d));
  // A range over both servers' parts: one message each, both pointing into the buffer.
  auto grad = std::make_shared<std::vector<float>>(20000);
  for (size_t i = 0; i < grad->size(); ++i) (*grad)[i] = 0.25f * static_cast<float>(i % 7);
  ASSERT_TRUE(c->Wait(c->DensePush(d, 10000, std::shared_ptr<const std::vector<float>>(grad)))
                  .ok());
  std::vector<float> out(40000);
  ASSERT_TRUE(c->Wait(c->DensePull(d, 0, 40000, out.data())).ok());
  for (int e = 0; e < 40000; ++e) {
    const float want = (e >= 10000 && e < 30000) ? -(*grad)[e - 10000] : 0.0f;
    ASSERT_EQ(out[e], want) << e;
  }
  // A refused push lets go of its buffer too.
  EXPECT_EQ(c->Wait(c->DensePush(d, 30000, std::shared_ptr<const std::vector<float>>(grad)))
                .code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(c->Wait(c->DensePush(d, 0, std::shared_ptr<const std::vector<float>>())).code(),
            StatusCode::kInvalidArgument);
  // ZeroMQ frees a sent message on its I/O thread, possibly just after the reply is in.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (grad.use_count() > 1 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(grad.use_count(), 1) << "the client still holds the pushed buffer";
}

// One server: a pull with repeated keys reads the caller's rows from the reply itself (no
// copy in unique order first), in the caller's order, also for PushPull.
TEST(ClusterTest, OneServerPullWithRepeatedKeysKeepsTheCallersOrder) {
  LocalCluster cluster(testing::Servers(1));
  std::unique_ptr<Client> c;
  ASSERT_NO_FATAL_FAILURE(StartAndConnect(cluster, &c));
  const InitializerSpec init{InitializerKind::kNormal, 0.0f, 0.5f, 7};
  auto t = c->CreateTable(TableSpec::Sparse("emb", 3, Sgd(0.5f), init));
  ASSERT_TRUE(t.ok());
  std::vector<uint64_t> keys;
  for (int i = 0; i < 3000; ++i) keys.push_back((uint64_t(i) * 7919) % 1000);
  std::vector<float> out(keys.size() * 3);
  ASSERT_TRUE(c->Wait(c->Pull(*t, keys, out.data())).ok());
  ExpectInitialRows(init, keys, out, 3);
  // Every key appears three times with gradient 1: each row moves by -0.5 * 3.
  std::vector<float> g(keys.size() * 3, 1.0f);
  ASSERT_TRUE(c->Wait(c->PushPull(*t, keys, g, out.data())).ok());
  ExpectInitialRows(init, keys, out, 3, 1.5f);
}

// Many small requests at once: the server reads at most 256 a round, and the rest, which no
// descriptor signals again, are read in the next rounds (io_loop.cc); every call completes.
TEST(ClusterTest, ABurstOfSmallRequestsLargerThanAServerRoundCompletes) {
  LocalCluster cluster(testing::Servers(1));
  std::unique_ptr<Client> c;
  Table d;
  ASSERT_NO_FATAL_FAILURE(StartWithDenseTable(cluster, 16, &c, &d));
  const std::vector<float> minus_one(16, -1.0f);
  std::vector<Handle> burst;
  for (int i = 0; i < 1000; ++i) burst.push_back(c->DensePush(d, 0, minus_one));
  for (const Handle& h : burst) ASSERT_TRUE(c->Wait(h, DeadlineAfterMs(30000)).ok());
  std::vector<float> out(16);
  ASSERT_TRUE(c->Wait(c->DensePull(d, 0, 16, out.data())).ok());
  for (float v : out) ASSERT_EQ(v, 1000.0f);
}

// Waiting callers let the client's I/O thread stand down (they read the replies); replies
// nobody waits for are still read, and a burst of calls left in flight completes.
TEST(ClusterTest, RepliesNobodyWaitsForAreReadAfterSynchronousCalls) {
  LocalCluster cluster(testing::Servers(1));
  std::unique_ptr<Client> c;
  Table d;
  ASSERT_NO_FATAL_FAILURE(StartWithDenseTable(cluster, 1024, &c, &d));
  std::vector<float> out(1024);
  for (int i = 0; i < 50; ++i) ASSERT_TRUE(c->Wait(c->DensePull(d, 0, 1024, out.data())).ok());
  // A zero-copy push, not waited for: the client lets go of the buffer once it reads the reply.
  auto grad = std::make_shared<std::vector<float>>(1024, -1.0f);
  Handle unwaited = c->DensePush(d, 0, std::shared_ptr<const std::vector<float>>(grad));
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (grad.use_count() > 1 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(grad.use_count(), 1) << "nobody read the reply of a call nobody waits for";
  ASSERT_TRUE(c->Wait(unwaited).ok());
  // A burst left in flight, then waited for in reverse order.
  const std::vector<float> minus_one(1024, -1.0f);
  std::vector<Handle> burst;
  for (int i = 0; i < 100; ++i) burst.push_back(c->DensePush(d, 0, minus_one));
  for (auto it = burst.rbegin(); it != burst.rend(); ++it) ASSERT_TRUE(c->Wait(*it).ok());
  // A window of eight zero-copy pushes of which only the first is waited for: that waiter
  // leaves seven in flight (fewer than make the I/O thread watch), and still their replies are
  // read and their buffers let go.
  std::vector<std::shared_ptr<std::vector<float>>> grads;
  std::vector<Handle> window;
  for (int i = 0; i < 8; ++i) {
    grads.push_back(std::make_shared<std::vector<float>>(1024, -1.0f));
    window.push_back(c->DensePush(d, 0, std::shared_ptr<const std::vector<float>>(grads.back())));
  }
  ASSERT_TRUE(c->Wait(window[0]).ok());
  auto held = [&] {
    return std::count_if(grads.begin(), grads.end(), [](const auto& g) {
      return g.use_count() > 1;
    });
  };
  const auto window_until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (held() > 0 && std::chrono::steady_clock::now() < window_until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(held(), 0) << "replies of calls left in flight by a waiter were not read";
  for (const Handle& h : window) ASSERT_TRUE(c->Wait(h).ok());
  ASSERT_TRUE(c->Wait(c->DensePull(d, 0, 1024, out.data())).ok());
  for (int e = 0; e < 1024; ++e) ASSERT_EQ(out[e], 109.0f) << e;
}

TEST(ClusterTest, BoundedStalenessBlocksFastWorker) {
  LocalCluster cluster(testing::Servers(2));
  ASSERT_TRUE(cluster.Start().ok());
  for (int staleness : {0, 2}) {
    SCOPED_TRACE("staleness " + std::to_string(staleness));
    ClientOptions o;
    o.consistency = {.num_workers = 2, .staleness = staleness};
    o.worker_id = 0;
    auto fast = Connect(cluster, o);
    o.worker_id = 1;
    auto slow = Connect(cluster, o);
    ASSERT_TRUE(fast && slow);
    // Clocks live on the servers: start both workers from 0 again.
    ASSERT_TRUE(fast->Wait(fast->SetClock(0)).ok());
    ASSERT_TRUE(slow->Wait(slow->SetClock(0)).ok());
    const std::string name = "ssp" + std::to_string(staleness);
    auto t = fast->CreateTable(TableSpec::Sparse(name, 2, Sgd(0.1f)));
    ASSERT_TRUE(t.ok());
    std::vector<uint64_t> keys = {1, 2, 3, 4, 5, 6, 7, 8};
    std::vector<float> out(16);
    // At clock c a pull needs every worker at >= c - staleness. Up to c == staleness the
    // fast worker is within the bound and answered at once.
    for (int i = 0; i < staleness; ++i) ASSERT_TRUE(fast->Wait(fast->Clock()).ok());
    ASSERT_TRUE(fast->Wait(fast->Pull(*t, keys, out.data()), DeadlineAfterMs(5000)).ok());
    // Two steps further ahead (c = staleness + 2): it needs the slow worker at clock 2.
    ASSERT_TRUE(fast->Wait(fast->Clock()).ok());
    ASSERT_TRUE(fast->Wait(fast->Clock()).ok());
    auto h = fast->Pull(*t, keys, out.data());
    EXPECT_EQ(fast->Wait(h, DeadlineAfterMs(500)).code(), StatusCode::kDeadlineExceeded)
        << "the fast worker was not blocked at the bound";
    // One step of the slow worker is not enough; the second releases the pull.
    ASSERT_TRUE(slow->Wait(slow->Clock()).ok());
    EXPECT_EQ(fast->Wait(h, DeadlineAfterMs(300)).code(), StatusCode::kDeadlineExceeded);
    ASSERT_TRUE(slow->Wait(slow->Clock()).ok());
    EXPECT_TRUE(fast->Wait(h, DeadlineAfterMs(10000)).ok()) << "not released";
    // The slow worker itself is never blocked (it is behind).
    EXPECT_TRUE(slow->Wait(slow->Pull(*t, keys, out.data()), DeadlineAfterMs(5000)).ok());
  }
}

// Two threads waiting for one call: the first polls the sockets, the second sleeps on the
// call and is counted as a sleeper (client_io.cc, WaitCall), so that the client's I/O thread
// does not stand down while nobody polls once the first leaves. Uncounted, its reply could
// wait for the I/O thread's next round (20 ms).
TEST(ClusterTest, ASecondThreadWaitingForTheSameCallIsCountedAsSleeping) {
  using Access = internal::ClientTestAccess;
  LocalCluster cluster(testing::Servers(1));
  ASSERT_TRUE(cluster.Start().ok());
  ClientOptions o;
  o.consistency = {.num_workers = 2, .staleness = 0};
  o.worker_id = 0;
  auto fast = Connect(cluster, o);
  o.worker_id = 1;
  auto slow = Connect(cluster, o);
  ASSERT_TRUE(fast && slow);
  auto t = fast->CreateTable(TableSpec::Sparse("s", 2, Sgd(0.1f)));
  ASSERT_TRUE(t.ok());
  // A step ahead of the other worker at staleness 0: the pull waits until it catches up.
  ASSERT_TRUE(fast->Wait(fast->Clock()).ok());
  std::vector<uint64_t> keys = {1, 2, 3};
  std::vector<float> out(6);
  Handle h = fast->Pull(*t, keys, out.data());
  // Waits (up to 20 s, only if broken) until `what` holds.
  auto eventually = [](auto what) {
    const Deadline end = DeadlineAfterMs(20000);
    while (!what() && Clock::now() < end) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return what();
  };
  Status first, second;
  std::thread a([&] { first = fast->Wait(h); });
  ASSERT_TRUE(eventually([&] { return Access::PollingWaiters(*fast) == 1; }));
  std::thread b([&] { second = fast->Wait(h); });
  EXPECT_TRUE(eventually([&] { return Access::SleepingWaiters(*fast) == 1; }))
      << "the second waiter is not counted as sleeping";
  EXPECT_EQ(Access::PollingWaiters(*fast), 1u);
  ASSERT_TRUE(slow->Wait(slow->Clock()).ok());  // releases the pull
  a.join();
  b.join();
  EXPECT_TRUE(first.ok()) << first.ToString();
  EXPECT_TRUE(second.ok()) << second.ToString();
  EXPECT_EQ(Access::PollingWaiters(*fast), 0u);
  EXPECT_EQ(Access::SleepingWaiters(*fast), 0u);
}

// One client shared by several threads: each thread's calls are sent from its own thread when
// the sockets are free and its replies may be received by any waiting thread or the client's
// I/O thread (client_io.cc). Every reply must reach its own caller's buffer, in order, and a
// call cancelled while its waiter polls the sockets must end as cancelled.
TEST(ClusterTest, OneClientSharedByThreadsGetsEveryReplyRight) {
  LocalCluster cluster(testing::Servers(2));
  ASSERT_TRUE(cluster.Start().ok());
  auto client = Connect(cluster);
  ASSERT_NE(client, nullptr);
  const uint32_t dim = 4;
  auto t = client->CreateTable(TableSpec::Sparse("shared", dim, Sgd(1.0f)));
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  const int kThreads = 6, kSteps = 150, kKeys = 24;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int th = 0; th < kThreads; ++th) {
    threads.emplace_back([&, th] {
      std::vector<uint64_t> keys(kKeys);
      for (int i = 0; i < kKeys; ++i) keys[i] = uint64_t(th) * 1000 + i;
      std::vector<float> minus_one(kKeys * dim, -1.0f), out(kKeys * dim);
      for (int s = 1; s <= kSteps && failures.load() == 0; ++s) {
        // Push then pull without waiting in between: the pull is sent after the push and
        // must see it. Every few steps the waits come in the other order.
        Handle push = client->Push(*t, keys, minus_one);
        Handle pull = client->Pull(*t, keys, out.data());
        Status a, b;
        if (s % 3 == 0) {
          b = client->Wait(pull, DeadlineAfterMs(30000));
          a = client->Wait(push, DeadlineAfterMs(30000));
        } else {
          a = client->Wait(push, DeadlineAfterMs(30000));
          b = client->Wait(pull, DeadlineAfterMs(30000));
        }
        if (!a.ok() || !b.ok()) {
          ADD_FAILURE() << "thread " << th << " step " << s << ": " << a.ToString() << " / "
                        << b.ToString();
          ++failures;
          return;
        }
        for (size_t i = 0; i < out.size(); ++i) {
          if (out[i] != static_cast<float>(s)) {
            ADD_FAILURE() << "thread " << th << " step " << s << " element " << i << " is "
                          << out[i];
            ++failures;
            return;
          }
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  ASSERT_EQ(failures.load(), 0);

  // A call that cannot complete (a pull parked by bounded staleness) cancelled by another
  // thread while its waiter polls.
  ClientOptions o;
  o.consistency = {.num_workers = 2, .staleness = 0};
  o.worker_id = 0;
  auto fast = Connect(cluster, o);
  ASSERT_NE(fast, nullptr);
  ASSERT_TRUE(fast->Wait(fast->SetClock(2)).ok());
  std::vector<uint64_t> keys = {1, 2, 3};
  std::vector<float> out(3 * dim);
  Handle parked = fast->Pull(*t, keys, out.data());
  std::thread canceller([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    fast->Cancel(parked);
  });
  const Status s = fast->Wait(parked, DeadlineAfterMs(30000));
  canceller.join();
  EXPECT_EQ(s.code(), StatusCode::kCancelled) << s.ToString();
}

TEST(ClusterTest, BarrierWaitsForAllWorkers) {
  LocalCluster cluster(testing::Servers(1));
  ASSERT_TRUE(cluster.Start().ok());
  const int n = 3;
  std::atomic<int> arrived{0}, passed_early{0};
  std::vector<std::thread> ts;
  for (int w = 0; w < n; ++w) {
    ts.emplace_back([&, w] {
      ClientOptions o;
      o.worker_id = w;
      o.consistency.num_workers = n;
      auto c = Connect(cluster, o);
      if (!c) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(100 * w));
      ++arrived;
      Status s = c->Barrier("start", DeadlineAfterMs(20000));
      EXPECT_TRUE(s.ok()) << s.ToString();
      if (arrived.load() < n) ++passed_early;
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_EQ(passed_early.load(), 0);
}

TEST(ClusterTest, CurveEncryptedClusterRefusesPlainAndWrongKeyClients) {
  auto kp = GenerateCurveKeyPair();
  ASSERT_TRUE(kp.ok()) << kp.status().ToString();
  testing::LocalClusterOptions o = testing::Servers(2);
  LocalCluster probe(o);  // only for its temp dir
  const std::string key_file = probe.dir() + "/server.key";
  {
    std::FILE* f = std::fopen(key_file.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fprintf(f, "%s\n", kp->secret_key.c_str());
    std::fclose(f);
  }
  o.extra_flags = {"--curve_secret_key_file=" + key_file};
  LocalCluster cluster(o);
  ASSERT_TRUE(cluster.Start().ok());
  ClientOptions co;
  co.connect_timeout_ms = 1500;
  co.curve_server_key = kp->public_key;
  auto c = Connect(cluster, co);
  ASSERT_NE(c, nullptr);
  auto t = c->CreateTable(TableSpec::Sparse("secret", 2, Sgd(1.0f)));
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  std::vector<uint64_t> keys = {1, 2, 3, 4, 5};
  std::vector<float> g(10, 1.0f), out(10);
  ASSERT_TRUE(c->Wait(c->PushPull(*t, keys, g, out.data())).ok());
  EXPECT_EQ(out[0], -1.0f);
  // A client without the key, and one with another server key, never complete the handshake:
  // Create fails with FailedPrecondition naming the key (tests/edge_test.cc: within 1 s).
  ClientOptions plain;
  plain.servers = cluster.endpoints();
  plain.connect_timeout_ms = 1500;
  EXPECT_EQ(Client::Create(plain).status().code(), StatusCode::kFailedPrecondition);
  auto other = GenerateCurveKeyPair();
  ASSERT_TRUE(other.ok());
  plain.curve_server_key = other->public_key;
  EXPECT_EQ(Client::Create(plain).status().code(), StatusCode::kFailedPrecondition);
  plain.curve_server_key = "short";
  EXPECT_EQ(Client::Create(plain).status().code(), StatusCode::kInvalidArgument);
}

// With retries off, calls to a dead server fail fast (with retries on, the default, they wait
// for it to come back: tests/exactly_once_test.cc, tests/worker/ride_through_test.cc).
TEST(ClusterTest, KilledServerGivesUnavailableNotHang) {
  LocalCluster cluster(testing::Servers(2));
  ASSERT_TRUE(cluster.Start().ok());
  ClientOptions o;
  o.request_timeout_ms = 5000;
  o.retry_for_ms = 0;
  auto c = Connect(cluster, o);
  ASSERT_NE(c, nullptr);
  TableSpec spec = TableSpec::Sparse("emb", 4, Sgd(0.1f));
  auto t = c->CreateTable(spec);
  ASSERT_TRUE(t.ok());
  std::vector<uint64_t> keys(1000);
  for (uint64_t i = 0; i < keys.size(); ++i) keys[i] = i;  // touches both servers
  std::vector<float> out(4000);
  ASSERT_TRUE(c->Wait(c->Pull(*t, keys, out.data())).ok());

  cluster.Kill(1);
  const auto t0 = std::chrono::steady_clock::now();
  Status s = c->Wait(c->Pull(*t, keys, out.data()), DeadlineAfterMs(20000));
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
  EXPECT_LT(secs, 6.0);
  // Requests in flight when the server dies fail too.
  std::vector<Handle> many;
  for (int i = 0; i < 20; ++i) many.push_back(c->Pull(*t, keys, out.data()));
  for (auto& h : many)
    EXPECT_EQ(c->Wait(h, DeadlineAfterMs(20000)).code(), StatusCode::kUnavailable);

  // Back again: the same client works without being recreated. (Memory-only servers lost the
  // table, so create it again; the durable tier recovers it by itself.)
  ASSERT_TRUE(cluster.Restart(1).ok());
  Status created;
  for (int i = 0; i < 100; ++i) {
    created = c->CreateTable(spec).status();
    if (created.ok()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(created.ok()) << created.ToString();
  EXPECT_TRUE(c->Wait(c->Pull(*t, keys, out.data()), DeadlineAfterMs(10000)).ok());
}

}  // namespace
}  // namespace tessera
