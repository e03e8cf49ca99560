#include "ps/server/restore_credits_internal.h"

#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <thread>
#include <vector>

namespace tessera::internal {
namespace {

TEST(RestoreCredits, TheReaderWaitsForACreditOnceAllAreOutAndCountsTheWait) {
  RestoreCredits credits(2);
  std::atomic<bool> stop{false};
  std::vector<RestoreCredit> held;
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(credits.Acquire(stop).ok());
    held.emplace_back(&credits);
  }
  EXPECT_EQ(credits.out(), 2u);
  EXPECT_EQ(credits.waits(), 0u);
  // The third waits until a batch gives its credit back.
  auto third = std::async(std::launch::async, [&] { return credits.Acquire(stop); });
  EXPECT_EQ(third.wait_for(std::chrono::milliseconds(100)), std::future_status::timeout);
  held.front().Reset();
  ASSERT_EQ(third.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  EXPECT_TRUE(third.get().ok());
  RestoreCredit taken(&credits);
  EXPECT_EQ(credits.out(), 2u);
  EXPECT_EQ(credits.out_max(), 2u);
  EXPECT_EQ(credits.waits(), 1u);
  held.clear();
  { RestoreCredit gone = std::move(taken); }  // the moved-from one gives back nothing
  EXPECT_EQ(credits.out(), 0u);
  EXPECT_EQ(credits.out_max(), 2u);
}

TEST(RestoreCredits, AStopEndsAWaitWithCancelledAndTakesNothing) {
  RestoreCredits credits(1);
  std::atomic<bool> stop{false};
  ASSERT_TRUE(credits.Acquire(stop).ok());
  RestoreCredit held(&credits);
  auto waiting = std::async(std::launch::async, [&] { return credits.Acquire(stop); });
  EXPECT_EQ(waiting.wait_for(std::chrono::milliseconds(50)), std::future_status::timeout);
  stop.store(true);  // no notify: the waiter looks at the flag by itself
  ASSERT_EQ(waiting.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  Status s = waiting.get();
  EXPECT_EQ(s.code(), StatusCode::kCancelled) << s.ToString();
  EXPECT_EQ(credits.out(), 1u);
  // A stopping server gives none out even when one is free.
  held.Reset();
  EXPECT_EQ(credits.Acquire(stop).code(), StatusCode::kCancelled);
  EXPECT_EQ(credits.out(), 0u);
}

TEST(RestoreCredits, ManyReleasersNeverLetMoreThanTheLimitOut) {
  RestoreCredits credits(3);
  std::atomic<bool> stop{false};
  std::atomic<int> out{0}, most{0};
  std::vector<std::thread> lanes;
  for (int i = 0; i < 200; ++i) {
    ASSERT_TRUE(credits.Acquire(stop).ok());
    const int now = ++out;
    for (int m = most.load(); now > m && !most.compare_exchange_weak(m, now);) {
    }
    lanes.emplace_back([&, c = RestoreCredit(&credits)]() mutable {
      --out;
      c.Reset();
    });
  }
  for (auto& t : lanes) t.join();
  EXPECT_LE(most.load(), 3);
  EXPECT_LE(credits.out_max(), 3u);
  EXPECT_EQ(credits.out(), 0u);
}

}  // namespace
}  // namespace tessera::internal
