// The hot-row cache over a real in-process store (CreateLocalStore): its staleness bounds, key
// order, flushes, eviction and refusals.
#include "worker/row_cache.h"

#include <gtest/gtest.h>

#include <numeric>
#include <span>
#include <string>
#include <vector>

namespace tessera::worker {
namespace {

// SGD with learning rate 1 and zero initial values: a row's value is minus the sum of the
// gradients applied to it, exactly (small integers).
const OptimizerSpec kSgd{.kind = OptimizerKind::kSgd, .learning_rate = 1.0f};

struct Stores {
  std::unique_ptr<ParamStore> inner = CreateLocalStore();
  std::unique_ptr<CachingStore> cache;
  uint32_t table = 0;
  uint32_t dim = 0;

  std::vector<float> Pull(ParamStore* s, const std::vector<uint64_t>& keys) {
    std::vector<float> out(keys.size() * dim, -999.0f);
    EXPECT_TRUE(s->Pull(table, keys, out.data()).Wait().ok());
    return out;
  }
  void Push(ParamStore* s, const std::vector<uint64_t>& keys, const std::vector<float>& grads) {
    ASSERT_TRUE(s->Push(table, keys, grads).Wait().ok());
  }
};

Stores Make(int32_t staleness, uint32_t admit_count = 1, uint64_t rows = 1000, uint32_t dim = 2) {
  Stores st;
  RowCacheOptions o;
  o.rows = rows;
  o.staleness = staleness;
  o.admit_count = admit_count;
  auto c = CreateCachingStore(st.inner.get(), o);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  st.cache = std::move(*c);
  // The same table through both: the cache's index is the inner store's.
  st.table = st.cache->AddTable(TableSpec::Sparse("emb", dim, kSgd)).value();
  EXPECT_EQ(st.inner->AddTable(TableSpec::Sparse("emb", dim, kSgd)).value(), st.table);
  st.dim = dim;
  return st;
}

// Another worker (straight to the inner store) adds 1 to a row every clock; the cached pulls
// see each value at most S clocks after it was written, never later, and do serve values S
// clocks old (the cache is used).
TEST(RowCache, ServedValuesAreAtMostSClocksOld) {
  for (int32_t s : {1, 2, 4}) {
    SCOPED_TRACE("S=" + std::to_string(s));
    Stores st = Make(s);
    const std::vector<uint64_t> keys = {7, 8};
    int64_t max_age = 0;
    for (int64_t t = 0; t < 40; ++t) {
      st.Push(st.inner.get(), keys, {-1, -1, -1, -1});  // the value written at clock t: t + 1
      const std::vector<float> v = st.Pull(st.cache.get(), keys);
      for (float x : v) {
        const int64_t written = static_cast<int64_t>(x) - 1;
        ASSERT_LE(written, t);
        EXPECT_LE(t - written, s) << "clock " << t << " served the value of clock " << written;
        max_age = std::max(max_age, t - written);
      }
      ASSERT_TRUE(st.cache->Clock().Wait().ok());
    }
    EXPECT_EQ(max_age, s);
    const RowCacheStats stats = st.cache->stats();
    EXPECT_GT(stats.hits, 0u);
    EXPECT_EQ(stats.rows, 2u);
  }
}

// This worker pushes gradients through the cache every clock, in the trainer's order (pull,
// push, clock). After the Clock() that starts clock T, the inner store holds exactly the sum of
// a prefix of them that covers every gradient of clocks <= T - S; after Flush, all of them.
// With `passed` a key not held goes with each push, and the sums due at the next Clock() ride
// on that push instead.
TEST(RowCache, GradientsReachTheInnerStoreWithinSClocksSummedExactly) {
  for (int32_t s : {1, 2, 4}) {
    for (bool passed : {false, true}) {
      SCOPED_TRACE("S=" + std::to_string(s) + (passed ? " with keys passed on" : ""));
      Stores st = Make(s);
      const std::vector<uint64_t> keys = {5};
      std::vector<double> pushed;  // gradient of clock t (first coordinate; the second is 10x)
      bool deferred_seen = false;
      for (int64_t t = 0; t < 40; ++t) {
        st.Pull(st.cache.get(), keys);
        const float g = static_cast<float>(t % 3 + 1);
        if (passed) {
          st.Push(st.cache.get(), {5, 100000 + static_cast<uint64_t>(t)}, {g, 10 * g, 1, 1});
        } else {
          st.Push(st.cache.get(), keys, {g, 10 * g});
        }
        pushed.push_back(g);
        const double all = std::accumulate(pushed.begin(), pushed.end(), 0.0);
        if (-st.Pull(st.inner.get(), keys)[0] < all) deferred_seen = true;
        ASSERT_TRUE(st.cache->Clock().Wait().ok());
        const int64_t now = t + 1;
        const std::vector<float> v = st.Pull(st.inner.get(), keys);
        const double applied = -v[0];
        EXPECT_EQ(v[1], 10 * v[0]);
        // A prefix of the gradients, at least through clock now - S.
        size_t k = 0;
        double prefix = 0;
        while (k < pushed.size() && prefix < applied) prefix += pushed[k++];
        ASSERT_EQ(prefix, applied) << "not a prefix sum at clock " << now;
        EXPECT_GE(static_cast<int64_t>(k), now - s + 1)
            << "a gradient of clock " << k << " is still deferred at clock " << now;
      }
      // (At S = 1 a sum due at the next Clock() rides on the push that adds to it.)
      EXPECT_EQ(deferred_seen, !(passed && s == 1));
      ASSERT_TRUE(st.cache->Flush().ok());
      const double total = std::accumulate(pushed.begin(), pushed.end(), 0.0);
      EXPECT_EQ(-st.Pull(st.inner.get(), keys)[0], total);
      EXPECT_EQ(st.cache->stats().deferred_rows, 0u);
      EXPECT_EQ(st.cache->stats().passed_keys, passed ? 40u : 0u);
    }
  }
}

// A pull with held and missed keys in any order: misses are exactly the inner store's values
// now, hits the cached ones, each at its key's position; one pull of only hits reads nothing.
TEST(RowCache, MixedHitsAndMissesFillOutInKeyOrder) {
  Stores st = Make(/*staleness=*/4, /*admit_count=*/2, 1000, /*dim=*/3);
  const std::vector<uint64_t> all = {10, 20, 30, 40, 50};
  st.Push(st.inner.get(), all, std::vector<float>(15, -1.0f));            // every value 1
  EXPECT_EQ(st.Pull(st.cache.get(), all), st.Pull(st.inner.get(), all));  // counted once
  st.Pull(st.cache.get(), {20, 40});  // twice: admitted, fetched
  EXPECT_EQ(st.cache->stats().rows, 2u);
  std::vector<float> g;
  for (int k = 0; k < 6; ++k) g.insert(g.end(), {-1.0f * (k + 1), -2.0f * (k + 1), 0});
  const std::vector<uint64_t> order = {50, 40, 30, 20, 10, 60};
  st.Push(st.inner.get(), order, g);  // another worker changes every row
  const RowCacheStats before = st.cache->stats();
  const std::vector<float> got = st.Pull(st.cache.get(), order);
  const std::vector<float> now = st.Pull(st.inner.get(), order);
  for (size_t i = 0; i < order.size(); ++i) {
    for (uint32_t j = 0; j < 3; ++j) {
      const bool held = order[i] == 20 || order[i] == 40;
      const float want = held ? 1.0f : now[i * 3 + j];
      EXPECT_EQ(got[i * 3 + j], want) << "key " << order[i] << " coordinate " << j;
    }
  }
  EXPECT_EQ(st.cache->stats().hits - before.hits, 2u);
  EXPECT_EQ(st.cache->stats().misses - before.misses, 4u);
}

// Flush pushes every deferred gradient (none reached the inner store before it).
TEST(RowCache, FlushPushesEveryDeferredGradient) {
  Stores st = Make(/*staleness=*/4);
  std::vector<uint64_t> keys(100);
  std::iota(keys.begin(), keys.end(), 1000);
  std::vector<float> grads;
  for (uint64_t k : keys) grads.insert(grads.end(), {static_cast<float>(k % 7), 1.0f});
  st.Pull(st.cache.get(), keys);
  st.Push(st.cache.get(), keys, grads);
  st.Push(st.cache.get(), keys, grads);
  EXPECT_EQ(st.Pull(st.inner.get(), keys), std::vector<float>(200, 0.0f));
  EXPECT_EQ(st.cache->stats().deferred_rows, 100u);
  ASSERT_TRUE(st.cache->Flush().ok());
  const std::vector<float> v = st.Pull(st.inner.get(), keys);
  for (size_t i = 0; i < v.size(); ++i) EXPECT_EQ(v[i], -2 * grads[i]);
  const RowCacheStats s = st.cache->stats();
  EXPECT_EQ(s.deferred_rows, 0u);
  EXPECT_EQ(s.flushed_rows, 100u);
  EXPECT_EQ(s.flushes, 1u);
}

// A full cache gives a row up for a more frequent key and pushes that row's deferred gradient
// at once; the evicted key's next pull reads the inner store's value with it.
TEST(RowCache, EvictionPushesTheEvictedRowsGradient) {
  Stores st = Make(/*staleness=*/4, /*admit_count=*/1, /*rows=*/2);
  st.Pull(st.cache.get(), {1, 2});
  st.Push(st.cache.get(), {1, 2}, {3, 4, 5, 6});
  EXPECT_EQ(st.Pull(st.inner.get(), {1, 2}), std::vector<float>(4, 0.0f));
  st.Pull(st.cache.get(), {3});  // as frequent as 1 and 2: not admitted
  EXPECT_EQ(st.cache->stats().evictions, 0u);
  st.Pull(st.cache.get(), {3});  // more frequent now: one of 1 and 2 gives way
  const RowCacheStats s = st.cache->stats();
  EXPECT_EQ(s.evictions, 1u);
  EXPECT_EQ(s.rows, 2u);
  EXPECT_EQ(s.deferred_rows, 1u);
  const std::vector<float> v = st.Pull(st.inner.get(), {1, 2});
  const bool first = v[0] != 0;
  EXPECT_EQ(v, first ? std::vector<float>({-3, -4, 0, 0}) : std::vector<float>({0, 0, -5, -6}));
  const uint64_t evicted = first ? 1 : 2;
  EXPECT_EQ(st.Pull(st.cache.get(), {evicted}),
            first ? std::vector<float>({-3, -4}) : std::vector<float>({-5, -6}));
}

// The count tables stay within their bound however many distinct keys go by, and a frequent
// key is still admitted.
TEST(RowCache, CountTablesAreBounded) {
  RowCacheOptions o;
  o.rows = 4;
  o.staleness = 2;
  o.admit_count = 2;
  o.counted_keys = 500;
  auto inner = CreateLocalStore();
  auto cache = CreateCachingStore(inner.get(), o).value();
  const uint32_t t = cache->AddTable(TableSpec::Sparse("emb", 1, kSgd)).value();
  std::vector<float> out(101);
  for (uint64_t round = 0; round < 100; ++round) {
    std::vector<uint64_t> keys = {1};  // in every pull
    for (uint64_t i = 0; i < 100; ++i) keys.push_back(1000 + round * 100 + i);
    ASSERT_TRUE(cache->Pull(t, keys, out.data()).Wait().ok());
    EXPECT_LE(cache->stats().counted_keys, 500u);
  }
  ASSERT_TRUE(cache->Pull(t, std::vector<uint64_t>{1}, out.data()).Wait().ok());
  EXPECT_GT(cache->stats().hits, 0u);
}

// Dense tables, meta and the clock pass through; a dense push is applied at once.
TEST(RowCache, DenseTablesPassThrough) {
  Stores st = Make(/*staleness=*/2);
  const uint32_t d = st.cache->AddTable(TableSpec::Dense("w", 2, kSgd)).value();
  ASSERT_TRUE(st.cache->DensePush(d, 0, std::vector<float>{1, 2}).Wait().ok());
  std::vector<float> w(2);
  ASSERT_TRUE(st.inner->DensePull(d, 0, 2, w.data()).Wait().ok());
  EXPECT_EQ(w, (std::vector<float>{-1, -2}));
  ASSERT_TRUE(st.cache->PutMeta("k", "v").ok());
  EXPECT_EQ(st.inner->GetMeta("k").value().value(), "v");
  ASSERT_TRUE(st.cache->Clock().Wait().ok());
  EXPECT_EQ(st.cache->clock(), 1);
  EXPECT_EQ(st.cache->Push(st.table, std::vector<uint64_t>{1}, std::vector<float>{1}).Wait().code(),
            StatusCode::kInvalidArgument);
}

// An inner store whose pulls read the real local store when they are waited, not when they are
// issued (as a remote pull's answer comes after its request), and fail if issued while `fail`
// is set; it counts the keys pulls ask for.
class LateStore final : public ForwardingStore {
 public:
  explicit LateStore(ParamStore* inner) : ForwardingStore(inner) {}
  Pending Pull(uint32_t table, std::span<const uint64_t> keys, float* out) override {
    pulled_keys += keys.size();
    if (fail) return Pending([] { return Status::Unavailable("pull lost"); });
    return Pending([this, table, k = std::vector<uint64_t>(keys.begin(), keys.end()), out] {
      return inner_->Pull(table, k, out).Wait();
    });
  }
  uint64_t pulled_keys = 0;
  bool fail = false;
};

struct LateStores {
  std::unique_ptr<ParamStore> local = CreateLocalStore();
  LateStore late{local.get()};
  std::unique_ptr<CachingStore> cache;
  uint32_t table = 0;
  // Pulls `keys` through the cache without waiting; `out` must outlive the wait.
  Pending Issue(const std::vector<uint64_t>& keys, std::vector<float>* out) {
    out->assign(keys.size() * 2, -999.0f);
    return cache->Pull(table, keys, out->data());
  }
};

// Rows 1..4 at value {k, k} in the local store, behind a cache of `rows` rows (dim 2).
std::unique_ptr<LateStores> MakeLate(int32_t staleness, uint64_t rows = 1000) {
  auto st = std::make_unique<LateStores>();
  RowCacheOptions o;
  o.rows = rows;
  o.staleness = staleness;
  o.admit_count = 1;
  st->cache = CreateCachingStore(&st->late, o).value();
  st->table = st->cache->AddTable(TableSpec::Sparse("emb", 2, kSgd)).value();
  for (uint64_t k = 1; k <= 4; ++k) {
    const float g = -static_cast<float>(k);
    EXPECT_TRUE(st->local->Push(st->table, std::vector<uint64_t>{k}, std::vector<float>{g, g})
                    .Wait()
                    .ok());
  }
  return st;
}

std::vector<float> Values(const std::vector<uint64_t>& keys) {
  std::vector<float> v;
  for (uint64_t k : keys) v.insert(v.end(), 2, static_cast<float>(k));
  return v;
}

// A pull issued while an earlier pull's fetch of a held row is in flight (prefetch) does not
// send the row's key again: it serves that fetch's value, whichever pull is waited first.
TEST(RowCache, PullsIssuedAheadShareARowsFetchInFlight) {
  auto st = MakeLate(/*staleness=*/2);
  std::vector<float> a, b;
  Pending pa = st->Issue({1, 2, 3}, &a);
  Pending pb = st->Issue({3, 1, 2, 4}, &b);
  EXPECT_EQ(st->late.pulled_keys, 4u);  // 1, 2, 3 once, and 4
  ASSERT_TRUE(pb.Wait().ok());          // waits for a's fetch of its rows
  EXPECT_EQ(b, Values({3, 1, 2, 4}));
  ASSERT_TRUE(pa.Wait().ok());
  EXPECT_EQ(a, Values({1, 2, 3}));
  EXPECT_EQ(st->cache->stats().joined, 3u);
  // Past S clocks the rows are fetched again, once for both pulls.
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(st->cache->Clock().Wait().ok());
  pa = st->Issue({1, 2}, &a);
  pb = st->Issue({2, 1}, &b);
  EXPECT_EQ(st->late.pulled_keys, 6u);
  ASSERT_TRUE(pa.Wait().ok());
  ASSERT_TRUE(pb.Wait().ok());
  EXPECT_EQ(a, Values({1, 2}));
  EXPECT_EQ(b, Values({2, 1}));
  EXPECT_EQ(st->cache->stats().joined, 5u);
}

// A fetch in flight is not joined by a pull issued more than S clocks after it: that value
// would be too old for it.
TEST(RowCache, APullDoesNotJoinAFetchOlderThanSClocks) {
  auto st = MakeLate(/*staleness=*/2);
  std::vector<float> a, b;
  Pending pa = st->Issue({1}, &a);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(st->cache->Clock().Wait().ok());
  Pending pb = st->Issue({1}, &b);
  EXPECT_EQ(st->late.pulled_keys, 2u);
  EXPECT_EQ(st->cache->stats().joined, 0u);
  ASSERT_TRUE(pb.Wait().ok());
  ASSERT_TRUE(pa.Wait().ok());
  EXPECT_EQ(b, Values({1}));
}

// A joined fetch that fails, or whose row is evicted before its values arrive, leaves the
// joining pull to fetch the row itself: it still gets the right values.
TEST(RowCache, AJoinFetchesTheRowItselfWhenTheFetchFailsOrTheRowGoes) {
  {
    auto st = MakeLate(/*staleness=*/2);
    std::vector<float> a, b;
    st->late.fail = true;
    Pending pa = st->Issue({1, 2}, &a);
    st->late.fail = false;
    Pending pb = st->Issue({1, 2}, &b);
    ASSERT_TRUE(pb.Wait().ok());
    EXPECT_EQ(b, Values({1, 2}));
    EXPECT_EQ(pa.Wait().code(), StatusCode::kUnavailable);
    EXPECT_EQ(st->late.pulled_keys, 4u);
    EXPECT_EQ(st->cache->stats().joined, 0u);
  }
  {
    auto st = MakeLate(/*staleness=*/2, /*rows=*/1);
    std::vector<float> a, b, c;
    Pending pa = st->Issue({1}, &a);     // holds row 1 (count 1), fetch in flight
    Pending pb = st->Issue({1}, &b);     // joins it (row 1's count 2)
    Pending pc = st->Issue({2, 2, 2}, &c);  // count 3: row 2 takes the only slot
    EXPECT_EQ(st->cache->stats().evictions, 1u);
    ASSERT_TRUE(pb.Wait().ok());
    EXPECT_EQ(b, Values({1}));
    ASSERT_TRUE(pa.Wait().ok());
    ASSERT_TRUE(pc.Wait().ok());
    EXPECT_EQ(a, Values({1}));
    EXPECT_EQ(c, Values({2, 2, 2}));
    EXPECT_EQ(st->late.pulled_keys, 1u + 3u + 1u);
  }
}

TEST(RowCache, RefusesBulkSynchronousConsistencyAndBadBounds) {
  auto inner = CreateLocalStore();
  RowCacheOptions o;
  o.consistency_staleness = 0;
  auto bsp = CreateCachingStore(inner.get(), o);
  ASSERT_EQ(bsp.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bsp.status().message().find("bulk-synchronous"), std::string::npos);
  o.consistency_staleness = 3;
  EXPECT_TRUE(CreateCachingStore(inner.get(), o).ok());
  for (auto bad :
       {RowCacheOptions{.rows = 0}, RowCacheOptions{.rows = kMaxCacheRows + 1},
        RowCacheOptions{.staleness = 0}, RowCacheOptions{.staleness = kMaxCacheStaleness + 1},
        RowCacheOptions{.admit_count = 0}}) {
    EXPECT_EQ(CreateCachingStore(inner.get(), bad).status().code(), StatusCode::kInvalidArgument);
  }
  EXPECT_FALSE(CreateCachingStore(nullptr, RowCacheOptions{}).ok());
}

}  // namespace
}  // namespace tessera::worker
