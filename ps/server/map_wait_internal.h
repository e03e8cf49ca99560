// A client's push that names a cluster map version ahead of this server's waits here for the
// map instead of being refused (docs/wire-protocol.md, "Numbers across a stale-map refusal and
// a fail-over").
#pragma once

#include <absl/container/flat_hash_map.h>
#include <absl/container/flat_hash_set.h>
#include <absl/strings/string_view.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ps/server/request_internal.h"

namespace tessera::internal {

/// Holds numbered client pushes (Header::client_id, the dedup key KeyByOrigin made, not 0) that
/// came with a map version ahead of this server's, the later pushes of the same client that
/// came while they waited, and the Clocks that came after them on the same connection (peer),
/// in arrival order, until the server's map catches up. A worker's Clock ends its step's
/// pushes on its connection: served ahead of them, it would let a checkpoint cut or the
/// staleness bound go past pushes not applied yet.
///
/// Why not refuse such a push as stale: a refusal by a server behind the push's map proves
/// nothing about an attempt of it still on its way, which the server may take once it caught
/// up. The client must then keep the push's number and send it on counted in that server's
/// sequence (client_origin), and if the keys are still that server's it comes back there under
/// another dedup key and is applied a second time. Held, the push is answered once: taken when
/// the map comes (a resend of it that comes meanwhile is dropped; the held one's answer, under
/// the same request id, answers it), or refused by the map that came.
///
/// Not thread-safe: the server's I/O thread owns it.
class MapWait {
 public:
  using Clock = std::chrono::steady_clock;
  /// Held pushes at most, and their frames' bytes at most (kFull beyond either).
  static constexpr size_t kMaxHeld = 65536;
  static constexpr uint64_t kMaxHeldBytes = uint64_t{256} << 20;
  /// A push held this long is given up (Expire): the server answers it Unavailable and its
  /// client sends it again under its number. Far above a map's way to a server (its watch, or
  /// the re-read a held push asks for), below the client's retry time (120 s by default).
  static constexpr std::chrono::seconds kHoldLimit{10};

  explicit MapWait(size_t max_held = kMaxHeld, uint64_t max_held_bytes = kMaxHeldBytes)
      : max_held_(max_held), max_held_bytes_(max_held_bytes) {}

  enum class Verdict {
    kServe,    // not ahead of `mine`, and nothing of its client waits
    kHeld,     // it waits (ahead of `mine`, or behind a held push of its client)
    kDropped,  // a copy of a held push (same client and number): the held one answers it
    kFull,     // it should wait, but the bounds are reached
  };
  /// Where numbered push `p` goes while this server's map is at `mine`. `ticket`: the map
  /// re-read (MapRecheck) it waits for when it is ahead (0: none).
  Verdict Admit(const std::shared_ptr<Pending>& p, uint64_t mine, uint64_t ticket = 0,
                Clock::time_point now = Clock::now());
  /// True when a push of dedup key `client` waits.
  bool Holds(uint64_t client) const { return per_client_.contains(client); }
  /// True when a push that came from `peer` (its ROUTER identity) waits.
  bool HoldsPeer(const zmq::message_t& peer) const { return per_peer_.contains(PeerKey(peer)); }
  /// Holds `p` (a Clock) behind the held pushes of its peer (HoldsPeer). kFull past the
  /// bounds (the caller serves it).
  Verdict AdmitBehindPeer(const std::shared_ptr<Pending>& p, Clock::time_point now = Clock::now());
  /// True when a held push's header satisfies `pred`.
  bool Any(const std::function<bool(const Header&)>& pred) const {
    for (const Held& held : held_) {
      if (pred(held.p->header)) return true;
    }
    return false;
  }

  /// Takes out, in arrival order, every held push whose map is here (at most `mine`) and that
  /// no held push of its client waits before, and every held Clock that no held request of its
  /// peer waits before, and hands each to `serve`.
  void Readmit(uint64_t mine, const std::function<void(const std::shared_ptr<Pending>&)>& serve);

  /// A held push given up at Expire.
  struct Expired {
    std::shared_ptr<Pending> p;
    /// True: ahead of the newest map the store had at the re-read it waited for (a version
    /// no map ever had); the server refuses it as stale. False: held past kHoldLimit, or
    /// behind a push of its client that was (the server answers it Unavailable).
    bool ahead_of_store = false;
  };
  /// The store's newest map version as a re-read after `ticket` found it; nullopt until one
  /// did.
  using Newest = std::function<std::optional<uint64_t>(uint64_t ticket)>;
  /// Takes out, in arrival order, the held pushes to give up at `now` (never a Clock: one goes
  /// at the next Readmit once the pushes before it are gone).
  std::vector<Expired> Expire(Clock::time_point now, const Newest& newest);

  size_t size() const { return held_.size(); }
  bool empty() const { return held_.empty(); }
  uint64_t bytes() const { return bytes_; }
  uint64_t held_total() const { return held_total_; }
  uint64_t resends_dropped() const { return resends_dropped_; }
  uint64_t expired() const { return expired_; }

 private:
  struct Held {
    std::shared_ptr<Pending> p;
    Clock::time_point since;
    uint64_t ticket = 0;
    bool clock = false;  // a Clock held behind its peer's pushes
  };
  void Push(Held held);
  static absl::string_view PeerKey(const zmq::message_t& peer) {
    return absl::string_view(static_cast<const char*>(peer.data()), peer.size());
  }
  // Takes the entries `take` says yes to out of held_, in order.
  std::vector<Held> TakeOut(const std::function<bool(const Held&)>& take);

  const size_t max_held_;
  const uint64_t max_held_bytes_;
  std::deque<Held> held_;
  absl::flat_hash_map<uint64_t, uint32_t> per_client_;        // held pushes of each client
  absl::flat_hash_map<std::string, uint32_t> per_peer_;       // held requests of each peer
  absl::flat_hash_set<std::pair<uint64_t, uint64_t>> numbers_;  // (client, seq) held
  uint64_t bytes_ = 0;
  uint64_t last_mine_ = 0;      // the version the last Readmit pass looked at
  bool expired_since_ = false;  // Expire took pushes out since that pass
  uint64_t held_total_ = 0, resends_dropped_ = 0, expired_ = 0;
};

}  // namespace tessera::internal
