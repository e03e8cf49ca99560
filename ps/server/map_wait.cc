#include "ps/server/map_wait_internal.h"

namespace tessera::internal {

MapWait::Verdict MapWait::Admit(const std::shared_ptr<Pending>& p, uint64_t mine,
                                uint64_t ticket, Clock::time_point now) {
  const Header& h = p->header;
  const bool ahead = h.map_version > mine;
  if (!ahead && !Holds(h.client_id)) return Verdict::kServe;
  if (numbers_.contains({h.client_id, h.client_seq})) {
    ++resends_dropped_;
    return Verdict::kDropped;
  }
  if (held_.size() >= max_held_ || bytes_ + FrameBytes(*p) > max_held_bytes_) {
    return Verdict::kFull;
  }
  Push(Held{p, now, ahead ? ticket : 0});
  return Verdict::kHeld;
}

MapWait::Verdict MapWait::AdmitBehindPeer(const std::shared_ptr<Pending>& p,
                                          Clock::time_point now) {
  if (held_.size() >= max_held_) return Verdict::kFull;
  Push(Held{p, now, 0, /*clock=*/true});
  return Verdict::kHeld;
}

void MapWait::Push(Held held) {
  const Header& h = held.p->header;
  if (!held.clock) {
    ++per_client_[h.client_id];
    numbers_.insert({h.client_id, h.client_seq});
  }
  ++per_peer_[held.p->identity.to_string()];
  bytes_ += FrameBytes(*held.p);
  ++held_total_;
  held_.push_back(std::move(held));
}

std::vector<MapWait::Held> MapWait::TakeOut(const std::function<bool(const Held&)>& take) {
  std::vector<Held> out;
  std::deque<Held> stay;
  for (Held& held : held_) {
    if (!take(held)) {
      stay.push_back(std::move(held));
      continue;
    }
    const Header& h = held.p->header;
    if (!held.clock) {
      auto it = per_client_.find(h.client_id);
      if (--it->second == 0) per_client_.erase(it);
      numbers_.erase({h.client_id, h.client_seq});
    }
    auto peer = per_peer_.find(PeerKey(held.p->identity));
    if (--peer->second == 0) per_peer_.erase(peer);
    bytes_ -= FrameBytes(*held.p);
    out.push_back(std::move(held));
  }
  held_.swap(stay);
  return out;
}

void MapWait::Readmit(uint64_t mine,
                      const std::function<void(const std::shared_ptr<Pending>&)>& serve) {
  // What may go changes only when the map moves or Expire took pushes out (the later ones of
  // their clients may go then): the server asks at every data request while pushes wait.
  if (held_.empty() || (mine == last_mine_ && !expired_since_)) return;
  last_mine_ = mine;
  expired_since_ = false;
  absl::flat_hash_set<uint64_t> waiting;  // clients with a push that waits on
  absl::flat_hash_set<std::string> waiting_peers;  // peers with a request that waits on
  std::vector<Held> ready = TakeOut([&](const Held& held) {
    const Header& h = held.p->header;
    const bool stays = held.clock ? waiting_peers.contains(PeerKey(held.p->identity))
                                  : waiting.contains(h.client_id) || h.map_version > mine;
    if (stays) {
      if (!held.clock) waiting.insert(h.client_id);
      waiting_peers.insert(held.p->identity.to_string());
    }
    return !stays;
  });
  // Served after the take-out: serving may hold nothing here (the server serves a readmitted
  // push past this gate), but it must not see a half-taken queue either.
  for (const Held& held : ready) serve(held.p);
}

std::vector<MapWait::Expired> MapWait::Expire(Clock::time_point now, const Newest& newest) {
  absl::flat_hash_set<uint64_t> given_up;  // clients one of whose pushes timed out
  std::vector<Expired> out;
  std::vector<Held> taken = TakeOut([&](const Held& held) {
    const Header& h = held.p->header;
    if (held.clock) return false;  // served by Readmit once its peer's pushes are gone
    if (given_up.contains(h.client_id)) {
      out.push_back(Expired{held.p, false});
      return true;
    }
    if (const auto n = held.ticket != 0 ? newest(held.ticket) : std::nullopt;
        n.has_value() && h.map_version > *n) {
      out.push_back(Expired{held.p, true});
      return true;
    }
    if (now - held.since >= kHoldLimit) {
      given_up.insert(h.client_id);
      out.push_back(Expired{held.p, false});
      return true;
    }
    return false;
  });
  for (const Expired& e : out) expired_ += e.ahead_of_store ? 0 : 1;
  expired_since_ = expired_since_ || !taken.empty();
  return out;
}

}  // namespace tessera::internal
