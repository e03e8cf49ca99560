// The server tier with a table larger than its memory budget, for bench_storage: a tessera-server
// on RocksDB with --memory_budget_mb at a quarter of the table's raw bytes, next to a memory-only
// server in the same run.
#pragma once

#include <cstdint>
#include <string>

#include "ps/status.h"

namespace tessera::bench {

struct ServerBudgetOptions {
  std::string server_binary;
  uint64_t rows = 1000000;  // in the table
  uint32_t dim = 16;        // Adagrad: as many state floats
  uint32_t batch = 10000;   // keys per push or pull (uniform over the table)
  int reps = 3;             // alternating between the servers; medians
  double min_rep_s = 2;     // each push and each pull phase of a repetition lasts at least this
  uint64_t block_cache_mb = 16;
  uint64_t write_buffer_mb = 16;
};

struct ServerBudgetResult {
  uint64_t budget_mb = 0;  // --memory_budget_mb: a quarter of rows x (value + state) bytes
  double push_budget = 0, push_memory = 0;  // caller keys per second, medians
  double pull_budget = 0, pull_memory = 0;
  // The durable server's resident memory: just started (no table), and its peak (VmHWM) over
  // the whole run, fill included.
  double base_rss_mb = 0, peak_rss_mb = 0;
  // The documented fixed overhead: the started server's memory + --block_cache_mb +
  // --write_buffer_mb (docs/storage.md, "Memory bound").
  double overhead_mb = 0;
  double rss_vs_budget_plus_overhead = 0;  // peak / (budget + overhead)
};

// Starts both servers (child processes, 2 lanes, the one not measured paused), fills the table
// on each, then measures pushes and pulls of uniform keys. Errors: a server that does not start
// or a request that fails.
Result<ServerBudgetResult> MeasureServerBudget(const ServerBudgetOptions& options);

}  // namespace tessera::bench
