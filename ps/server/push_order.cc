#include <algorithm>

#include "ps/server/push_order_internal.h"

namespace tessera::internal {

bool PushOrder::Ordered(const Pending& p) {
  const Header& h = p.header;
  return IsPush(h.op) && h.client_id != 0 && h.replica_from == 0 && !p.admitted_as_retry;
}

void PushOrder::NoteParked(Pending& p) {
  if (!Ordered(p) || p.order_parked) return;
  p.order_parked = true;
  ++clients_[p.header.client_id].parked;
}

bool PushOrder::Unpark(Pending& p) {
  if (!p.order_parked) return false;
  p.order_parked = false;
  auto it = clients_.find(p.header.client_id);
  return it != clients_.end() && --it->second.parked == 0;
}

bool PushOrder::Hold(const std::shared_ptr<Pending>& p) {
  if (!Ordered(*p)) return false;
  const Header& h = p->header;
  auto it = clients_.find(h.client_id);
  if (it == clients_.end() || it->second.parked == 0) return false;
  std::deque<std::shared_ptr<Pending>>& held = it->second.held;
  auto at = std::upper_bound(
      held.begin(), held.end(), h.client_seq,
      [](uint64_t seq, const std::shared_ptr<Pending>& q) { return seq < q->header.client_seq; });
  held.insert(at, p);
  ++held_now_;
  ++held_total_;
  return true;
}

std::deque<std::shared_ptr<Pending>> PushOrder::Release(uint64_t client) {
  auto it = clients_.find(client);
  if (it == clients_.end() || it->second.parked > 0) return {};
  std::deque<std::shared_ptr<Pending>> held = std::move(it->second.held);
  clients_.erase(it);
  held_now_ -= held.size();
  return held;
}

}  // namespace tessera::internal
