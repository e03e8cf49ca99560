#include <glog/logging.h>
#include <zmq.h>

#include <zmq_addon.hpp>

#include "ps/server/access_internal.h"
#include "ps/thread_name_internal.h"

namespace tessera::internal {

bool IsLoopbackAddress(std::string_view a) {
  if (a.starts_with("::ffff:")) a.remove_prefix(7);
  return a.starts_with("127.") || a == "::1";
}

Rights RightsOf(const AccessPolicy& policy, const char* user_id, const char* peer_address) {
  if (policy.curve) {
    const std::string_view user = user_id == nullptr ? "" : user_id;
    return Rights{.peer = user == kPeerUser, .admin = user == kAdminUser};
  }
  const bool trusted = policy.allow_remote_admin || policy.local_endpoint ||
                       (peer_address != nullptr && IsLoopbackAddress(peer_address));
  return Rights{.peer = trusted, .admin = trusted};
}

Rights RightsOfMessage(const AccessPolicy& policy, const zmq::message_t& envelope) {
  auto* msg = const_cast<zmq_msg_t*>(envelope.handle());
  const char* user = policy.curve ? zmq_msg_gets(msg, "User-Id") : nullptr;
  const char* address = policy.curve ? nullptr : zmq_msg_gets(msg, "Peer-Address");
  return RightsOf(policy, user, address);
}

namespace {

// What a sender without the right must change to get it.
std::string HowToGet(bool peer, const AccessPolicy& policy) {
  if (policy.curve) {
    return peer ? "only another server's link presents the peer key (--curve_peer_key_file)"
                : "to get it, connect with a key listed in the server's --admin_clients "
                  "(tessera-ctl --curve_client_key_file)";
  }
  return "without CurveZMQ only a sender on this host (loopback) has it, unless the server "
         "runs with --allow_remote_admin_without_curve";
}

}  // namespace

Status Authorize(const Header& h, const Rights& rights, uint32_t rank, const AccessPolicy& policy) {
  const std::string server = "server " + std::to_string(rank) + " refuses ";
  if (h.replica_from != 0 && !rights.peer) {
    return Status::PermissionDenied(server + "a forwarded " + std::string(OpName(h.op)) +
                                    " (replica_from " + std::to_string(h.replica_from) +
                                    "): forwarding needs the peer right; " +
                                    HowToGet(true, policy));
  }
  const bool slot_op = h.op == Op::kSlotExport || h.op == Op::kSlotImport || h.op == Op::kSlotDrop;
  const bool admin_op = h.op == Op::kCheckpoint || h.op == Op::kRestore || h.op == Op::kExport ||
                        h.op == Op::kDropTable;
  if ((slot_op && !rights.peer && !rights.admin) || (admin_op && !rights.admin)) {
    return Status::PermissionDenied(server + std::string(OpName(h.op)) +
                                    ": it needs the admin right" +
                                    (slot_op ? " (or the peer right)" : "") + "; " +
                                    HowToGet(false, policy));
  }
  return Status::OK();
}

Result<std::unique_ptr<ZapHandler>> ZapHandler::Create(zmq::context_t& ctx,
                                                       const CurveAccess& access) {
  absl::flat_hash_map<std::string, std::string_view> users;
  // An admin's or a peer's key is also let in; a key in several lists gets the most rights
  // the later lists give (peer, then admin).
  const std::pair<const std::vector<std::string>*, std::string_view> lists[] = {
      {&access.clients, kClientUser}, {&access.peers, kPeerUser}, {&access.admins, kAdminUser}};
  for (const auto& [keys, user] : lists) {
    for (const std::string& key : *keys) {
      std::string raw(32, '\0');
      if (key.size() != 40 ||
          zmq_z85_decode(reinterpret_cast<uint8_t*>(raw.data()), key.c_str()) == nullptr) {
        return Status::InvalidArgument("'" + key.substr(0, 48) +
                                       "' is not a 40-character Z85 CurveZMQ public key");
      }
      users[raw] = user;
    }
  }
  zmq::socket_t socket;
  try {
    socket = zmq::socket_t(ctx, zmq::socket_type::rep);
    socket.set(zmq::sockopt::linger, 0);
    socket.bind("inproc://zeromq.zap.01");
  } catch (const zmq::error_t& e) {
    return Status::Internal(std::string("cannot start the CurveZMQ ZAP handler: ") + e.what());
  }
  return std::unique_ptr<ZapHandler>(
      new ZapHandler(std::move(socket), std::move(users), access.any_client));
}

ZapHandler::ZapHandler(zmq::socket_t socket,
                       absl::flat_hash_map<std::string, std::string_view> users, bool any_client)
    : socket_(std::move(socket)), users_(std::move(users)), any_client_(any_client) {
  thread_ = std::thread([this] { Run(); });
}

ZapHandler::~ZapHandler() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
}

void ZapHandler::Run() {
  NameThisThread("zap");
  while (!stop_.load()) {
    zmq::pollitem_t item{socket_.handle(), 0, ZMQ_POLLIN, 0};
    try {
      if (zmq::poll(&item, 1, std::chrono::milliseconds(100)) == 0) continue;
      std::vector<zmq::message_t> request;
      if (!zmq::recv_multipart(socket_, std::back_inserter(request), zmq::recv_flags::dontwait)) {
        continue;
      }
      Answer(request);
    } catch (const zmq::error_t& e) {
      if (e.num() == ETERM) return;
      LOG(ERROR) << "CurveZMQ ZAP handler: " << e.what();
    }
  }
}

void ZapHandler::Answer(std::vector<zmq::message_t>& request) {
  // RFC 27: version, request id, domain, address, routing id, mechanism, credentials.
  const bool well_formed = request.size() >= 7 && request[0].to_string_view() == "1.0";
  std::string_view user;
  if (well_formed && request[5].to_string_view() == "CURVE" && request[6].size() == 32) {
    auto it = users_.find(request[6].to_string());
    if (it != users_.end()) {
      user = it->second;
    } else if (any_client_) {
      user = kClientUser;
    } else {
      char z85[41] = {};
      zmq_z85_encode(z85, static_cast<const uint8_t*>(request[6].data()), 32);
      LOG_EVERY_N(WARNING, 100) << "refused a CurveZMQ client from " << request[3].to_string_view()
                                << ": its public key " << z85
                                << " is not in --authorized_clients or --admin_clients";
    }
  }
  const std::string id = request.size() >= 2 ? request[1].to_string() : std::string();
  std::vector<zmq::message_t> reply;
  reply.emplace_back(std::string_view("1.0"));
  reply.emplace_back(id.data(), id.size());
  reply.emplace_back(std::string_view(user.empty() ? "400" : "200"));
  reply.emplace_back(std::string_view(user.empty() ? "key not authorized" : "OK"));
  reply.emplace_back(user.data(), user.size());
  reply.emplace_back();  // metadata: none
  zmq::send_multipart(socket_, reply);
}

}  // namespace tessera::internal
