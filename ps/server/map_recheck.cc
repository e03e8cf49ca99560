#include <glog/logging.h>

#include "ps/server/map_recheck_internal.h"
#include "ps/thread_name_internal.h"

namespace tessera::internal {

MapRecheck::~MapRecheck() {
  {
    MutexLock l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

Status MapRecheck::SetLoader(Load load) {
  MutexLock l(mu_);
  if (load_) return Status::FailedPrecondition("the cluster map loader is set already");
  load_ = std::move(load);
  thread_ = std::thread([this] { Run(); });
  return Status::OK();
}

bool MapRecheck::enabled() const {
  MutexLock l(mu_);
  return static_cast<bool>(load_);
}

uint64_t MapRecheck::Request() {
  MutexLock l(mu_);
  if (!load_) return 0;
  // A read that started before this call may have missed a map stored just before it: the
  // ticket names the next read.
  if (requested_ == started_) ++requested_;
  cv_.notify_all();
  return requested_;
}

std::optional<uint64_t> MapRecheck::NewestSince(uint64_t ticket) const {
  MutexLock l(mu_);
  if (!load_ || done_ < ticket) return std::nullopt;
  return newest_;
}

uint64_t MapRecheck::failed_reads() const {
  MutexLock l(mu_);
  return failed_;
}

void MapRecheck::Run() {
  NameThisThread("map-recheck");
  MutexLock l(mu_);
  for (;;) {
    while (!stop_ && requested_ == started_) cv_.wait(l.native());
    if (stop_) return;
    const uint64_t ticket = requested_;
    started_ = ticket;
    Load load = load_;
    l.Unlock();
    Result<RoutingMap> m = load();
    uint64_t version = 0;
    bool read = m.ok() || m.status().code() == StatusCode::kNotFound;
    if (m.ok()) {
      version = m->version;
      apply_(*m);
    } else if (!read) {
      LOG_EVERY_N(WARNING, 10) << "cluster map re-read for a forwarded push: "
                               << m.status().ToString();
    }
    l.Lock();
    if (read) {
      done_ = ticket;
      newest_ = version;
    } else {
      ++failed_;
    }
  }
}

}  // namespace tessera::internal
