#include "ps/server/restore_credits_internal.h"

#include <algorithm>
#include <chrono>

namespace tessera::internal {

RestoreCredits::RestoreCredits(uint32_t limit) : limit_(std::max<uint32_t>(limit, 1)) {}

Status RestoreCredits::Acquire(const std::atomic<bool>& stop) {
  // A shutdown sets `stop` without knowing of this wait: look at it every few milliseconds.
  constexpr auto kPoll = std::chrono::milliseconds(20);
  MutexLock l(mu_);
  bool waited = false;
  while (out_ >= limit_) {
    if (stop.load(std::memory_order_acquire)) {
      return Status::Cancelled("restore given up: the server is stopping");
    }
    waited = true;
    cv_.wait_for(l.native(), kPoll);
  }
  if (stop.load(std::memory_order_acquire)) {
    return Status::Cancelled("restore given up: the server is stopping");
  }
  if (waited) ++waits_;
  ++out_;
  out_max_ = std::max(out_max_, out_);
  return Status::OK();
}

void RestoreCredits::Release() {
  {
    MutexLock l(mu_);
    if (out_ > 0) --out_;
  }
  cv_.notify_one();
}

uint64_t RestoreCredits::out() const {
  MutexLock l(mu_);
  return out_;
}

uint64_t RestoreCredits::out_max() const {
  MutexLock l(mu_);
  return out_max_;
}

uint64_t RestoreCredits::waits() const {
  MutexLock l(mu_);
  return waits_;
}

RestoreCredit& RestoreCredit::operator=(RestoreCredit&& o) noexcept {
  if (this != &o) {
    Reset();
    credits_ = o.credits_;
    o.credits_ = nullptr;
  }
  return *this;
}

void RestoreCredit::Reset() {
  if (credits_ != nullptr) credits_->Release();
  credits_ = nullptr;
}

}  // namespace tessera::internal
