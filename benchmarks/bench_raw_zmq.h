// The zero-copy raw ZeroMQ baseline of bench_transport: what a parameter server that reads
// what it gets costs over one DEALER/ROUTER connection, with no copy at either end that the
// protocol does not force; and bench_transport's echo server, which also serves these ops.
// Header-only.
//
//   push  the client sends a 16-byte header and payload frames that point into its own buffer
//         (ZeroMQ constant messages, no copy); the server reads every element of every frame
//         (sums the floats, and the 8-byte keys of a sparse push) and acks with the header.
//   pull  the client sends the header (and, for a sparse pull, its keys, without a copy); the
//         server reads the keys, and answers with the header and `bytes` of its own store,
//         sent without a copy (constant message); the client copies the reply into the
//         caller's buffer, as a pull API that fills the caller's buffer must (ps-lite's Pull
//         copies too).
// Thread-safety: the server function runs on one thread; a client object is used by one thread.
#pragma once

#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>
#include <zmq.hpp>
#include <zmq_addon.hpp>

namespace tessera::bench {

/// Ops of the zero-copy raw protocol (the header's op; other ops belong to the caller).
inline constexpr uint32_t kRawZcPush = 16;
inline constexpr uint32_t kRawZcPull = 17;

/// The first frame of every raw request and reply.
struct RawHeader {
  uint64_t id;
  uint32_t op;     // kRawZc*, or bench_transport's kRawPush, kRawPull, kRawPushTouch
  uint32_t bytes;  // pulls: bytes of the reply's payload
};

/// Reads every element of a frame: floats summed (a frame of a multiple of 4 bytes), or, for
/// `keys`, 8-byte keys summed. Eight accumulators so that the compiler may vectorize the loop
/// without reassociating one sum (no -ffast-math needed).
inline double TouchFrame(const zmq::message_t& m, bool keys) {
  const char* p = static_cast<const char*>(m.data());
  if (keys) {
    uint64_t s = 0;
    for (size_t i = 0; i + 8 <= m.size(); i += 8) {
      uint64_t k;
      std::memcpy(&k, p + i, 8);
      s += k;
    }
    return static_cast<double>(s);
  }
  const size_t n = m.size() / 4;
  float acc[8] = {};
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    float v[8];
    std::memcpy(v, p + i * 4, 32);
    for (int j = 0; j < 8; ++j) acc[j] += v[j];
  }
  for (; i < n; ++i) {
    float v;
    std::memcpy(&v, p + i * 4, 4);
    acc[0] += v;
  }
  double s = 0;
  for (float a : acc) s += a;
  return s;
}

/// The server side of the zero-copy ops, called by a ROUTER loop with a request's frames
/// (identity, header, data frames...) whose header op is kRawZcPush or kRawZcPull; appends the
/// reply's frames after the identity to `reply`. `store` is the source of pulled bytes: grown
/// when a pull asks for more, and an outgrown store is kept in `retired` (a reply still queued
/// may point into it).
inline void ServeRawZc(std::vector<zmq::message_t>& parts, const RawHeader& h,
                       std::vector<zmq::message_t>& reply, std::unique_ptr<char[]>& store,
                       size_t& store_size, std::vector<std::unique_ptr<char[]>>& retired) {
  static volatile double sink = 0;
  // Frames after the header: a sparse request's first one holds keys when a second follows.
  const size_t data = parts.size() - 2;
  double s = 0;
  for (size_t i = 2; i < parts.size(); ++i) {
    const bool keys = h.op == kRawZcPull ? true : (data == 2 && i == 2);
    s += TouchFrame(parts[i], keys);
  }
  sink = sink + s;
  if (h.op != kRawZcPull) return;
  if (store_size < h.bytes) {
    if (store) retired.push_back(std::move(store));
    store = std::make_unique<char[]>(h.bytes);
    std::memset(store.get(), 0, h.bytes);
    store_size = h.bytes;
  }
  reply.emplace_back(store.get(), h.bytes, nullptr, nullptr);  // constant: no copy
}

/// A constant (zero-copy) message of `bytes` at `p`, which must stay alive and unchanged
/// until ZeroMQ has sent it (the benchmark's buffers outlive every request).
inline zmq::message_t ZeroCopyFrame(const void* p, size_t bytes) {
  return zmq::message_t(const_cast<void*>(p), bytes, nullptr, nullptr);
}

