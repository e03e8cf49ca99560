// MapRecheck without a store: the loader is a function that reads a version the test sets.
#include "ps/server/map_recheck_internal.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

namespace tessera::internal {
namespace {

// Waits (up to 10 s) until NewestSince(ticket) answers.
std::optional<uint64_t> AwaitNewest(const MapRecheck& r, uint64_t ticket) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < until) {
    if (auto n = r.NewestSince(ticket)) return n;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return std::nullopt;
}

TEST(MapRecheck, AnswersOnlyAfterAReadThatStartedAfterTheTicket) {
  std::atomic<uint64_t> stored{3};
  std::atomic<uint64_t> applied{0};
  MapRecheck r([&](const RoutingMap& m) { applied = m.version; });
  EXPECT_FALSE(r.enabled());
  EXPECT_EQ(r.Request(), 0u);  // no loader: nothing to wait for
  ASSERT_TRUE(r.SetLoader([&]() -> Result<RoutingMap> {
                 RoutingMap m;
                 m.version = stored.load();
                 return m;
               }).ok());
  EXPECT_EQ(r.SetLoader([] { return Result<RoutingMap>(RoutingMap{}); }).code(),
            StatusCode::kFailedPrecondition);
  const uint64_t first = r.Request();
  EXPECT_EQ(AwaitNewest(r, first), std::optional<uint64_t>(3));
  EXPECT_EQ(applied.load(), 3u);  // the map read is served by too
  // A map stored later: a ticket issued after it is answered by a read that sees it, never
  // by the earlier read.
  stored = 7;
  const uint64_t second = r.Request();
  EXPECT_GT(second, first);
  EXPECT_EQ(AwaitNewest(r, second), std::optional<uint64_t>(7));
  EXPECT_EQ(applied.load(), 7u);
}

TEST(MapRecheck, AFailedReadAnswersNothingAndNotFoundIsVersionZero) {
  std::atomic<int> mode{0};  // 0: the store does not answer, 1: no map stored
  MapRecheck r([](const RoutingMap&) {});
  ASSERT_TRUE(r.SetLoader([&]() -> Result<RoutingMap> {
                 if (mode == 0) return Status::Unavailable("etcd does not answer");
                 return Status::NotFound("no cluster map");
               }).ok());
  const uint64_t t = r.Request();
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (r.failed_reads() == 0 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(r.failed_reads(), 1u);
  EXPECT_EQ(r.NewestSince(t), std::nullopt);  // unknown: the push waits (its deadline)
  mode = 1;
  const uint64_t again = r.Request();
  EXPECT_EQ(AwaitNewest(r, again), std::optional<uint64_t>(0));
}

}  // namespace
}  // namespace tessera::internal
