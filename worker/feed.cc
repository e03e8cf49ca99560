#include "worker/feed.h"

#include <sched.h>

#include <algorithm>
#include <condition_variable>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "ps/mutex.h"

namespace tessera::worker {

uint32_t DefaultDataThreads(uint32_t local_ranks) {
  uint32_t cores = 0;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) cores = CPU_COUNT(&set);
  if (cores == 0) cores = std::thread::hardware_concurrency();
  const uint32_t share = std::max<uint32_t>(cores, 1) / std::max<uint32_t>(local_ranks, 1);
  return std::clamp<uint32_t>(share > 1 ? share - 1 : 1, 1, 8);
}

// Batch `seq` (the seq-th chunk cut) lives in slot seq % depth from its cut until Next takes
// it. A thread may cut seq only while seq < next_out_ + depth, so the slot is free then: the
// slot's data belongs to the thread that cut it until it is kReady, then to the consumer until
// it is kFree again (the states, under mu_, hand it over).
class BatchFeed::Impl {
 public:
  Impl(DataReader* reader, uint32_t batch_size, uint32_t threads, uint32_t depth)
      : reader_(reader),
        schema_(reader->schema()),
        batch_size_(batch_size),
        depth_(depth),
        slots_(depth),
        states_(depth, State::kFree) {
    threads_.reserve(threads);
    for (uint32_t i = 0; i < threads; ++i) threads_.emplace_back([this] { Run(); });
  }

  ~Impl() {
    {
      MutexLock lock(mu_);
      stop_ = true;
    }
    space_.notify_all();
    for (std::thread& t : threads_) t.join();
  }

  Result<bool> Next(ReadyBatch* out) {
    if (!final_.ok()) return final_;
    if (ended_) return End(out);
    size_t i = 0;
    {
      MutexLock lock(mu_);
      i = next_out_ % depth_;
      while (states_[i] != State::kReady) ready_.wait(lock.native());
    }
    Slot& slot = slots_[i];
    bool more = true;
    if (!slot.status.ok()) {
      final_ = slot.status;
    } else if (slot.end) {
      ended_ = true;
      end_position_ = slot.ready.position;
      more = false;
    } else {
      std::swap(*out, slot.ready);  // out's buffers go to the slot, for a later batch
    }
    {
      MutexLock lock(mu_);
      states_[i] = State::kFree;
      ++next_out_;
    }
    space_.notify_all();
    if (!final_.ok()) return final_;
    if (!more) return End(out);
    return true;
  }

  uint32_t threads() const { return static_cast<uint32_t>(threads_.size()); }
  uint32_t depth() const { return depth_; }
  uint32_t queued() const {
    MutexLock lock(mu_);
    return static_cast<uint32_t>(std::count(states_.begin(), states_.end(), State::kReady));
  }

 private:
  enum class State : uint8_t { kFree, kBusy, kReady };
  struct Slot {
    ReadyBatch ready;
    Status status;     // the batch's error (it is then the last)
    bool end = false;  // the end of the data (the last)
  };

  Result<bool> End(ReadyBatch* out) {
    out->batch.Clear(schema_);
    out->index.unique_keys.clear();
    out->index.rows.clear();
    out->position = end_position_;
    return false;
  }

  // A data thread: cuts the next chunk (one thread at a time), then parses and indexes it.
  void Run() ABSL_LOCKS_EXCLUDED(mu_, cut_mu_) {
    while (true) {
      MutexLock cut(cut_mu_);
      uint64_t seq = 0;
      {
        MutexLock lock(mu_);
        while (!stop_ && !cut_done_ && next_cut_ >= next_out_ + depth_) {
          space_.wait(lock.native());
        }
        if (stop_ || cut_done_) return;
        seq = next_cut_++;
        states_[seq % depth_] = State::kBusy;
      }
      Result<std::unique_ptr<DataChunk>> chunk = reader_->ReadChunk(batch_size_);
      const uint64_t position = reader_->position();
      if (!chunk.ok() || (*chunk)->size() == 0) StopCutting();
      cut.Unlock();

      Slot& slot = slots_[seq % depth_];
      slot.ready.position = position;
      slot.end = false;
      slot.status = chunk.ok() ? Make(**chunk, &slot.ready) : chunk.status();
      if (slot.status.ok() && slot.ready.batch.size == 0) slot.end = true;
      if (!slot.status.ok()) StopCutting();  // nothing after an error is handed over
      if (chunk.ok()) chunk->reset();        // (its buffers are freed here, not under mu_)
      {
        MutexLock lock(mu_);
        states_[seq % depth_] = State::kReady;
      }
      ready_.notify_all();
    }
  }

