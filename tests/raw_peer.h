// A raw DEALER socket that sends hand-made envelopes to one server, for tests that must reach
// the server with what the client library would refuse to send (or would retry).
#pragma once

#include <chrono>
#include <iterator>
#include <optional>
#include <string>
#include <vector>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "ps/codec.h"

namespace tessera::testing {

/// The CurveZMQ keys (Z85) a RawPeer presents to a server started with a secret key.
struct RawCurveKeys {
  std::string server_public;
  std::string public_key;
  std::string secret_key;
};

/// One DEALER connection. Not thread-safe.
class RawPeer {
 public:
  explicit RawPeer(const std::string& endpoint, int reply_timeout_ms = 10000,
                   const RawCurveKeys* curve = nullptr)
      : sock_(ctx_, zmq::socket_type::dealer) {
    sock_.set(zmq::sockopt::linger, 0);
    sock_.set(zmq::sockopt::rcvtimeo, reply_timeout_ms);
    if (curve != nullptr) {
      sock_.set(zmq::sockopt::curve_serverkey, curve->server_public);
      sock_.set(zmq::sockopt::curve_publickey, curve->public_key);
      sock_.set(zmq::sockopt::curve_secretkey, curve->secret_key);
    }
    sock_.connect(endpoint);
  }
  zmq::socket_t& socket() { return sock_; }

  /// Sends `h` (request id assigned here) and `data` frames without waiting; false when the
  /// socket's queue is full.
  bool Send(Header h, const std::vector<std::string>& data = {}) {
    return Resend(h, ++next_id_, data);
  }

  /// Sends `h` as request `request_id` again, byte for byte what Send sent (a resend after a
  /// lost answer, as a primary resends a forwarded push); false when the queue is full.
  bool Resend(Header h, uint64_t request_id, const std::vector<std::string>& data = {}) {
    h.request_id = request_id;
    std::string env;
    EncodeHeader(h, &env);
    std::vector<zmq::message_t> parts;
    parts.emplace_back(env.data(), env.size());
    for (auto& d : data) parts.emplace_back(d.data(), d.size());
    return zmq::send_multipart(sock_, parts, zmq::send_flags::dontwait).has_value();
  }

  /// The next reply (any request's) within `limit`, its data frames to `*data` when given;
  /// nullopt when none came. A frame set whose envelope does not decode is skipped.
  std::optional<Header> NextReply(std::chrono::milliseconds limit,
                                  std::vector<std::string>* data = nullptr) {
    const auto until = std::chrono::steady_clock::now() + limit;
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          until - std::chrono::steady_clock::now());
      zmq::pollitem_t item{sock_.handle(), 0, ZMQ_POLLIN, 0};
      if (left.count() <= 0 || zmq::poll(&item, 1, left) == 0) return std::nullopt;
      std::vector<zmq::message_t> reply;
      auto n = zmq::recv_multipart(sock_, std::back_inserter(reply));
      Header h;
      if (!n || reply.empty() || !DecodeHeader(reply[0].data(), reply[0].size(), &h).ok()) {
        continue;
      }
      if (data != nullptr) {
        data->clear();
        for (size_t i = 1; i < reply.size(); ++i) data->push_back(reply[i].to_string());
      }
      return h;
    }
  }

  /// Sends `h` and waits for its reply (other replies are skipped); the reply's data frames go
  /// to `*reply_data` when given. The reply's status is Internal "no reply" when none came
  /// within the reply timeout.
  Header Call(const Header& h, const std::vector<std::string>& data = {},
              std::vector<std::string>* reply_data = nullptr) {
    Header r;
    r.status = StatusCode::kInternal;
    r.message = "no reply";
    if (!Send(h, data)) return r;
    const uint64_t id = next_id_;
    for (;;) {
      std::vector<zmq::message_t> reply;
      auto n = zmq::recv_multipart(sock_, std::back_inserter(reply));
      if (!n || reply.empty()) return r;
      Header got;
      if (!DecodeHeader(reply[0].data(), reply[0].size(), &got).ok()) continue;
      if (got.request_id != id) continue;
      if (reply_data != nullptr) {
        reply_data->clear();
        for (size_t i = 1; i < reply.size(); ++i) reply_data->push_back(reply[i].to_string());
      }
      return got;
    }
  }

 private:
  zmq::context_t ctx_;
  zmq::socket_t sock_;
  uint64_t next_id_ = 0;
};

/// The bytes of `v`, as one data frame.
template <typename T>
std::string Bytes(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

/// The envelope of a sparse request (`op`: pull, push or push-pull) of `count` keys of `dim`
/// F32 values for table `table_id`; the frames are the keys, then for a push the values.
inline Header SparseHeader(Op op, uint64_t table_id, uint64_t count, uint32_t dim) {
  Header h;
  h.op = op;
  h.table_id = table_id;
  h.elem_type = ElemType::kF32;
  h.count = count;
  h.dim = dim;
  return h;
}

/// Milliseconds since `t0`.
inline double MsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace tessera::testing
