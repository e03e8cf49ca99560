// The request log's group write on a thread of its own, so that the I/O thread can go on
// forwarding the lanes' replies and serving reads that no push orders while the disk syncs
// (ServerImpl::FlushStagedServingReads, log_wait.cc).
#pragma once

#include <condition_variable>
#include <functional>
#include <thread>

#include "ps/mutex.h"
#include "ps/status.h"

namespace tessera::internal {

/// Tests: `hook` runs on the writer thread before each group write that FlushStagedServingReads
/// starts (null: none), in every server of the process.
void SetLogWriteHookForTesting(std::function<void()> hook);

/// Runs one write at a time on its thread and signals its end on a descriptor the I/O thread
/// polls. Start, Done, Finish and fd: the I/O thread only.
class LogGroupWriter {
 public:
  LogGroupWriter();
  ~LogGroupWriter();
  LogGroupWriter(const LogGroupWriter&) = delete;
  LogGroupWriter& operator=(const LogGroupWriter&) = delete;

  /// Starts `write` on the writer thread (nothing may be running).
  void Start(std::function<Status()> write) ABSL_LOCKS_EXCLUDED(mu_);
  /// Whether the write has ended.
  bool Done() ABSL_LOCKS_EXCLUDED(mu_);
  /// Waits for the write's end; returns its status and resets the descriptor.
  Status Finish() ABSL_LOCKS_EXCLUDED(mu_);
  /// Readable once the write has ended (an eventfd).
  int fd() const { return fd_; }

 private:
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);

  const int fd_;
  Mutex mu_;
  std::condition_variable cv_;
  std::function<Status()> job_ ABSL_GUARDED_BY(mu_);
  bool running_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  Status result_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace tessera::internal
