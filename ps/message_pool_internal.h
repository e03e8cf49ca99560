// Reused buffers for large ZeroMQ messages (pushes a client sends, pull replies a server sends).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include <zmq.hpp>

#include "ps/mutex.h"

namespace tessera::internal {

/// Message buffers of 64 KiB and more, kept for reuse once ZeroMQ frees a message, so that a
/// request's frames land in memory that is already mapped. A fresh multi-MiB buffer costs a
/// page fault per 4 KiB the first time it is written, which in a VM is about as slow as the copy
/// itself: with 8 pushes of 16 MiB in flight the copying client spent most of its time there.
/// Buffers come in power-of-two capacities; at most max_retained() bytes wait for reuse, the
/// rest go back to the allocator. Thread-safe: ZeroMQ frees messages on its I/O threads.
class MessagePool {
 public:
  /// Messages under this size are ordinary ZeroMQ messages.
  static constexpr size_t kMinBytes = size_t{64} << 10;

  explicit MessagePool(size_t max_retained) : max_retained_(max_retained) {}
  MessagePool(const MessagePool&) = delete;
  MessagePool& operator=(const MessagePool&) = delete;
  ~MessagePool();

  /// The process's pool (64 MiB retained at most unless set_max_retained() says otherwise).
  /// Never destroyed: ZeroMQ may free a message after the client or server that made it is gone.
  static MessagePool& Shared();

  /// A message of `bytes` with uninitialized contents, from the pool when `bytes` >= kMinBytes.
  zmq::message_t Message(size_t bytes);
  /// A message holding a copy of `bytes` bytes at `data`.
  zmq::message_t Copy(const void* data, size_t bytes);

  size_t max_retained() const;
  /// Changes the limit; buffers over it are freed as they come back.
  void set_max_retained(size_t bytes);
  /// Bytes of buffers waiting for reuse.
  size_t retained() const;
  /// Buffers handed out that were reused rather than allocated (since construction).
  uint64_t reused() const;

 private:
  static constexpr int kClasses = 48;  // capacities 2^0 .. 2^47 (only 2^16 and up are used)
  // A buffer's first 64 bytes: its pool and capacity class; the message's data follows.
  struct Header {
    MessagePool* pool;
    int cls;
  };
  static constexpr size_t kHeaderBytes = 64;
  static void Free(void* data, void* hint);
  void GiveBack(Header* h);

  mutable Mutex mu_;
  size_t max_retained_ ABSL_GUARDED_BY(mu_);
  std::vector<Header*> free_[kClasses] ABSL_GUARDED_BY(mu_);
  size_t retained_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t reused_ ABSL_GUARDED_BY(mu_) = 0;
};

/// A message of the `bytes` bytes at `data`, sent without a copy: it holds `owner` (which must
/// keep those bytes unchanged) until ZeroMQ frees the message, on whichever thread that is.
zmq::message_t SharedMessage(const void* data, size_t bytes, std::shared_ptr<const void> owner);

}  // namespace tessera::internal
