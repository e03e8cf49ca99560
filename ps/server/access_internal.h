// Who may do what on a server (docs/operations.md, "Security"): the rights of a request's
// sender, from its CurveZMQ key (the ZAP handler's User-Id) or, without CurveZMQ, from its
// address, and the gate that keeps the peer and admin ops to senders that have those rights.
#pragma once

#include <absl/container/flat_hash_map.h>

#include <atomic>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "ps/codec.h"
#include "ps/status.h"

namespace tessera::internal {

/// What a sender may do besides the data ops every client may send.
struct Rights {
  bool peer = false;   ///< server-to-server: forwarded pushes, slot moves and backup fills
  bool admin = false;  ///< operators: checkpoints (and their aborts), restores, exports, slot moves
};

/// How a server tells who sent a request.
struct AccessPolicy {
  /// CurveZMQ is on: rights come from the key the ZAP handler classified (its User-Id).
  bool curve = false;
  /// Without CurveZMQ: senders that are not on loopback get the peer and admin rights too
  /// (--allow_remote_admin_without_curve). Ignored with CurveZMQ.
  bool allow_remote_admin = false;
  /// The server listens on ipc:// or inproc://: every sender is on this host.
  bool local_endpoint = false;
};

/// The User-Id the ZAP handler gives each class of key.
inline constexpr std::string_view kClientUser = "client";
inline constexpr std::string_view kPeerUser = "peer";
inline constexpr std::string_view kAdminUser = "admin";

/// True for a loopback IP address as ZeroMQ's "Peer-Address" writes it: 127.0.0.0/8, ::1,
/// ::ffff:127.x.y.z.
bool IsLoopbackAddress(std::string_view address);

/// The rights of a sender: `user_id` and `peer_address` are the request's "User-Id" and
/// "Peer-Address" message properties (null when the message has none).
Rights RightsOf(const AccessPolicy& policy, const char* user_id, const char* peer_address);

/// The rights of the sender of the message `envelope` (one frame of a received request).
Rights RightsOfMessage(const AccessPolicy& policy, const zmq::message_t& envelope);

/// OK when a sender with `rights` may send `h`; else PermissionDenied naming the op, the right
/// it needs and how to get it. Data, table, meta, clock, barrier, stats and ping need none.
Status Authorize(const Header& h, const Rights& rights, uint32_t rank, const AccessPolicy& policy);

/// The keys a server lets in over CurveZMQ and the class of each.
struct CurveAccess {
  /// Public keys (Z85) of clients allowed to connect (--authorized_clients). Empty with
  /// `any_client`: every key may connect as a client.
  std::vector<std::string> clients;
  bool any_client = true;
  /// Public keys (Z85) of operators (--admin_clients): connect with the admin rights.
  std::vector<std::string> admins;
  /// Public keys (Z85) the servers' own links present (the peer key pair): the peer rights.
  std::vector<std::string> peers;
};

/// The ZAP handler (ZeroMQ RFC 27) of a server's context: answers each CurveZMQ handshake on
/// inproc://zeromq.zap.01 with 200 and the key's class as User-Id, or 400 for a key it does
/// not know (the client's handshake then fails). Owns a thread, joined by the destructor; the
/// key sets are fixed at creation. Create it before the server socket binds.
class ZapHandler {
 public:
  static Result<std::unique_ptr<ZapHandler>> Create(zmq::context_t& ctx, const CurveAccess& access);
  ~ZapHandler();
  ZapHandler(const ZapHandler&) = delete;
  ZapHandler& operator=(const ZapHandler&) = delete;

 private:
  ZapHandler(zmq::socket_t socket, absl::flat_hash_map<std::string, std::string_view> users,
             bool any_client);
  void Run();
  // One request's reply frames: status code, text and User-Id.
  void Answer(std::vector<zmq::message_t>& request);

  zmq::socket_t socket_;  // the handler thread's only
  const absl::flat_hash_map<std::string, std::string_view> users_;  // binary key -> User-Id
  const bool any_client_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace tessera::internal
