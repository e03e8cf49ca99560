#include <glog/logging.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <span>
#include <string>
#include <string_view>

#include "ps/message_pool_internal.h"
#include "ps/server/lane_internal.h"
#include "ps/thread_name_internal.h"

namespace tessera::internal {
namespace {

constexpr int kFileWriterNice = 10;  // a tenth of a normal thread's share when both want a core

// An inproc PUSH socket to the I/O thread's reply queue.
zmq::socket_t ReplySocket(zmq::context_t& ctx, const std::string& endpoint) {
  zmq::socket_t s(ctx, zmq::socket_type::push);
  s.set(zmq::sockopt::sndhwm, 0);
  s.set(zmq::sockopt::linger, 0);
  s.connect(endpoint);
  return s;
}

}  // namespace

Lane::Lane(uint32_t index, std::unique_ptr<LaneStore> store, zmq::context_t& ctx,
           const std::string& reply_endpoint, uint32_t write_back_interval_ms,
           uint64_t max_dirty_bytes)
    : index_(index),
      store_(std::move(store)),
      push_(ReplySocket(ctx, reply_endpoint)),
      write_back_interval_(std::chrono::milliseconds(write_back_interval_ms)),
      max_dirty_bytes_(max_dirty_bytes) {
  committed_seq_.store(store_->committed_seq());
  thread_ = std::thread([this] { Loop(); });
}

Lane::~Lane() { Stop(); }

void Lane::Submit(Task t) {
  if (t.pass == Task::Pass::kRead) reads_waiting_.fetch_add(1, std::memory_order_relaxed);
  {
    MutexLock l(mu_);
    queue_.push_back(std::move(t));
  }
  cv_.notify_one();
}

void Lane::Stop() {
  {
    MutexLock l(mu_);
    if (stop_) return;
    stop_ = true;
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
  push_.close();
}

bool Lane::TryRunInline(Task& t, zmq::socket_t& reply) {
  {
    MutexLock l(mu_);
    if (!queue_.empty() || stop_) return false;
    if (!run_mu_.try_lock()) return false;
  }
  if (t.pass == Task::Pass::kRead) reads_waiting_.fetch_add(1, std::memory_order_relaxed);
  std::vector<Task> one;
  one.push_back(std::move(t));
  RunBatch(one, reply, /*may_wait=*/false);
  run_mu_.unlock();
  return true;
}

void Lane::Loop() {
  NameThisThread("lane-" + std::to_string(index_));
  std::vector<Task> batch;
  // An idle lane still wakes up: to hand off rows once the interval is over, and to notice a
  // finished hand-off (which moves the log mark on).
  const auto tick = std::clamp<std::chrono::milliseconds>(
      write_back_interval_ / 4, std::chrono::milliseconds(10), std::chrono::milliseconds(1000));
  for (;;) {
    {
      MutexLock l(mu_);
      // cv_.wait_for(l, tick, HasWork), spelled out so the analysis sees mu_ held.
      const auto deadline = std::chrono::steady_clock::now() + tick;
      bool work = HasWork();
      while (!work) {
        const bool timed_out = cv_.wait_until(l.native(), deadline) == std::cv_status::timeout;
        work = HasWork();
        if (timed_out) break;
      }
      if (!work) {
        l.Unlock();
        MutexLock run(run_mu_);
        WriteBackIfDue(batch, /*may_wait=*/true);  // batch is empty
        continue;
      }
      if (queue_.empty() && stop_) return;
    }
    // Take the batch while holding run_mu_, so an inline run never overtakes queued tasks.
    MutexLock run(run_mu_);
    {
      MutexLock l(mu_);
      batch.assign(std::make_move_iterator(queue_.begin()), std::make_move_iterator(queue_.end()));
      queue_.clear();
    }
    RunBatch(batch, push_, /*may_wait=*/true);
  }
}

void Lane::RunBatch(std::vector<Task>& batch, zmq::socket_t& reply, bool may_wait) {
  running_batch_ = &batch;
  running_reply_ = &reply;
  // Whether every write before this part needs nothing of this batch's write-back to be as
  // durable as it will be (kWrite): a read is then answered as soon as it ran, not after the
  // batch's other parts and a hand-off of rows.
  bool plain = true;
  for (size_t i = 0; i < batch.size(); ++i) {
    Task& t = batch[i];
    if (t.done) continue;  // a read ServeWaitingReads answered
    running_index_ = i;
    if (t.pass == Task::Pass::kRead && plain) {
      RunAhead(t);
      continue;
    }
    if (t.pass == Task::Pass::kRead) reads_waiting_.fetch_sub(1, std::memory_order_relaxed);
    Status s = t.run(*this);
    if (!s.ok()) t.pending->Fail(s);
    if (t.seq != 0) store_->SetAppliedSeq(t.seq);
    plain = plain && !(t.writes && t.pass != Task::Pass::kWrite);
  }
  running_batch_ = nullptr;
  running_reply_ = nullptr;
  WriteBackIfDue(batch, may_wait);
  for (Task& t : batch) {
    if (!t.done) FinishPart(*t.pending, Status::OK(), reply);
  }
  batch.clear();
}

void Lane::RunAhead(Task& t) {
  reads_waiting_.fetch_sub(1, std::memory_order_relaxed);
  Status s = t.run(*this);
  if (!s.ok()) t.pending->Fail(s);
  t.done = true;
  FinishPart(*t.pending, Status::OK(), *running_reply_);
}

void Lane::ServeWaitingReads() {
  run_mu_.AssertHeld();
  if (reads_waiting_.load(std::memory_order_relaxed) == 0 || running_batch_ == nullptr) return;
  std::vector<Task>& batch = *running_batch_;
  if (batch[running_index_].pass != Task::Pass::kWrite) return;
  // The connections with a write ahead of the parts looked at so far.
  std::vector<std::string> writers;
  const auto wrote = [&](const Task& t) { writers.push_back(t.pending->identity.to_string()); };
  // Whether read `t` may go now; false with *stop at a part nothing passes.
  const auto may_go = [&](const Task& t, bool* stop) {
    if (t.done) return false;
    if (t.pass == Task::Pass::kWrite) {
      wrote(t);
      return false;
    }
    if (t.pass == Task::Pass::kNone) {
      *stop = true;
      return false;
    }
    const std::string_view id = t.pending->identity.to_string_view();
    return std::find(writers.begin(), writers.end(), id) == writers.end();
  };
  wrote(batch[running_index_]);
  bool stop = false;
  for (size_t i = running_index_ + 1; i < batch.size() && !stop; ++i) {
    if (!may_go(batch[i], &stop)) continue;
    RunAhead(batch[i]);
    reads_passed_.fetch_add(1, std::memory_order_relaxed);
  }
  if (stop) return;
  std::vector<Task> ahead;
  {
    MutexLock l(mu_);
    std::vector<size_t> take;
    for (size_t i = 0; i < queue_.size() && !stop; ++i) {
      if (may_go(queue_[i], &stop)) take.push_back(i);
    }
    for (size_t i : take) ahead.push_back(std::move(queue_[i]));
    for (size_t k = take.size(); k-- > 0;) queue_.erase(queue_.begin() + take[k]);
  }
  for (Task& t : ahead) {
    RunAhead(t);
    reads_passed_.fetch_add(1, std::memory_order_relaxed);
  }
}

void Lane::WriteBackIfDue(std::vector<Task>& batch, bool may_wait) {
  bool wrote = false, unlogged = false;
  for (const Task& t : batch) {
    wrote |= t.writes;
    // Writes the request log does not hold (restored rows) are durable before the reply.
    unlogged |= t.writes && t.seq == 0;
  }
  if (unlogged || (wrote && write_back_interval_.count() == 0)) {
    Status s = store_->Commit();
    if (!s.ok()) {
      LOG(ERROR) << "lane " << index_ << ": commit failed: " << s.ToString();
      for (Task& t : batch) {
        if (t.writes) t.pending->Fail(s.WithContext("commit"));
      }
    }
  } else if (write_back_interval_.count() != 0) {
    const auto now = std::chrono::steady_clock::now();
    const bool over = max_dirty_bytes_ != 0 && store_->dirty_bytes() > max_dirty_bytes_;
    // Due at the same instants in every lane (each multiple of the interval on the steady
    // clock): busy lanes hand off together and the writer flushes their rows once. At least
    // half an interval after the last hand-off: the first one (at the lane's first tick) or
    // one forced by max_dirty_bytes does not bring the next closer (a 10-minute interval that
    // handed off again a few seconds after the start would surprise). Due while the last
    // hand-off is still being written: the next tick tries again (not a whole interval later),
    // so the durable mark, and with it the log a restart replays, lags by at most an interval
    // plus one write and flush.
    const auto period = [&](std::chrono::steady_clock::time_point t) {
      return t.time_since_epoch() / write_back_interval_;
    };
    bool due = period(now) > period(last_write_back_) &&
               now - last_write_back_ >= write_back_interval_ / 2 && !store_->write_back_busy();
    if (due && !over && snapshots_writing_->load(std::memory_order_acquire) > 0 &&
        now - last_write_back_ < kMaxWriteBackPostponement * write_back_interval_) {
      due = false;  // after the snapshot's scan (SnapshotBeingWritten)
      const int64_t tick = period(now);
      if (tick != last_postponed_period_) {
        last_postponed_period_ = tick;
        postponed_.fetch_add(1, std::memory_order_relaxed);
      }
    }
    if (over || due) {
      last_write_back_ = now;
      hand_offs_.fetch_add(1, std::memory_order_relaxed);
      if (over && may_wait) waits_.fetch_add(1, std::memory_order_relaxed);
      // A failed write-back loses nothing: the pushes are in the request log, the rows stay
      // pinned in memory and go out with the next hand-off. A periodic hand-off is flushed as
      // soon as written (the mark lags by about an interval); one forced by max_dirty_bytes
      // waits in the memtables for the next (fewer, larger files to compact).
      Status s = store_->WriteBack(/*wait=*/over && may_wait, /*flush_soon=*/!over);
      if (!s.ok()) LOG(WARNING) << "lane " << index_ << ": writing rows back: " << s.ToString();
    }
  }
  committed_seq_.store(store_->committed_seq(), std::memory_order_release);
}

std::shared_ptr<void> Lane::SnapshotBeingWritten() {
  snapshots_writing_->fetch_add(1, std::memory_order_acq_rel);
  std::shared_ptr<std::atomic<int>> count = snapshots_writing_;
  return std::shared_ptr<void>(nullptr, [count](void*) {
    count->fetch_sub(1, std::memory_order_acq_rel);
  });
}

FileWriter::FileWriter(zmq::context_t& ctx, const std::string& reply_endpoint)
    : push_(ReplySocket(ctx, reply_endpoint)) {
  thread_ = std::thread([this] { Loop(); });
}

FileWriter::~FileWriter() { Stop(); }

void FileWriter::Submit(std::shared_ptr<Pending> p, std::function<Status()> work) {
  {
    MutexLock l(mu_);
    jobs_.push_back(Job{std::move(p), std::move(work)});
  }
  cv_.notify_one();
}

void FileWriter::Stop() {
  {
    MutexLock l(mu_);
    if (stop_) return;
    stop_ = true;
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
  push_.close();
}

void FileWriter::Loop() {
  NameThisThread("file-writer");
  // Checkpoint and export files are background work: on a busy machine the lanes and the I/O
  // thread come first (Linux applies a nice value per thread).
  if (setpriority(PRIO_PROCESS, static_cast<id_t>(gettid()), kFileWriterNice) != 0) {
    PLOG(WARNING) << "file writer: setpriority";
  }
  for (;;) {
    Job job;
    {
      MutexLock l(mu_);
      while (!stop_ && jobs_.empty()) cv_.wait(l.native());
      if (jobs_.empty()) return;  // stopping, nothing left
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    Status s = job.work();
    job.work = nullptr;  // what it holds (a snapshot) goes before the reply
    FinishPart(*job.pending, s, push_);
  }
}

namespace {

// Holds a lane's scratch vector while a part uses it, and gives it back (its capacity kept):
// a read run between a push's slices finds the lane's own empty and uses that.
template <typename V>
class BorrowScratch {
 public:
  explicit BorrowScratch(V& lane) : lane_(lane) { v.swap(lane_); }
  ~BorrowScratch() { lane_.swap(v); }
  BorrowScratch(const BorrowScratch&) = delete;
  BorrowScratch& operator=(const BorrowScratch&) = delete;
  V v;

 private:
  V& lane_;
};

}  // namespace

Status RunSparsePart(Lane& lane, Pending& p, const std::vector<uint32_t>& idx, uint64_t table_id,
                     uint32_t dim, bool push, bool pull, float lr_scale) {
  const size_t n = idx.size();
  BorrowScratch<std::vector<uint64_t>> scratch_keys(lane.scratch_keys);
  std::vector<uint64_t>& keys = scratch_keys.v;
  keys.resize(n);
  for (size_t i = 0; i < n; ++i) keys[i] = p.keys[idx[i]];
  if (push) {
    BorrowScratch<std::vector<const float*>> scratch_grads(lane.scratch_grads);
    std::vector<const float*>& grads = scratch_grads.v;
    grads.resize(n);
    for (size_t i = 0; i < n; ++i) grads[i] = p.values + size_t{idx[i]} * dim;
    ApplyContext ctx{lane.NextStep(), NowSeconds(), lr_scale};
    // In slices, with the reads of other connections waiting behind this push served between
    // them. A slice that fails leaves the slices before it applied, as a push that fails on
    // one lane of several leaves the other lanes' parts applied.
    const std::span<const uint64_t> all_keys(keys);
    const std::span<const float* const> all_grads(grads);
    for (size_t a = 0; a < n; a += kApplySlice) {
      const size_t len = std::min(kApplySlice, n - a);
      TESSERA_RETURN_IF_ERROR(lane.store().Apply(table_id, all_keys.subspan(a, len),
                                                 all_grads.subspan(a, len), ctx));
      if (a + len < n) lane.ServeWaitingReads();
    }
  }
  if (pull) {
    std::vector<float*>& outs = lane.scratch_outs;
    outs.resize(n);
    float* base = static_cast<float*>(p.out.data());
    for (size_t i = 0; i < n; ++i) outs[i] = base + size_t{idx[i]} * dim;
    TESSERA_RETURN_IF_ERROR(lane.store().Lookup(table_id, keys, outs));
  }
  return Status::OK();
}

namespace {

// Sets the reply frame of segment `s` of dense pull `p` (one frame per server chunk): the
// chunk's memory itself, shared copy-on-write (a later push to the chunk writes to a copy,
// so the frame is the chunk as it was between two pushes while ZeroMQ sends it), or a copy
// where the engine cannot share a chunk.
Status ShareDenseSegment(LaneStore& store, Pending& p, uint64_t table_id, const DenseSegment& s) {
  zmq::message_t& frame = p.out_frames[s.chunk - p.header.offset / kDenseChunkFloats];
  const size_t bytes = sizeof(float) * (s.end - s.begin);
  uint32_t len = 0;
  TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<const float> row,
                           store.DenseShare(table_id, s.chunk, &len));
  if (row == nullptr) {
    frame = MessagePool::Shared().Message(bytes);
    return store.DenseRead(table_id, s.chunk, s.begin, s.end, static_cast<float*>(frame.data()));
  }
  if (s.end > len || s.begin > s.end) return Status::InvalidArgument("dense range out of chunk");
  const float* data = row.get() + s.begin;
  frame = SharedMessage(data, bytes, std::move(row));
  return Status::OK();
}

// Sets lane slot `slot`'s reply frames of dense pull `p` that takes frames of several chunks
// (kDensePullRunFrames), from its segments `segs` (in chunk order): segments whose shared
// chunks lie side by side in one block of the engine (DenseRuns) go as one frame that points
// into the table (held, copy-on-write, as ShareDenseSegment's); where the engine cannot share
// a chunk, all of the lane's segments are copied into one frame. The index gets, per frame,
// its number of chunks, then those chunks.
Status ShareDenseRuns(LaneStore& store, Pending& p, uint64_t table_id,
                      const std::vector<DenseSegment>& segs, uint32_t slot) {
  std::vector<zmq::message_t>& frames = p.lane_frames[slot];
  std::vector<uint64_t>& index = p.lane_index[slot];
  const char* begin = nullptr;  // the frame being built: bytes at begin, held by owner
  size_t bytes = 0;
  std::shared_ptr<const float> owner;
  size_t count_at = 0;  // its chunk count in the index
  for (const DenseSegment& s : segs) {
    uint32_t len = 0;
    TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<const float> row,
                             store.DenseShare(table_id, s.chunk, &len));
    if (row == nullptr) {
      frames.clear();
      index.clear();
      owner = nullptr;
      break;
    }
    if (s.end > len || s.begin > s.end) return Status::InvalidArgument("dense range out of chunk");
    const char* data = reinterpret_cast<const char*>(row.get() + s.begin);
    // Joins the frame when it continues it in memory within the same block.
    const bool joins = owner != nullptr && begin + bytes == data && !owner.owner_before(row) &&
                       !row.owner_before(owner);
    if (!joins) {
      if (owner != nullptr) frames.push_back(SharedMessage(begin, bytes, std::move(owner)));
      begin = data;
      bytes = 0;
      owner = std::move(row);
      count_at = index.size();
      index.push_back(0);
    }
    bytes += sizeof(float) * (s.end - s.begin);
    ++index[count_at];
    index.push_back(s.chunk);
  }
  if (owner != nullptr) {
    frames.push_back(SharedMessage(begin, bytes, std::move(owner)));
    return Status::OK();
  }
  size_t total = 0;
  for (const DenseSegment& s : segs) total += sizeof(float) * (s.end - s.begin);
  zmq::message_t frame = MessagePool::Shared().Message(total);
  float* out = static_cast<float*>(frame.data());
  index.push_back(segs.size());
  for (const DenseSegment& s : segs) {
    TESSERA_RETURN_IF_ERROR(store.DenseRead(table_id, s.chunk, s.begin, s.end, out));
    out += s.end - s.begin;
    index.push_back(s.chunk);
  }
  frames.push_back(std::move(frame));
  return Status::OK();
}

}  // namespace

Status RunDensePart(Lane& lane, uint32_t lane_index, Pending& p,
                    const std::vector<DenseSegment>& segs, uint64_t table_id, bool push,
                    float lr_scale) {
  ApplyContext ctx{lane.NextStep(), NowSeconds(), lr_scale};
  if (!push && !p.lane_frames.empty()) {
    return ShareDenseRuns(lane.store(), p, table_id, segs, lane_index);
  }
  for (const DenseSegment& s : segs) {
    if (push) {
      TESSERA_RETURN_IF_ERROR(
          lane.store().DenseApply(table_id, s.chunk, s.begin, s.end, p.values + s.pos, ctx));
    } else if (!p.out_frames.empty()) {
      TESSERA_RETURN_IF_ERROR(ShareDenseSegment(lane.store(), p, table_id, s));
    } else {
      float* out = static_cast<float*>(p.out.data()) + s.pos;
      TESSERA_RETURN_IF_ERROR(lane.store().DenseRead(table_id, s.chunk, s.begin, s.end, out));
    }
  }
  return Status::OK();
}

}  // namespace tessera::internal
