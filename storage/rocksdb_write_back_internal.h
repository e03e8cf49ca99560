// A lane's write-back hand-off to the RocksDB engine's writer thread (docs/storage.md). The
// methods not defined here are in rocksdb_write_back.cc, with the writer's loop and the lane's
// side (hand-off, reap).
#pragma once

#include <rocksdb/write_batch.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "ps/status.h"
#include "storage/row_cache_internal.h"

namespace tessera::internal {

// One lane's rows (and applied mark) handed to the engine's writer thread. The lane copies the
// rows out (the copy is the snapshot the writer writes); the writer sorts and batches them.
// Reused by the lane once done, so its buffers do not fault in fresh pages every time.
struct WriteBackJob {
  static constexpr int kQueued = 0, kDone = 1, kFailed = 2;
  // Sparse rows of one column family: the lane's arena frozen at the hand-off and the slots of
  // the rows to write. The writer encodes them and lets the arena go.
  struct Family {
    rocksdb::ColumnFamilyHandle* cf = nullptr;
    uint32_t floats = 0;
    CachedRows::Frozen frozen;
    std::vector<uint32_t> slots;
  };
  std::vector<Family> families;
  size_t used_families = 0;
  // The lane's applied mark and its dense chunks; the writer appends the sparse rows.
  rocksdb::WriteBatch batch;
  // The writer's: sparse rows encoded, before they go into `batch` (not zeroed when allocated:
  // a write-back of a million rows spent a tenth of the writer's time in memset and faults).
  std::unique_ptr<char[]> records;
  size_t records_capacity = 0;
  char* Records(size_t bytes) {
    if (bytes > records_capacity) {
      records.reset(new char[bytes]);
      records_capacity = bytes;
    }
    return records.get();
  }
  // The lane's: the writer flushes the memtables after this job's round (Commit: the rows
  // durable on return). Other rounds stay in the memtables until a flush (docs/storage.md).
  bool flush = false;
  // The lane's: the writer flushes once this job's round, and the rounds of the jobs queued
  // behind it, are written (WriteBack's flush_soon).
  bool flush_soon = false;
  // The writer's, set before state leaves kQueued: the round that wrote the batch, and whether
  // that round was flushed (the rows and the mark durable) before the job was done.
  uint64_t round = 0;
  bool durable = false;
  Status error;         // set before state leaves kQueued
  std::atomic<int> state{kQueued};

  void Reset() {
    ReleaseRows();
    for (Family& f : families) f.slots.clear();
    used_families = 0;
    batch.Clear();
    flush = flush_soon = durable = false;
    round = 0;
    error = Status::OK();
    state.store(kQueued, std::memory_order_relaxed);
  }
  // Lets the lane's arena go: its next change to a block need not copy it.
  void ReleaseRows() {
    for (Family& f : families) f.frozen = CachedRows::Frozen();
  }
  Family& NextFamily(rocksdb::ColumnFamilyHandle* cf, uint32_t floats) {
    if (used_families == families.size()) families.emplace_back();
    Family& f = families[used_families++];
    f.cf = cf;
    f.floats = floats;
    return f;
  }
  // Encodes the sparse rows, releasing the arena, and appends them to `batch` in key order (a
  // memtable insert in order starts its skiplist search where the previous key went; measured:
  // the unsorted inserts were a quarter of a durable server's CPU).
  Status AppendSortedRows();
  // The lane's copy at the hand-off (budgeted lanes): `slots` of `rows` appended to `batch` in
  // key order, encoded straight into it (no arena is frozen, so no push copies a block).
  rocksdb::Status CopySortedRows(const CachedRows& rows, rocksdb::ColumnFamilyHandle* cf,
                                 std::span<const uint32_t> slots);
  // Frees `records` (and `batch`) when large.
  void TrimBuffers(bool batch_too);
  void Wait() {
    for (int s = state.load(std::memory_order_acquire); s == kQueued;
         s = state.load(std::memory_order_acquire)) {
      state.wait(s, std::memory_order_acquire);
    }
  }
};

}  // namespace tessera::internal
