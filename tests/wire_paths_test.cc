// The client's large-request paths against real tessera-server processes: dense calls cut
// into chunk requests (ClientOptions::dense_chunk_bytes) give bit-identical tables and pulls to
// one request per server, and sparse calls with strictly increasing keys (no dedup; frames
// taken whole from the caller's buffers) give the same rows as the deduping path, while keys
// that only look sorted (repeats) take the deduping path.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "ps/client/client.h"
#include "tests/cluster_fixture.h"

namespace tessera {
namespace {

using testing::LocalCluster;

std::unique_ptr<Client> Connect(const LocalCluster& c, uint64_t dense_chunk_bytes) {
  ClientOptions o;
  o.servers = c.endpoints();
  o.dense_chunk_bytes = dense_chunk_bytes;
  auto r = Client::Create(o);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? std::move(r).value() : nullptr;
}

OptimizerSpec Adagrad() {
  OptimizerSpec o;
  o.kind = OptimizerKind::kAdagrad;
  o.learning_rate = 0.1f;
  o.initial_accumulator = 0.1f;
  return o;
}

// The "pushes" counter of every server, summed: requests, so chunk requests count one each.
int64_t PushRequests(Client& c) {
  int64_t sum = 0;
  for (uint32_t rank : c.server_ids()) {
    auto stats = c.ServerStats(rank);
    if (!stats.ok()) return -1;
    const std::string& t = *stats;
    const size_t p = t.find("\npushes ");
    if (p == std::string::npos) return -1;
    sum += std::strtoll(t.c_str() + p + 8, nullptr, 10);
  }
  return sum;
}

std::vector<float> Gradients(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> g(n);
  for (float& x : g) x = d(rng);
  return g;
}

// Two servers, a dense Adagrad table of a length that is no multiple of a chunk: pushes of
// ranges that start and end inside server chunks, through a client that cuts them into 64 KiB
// requests and one that sends a request per server, into tables of their own; every pull of
// either table through either client is bit-identical, and a chunked pull writes nothing
// outside its range.
TEST(WirePathsTest, ChunkedDenseCallsAreBitIdenticalToOneRequestPerServer) {
  LocalCluster cluster(testing::Servers(2));
  ASSERT_TRUE(cluster.Start().ok());
  auto whole = Connect(cluster, 0);
  auto chunked = Connect(cluster, 64 << 10);
  ASSERT_NE(whole, nullptr);
  ASSERT_NE(chunked, nullptr);
  constexpr uint64_t kLength = 1000003;
  auto a = whole->CreateTable(TableSpec::Dense("whole", kLength, Adagrad()));
  auto b = chunked->CreateTable(TableSpec::Dense("chunked", kLength, Adagrad()));
  ASSERT_TRUE(a.ok() && b.ok());
  const int64_t pushes_before = PushRequests(*chunked);
  struct Range {
    uint64_t offset, length;
  };
  const std::vector<Range> ranges = {{0, kLength}, {12345, 900001}, {499999, 7}, {3, 200000}};
  uint64_t seed = 1;
  for (const Range& r : ranges) {
    const std::vector<float> g = Gradients(r.length, seed++);
    ASSERT_TRUE(whole->Wait(whole->DensePush(*a, r.offset, g)).ok());
    ASSERT_TRUE(chunked->Wait(chunked->DensePush(*b, r.offset, g)).ok());
    // The zero-copy form cut into chunks too.
    auto owned = std::make_shared<const std::vector<float>>(g);
    ASSERT_TRUE(whole->Wait(whole->DensePush(*a, r.offset, owned)).ok());
    ASSERT_TRUE(chunked->Wait(chunked->DensePush(*b, r.offset, owned)).ok());
  }
  // Chunks are requests of their own: the 64 KiB client sent more than one a server.
  const int64_t pushes = PushRequests(*chunked) - pushes_before;
  EXPECT_GT(pushes, 2 * 2 * static_cast<int64_t>(ranges.size()))
      << "the chunked client sent no more requests than one per server";
  for (const Range& r : ranges) {
    // Sentinels around the range: a chunk written at the wrong place shows.
    std::vector<float> ref(r.length + 2, -7.0f), got_a(r.length + 2, -7.0f),
        got_b(r.length + 2, -7.0f), whole_b(r.length + 2, -7.0f);
    ASSERT_TRUE(whole->Wait(whole->DensePull(*a, r.offset, r.length, ref.data() + 1)).ok());
    ASSERT_TRUE(chunked->Wait(chunked->DensePull(*a, r.offset, r.length, got_a.data() + 1)).ok());
    ASSERT_TRUE(chunked->Wait(chunked->DensePull(*b, r.offset, r.length, got_b.data() + 1)).ok());
    ASSERT_TRUE(whole->Wait(whole->DensePull(*b, r.offset, r.length, whole_b.data() + 1)).ok());
    EXPECT_EQ(ref.front(), -7.0f);
    EXPECT_EQ(ref.back(), -7.0f);
    EXPECT_EQ(0, std::memcmp(ref.data(), got_a.data(), ref.size() * 4))
        << "chunked pull of the unchunked table differs, range at " << r.offset;
    EXPECT_EQ(0, std::memcmp(ref.data(), got_b.data(), ref.size() * 4))
        << "the table pushed in chunks differs, range at " << r.offset;
    EXPECT_EQ(0, std::memcmp(ref.data(), whole_b.data(), ref.size() * 4))
        << "unchunked pull of the chunked table differs, range at " << r.offset;
  }
}

// Keys strictly increasing, repeated, and shuffled, pushed (span and zero-copy forms) and
// pulled on one server (frames taken whole) and on two (routed, no dedup): every table pushed
// through strictly increasing keys equals one pushed the same rows in shuffled order (the
// deduping path), and keys sorted with repeats are summed once per key (Adagrad would tell
// two applications from one) as the shuffled repeats are.
void ExpectPresortedPathsMatchTheDedupingPath(uint32_t servers) {
  LocalCluster cluster(testing::Servers(servers));
  ASSERT_TRUE(cluster.Start().ok());
  auto c = Connect(cluster, 0);
  ASSERT_NE(c, nullptr);
  constexpr uint32_t kDim = 5;
  auto sorted_t = c->CreateTable(TableSpec::Sparse("sorted", kDim, Adagrad()));
  auto shuffled_t = c->CreateTable(TableSpec::Sparse("shuffled", kDim, Adagrad()));
  ASSERT_TRUE(sorted_t.ok() && shuffled_t.ok());
  std::mt19937_64 rng(servers);
  for (int round = 0; round < 3; ++round) {
    // Unique sorted keys, every third one with a repeat in the "repeats" batch.
    std::vector<uint64_t> keys;
    for (uint64_t k = 1 + round; keys.size() < 3000; k += 1 + rng() % 50) keys.push_back(k);
    std::vector<uint64_t> repeats;
    for (size_t i = 0; i < keys.size(); ++i) {
      repeats.push_back(keys[i]);
      if (i % 3 == 0) repeats.push_back(keys[i]);
    }
    for (const std::vector<uint64_t>* batch : {&keys, &repeats}) {
      const std::vector<float> g = Gradients(batch->size() * kDim, 100 + round);
      // The same rows in shuffled order (the deduping path).
      std::vector<size_t> order(batch->size());
      for (size_t i = 0; i < order.size(); ++i) order[i] = i;
      std::shuffle(order.begin(), order.end(), rng);
      std::vector<uint64_t> sk;
      std::vector<float> sg;
      for (size_t i : order) {
        sk.push_back((*batch)[i]);
        sg.insert(sg.end(), g.begin() + i * kDim, g.begin() + (i + 1) * kDim);
      }
      ASSERT_TRUE(c->Wait(c->Push(*shuffled_t, sk, sg)).ok());
      if (round % 2 == 0) {
        ASSERT_TRUE(c->Wait(c->Push(*sorted_t, *batch, g)).ok());
      } else {
        auto ok = std::make_shared<const std::vector<uint64_t>>(*batch);
        auto og = std::make_shared<const std::vector<float>>(g);
        ASSERT_TRUE(c->Wait(c->Push(*sorted_t, ok, og)).ok());
        // ZeroMQ frees a sent message on its I/O thread, possibly just after the reply.
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
        while ((ok.use_count() > 1 || og.use_count() > 1) &&
               std::chrono::steady_clock::now() < until) {
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
        EXPECT_EQ(ok.use_count(), 1) << "the client still holds the pushed keys";
        EXPECT_EQ(og.use_count(), 1) << "the client still holds the pushed gradients";
      }
    }
    // Pulls: sorted keys (no dedup), shuffled keys with repeats (deduped), both tables.
    std::vector<float> a(keys.size() * kDim, -7.0f), b(keys.size() * kDim, -7.0f);
    ASSERT_TRUE(c->Wait(c->Pull(*sorted_t, keys, a.data())).ok());
    ASSERT_TRUE(c->Wait(c->Pull(*shuffled_t, keys, b.data())).ok());
    ASSERT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4))
        << "round " << round << ": the table pushed by sorted keys differs";
    std::vector<uint64_t> mixed = repeats;
    std::shuffle(mixed.begin(), mixed.end(), rng);
    std::vector<float> m(mixed.size() * kDim);
    ASSERT_TRUE(c->Wait(c->Pull(*sorted_t, mixed, m.data())).ok());
    for (size_t i = 0; i < mixed.size(); ++i) {
      const size_t at = std::lower_bound(keys.begin(), keys.end(), mixed[i]) - keys.begin();
      ASSERT_EQ(0, std::memcmp(m.data() + i * kDim, a.data() + at * kDim, kDim * 4))
          << "row of key " << mixed[i];
    }
  }
}

TEST(WirePathsTest, PresortedSparseKeysMatchTheDedupingPathOnOneServer) {
  ExpectPresortedPathsMatchTheDedupingPath(1);
}

TEST(WirePathsTest, PresortedSparseKeysMatchTheDedupingPathOnTwoServers) {
  ExpectPresortedPathsMatchTheDedupingPath(2);
}

// The zero-copy sparse push refuses null buffers and a length mismatch, and lets go of them.
TEST(WirePathsTest, ZeroCopySparsePushRefusesBadBuffers) {
  LocalCluster cluster(testing::Servers(1));
  ASSERT_TRUE(cluster.Start().ok());
  auto c = Connect(cluster, 0);
  ASSERT_NE(c, nullptr);
  auto t = c->CreateTable(TableSpec::Sparse("emb", 4, Adagrad()));
  ASSERT_TRUE(t.ok());
  auto keys = std::make_shared<const std::vector<uint64_t>>(std::vector<uint64_t>{1, 2, 3});
  auto short_grads = std::make_shared<const std::vector<float>>(11, 1.0f);
  const Status s = c->Wait(c->Push(*t, keys, short_grads));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_EQ(c->Wait(c->Push(*t, keys, nullptr)).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(keys.use_count(), 1);
  EXPECT_EQ(short_grads.use_count(), 1);
}

}  // namespace
}  // namespace tessera
