// The server's metrics: per-op request counts, errors and latency, bytes, and the state that
// other threads own (lanes, storage, clocks), mirrored once per maintenance pass.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ps/codec.h"
#include "ps/metrics/metrics.h"
#include "ps/mutex.h"
#include "storage/storage.h"

namespace tessera::internal {

/// Thread-safe: the I/O thread, the lanes and the file writer answer requests.
class ServerMetrics {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;

  ServerMetrics(metrics::Registry& registry, uint32_t rank, uint32_t num_servers,
                uint32_t lanes);
  ~ServerMetrics();  // removes the collectors

  /// A message came in: `op` decoded (nullptr: its envelope did not decode), `bytes` in all.
  void Received(const Op* op, size_t bytes);
  /// A reply of `bytes` (all frames) was queued.
  void Sent(size_t bytes) { sent_bytes_->Inc(bytes); }
  /// A request was answered, `ok` or with an error; `received`: when it came in.
  void Completed(Op op, bool ok, TimePoint received);

  /// Lines for the Stats op (tessera-ctl stats): version, uptime, and per op that was seen
  /// "op_<name> requests=N errors=E p50_ms=X p99_ms=Y" (quantiles as the upper bound of their
  /// latency bucket).
  std::string StatsLines() const;

  /// Lane `l`'s store, published by the lane itself (a maintenance task).
  void PublishLane(uint32_t l, const StoreStats& st, std::vector<TableMemory> tables,
                   uint64_t dirty_bytes, uint64_t back_pressure_waits, uint64_t durable_log_mark);

  /// The I/O thread's state, published once per maintenance pass.
  struct IoState {
    uint64_t tables = 0, connections = 0, parked = 0, stalled_peers = 0;
    int64_t min_clock = 0, max_clock = 0, max_push_clock = -1;
    uint64_t log_last_seq = 0, log_truncated_to = 0;
    uint64_t refused_connections = 0, dropped_replies = 0, throttled_requests = 0,
             retried_pushes = 0, push_keys = 0, pull_keys = 0;
    // Hardening (issue 35): pushes of clients known nowhere refused, push marks in memory and
    // spilled to the store, idle connections displaced, forwarded pushes that expired while
    // held and that named a map ahead of etcd's.
    uint64_t unknown_client_pushes = 0, push_marks_in_memory = 0, push_marks_spilled = 0,
             idle_connections_displaced = 0, replica_held_expired = 0,
             replica_refused_ahead = 0;
    // Restores (restore_credits_internal.h): the most batches queued to the lanes at once,
    // and the times the checkpoint reader waited for a lane.
    uint64_t restore_queued_batches_max = 0, restore_back_pressure_waits = 0;
    bool checkpoint_pending = false;
    std::vector<std::pair<uint64_t, std::string>> table_names;  // id, name
    std::vector<std::pair<std::string, uint64_t>> engine;  // StorageEngine::EngineStats()
  };
  void PublishIo(IoState s);

 private:
  struct PerOp {
    metrics::Counter* requests;
    metrics::Counter* errors;
    metrics::Histogram* seconds;
  };
  struct LaneMirror {
    std::atomic<uint64_t> rows{0}, bytes{0}, lookups{0}, memory_hits{0}, applies{0},
        apply_memory_hits{0}, evicted{0}, disk_reads{0}, budget_evictions{0}, admission_rejects{0},
        write_backs{0},
        rows_written{0}, dirty_bytes{0}, back_pressure_waits{0}, durable_log_mark{0};
    Mutex tables_mu;
    std::vector<TableMemory> tables ABSL_GUARDED_BY(tables_mu);
  };
  void AddLaneCollectors();
  void AddIoCollectors();
  void AddTableCollectors();

  metrics::Registry& registry_;
  const TimePoint started_ = std::chrono::steady_clock::now();
  std::array<PerOp, kMaxOp + 1> ops_{};
  metrics::Counter* invalid_requests_;
  metrics::Counter* invalid_errors_;
  metrics::Counter* received_bytes_;
  metrics::Counter* sent_bytes_;
  std::vector<std::unique_ptr<LaneMirror>> lanes_;
  Mutex io_mu_;
  IoState io_ ABSL_GUARDED_BY(io_mu_);
};

}  // namespace tessera::internal
