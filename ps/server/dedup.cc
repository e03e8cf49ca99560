#include <algorithm>
#include <cstring>
#include <vector>

#include "ps/server/dedup_internal.h"

namespace tessera::internal {

PushDedup::Verdict PushDedup::Check(uint64_t client, uint64_t seq) const {
  if (client == 0) return Verdict::kNew;
  auto it = clients_.find(client);
  if (it == clients_.end()) return Verdict::kNew;
  const Entry& e = it->second;
  if (seq <= e.logged) return Verdict::kApplied;
  if (e.returned != 0) {
    if (seq == e.returned) return Verdict::kNew;
    if (seq > e.returned &&
        std::chrono::steady_clock::now() - e.returned_at < resend_window_) {
      return Verdict::kBlocked;
    }
  }
  if (seq <= e.accepted) return Verdict::kPending;
  return Verdict::kNew;
}

PushDedup::Entry& PushDedup::Touch(uint64_t client) {
  if (clients_.size() >= kMaxClients && !clients_.contains(client)) {
    // Forget the least recently seen quarter.
    std::vector<uint64_t> ticks;
    ticks.reserve(clients_.size());
    for (auto& [c, e] : clients_) ticks.push_back(e.touched);
    auto cut = ticks.begin() + ticks.size() / 4;
    std::nth_element(ticks.begin(), cut, ticks.end());
    const uint64_t below = *cut;
    absl::erase_if(clients_, [below](const auto& kv) { return kv.second.touched < below; });
  }
  Entry& e = clients_[client];
  e.touched = ++tick_;
  return e;
}

void PushDedup::Accept(uint64_t client, uint64_t seq) {
  if (client == 0) return;
  Entry& e = Touch(client);
  e.accepted = std::max(e.accepted, seq);
  if (seq == e.returned) e.returned = 0;  // the refused one is back: the gap is closed
}

void PushDedup::Logged(uint64_t client, uint64_t seq) {
  if (client == 0) return;
  Entry& e = Touch(client);
  e.logged = std::max(e.logged, seq);
  e.accepted = std::max(e.accepted, seq);
  if (e.returned != 0 && e.returned <= e.logged) e.returned = 0;
}

void PushDedup::Abandon(uint64_t client, uint64_t seq, bool resend) {
  auto it = clients_.find(client);
  if (client == 0 || it == clients_.end()) return;
  Entry& e = it->second;
  if (e.accepted == seq) e.accepted = std::max(e.logged, seq - 1);
  if (!resend && seq == e.returned) e.returned = 0;
  if (resend && seq > e.logged) {
    const auto now = std::chrono::steady_clock::now();
    const bool open = e.returned != 0 && now - e.returned_at < resend_window_;
    if (!open || seq < e.returned) e.returned = open ? std::min(e.returned, seq) : seq;
    e.returned_at = now;
  }
}

void PushDedup::ClearGap(uint64_t client, uint64_t seq) {
  auto it = clients_.find(client);
  if (client != 0 && it != clients_.end() && it->second.returned == seq) it->second.returned = 0;
}

std::string PushDedup::Encode() const {
  std::string out(4 + clients_.size() * 16, '\0');
  const uint32_t n = static_cast<uint32_t>(clients_.size());
  std::memcpy(out.data(), &n, 4);
  char* d = out.data() + 4;
  for (auto& [c, e] : clients_) {
    std::memcpy(d, &c, 8);
    std::memcpy(d + 8, &e.logged, 8);
    d += 16;
  }
  return out;
}

Status PushDedup::Merge(std::string_view bytes) {
  uint32_t n = 0;
  if (bytes.size() < 4) return Status::Corruption("push-dedup record shorter than its count");
  std::memcpy(&n, bytes.data(), 4);
  if (bytes.size() != 4 + uint64_t{n} * 16) {
    return Status::Corruption("push-dedup record of " + std::to_string(bytes.size()) +
                              " bytes does not hold " + std::to_string(n) + " clients");
  }
  for (uint32_t i = 0; i < n; ++i) {
    uint64_t c, mark;
    std::memcpy(&c, bytes.data() + 4 + i * 16, 8);
    std::memcpy(&mark, bytes.data() + 12 + i * 16, 8);
    Logged(c, mark);
  }
  return Status::OK();
}

}  // namespace tessera::internal
