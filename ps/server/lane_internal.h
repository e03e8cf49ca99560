// The server's executor threads: lanes, each owning the rows of its slots alone, and the file
// writer that writes checkpoint files off the lanes.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "ps/mutex.h"
#include "ps/server/request_internal.h"
#include "storage/storage.h"

namespace tessera::internal {

class Lane;

/// One lane's part of a request.
struct Task {
  std::shared_ptr<Pending> pending;
  std::function<Status(Lane&)> run;
  /// The part writes rows (they are committed with the lane's batch).
  bool writes = false;
  /// Request-log sequence number this part completes for its lane (0: none).
  uint64_t seq = 0;
  /// How the lane may reorder this part (Lane::ServeWaitingReads). kRead: a sparse pull that
  /// no clock orders; it may run before kWrite parts of other connections queued or running
  /// ahead of it. kWrite: a push whose rows are as durable once applied as the engine makes
  /// anything (logged, or a memory-only server). kNone: nothing passes it (admin work,
  /// restores, clock-ordered reads).
  enum class Pass : uint8_t { kNone, kRead, kWrite };
  Pass pass = Pass::kNone;
  /// Run and answered ahead of its turn (RunBatch skips it).
  bool done = false;
};

/// One executor thread owning the rows of its slots. Tasks run in the order they were
/// submitted; each finished task finishes one part of its request (FinishPart), so the lane
/// that finishes a request's last part sends its reply. Submit(), Stop() and TryRunInline()
/// are thread-safe; the store, the step counter and the scratch buffers belong to whoever runs
/// the lane's tasks (the lane thread, or the I/O thread in TryRunInline, holding run_mu_).
class Lane {
 public:
  /// `write_back_interval_ms` > 0: rows changed by logged pushes are handed to the storage
  /// engine's writer about that often (the request log holds them durably meanwhile), and at
  /// once when more than `max_dirty_bytes` (0: no limit) are not yet durable, then waiting for
  /// the previous hand-off (back-pressure); 0: every batch that wrote commits before it is
  /// answered. Replies go to `reply_endpoint` (an inproc PULL the I/O thread forwards).
  Lane(uint32_t index, std::unique_ptr<LaneStore> store, zmq::context_t& ctx,
       const std::string& reply_endpoint, uint32_t write_back_interval_ms,
       uint64_t max_dirty_bytes);
  ~Lane();
  Lane(const Lane&) = delete;
  Lane& operator=(const Lane&) = delete;

  void Submit(Task t);
  /// Runs what is queued, then joins the thread. Idempotent.
  void Stop();

  /// Runs `t` on the calling thread (the I/O thread) when the lane is idle with nothing
  /// queued, and replies over `reply`; false (nothing done) otherwise. Saves the two thread
  /// hops of small requests. Order holds: nothing of this lane is queued or running.
  bool TryRunInline(Task& t, zmq::socket_t& reply);

  LaneStore& store() { return *store_; }
  /// The request-log mark this lane's rows are durable up to.
  uint64_t committed_seq() const { return committed_seq_.load(std::memory_order_acquire); }
  uint32_t index() const { return index_; }
  /// The lane's next step number (row update steps for eviction by idle steps).
  /// Called by a running task: its runner holds run_mu_ (the task reaches it through a
  /// std::function, where the analysis cannot follow the lock).
  uint64_t NextStep() {
    run_mu_.AssertHeld();
    return ++step_;
  }
  /// The last step number given out (rows updated so far have last_step <= it). Lane thread.
  uint64_t step() const {
    run_mu_.AssertHeld();
    return step_;
  }
  /// Times the lane waited for the storage writer because too many rows were not yet durable.
  uint64_t back_pressure_waits() const { return waits_.load(std::memory_order_relaxed); }
  /// Reads answered ahead of writes queued or running before them (ServeWaitingReads).
  uint64_t reads_passed() const { return reads_passed_.load(std::memory_order_relaxed); }

  /// Marks a snapshot of this lane's rows (a checkpoint's or an export's) as being written by
  /// the file writer until the returned object is destroyed (any thread). Meanwhile the lane
  /// postpones its periodic write-back hand-offs (not those forced by max_dirty_bytes), for at
  /// most kMaxWriteBackPostponement intervals after the last one. A hand-off during the
  /// snapshot's scan freezes the rows a second time (copy-on-write again) and runs the
  /// engine's writer (memtable inserts, a flush) beside the file writer: on a 2-core machine,
  /// with hand-offs postponed, RocksDB checkpoints took 0.7x as long and their longest push
  /// 0.8x (docs/benchmarks.md).
  std::shared_ptr<void> SnapshotBeingWritten();
  /// Write-back ticks (interval periods) whose periodic hand-off was postponed because a
  /// snapshot was being written; a tick counts once however many batches found it due.
  uint64_t write_backs_postponed() const {
    return postponed_.load(std::memory_order_relaxed);
  }
  /// Write-back hand-offs the lane asked its store for (periodic and forced by
  /// max_dirty_bytes).
  uint64_t write_back_hand_offs() const {
    return hand_offs_.load(std::memory_order_relaxed);
  }

