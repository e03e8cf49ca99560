// The server's bounds on its clients: connections admitted in accept order up to a maximum
// (ConnectionTable, fed by the ROUTER's socket monitor) and, per peer, the requests in flight
// and whether its replies are being read (PeerTable).
#pragma once

#include <absl/container/flat_hash_map.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "ps/status.h"

namespace tessera::internal {

/// The TCP connections of the ROUTER, from its monitor's ACCEPTED and DISCONNECTED events
/// (keyed by file descriptor, which ZMQ_SRCFD names on every received frame). The first
/// `max_connections` open connections are admitted; a later one is refused until an admitted
/// one closes, then the oldest refused one is admitted. An idle connection (no request for
/// `idle_timeout`, counted from its accept when it never sent one) does not keep its place
/// from others: a connection that needs one (a new one, or a refused one with a request)
/// takes the place of the longest idle, which is refused until a place frees again (or it
/// takes an idle one's in turn when it sends). So connections that finish the handshake and
/// never send cannot lock clients out. With `max_per_source` set, at most that many connections
/// of one source address (the peer's IP, without port) are admitted at once, so one host cannot
/// take every place; its further connections wait like those over `max_connections`, and an
/// idle one of that host is the only one they may displace. Not thread-safe: the I/O thread
/// owns it.
class ConnectionTable {
 public:
  using Time = std::chrono::steady_clock::time_point;
  /// `max_connections`, `max_per_source` 0: no limit. `idle_timeout` zero: a connection never
  /// counts as idle.
  explicit ConnectionTable(uint32_t max_connections,
                           std::chrono::milliseconds idle_timeout = std::chrono::minutes(1),
                           uint32_t max_per_source = 0)
      : max_(max_connections), max_per_source_(max_per_source), idle_timeout_(idle_timeout) {}

  /// A connection from `source` (its peer address; empty when unknown, counted as one source).
  void Accepted(int fd, Time now = std::chrono::steady_clock::now(), std::string source = {});
  void Closed(int fd);
  /// Whether requests that arrive on `fd` are served. A connection the monitor has not
  /// reported yet is admitted.
  bool admitted(int fd) const;
  /// A request arrived on `fd` at `now`: the connection is active. A refused one takes the
  /// place of an idle one if there is any. Returns admitted(fd).
  bool Active(int fd, Time now);
  /// Admitted connections that lost their place to another while idle.
  uint64_t idle_displaced() const { return idle_displaced_; }

  size_t open() const { return conns_.size(); }
  size_t admitted_count() const { return admitted_; }
  uint32_t max_connections() const { return max_; }
  uint32_t max_per_source() const { return max_per_source_; }
  /// The source of `fd` (empty when unknown) and how many of its connections are admitted.
  std::string source(int fd) const;
  uint32_t admitted_from(const std::string& source) const;
  /// Whether `fd` (refused) waits for a place of its source rather than a place at all.
  bool over_source_limit(int fd) const;

 private:
  struct Conn {
    uint64_t order;
    bool admitted;
    Time last_active;  // its last request, else its accept
    std::string source;
  };
  bool SourceFull(const std::string& source) const;
  void Admit(Conn& c);
  void Refuse(int fd, Conn& c);
  // Refuses the admitted connection idle the longest at `now` and admits `fd` (refused) in
  // its place (one of its own source when that source is full); false when none is idle.
  bool TakeIdlePlace(int fd, Time now);
  const uint32_t max_;
  const uint32_t max_per_source_;
  const std::chrono::milliseconds idle_timeout_;
  uint64_t idle_displaced_ = 0;
  uint64_t next_order_ = 0;
  size_t admitted_ = 0;
  absl::flat_hash_map<int, Conn> conns_;
  absl::flat_hash_map<std::string, uint32_t> admitted_by_source_;  // only with max_per_source_
  std::map<uint64_t, int> refused_;  // accept order -> fd, oldest first
};

/// Per-peer (ROUTER identity) admission: requests in flight up to a limit, and a peer whose
/// replies could not be queued (it stopped reading and its send queue reached the high-water
/// mark) is marked stalled until a reply to it can be queued again. The I/O thread owns the
/// table; the in-flight slots it hands out are released by whichever thread drops them.
class PeerTable {
 public:
  using Time = std::chrono::steady_clock::time_point;
  /// `max_in_flight` 0: no limit.
  explicit PeerTable(uint32_t max_in_flight) : max_in_flight_(max_in_flight) {}

  /// Takes one in-flight slot of `peer`: held until the returned token is destroyed (it
  /// travels with the request). ResourceExhausted when the peer already holds the limit.
  Result<std::shared_ptr<void>> Admit(std::string_view peer, Time now);
  /// Replies to `peer` cannot be queued: it is not reading them.
  void MarkStalled(std::string_view peer, Time now);
  void ClearStalled(std::string_view peer);
  bool stalled(std::string_view peer) const;
  /// Requests of `peer` in flight now.
  uint32_t in_flight(std::string_view peer) const;
  /// Forgets peers with nothing in flight that were last seen before `idle_since`.
  void Sweep(Time idle_since);

  size_t size() const { return peers_.size(); }
  size_t stalled_count() const;
  uint32_t max_in_flight() const { return max_in_flight_; }

 private:
  struct Peer {
    std::atomic<uint32_t> in_flight{0};
    bool stalled = false;  // I/O thread only, as last_seen
    Time last_seen{};
  };
  struct Slot;
  // The peer's entry (created if new), last seen `now`.
  const std::shared_ptr<Peer>& Touch(std::string_view peer, Time now);

  const uint32_t max_in_flight_;
  absl::flat_hash_map<std::string, std::shared_ptr<Peer>> peers_;
};

}  // namespace tessera::internal
