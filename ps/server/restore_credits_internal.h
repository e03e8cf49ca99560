// Back-pressure for Restore (admin_ops.cc): a bound on the row batches the checkpoint reader
// has queued to the lanes and they have not yet applied, so a restore's memory does not grow
// with the checkpoint's size.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>

#include "ps/mutex.h"
#include "ps/status.h"

namespace tessera::internal {

/// A counting semaphore of restore batches. The reader (the I/O thread) takes a credit with
/// Acquire() before it queues a batch to a lane; the batch holds it (RestoreCredit) and gives it
/// back with its copy of the rows once its lane has applied them. Counts the most credits out
/// at once and the acquisitions that had to wait, for stats and metrics. Thread-safe: the I/O
/// thread acquires, the lanes release, anyone reads the counts. Must outlive every credit it
/// gave out.
class RestoreCredits {
 public:
  /// `limit`: most credits out at once; at least 1 (0 is taken as 1).
  explicit RestoreCredits(uint32_t limit);
  RestoreCredits(const RestoreCredits&) = delete;
  RestoreCredits& operator=(const RestoreCredits&) = delete;

  /// Waits until fewer than limit() credits are out and takes one: OK. Cancelled (nothing
  /// taken) when `stop` is or becomes true first (looked at every few milliseconds while
  /// waiting: the server's shutdown flag, so a shutdown never waits for a restore's credits).
  [[nodiscard]] Status Acquire(const std::atomic<bool>& stop);
  /// Gives back a credit taken by Acquire (RestoreCredit calls it).
  void Release();

  uint32_t limit() const { return limit_; }
  /// Credits out now: batches queued to the lanes or being applied.
  uint64_t out() const;
  /// The most credits that were out at once since the server started.
  uint64_t out_max() const;
  /// Acquisitions that found every credit out and waited (back-pressure on the reader).
  uint64_t waits() const;

 private:
  const uint32_t limit_;
  mutable Mutex mu_;
  std::condition_variable cv_;
  uint64_t out_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t out_max_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t waits_ ABSL_GUARDED_BY(mu_) = 0;
};

/// One credit of a RestoreCredits, given back when this is destroyed (or moved from and
/// reset). Move-only. Not thread-safe by itself: one owner at a time.
class RestoreCredit {
 public:
  RestoreCredit() = default;
  /// Takes ownership of a credit `credits` gave out (Acquire returned OK).
  explicit RestoreCredit(RestoreCredits* credits) : credits_(credits) {}
  RestoreCredit(RestoreCredit&& o) noexcept : credits_(o.credits_) { o.credits_ = nullptr; }
  RestoreCredit& operator=(RestoreCredit&& o) noexcept;
  RestoreCredit(const RestoreCredit&) = delete;
  RestoreCredit& operator=(const RestoreCredit&) = delete;
  ~RestoreCredit() { Reset(); }

  /// Gives the credit back now (nothing when it holds none).
  void Reset();

 private:
  RestoreCredits* credits_ = nullptr;
};

}  // namespace tessera::internal
