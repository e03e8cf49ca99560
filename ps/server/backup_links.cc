#include <glog/logging.h>

#include "ps/server/backup_links_internal.h"

namespace tessera::internal {

zmq::socket_t* BackupLinks::Get(uint16_t server, const std::string& address) {
  auto it = links_.find(server);
  if (it != links_.end() && it->second.address == address) return &it->second.dealer;
  Link link{address, zmq::socket_t(ctx_, zmq::socket_type::dealer)};
  link.dealer.set(zmq::sockopt::linger, 0);
  // Pushes waiting for a backup that does not read are bounded by the queue's resends, not by
  // ZeroMQ's buffers.
  link.dealer.set(zmq::sockopt::sndhwm, 0);
  if (!curve_secret_key_.empty()) {
    // The servers share one key pair (--curve_secret_key_file); the link presents the peer
    // key pair, which the backup's ZAP handler gives the peer right (access_internal.h).
    char server_public[41] = {}, peer_public[41] = {};
    if (zmq_curve_public(server_public, curve_secret_key_.c_str()) == 0 &&
        zmq_curve_public(peer_public, curve_peer_secret_key_.c_str()) == 0) {
      link.dealer.set(zmq::sockopt::curve_serverkey, std::string(server_public, 40));
      link.dealer.set(zmq::sockopt::curve_publickey, std::string(peer_public, 40));
      link.dealer.set(zmq::sockopt::curve_secretkey, curve_peer_secret_key_);
    }
  }
  try {
    link.dealer.connect(address);
  } catch (const zmq::error_t& e) {
    LOG(ERROR) << "replication: cannot connect to backup server " << server << " at " << address
               << ": " << e.what();
    return nullptr;
  }
  links_.erase(server);
  auto [pos, inserted] = links_.emplace(server, std::move(link));
  changed_ = true;
  return &pos->second.dealer;
}

void BackupLinks::CloseUnused(const absl::flat_hash_set<uint16_t>& used) {
  for (auto it = links_.begin(); it != links_.end();) {
    if (!used.contains(it->first)) {
      links_.erase(it++);
      changed_ = true;
    } else {
      ++it;
    }
  }
}

}  // namespace tessera::internal
