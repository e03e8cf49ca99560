// A client's pushes are logged in its order (docs/wire-protocol.md, "Exactly-once pushes"):
// the pushes held behind a parked push of their client.
#pragma once

#include <absl/container/flat_hash_map.h>

#include <cstdint>
#include <deque>
#include <memory>

#include "ps/server/request_internal.h"

namespace tessera::internal {

/// Keeps the dedup's logged mark from passing a push that waits: while a push of client C is
/// parked (checkpoint cut, slot copy, the staleness gate), C's later pushes are held behind it
/// and leave, in sequence order, once none of C's pushes is parked. Not thread-safe: the
/// server's I/O thread owns it.
///
/// No bound of its own: a held push keeps its admission slot, so --max_in_flight_per_peer
/// bounds them (a refusal here would give back a number below others taken since).
class PushOrder {
 public:
  /// A push whose place in its client's sequence counts (PushDedup): not a primary's
  /// forwarded copy (its primary orders those), not the pull left of a push-pull applied
  /// already.
  static bool Ordered(const Pending& p);

  /// Counts `p`, just parked, as its client's parked push when it is an ordered one.
  void NoteParked(Pending& p);
  /// `p` leaves its park: true when it was its client's last parked push (the held ones may
  /// go: Release).
  bool Unpark(Pending& p);
  /// True when `p` is an ordered push of a client with a parked push: it is held, in
  /// sequence order (a readmitted push may come back behind later ones).
  bool Hold(const std::shared_ptr<Pending>& p);
  /// The pushes held behind `client`'s parked ones, in sequence order, once none is parked
  /// (the client is forgotten); empty while one still is.
  std::deque<std::shared_ptr<Pending>> Release(uint64_t client);

  uint64_t held_now() const { return held_now_; }
  uint64_t held_total() const { return held_total_; }

 private:
  struct Client {
    uint32_t parked = 0;
    std::deque<std::shared_ptr<Pending>> held;
  };
  absl::flat_hash_map<uint64_t, Client> clients_;
  uint64_t held_now_ = 0, held_total_ = 0;
};

}  // namespace tessera::internal
