#include <string>

#include "ps/server/peers_internal.h"

namespace tessera::internal {
namespace {

// The map's heterogeneous lookup takes absl's string_view (not std's in every absl build).
absl::string_view Key(std::string_view s) { return absl::string_view(s.data(), s.size()); }

}  // namespace

void ConnectionTable::Accepted(int fd, Time now, std::string source) {
  // A descriptor is reused only after its DISCONNECTED event, which comes first; drop a stale
  // entry anyway rather than count it twice.
  Closed(fd);
  const uint64_t order = next_order_++;
  Conn& c = conns_[fd];
  c = Conn{order, false, now, std::move(source)};
  if ((max_ == 0 || admitted_ < max_) && !SourceFull(c.source)) {
    Admit(c);
  } else {
    refused_[order] = fd;
    TakeIdlePlace(fd, now);
  }
}

bool ConnectionTable::SourceFull(const std::string& source) const {
  return max_per_source_ != 0 && admitted_from(source) >= max_per_source_;
}

void ConnectionTable::Admit(Conn& c) {
  c.admitted = true;
  ++admitted_;
  if (max_per_source_ != 0) ++admitted_by_source_[c.source];
}

void ConnectionTable::Refuse(int fd, Conn& c) {
  c.admitted = false;
  --admitted_;
  if (max_per_source_ != 0) {
    auto it = admitted_by_source_.find(c.source);
    if (--it->second == 0) admitted_by_source_.erase(it);
  }
  refused_[c.order] = fd;
}

bool ConnectionTable::Active(int fd, Time now) {
  auto it = conns_.find(fd);
  if (it == conns_.end()) return true;  // not reported by the monitor yet: admitted
  it->second.last_active = now;
  if (it->second.admitted) return true;
  return TakeIdlePlace(fd, now);
}

bool ConnectionTable::TakeIdlePlace(int fd, Time now) {
  if (idle_timeout_.count() == 0) return false;
  // Only when a connection is refused: a scan of the open connections. A source at its limit
  // may only displace one of its own idle connections (else it would still be over it).
  const std::string& source = conns_[fd].source;
  const bool own_only = SourceFull(source);
  int idlest = -1;
  Time oldest = now - idle_timeout_;
  for (const auto& [other, c] : conns_) {
    if (c.admitted && c.last_active <= oldest && (!own_only || c.source == source)) {
      oldest = c.last_active;
      idlest = other;
    }
  }
  if (idlest < 0) return false;
  Refuse(idlest, conns_[idlest]);
  Conn& in = conns_[fd];
  refused_.erase(in.order);
  Admit(in);
  ++idle_displaced_;
  return true;
}

void ConnectionTable::Closed(int fd) {
  auto it = conns_.find(fd);
  if (it == conns_.end()) return;
  if (it->second.admitted) {
    Refuse(fd, it->second);  // gives back its place (and its source's)
  }
  refused_.erase(it->second.order);
  conns_.erase(it);
  // The oldest refused connections still open whose source has room take the freed places.
  for (auto r = refused_.begin(); r != refused_.end() && (max_ == 0 || admitted_ < max_);) {
    Conn& c = conns_[r->second];
    if (SourceFull(c.source)) {
      ++r;
      continue;
    }
    Admit(c);
    r = refused_.erase(r);
  }
}

bool ConnectionTable::admitted(int fd) const {
  auto it = conns_.find(fd);
  return it == conns_.end() || it->second.admitted;
}

std::string ConnectionTable::source(int fd) const {
  auto it = conns_.find(fd);
  return it == conns_.end() ? std::string() : it->second.source;
}

uint32_t ConnectionTable::admitted_from(const std::string& source) const {
  auto it = admitted_by_source_.find(source);
  return it == admitted_by_source_.end() ? 0 : it->second;
}

bool ConnectionTable::over_source_limit(int fd) const {
  auto it = conns_.find(fd);
  return it != conns_.end() && !it->second.admitted && SourceFull(it->second.source);
}

// Holds one in-flight slot of a peer; gives it back when the request is dropped.
struct PeerTable::Slot {
  explicit Slot(std::shared_ptr<Peer> p) : peer(std::move(p)) {}
  ~Slot() { peer->in_flight.fetch_sub(1, std::memory_order_relaxed); }
  std::shared_ptr<Peer> peer;
};

const std::shared_ptr<PeerTable::Peer>& PeerTable::Touch(std::string_view peer, Time now) {
  auto& p = peers_[std::string(peer)];
  if (!p) p = std::make_shared<Peer>();
  p->last_seen = now;
  return p;
}

Result<std::shared_ptr<void>> PeerTable::Admit(std::string_view peer, Time now) {
  const std::shared_ptr<Peer>& p = Touch(peer, now);
  const uint32_t n = p->in_flight.load(std::memory_order_relaxed);
  if (max_in_flight_ != 0 && n >= max_in_flight_) {
    return Status::ResourceExhausted(
        "this client has " + std::to_string(n) +
        " requests in flight on the server, its limit (--max_in_flight_per_peer) is " +
        std::to_string(max_in_flight_) + ": wait for replies before sending more");
  }
  p->in_flight.fetch_add(1, std::memory_order_relaxed);
  return std::shared_ptr<void>(std::make_shared<Slot>(p));
}

void PeerTable::MarkStalled(std::string_view peer, Time now) { Touch(peer, now)->stalled = true; }

void PeerTable::ClearStalled(std::string_view peer) {
  auto it = peers_.find(Key(peer));
  if (it != peers_.end()) it->second->stalled = false;
}

bool PeerTable::stalled(std::string_view peer) const {
  auto it = peers_.find(Key(peer));
  return it != peers_.end() && it->second->stalled;
}

uint32_t PeerTable::in_flight(std::string_view peer) const {
  auto it = peers_.find(Key(peer));
  return it == peers_.end() ? 0 : it->second->in_flight.load(std::memory_order_relaxed);
}

void PeerTable::Sweep(Time idle_since) {
  absl::erase_if(peers_, [&](const auto& kv) {
    return kv.second->in_flight.load(std::memory_order_relaxed) == 0 &&
           kv.second->last_seen < idle_since;
  });
}

size_t PeerTable::stalled_count() const {
  size_t n = 0;
  for (auto& [id, p] : peers_) n += p->stalled;
  return n;
}

}  // namespace tessera::internal
