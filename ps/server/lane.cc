#include <glog/logging.h>

#include "ps/record_file_internal.h"
#include "ps/server/lane_internal.h"

namespace tessera::internal {
namespace {

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
           const std::string& reply_endpoint, uint32_t commit_interval_ms)
    : index_(index),
      store_(std::move(store)),
      push_(ReplySocket(ctx, reply_endpoint)),
      commit_interval_(std::chrono::milliseconds(commit_interval_ms)) {
  thread_ = std::thread([this] { Loop(); });
}

Lane::~Lane() { Stop(); }

void Lane::Submit(Task t) {
  {
    std::lock_guard<std::mutex> l(mu_);
    queue_.push_back(std::move(t));
  }
  cv_.notify_one();
}

void Lane::Stop() {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (stop_) return;
    stop_ = true;
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
  push_.close();
}

bool Lane::TryRunInline(Task& t, zmq::socket_t& reply) {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (!queue_.empty() || stop_ || !run_mu_.try_lock()) return false;
  }
  std::vector<Task> one;
  one.push_back(std::move(t));
  RunBatch(one, reply);
  run_mu_.unlock();
  return true;
}

void Lane::Loop() {
  std::vector<Task> batch;
  for (;;) {
    {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait(l, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty() && stop_) return;
    }
    // Take the batch while holding run_mu_, so an inline run never overtakes queued tasks.
    std::lock_guard<std::mutex> run(run_mu_);
    {
      std::lock_guard<std::mutex> l(mu_);
      batch.assign(std::make_move_iterator(queue_.begin()), std::make_move_iterator(queue_.end()));
      queue_.clear();
    }
    RunBatch(batch, push_);
  }
}

void Lane::RunBatch(std::vector<Task>& batch, zmq::socket_t& reply) {
  for (Task& t : batch) {
    Status s = t.run(*this);
    if (!s.ok()) t.pending->Fail(s);
    if (t.seq != 0) store_->SetAppliedSeq(t.seq);
  }
  CommitIfDue(batch);
  for (Task& t : batch) FinishPart(*t.pending, Status::OK(), reply);
  batch.clear();
}

void Lane::CommitIfDue(std::vector<Task>& batch) {
  bool wrote = false, unlogged = false;
  for (const Task& t : batch) {
    wrote |= t.writes;
    // Writes the request log does not hold (restored rows, maintenance) commit at once.
    unlogged |= t.writes && t.seq == 0;
  }
  const auto now = std::chrono::steady_clock::now();
  if (!wrote ||
      (!unlogged && commit_interval_.count() != 0 && now - last_commit_ < commit_interval_)) {
    return;
  }
  // Group commit: one durability point for every write of the batch. With the request log
  // on, pushes were durable before they reached the lane; this bounds replay work.
  last_commit_ = now;
  Status s = store_->Commit();
  if (!s.ok()) {
    LOG(ERROR) << "lane " << index_ << ": commit failed: " << s.ToString();
    for (Task& t : batch) {
      if (t.writes) t.pending->Fail(s.WithContext("commit"));
    }
    return;
  }
  committed_seq_.store(store_->committed_seq(), std::memory_order_release);
}

FileWriter::FileWriter(zmq::context_t& ctx, const std::string& reply_endpoint)
    : push_(ReplySocket(ctx, reply_endpoint)) {
  thread_ = std::thread([this] { Loop(); });
}

FileWriter::~FileWriter() { Stop(); }

void FileWriter::Submit(std::shared_ptr<Pending> p, std::string path,
                        std::shared_ptr<std::string> data) {
  {
    std::lock_guard<std::mutex> l(mu_);
    jobs_.push_back(Job{std::move(p), std::move(path), std::move(data)});
  }
  cv_.notify_one();
}

void FileWriter::Stop() {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (stop_) return;
    stop_ = true;
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
  push_.close();
}

void FileWriter::Loop() {
  for (;;) {
    Job job;
    {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait(l, [&] { return stop_ || !jobs_.empty(); });
      if (jobs_.empty()) return;  // stopping, nothing left
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    Status s = WriteFileDurably(job.path, *job.data);
    job.data.reset();
    FinishPart(*job.pending, s, push_);
  }
}

}  // namespace tessera::internal