/// The client of the raw server's zero-copy ops (RunEchoServer): one DEALER; requests complete in the order they were issued.
class RawZcClient {
 public:
  explicit RawZcClient(const std::string& endpoint) : ctx_(1), dealer_(ctx_, zmq::socket_type::dealer) {
    dealer_.set(zmq::sockopt::linger, 0);
    dealer_.set(zmq::sockopt::sndhwm, 0);
    dealer_.set(zmq::sockopt::rcvhwm, 0);
    dealer_.connect(endpoint);
  }
  /// Sends request `id`: the header, then `frames` (pointer, bytes) without copying them.
  void Issue(uint64_t id, uint32_t op, uint32_t reply_bytes,
             const std::vector<std::pair<const void*, size_t>>& frames) {
    const RawHeader h{id, op, reply_bytes};
    dealer_.send(zmq::const_buffer(&h, sizeof(h)),
                 frames.empty() ? zmq::send_flags::none : zmq::send_flags::sndmore);
    for (size_t i = 0; i < frames.size(); ++i) {
      zmq::message_t m = ZeroCopyFrame(frames[i].first, frames[i].second);
      dealer_.send(m, i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
    }
  }
  /// Waits for the next reply and copies its payload, if any, to `dst`. False on a malformed
  /// reply.
  bool Complete(void* dst) {
    std::vector<zmq::message_t> parts;
    if (!zmq::recv_multipart(dealer_, std::back_inserter(parts))) return false;
    if (parts.empty() || parts[0].size() != sizeof(RawHeader)) return false;
    if (parts.size() == 2 && dst != nullptr) std::memcpy(dst, parts[1].data(), parts[1].size());
    return true;
  }

 private:
  zmq::context_t ctx_;
  zmq::socket_t dealer_;
};

// ------------------------------------------------------------------ bench_transport's echo

inline constexpr uint32_t kRawPush = 1;
inline constexpr uint32_t kRawPull = 2;
inline constexpr uint32_t kRawPushTouch = 3;  // a push the server adds into its own floats

/// The raw server of bench_transport and bench_sparse: serves raw requests (the ops above and
/// the zero-copy ones) on `endpoint` until `*stop` (if not null) or `*signalled` is set. Calls `on_ready`
/// with the bound endpoint once listening.
inline void RunEchoServer(const std::string& endpoint, const std::atomic<bool>* stop,
                          const volatile sig_atomic_t* signalled,
                          const std::function<void(const std::string&)>& on_ready) {
  zmq::context_t ctx(1);
  zmq::socket_t router(ctx, zmq::socket_type::router);
  router.set(zmq::sockopt::linger, 0);
  router.set(zmq::sockopt::sndhwm, 0);
  router.set(zmq::sockopt::rcvhwm, 0);
  router.bind(endpoint);
  on_ready(router.get(zmq::sockopt::last_endpoint));
  // The source of pulled bytes (a server produces them from its own memory), and the floats
  // touching pushes are added into.
  std::vector<char> store;
  std::vector<float> sums;
  // The zero-copy ops' store (bench_raw_zmq.h).
  std::unique_ptr<char[]> zc_store;
  size_t zc_store_size = 0;
  std::vector<std::unique_ptr<char[]>> zc_retired;
  zmq::pollitem_t item{router.handle(), 0, ZMQ_POLLIN, 0};
  std::vector<zmq::message_t> parts;
  for (;;) {
    if ((stop != nullptr && stop->load()) || *signalled) break;
    try {
      if (zmq::poll(&item, 1, std::chrono::milliseconds(100)) == 0) continue;
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) continue;
      break;
    }
    for (;;) {
      parts.clear();
      auto got = zmq::recv_multipart(router, std::back_inserter(parts), zmq::recv_flags::dontwait);
      if (!got) break;
      if (parts.size() < 2 || parts[1].size() != sizeof(RawHeader)) continue;
      RawHeader h;
      std::memcpy(&h, parts[1].data(), sizeof(h));
      std::vector<zmq::message_t> reply;
      reply.push_back(std::move(parts[0]));
      reply.emplace_back(&h, sizeof(h));
      if (h.op == kRawZcPush || h.op == kRawZcPull) {
        ServeRawZc(parts, h, reply, zc_store, zc_store_size, zc_retired);
      } else if (h.op == kRawPull) {
        if (store.size() < h.bytes) store.assign(h.bytes, 1);
        reply.emplace_back(store.data(), h.bytes);
      } else if (h.op == kRawPushTouch && parts.size() == 3) {
        const size_t n = parts[2].size() / sizeof(float);
        if (sums.size() < n) sums.resize(n, 0.0f);
        const char* g = static_cast<const char*>(parts[2].data());
        for (size_t i = 0; i < n; ++i) {
          float x;
          std::memcpy(&x, g + i * sizeof(float), sizeof(float));
          sums[i] += x;
        }
      }
      zmq::send_multipart(router, reply, zmq::send_flags::dontwait);
    }
  }
}

}  // namespace tessera::bench
