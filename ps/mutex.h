// tessera::Mutex and tessera::MutexLock: std::mutex and std::unique_lock with the capability
// attributes that clang's -Wthread-safety analysis needs (libstdc++'s std::mutex carries none,
// so ABSL_GUARDED_BY(a std::mutex) would be ignored). Fields a Mutex protects are declared
// ABSL_GUARDED_BY(mu_) and scripts/check_thread_safety.sh (ctest thread_safety_analysis)
// checks every access with clang. docs/architecture.md, "Threads and locks".
#pragma once

#include <absl/base/thread_annotations.h>

#include <condition_variable>
#include <mutex>

namespace tessera {

/// A std::mutex that clang's thread-safety analysis knows as a capability. It is a std::mutex
/// (same locking, same cost): std::condition_variable waits on it through MutexLock::native(),
/// and code not yet converted can still lock it with std::lock_guard<std::mutex> (unchecked:
/// the analysis sees such a section as unlocked, so it cannot touch annotated fields).
/// Thread-safe, like std::mutex.
class ABSL_LOCKABLE Mutex : public std::mutex {
 public:
  void lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { std::mutex::lock(); }
  void unlock() ABSL_UNLOCK_FUNCTION() { std::mutex::unlock(); }
  [[nodiscard]] bool try_lock() ABSL_EXCLUSIVE_TRYLOCK_FUNCTION(true) {
    return std::mutex::try_lock();
  }
  /// Tells the analysis that the caller holds the mutex (where it cannot see why); no check
  /// at run time.
  void AssertHeld() const ABSL_ASSERT_EXCLUSIVE_LOCK() {}
};

/// Holds a Mutex for its scope, like std::unique_lock<std::mutex> (which it wraps, so a
/// std::condition_variable can wait on native()). Constructed with std::defer_lock it starts
/// unlocked; Lock(), TryLock() and Unlock() move it between the two states, and the destructor
/// unlocks if held. Not thread-safe: one thread owns it.
class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex& mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : lock_(mu) {}
  MutexLock(Mutex& mu, std::defer_lock_t) ABSL_LOCKS_EXCLUDED(mu) : lock_(mu, std::defer_lock) {}
  ~MutexLock() ABSL_UNLOCK_FUNCTION() {}
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { lock_.lock(); }
  [[nodiscard]] bool TryLock() ABSL_EXCLUSIVE_TRYLOCK_FUNCTION(true) { return lock_.try_lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() { lock_.unlock(); }
  [[nodiscard]] bool owns_lock() const { return lock_.owns_lock(); }

  /// For std::condition_variable::wait*: the wait releases and retakes the mutex inside, which
  /// the analysis does not see; it is held again when the wait returns. Wait in a loop that
  /// tests the condition in the caller (`while (!ready_) cv_.wait(l.native());`): a predicate
  /// lambda is analysed as a function of its own that holds no lock.
  std::unique_lock<std::mutex>& native() { return lock_; }

 private:
  std::unique_lock<std::mutex> lock_;
};

}  // namespace tessera