  void StopCutting() ABSL_LOCKS_EXCLUDED(mu_) {
    {
      MutexLock lock(mu_);
      cut_done_ = true;
    }
    space_.notify_all();
  }

  // The chunk's samples and their index into *ready.
  Status Make(DataChunk& chunk, ReadyBatch* ready) const {
    ready->batch.Clear(schema_);
    TESSERA_RETURN_IF_ERROR(chunk.Parse(&ready->batch));
    if (ready->batch.size != chunk.size()) {
      return Status::Internal("a chunk of " + std::to_string(chunk.size()) +
                              " samples parsed into " + std::to_string(ready->batch.size));
    }
    IndexBatch(ready->batch, &ready->index);
    return Status::OK();
  }

  Mutex cut_mu_;  // one thread cuts at a time (the reader is not thread-safe)
  DataReader* const reader_ ABSL_PT_GUARDED_BY(cut_mu_);
  const Schema schema_;
  const uint32_t batch_size_;
  const uint32_t depth_;
  std::vector<Slot> slots_;  // handed over by states_ (see the class comment)

  mutable Mutex mu_;
  std::condition_variable ready_;  // a slot became kReady
  std::condition_variable space_;  // the window moved, or cutting stopped
  std::vector<State> states_ ABSL_GUARDED_BY(mu_);
  uint64_t next_cut_ ABSL_GUARDED_BY(mu_) = 0;  // the seq the next chunk cut gets
  uint64_t next_out_ ABSL_GUARDED_BY(mu_) = 0;  // the seq Next hands over next
  bool cut_done_ ABSL_GUARDED_BY(mu_) = false;  // the end or an error was cut
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;

  // The consumer's.
  Status final_;
  bool ended_ = false;
  uint64_t end_position_ = 0;
};

Result<std::unique_ptr<BatchFeed>> BatchFeed::Start(DataReader* reader,
                                                    const FeedOptions& options) {
  if (reader == nullptr) return Status::InvalidArgument("feed: no reader");
  if (options.batch_size == 0) return Status::InvalidArgument("feed: batch_size is 0");
  if (options.threads > kMaxDataThreads) {
    return Status::InvalidArgument("feed: " + std::to_string(options.threads) +
                                   " data threads, more than the bound " +
                                   std::to_string(kMaxDataThreads));
  }
  if (options.depth > kMaxFeedDepth) {
    return Status::InvalidArgument("feed: depth " + std::to_string(options.depth) +
                                   " over the bound " + std::to_string(kMaxFeedDepth));
  }
  const uint32_t threads = options.threads != 0 ? options.threads : DefaultDataThreads();
  const uint32_t depth = options.depth != 0 ? options.depth : 2 * threads + 2;
  return std::unique_ptr<BatchFeed>(
      new BatchFeed(std::make_unique<Impl>(reader, options.batch_size, threads, depth)));
}

BatchFeed::BatchFeed(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
BatchFeed::~BatchFeed() = default;
Result<bool> BatchFeed::Next(ReadyBatch* out) { return impl_->Next(out); }
uint32_t BatchFeed::threads() const { return impl_->threads(); }
uint32_t BatchFeed::depth() const { return impl_->depth(); }
uint32_t BatchFeed::queued() const { return impl_->queued(); }

}  // namespace tessera::worker
