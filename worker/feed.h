// The data pipeline ahead of training: a reader's batches cut, parsed (or generated), hashed to
// keys and indexed on threads of their own, into a bounded queue of ready batches, in order.
#pragma once

#include <cstdint>
#include <memory>

#include "ps/status.h"
#include "worker/batch.h"
#include "worker/data_reader.h"

namespace tessera::worker {

/// A batch ready for training: its samples, their keys deduplicated, and where the reader is
/// after it.
struct ReadyBatch {
  Batch batch;            ///< the samples (batch.size == 0 only at the end)
  IndexedBatch index;     ///< IndexBatch(batch): unique_keys ascending, rows per key entry
  uint64_t position = 0;  ///< the reader's position() after this batch's samples
};

/// Options of a BatchFeed.
struct FeedOptions {
  uint32_t batch_size = 1024;  ///< samples per batch (the last may be smaller)
  uint32_t threads = 0;        ///< threads that parse/generate and index; 0: DefaultDataThreads()
  uint32_t depth = 0;          ///< ready batches queued at most; 0: 2 * threads + 2
};

/// The bounds Start enforces on FeedOptions::threads and FeedOptions::depth.
inline constexpr uint32_t kMaxDataThreads = 256;
inline constexpr uint32_t kMaxFeedDepth = 4096;

/// The data threads a feed uses by default on this machine: the cores this process may run on
/// (its CPU affinity mask, else std::thread::hardware_concurrency()), divided among the node's
/// `local_ranks` (0 counts as 1), less one for the rank's training thread; at least 1, at most
/// 8. A data thread that is ahead waits (the queue is bounded), so a spare one costs memory,
/// not CPU. E.g. 2 cores: 1; 16 cores: 8; 16 cores and 8 local ranks: 1.
uint32_t DefaultDataThreads(uint32_t local_ranks = 1);

/// Reads `reader` ahead of training on its own threads. Each thread in turn cuts the reader's
/// next chunk (DataReader::ReadChunk, one at a time, with the reader's position after it), then
/// parses it and indexes its keys (IndexBatch) alongside the others; Next hands the batches
/// over in the order they were cut. So the batches and positions are exactly those of
/// sequential Read(batch_size) + IndexBatch calls, whatever the number of threads: training
/// stays reproducible. Readers without a parallel part (DataReader::ReadChunk's default) are
/// read on the feed's threads one batch at a time and indexed in parallel.
/// Not thread-safe: one consumer thread calls Next.
class BatchFeed {
 public:
  /// Borrows `reader`, positioned where training starts; the feed is its only user until
  /// destroyed (afterwards its position is past the batches read ahead). InvalidArgument for
  /// a null reader, batch_size 0, or threads or depth over kMaxDataThreads / kMaxFeedDepth.
  static Result<std::unique_ptr<BatchFeed>> Start(DataReader* reader, const FeedOptions& options);
  ~BatchFeed();  ///< stops and joins the threads (also when batches are still queued)

  /// The next batch, in order, swapped into *out (pass the same ReadyBatch objects back so
  /// buffers are reused). false at the end of the data (then out->batch is empty and
  /// out->position is the reader's position at the end), and on every later call. A reader
  /// error is returned in order, after the batches before it, and then again on every later
  /// call.
  Result<bool> Next(ReadyBatch* out);

  /// The threads and the queue's depth in use.
  uint32_t threads() const;
  uint32_t depth() const;
  /// Batches made and waiting for Next (at most depth()); for tests and metrics.
  uint32_t queued() const;

 private:
  class Impl;
  explicit BatchFeed(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera::worker
