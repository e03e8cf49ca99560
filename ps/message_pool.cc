#include "ps/message_pool_internal.h"

#include <bit>
#include <cstring>
#include <new>

namespace tessera::internal {

namespace {
constexpr std::align_val_t kAlign{64};
}  // namespace

MessagePool::~MessagePool() {
  for (auto& list : free_) {
    for (Header* h : list) ::operator delete(h, kAlign);
  }
}

MessagePool& MessagePool::Shared() {
  static MessagePool* pool = new MessagePool(size_t{64} << 20);
  return *pool;
}

zmq::message_t MessagePool::Message(size_t bytes) {
  if (bytes < kMinBytes) return zmq::message_t(bytes);
  const int cls = std::bit_width(bytes - 1);  // 2^cls >= bytes
  Header* h = nullptr;
  {
    MutexLock l(mu_);
    if (!free_[cls].empty()) {
      h = free_[cls].back();
      free_[cls].pop_back();
      retained_ -= size_t{1} << cls;
      ++reused_;
    }
  }
  if (h == nullptr) {
    h = static_cast<Header*>(::operator new(kHeaderBytes + (size_t{1} << cls), kAlign));
    h->pool = this;
    h->cls = cls;
  }
  return zmq::message_t(reinterpret_cast<std::byte*>(h) + kHeaderBytes, bytes, &MessagePool::Free,
                        h);
}

zmq::message_t MessagePool::Copy(const void* data, size_t bytes) {
  zmq::message_t m = Message(bytes);
  if (bytes > 0) std::memcpy(m.data(), data, bytes);
  return m;
}

void MessagePool::Free(void*, void* hint) {
  Header* h = static_cast<Header*>(hint);
  h->pool->GiveBack(h);
}

void MessagePool::GiveBack(Header* h) {
  const size_t cap = size_t{1} << h->cls;
  {
    MutexLock l(mu_);
    if (retained_ + cap <= max_retained_) {
      free_[h->cls].push_back(h);
      retained_ += cap;
      return;
    }
  }
  ::operator delete(h, kAlign);
}

size_t MessagePool::max_retained() const {
  MutexLock l(mu_);
  return max_retained_;
}

void MessagePool::set_max_retained(size_t bytes) {
  MutexLock l(mu_);
  max_retained_ = bytes;
}

size_t MessagePool::retained() const {
  MutexLock l(mu_);
  return retained_;
}

uint64_t MessagePool::reused() const {
  MutexLock l(mu_);
  return reused_;
}

zmq::message_t SharedMessage(const void* data, size_t bytes, std::shared_ptr<const void> owner) {
  // ZeroMQ's free function gets a void* hint: the reference travels there as a heap object.
  auto ref = std::make_unique<std::shared_ptr<const void>>(std::move(owner));
  // ZeroMQ only reads a message's data; its free function takes a non-const pointer.
  zmq::message_t m(
      const_cast<void*>(data), bytes,
      [](void*, void* hint) { delete static_cast<std::shared_ptr<const void>*>(hint); },
      ref.get());
  ref.release();  // the message owns it now
  return m;
}

}  // namespace tessera::internal
