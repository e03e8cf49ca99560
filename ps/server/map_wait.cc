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
  const uint64_t bytes = FrameBytes(*p);
  if (held_.size() >= max_held_ || bytes_ + bytes > max_held_bytes_) return Verdict::kFull;
  held_.push_back(Held{p, now, ahead ? ticket : 0});
  ++per_client_[h.client_id];
  numbers_.insert({h.client_id, h.client_seq});
  bytes_ += bytes;
  ++held_total_;
  return Verdict::kHeld;
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
    auto it = per_client_.find(h.client_id);
    if (--it->second == 0) per_client_.erase(it);
    numbers_.erase({h.client_id, h.client_seq});
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
  std::vector<Held> ready = TakeOut([&](const Held& held) {
    const Header& h = held.p->header;
    if (waiting.contains(h.client_id) || h.map_version > mine) {
      waiting.insert(h.client_id);
      return false;
    }
    return true;
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
