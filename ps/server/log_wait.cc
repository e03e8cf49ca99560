// Group commit that keeps serving reads while the disk syncs: the request log's write on its
// own thread (LogGroupWriter), and what the I/O thread does meanwhile.
#include <glog/logging.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>

#include "ps/server/log_wait_internal.h"
#include "ps/server/server_impl_internal.h"
#include "ps/thread_name_internal.h"

namespace tessera::internal {

LogGroupWriter::LogGroupWriter() : fd_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
  PCHECK(fd_ >= 0) << "eventfd";
  thread_ = std::thread([this] { Loop(); });
}

LogGroupWriter::~LogGroupWriter() {
  {
    MutexLock l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  close(fd_);
}

void LogGroupWriter::Start(std::function<Status()> write) {
  {
    MutexLock l(mu_);
    job_ = std::move(write);
    running_ = true;
  }
  cv_.notify_all();
}

bool LogGroupWriter::Done() {
  MutexLock l(mu_);
  return !running_;
}

Status LogGroupWriter::Finish() {
  Status s;
  {
    MutexLock l(mu_);
    while (running_) cv_.wait(l.native());
    s = std::move(result_);
    result_ = Status::OK();
  }
  uint64_t n = 0;
  while (read(fd_, &n, sizeof(n)) < 0 && errno == EINTR) {
  }
  return s;
}

void LogGroupWriter::Loop() {
  NameThisThread("log-writer");
  for (;;) {
    std::function<Status()> job;
    {
      MutexLock l(mu_);
      while (!stop_ && job_ == nullptr) cv_.wait(l.native());
      if (job_ == nullptr) return;  // stopping, nothing to write
      job = std::move(job_);
      job_ = nullptr;
    }
    Status s = job();
    {
      MutexLock l(mu_);
      result_ = std::move(s);
      running_ = false;
    }
    cv_.notify_all();
    const uint64_t one = 1;
    while (write(fd_, &one, sizeof(one)) < 0 && errno == EINTR) {
    }
  }
}

namespace {

Mutex hook_mu;
std::function<void()>* log_write_hook ABSL_GUARDED_BY(hook_mu) = nullptr;

void RunLogWriteHook() {
  std::function<void()> hook;
  {
    MutexLock l(hook_mu);
    if (log_write_hook != nullptr) hook = *log_write_hook;
  }
  if (hook) hook();
}

// A sparse pull that no clock orders, from a connection with nothing that it must not pass.
bool FreeRead(const std::vector<zmq::message_t>& parts,
              const absl::flat_hash_set<std::string>& busy) {
  if (parts.size() < 2) return false;
  Header h;
  if (!DecodeHeader(parts[1].data(), parts[1].size(), &h).ok()) return false;
  return UnorderedSparsePull(h) && !busy.contains(parts[0].to_string());
}

}  // namespace

void SetLogWriteHookForTesting(std::function<void()> hook) {
  MutexLock l(hook_mu);
  delete log_write_hook;
  log_write_hook = hook ? new std::function<void()>(std::move(hook)) : nullptr;
}

void ServerImpl::FlushStagedServingReads() {
  if (staged_.empty()) return;  // always, without a durable log (LogAndRun stages nothing)
  FlushStagedWith([this](const std::vector<StagedRun>& staged) {
    return WriteStagedServingReads(staged);
  });
  // What was set aside comes after the group, as it would have been read after the write.
  while (!set_aside_.empty()) {
    std::vector<zmq::message_t> parts = std::move(set_aside_.front());
    set_aside_.pop_front();
    HandleMessage(std::move(parts));
  }
}

Status ServerImpl::WriteStagedServingReads(const std::vector<StagedRun>& staged) {
  // The connections whose requests a read must not pass: the group's pushes', then those of
  // every request set aside.
  absl::flat_hash_set<std::string> busy;
  for (const StagedRun& r : staged) busy.insert(r.p->identity.to_string());
  log_writer_.Start([this] {
    RunLogWriteHook();
    return log_->WriteStaged();
  });
  while (!log_writer_.Done()) {
    const bool room = set_aside_.size() < kMaxSetAside;
    zmq::pollitem_t items[] = {{nullptr, log_writer_.fd(), ZMQ_POLLIN, 0},
                               {replies_.handle(), 0, ZMQ_POLLIN, 0},
                               {router_.handle(), 0, ZMQ_POLLIN, 0}};
    try {
      zmq::poll(items, room ? 3 : 2, std::chrono::milliseconds(100));
    } catch (const zmq::error_t& e) {
      if (e.num() != EINTR) LOG(ERROR) << "poll during the log write failed: " << e.what();
    }
    ForwardReplies();
    for (std::vector<zmq::message_t> parts;
         set_aside_.size() < kMaxSetAside && TryReceive(router_, &parts);) {
      if (FreeRead(parts, busy)) {
        ++counts_.reads_during_log_write;
        HandleMessage(std::move(parts));
        continue;
      }
      busy.insert(parts[0].to_string());
      set_aside_.push_back(std::move(parts));
    }
  }
  // The sockets were read here, not through their descriptors: the loop looks at all of them.
  polled_during_log_write_ = true;
  return log_writer_.Finish();
}

}  // namespace tessera::internal
