// BackgroundRun: the thread of one of a server's background controllers (scale.h,
// BackgroundController). Internal to tessera_control.
#pragma once

#include <atomic>
#include <functional>
#include <mutex>
#include <thread>

namespace tessera::internal {

// Runs `run` on a thread of its own after each Kick (once more when kicked while it runs): a
// controller of tessera-ctl (a backup rebuild, a scale taking in servers that registered).
// Thread-safe; destruction sets the stop flag `run` is given (a controller stops before its
// next batch) and joins.
class BackgroundRun {
 public:
  explicit BackgroundRun(std::function<void(const std::atomic<bool>*)> run)
      : run_(std::move(run)) {}
  ~BackgroundRun();
  BackgroundRun(const BackgroundRun&) = delete;
  BackgroundRun& operator=(const BackgroundRun&) = delete;

  void Kick();

 private:
  void Loop();

  const std::function<void(const std::atomic<bool>*)> run_;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  bool running_ = false, again_ = false;
  std::thread thread_;
};

}  // namespace tessera::internal
