// BackgroundRun (background_run_internal.h): a run after each kick, one more for the kicks
// while it runs, the stop flag set and the thread joined by destruction. No etcd, no sockets.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>

#include "ps/control/background_run_internal.h"

namespace tessera::internal {
namespace {

using std::chrono::milliseconds;

// Waits up to 10 s for `done`.
template <typename F>
bool Eventually(F done) {
  for (int i = 0; i < 10000 && !done(); ++i) std::this_thread::sleep_for(milliseconds(1));
  return done();
}

// A run that counts itself and waits until it is let go (or stopped).
struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  bool open = false;
  std::atomic<int> started{0}, finished{0};
  std::atomic<bool> saw_stop{false};

  void Run(const std::atomic<bool>* stop) {
    ++started;
    std::unique_lock<std::mutex> l(mu);
    cv.wait_for(l, std::chrono::seconds(10), [&] { return open || stop->load(); });
    if (stop->load()) saw_stop = true;
    ++finished;
  }
  void Open() {
    std::lock_guard<std::mutex> l(mu);
    open = true;
    cv.notify_all();
  }
};

TEST(BackgroundRun, KicksDuringARunGiveExactlyOneMoreRun) {
  Gate gate;
  BackgroundRun run([&](const std::atomic<bool>* stop) { gate.Run(stop); });
  run.Kick();
  ASSERT_TRUE(Eventually([&] { return gate.started == 1; }));
  run.Kick();  // while the first run waits: one more run, however many kicks
  run.Kick();
  run.Kick();
  gate.Open();
  ASSERT_TRUE(Eventually([&] { return gate.finished == 2; }));
  std::this_thread::sleep_for(milliseconds(50));
  EXPECT_EQ(gate.started, 2);
  // A kick after the runs ended starts a new one (on a new thread).
  run.Kick();
  ASSERT_TRUE(Eventually([&] { return gate.finished == 3; }));
  EXPECT_FALSE(gate.saw_stop);
}

TEST(BackgroundRun, DestructionStopsTheRunAndJoinsIt) {
  Gate gate;
  auto run =
      std::make_unique<BackgroundRun>([&](const std::atomic<bool>* stop) { gate.Run(stop); });
  run->Kick();
  ASSERT_TRUE(Eventually([&] { return gate.started == 1; }));
  run->Kick();  // due again, but the stop comes first
  // The run sees the flag when it next looks (a controller: before its next batch); the
  // notifications wake the gate's wait so that the test need not wait out its timeout.
  std::thread poke([&] {
    for (int i = 0; i < 10000 && !gate.saw_stop; ++i) {
      gate.cv.notify_all();
      std::this_thread::sleep_for(milliseconds(1));
    }
  });
  run.reset();  // joins
  EXPECT_EQ(gate.finished, 1);
  EXPECT_TRUE(gate.saw_stop);
  EXPECT_EQ(gate.started, 1);  // the kick left due is not run after the stop
  poke.join();
}

TEST(BackgroundRun, NoKickNoRun) {
  std::atomic<int> runs{0};
  {
    BackgroundRun run([&](const std::atomic<bool>*) { ++runs; });
  }
  EXPECT_EQ(runs, 0);
}

}  // namespace
}  // namespace tessera::internal
