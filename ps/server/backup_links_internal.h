// A primary's links to the backups of its slots and dense parts (docs/elasticity.md,
// "Replication and fail-over"): one DEALER per backup server.
#pragma once

#include <absl/container/flat_hash_map.h>
#include <absl/container/flat_hash_set.h>

#include <cstdint>
#include <string>
#include <zmq.hpp>

namespace tessera::internal {

/// The DEALERs to backup servers, by server id. Not thread-safe: the server's I/O thread owns
/// it, and polls each link's descriptor (rebuilding its list when TakeChanged() says so).
class BackupLinks {
 public:
  struct Link {
    std::string address;
    zmq::socket_t dealer;
  };

  /// `curve_secret_key`: the servers' shared CurveZMQ key (empty: plain TCP); the links present
  /// the peer key pair `curve_peer_secret_key` (empty: the server key pair).
  BackupLinks(zmq::context_t& ctx, std::string curve_secret_key, std::string curve_peer_secret_key)
      : ctx_(ctx),
        curve_secret_key_(std::move(curve_secret_key)),
        curve_peer_secret_key_(curve_peer_secret_key.empty() ? curve_secret_key_
                                                             : std::move(curve_peer_secret_key)) {}

  /// The DEALER to `server` at `address`: connected on first use, and again when its address
  /// changed; null when it cannot connect (logged).
  zmq::socket_t* Get(uint16_t server, const std::string& address);
  /// Closes the links to servers not in `used`.
  void CloseUnused(const absl::flat_hash_set<uint16_t>& used);
  /// True once after a link was opened or closed (and at first).
  bool TakeChanged() {
    const bool changed = changed_;
    changed_ = false;
    return changed;
  }
  bool empty() const { return links_.empty(); }
  absl::flat_hash_map<uint16_t, Link>& links() { return links_; }

 private:
  zmq::context_t& ctx_;
  const std::string curve_secret_key_;
  const std::string curve_peer_secret_key_;
  absl::flat_hash_map<uint16_t, Link> links_;
  bool changed_ = true;
};

}  // namespace tessera::internal