  /// Called by a running kWrite part between slices of its work: runs and answers the kRead
  /// parts queued behind it (in this batch or the queue) that only kWrite parts of other
  /// connections stand before, so that a small read does not wait for a large push. A read
  /// sees the running push partly applied, as a read on another lane can already see a push
  /// one lane applied and the other not yet; a read of the push's own connection, or one
  /// behind anything else (admin work, a restore, a clock-ordered read), keeps its turn.
  /// Called by a running task: its runner holds run_mu_ (asserted, as in NextStep).
  void ServeWaitingReads() ABSL_LOCKS_EXCLUDED(mu_);

  // Scratch buffers for request parts, reused across requests (lane thread only).
  std::vector<uint64_t> scratch_keys;
  std::vector<const float*> scratch_grads;
  std::vector<float*> scratch_outs;

 private:
  void Loop() ABSL_LOCKS_EXCLUDED(mu_, run_mu_);
  // `may_wait`: whether back-pressure may block this thread (not the I/O thread's inline runs).
  void RunBatch(std::vector<Task>& batch, zmq::socket_t& reply, bool may_wait)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(run_mu_) ABSL_LOCKS_EXCLUDED(mu_);
  // Commits writes the request log does not hold; hands rows to the writer when due.
  void WriteBackIfDue(std::vector<Task>& batch, bool may_wait)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(run_mu_);
  bool HasWork() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !queue_.empty(); }
  // Runs read `t` ahead of its turn and answers it.
  void RunAhead(Task& t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(run_mu_);

  const uint32_t index_;
  std::unique_ptr<LaneStore> store_;
  zmq::socket_t push_;  // used only by this lane's thread
  std::thread thread_;
  // Held while tasks run: by the lane thread, or by the I/O thread for an inline run. Locked
  // before mu_ when both are held (Loop takes the batch under both); TryRunInline only
  // try-locks it under mu_, which cannot deadlock.
  mutable Mutex run_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  Mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> queue_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t step_ ABSL_GUARDED_BY(run_mu_) = 0;
  const std::chrono::milliseconds write_back_interval_;
  const uint64_t max_dirty_bytes_;
  std::chrono::steady_clock::time_point last_write_back_ ABSL_GUARDED_BY(run_mu_){};
  // The write-back period last counted in postponed_ (-1: none).
  int64_t last_postponed_period_ ABSL_GUARDED_BY(run_mu_) = -1;
  std::atomic<uint64_t> committed_seq_{0};
  std::atomic<uint64_t> waits_{0};
  // kRead parts submitted and not yet run: ServeWaitingReads looks no further when 0.
  std::atomic<uint32_t> reads_waiting_{0};
  std::atomic<uint64_t> reads_passed_{0};
  // Snapshots of this lane being written (SnapshotBeingWritten): shared with their guards,
  // which may outlive the lane in a file writer's queue.
  const std::shared_ptr<std::atomic<int>> snapshots_writing_ =
      std::make_shared<std::atomic<int>>(0);
  std::atomic<uint64_t> postponed_{0};
  std::atomic<uint64_t> hand_offs_{0};
  // The batch RunBatch is running, the index of its running part, and where replies go.
  std::vector<Task>* running_batch_ ABSL_GUARDED_BY(run_mu_) = nullptr;
  size_t running_index_ ABSL_GUARDED_BY(run_mu_) = 0;
  zmq::socket_t* running_reply_ ABSL_GUARDED_BY(run_mu_) = nullptr;
};

/// While a snapshot is being written, a lane's periodic write-back waits at most this many
/// intervals after its last hand-off (then hands off anyway: the durable mark, and with it the
/// request log a restart replays, lags by at most this many intervals plus a write and a flush).
inline constexpr int kMaxWriteBackPostponement = 4;

/// Keys a sparse push applies between two looks for reads waiting behind it
/// (Lane::ServeWaitingReads): about 0.2-1 ms of a lane's work.
inline constexpr size_t kApplySlice = 2048;

/// A lane's part of a sparse pull, push or push-pull `p`: the keys at `idx` of p's keys
/// (those of this lane); a push applies their gradients (p.values), a pull writes their rows
/// into p.out, at each key's place in the request.
Status RunSparsePart(Lane& lane, Pending& p, const std::vector<uint32_t>& idx, uint64_t table_id,
                     uint32_t dim, bool push, bool pull, float lr_scale);
/// A lane's part of a dense pull or push `p`: its segments `segs` of the range; a push applies
/// p.values at each segment's place, a pull writes p.out (or its reply frames: p.out_frames,
/// or slot `lane_index` of p.lane_frames and p.lane_index).
Status RunDensePart(Lane& lane, uint32_t lane_index, Pending& p,
                    const std::vector<DenseSegment>& segs, uint64_t table_id, bool push,
                    float lr_scale);

/// Runs file work off the lanes (writing checkpoint and export snapshots), one job at a time,
/// then finishes one part of the job's request. Submit() and Stop() are thread-safe.
class FileWriter {
 public:
  FileWriter(zmq::context_t& ctx, const std::string& reply_endpoint);
  ~FileWriter();
  FileWriter(const FileWriter&) = delete;
  FileWriter& operator=(const FileWriter&) = delete;

  /// Runs `work`, then finishes one part of `p` (which the caller added) with its status.
  void Submit(std::shared_ptr<Pending> p, std::function<Status()> work);
  /// Runs what is queued, then joins the thread. Idempotent.
  void Stop();

 private:
  struct Job {
    std::shared_ptr<Pending> pending;
    std::function<Status()> work;
  };
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);

  zmq::socket_t push_;  // writer thread only
  std::thread thread_;
  Mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> jobs_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace tessera::internal
