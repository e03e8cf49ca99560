#include <glog/logging.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <vector>

#include "ps/server/dedup_internal.h"

namespace tessera::internal {
namespace {

uint64_t WallSeconds() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::seconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
}

std::string StoreKey(uint64_t client) {
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(client));
  return std::string(PushDedup::kStorePrefix) + hex;
}

// A spilled record: u64 logged mark, u64 wall-clock seconds last seen (little-endian).
std::string StoreValue(uint64_t mark, uint64_t seen_s) {
  std::string v(16, '\0');
  std::memcpy(v.data(), &mark, 8);
  std::memcpy(v.data() + 8, &seen_s, 8);
  return v;
}

}  // namespace

Result<std::optional<uint64_t>> PushDedup::Spilled(uint64_t client) const {
  if (store_ == nullptr) return std::optional<uint64_t>();
  const std::string key = StoreKey(client);
  TESSERA_ASSIGN_OR_RETURN(std::optional<std::string> v, store_->GetMeta(key));
  if (!v) return std::optional<uint64_t>();
  if (v->size() != 16) {
    return Status::Corruption("push mark record '" + key + "' has " + std::to_string(v->size()) +
                              " bytes, not 16");
  }
  uint64_t mark = 0;
  std::memcpy(&mark, v->data(), 8);
  return std::optional<uint64_t>(mark);
}

PushDedup::Verdict PushDedup::Check(uint64_t client, uint64_t seq) const {
  if (client == 0) return Verdict::kNew;
  auto it = clients_.find(client);
  if (it == clients_.end()) {
    // Spilled, or never seen (or forgotten past the retention, or lost with a memory-only
    // store): only a client's first push is new for sure.
    Result<std::optional<uint64_t>> spilled = Spilled(client);
    if (!spilled.ok()) {
      LOG(WARNING) << "reading the push mark of client " << client << ": "
                   << spilled.status().ToString();
      return Verdict::kUnreadable;
    }
    if (*spilled) return seq <= **spilled ? Verdict::kApplied : Verdict::kNew;
    return seq > 1 ? Verdict::kUnknown : Verdict::kNew;
  }
  const Entry& e = it->second;
  if (seq <= e.logged) return Verdict::kApplied;
  if (!e.returned.empty()) {
    // The lowest refused one is new; while the gap is open, the client's pushes after it wait
    // (the other refused ones too: the client sends them again in their order).
    const uint64_t lowest = *e.returned.begin();
    if (seq == lowest) return Verdict::kNew;
    if (seq > lowest && GapOpen(e)) {
      return Verdict::kBlocked;
    }
  }
  if (seq <= e.accepted) return Verdict::kPending;
  return Verdict::kNew;
}

PushDedup::Entry& PushDedup::Touch(uint64_t client) {
  auto it = clients_.find(client);
  if (it != clients_.end()) {
    it->second.touched = ++tick_;
    it->second.seen_s = WallSeconds();
    return it->second;
  }
  if (clients_.size() >= options_.max_clients) Spill();
  Entry& e = clients_[client];
  e.touched = ++tick_;
  e.seen_s = WallSeconds();
  // Back from the store: its mark comes with it (Check read it a moment ago).
  Result<std::optional<uint64_t>> spilled = Spilled(client);
  if (!spilled.ok()) {
    LOG(ERROR) << "reading the push mark of client " << client << ": "
               << spilled.status().ToString();
  } else if (*spilled) {
    e.logged = e.accepted = **spilled;
  }
  return e;
}

void PushDedup::Spill() {
  const uint64_t now_s = WallSeconds();
  // Only clients at rest: one with a push in flight or a gap open keeps its state here.
  std::vector<std::pair<uint64_t, uint64_t>> at_rest;  // (touched, client)
  for (const auto& [c, e] : clients_) {
    if (e.accepted <= e.logged && !GapOpen(e)) at_rest.emplace_back(e.touched, c);
  }
  const size_t n = std::min(at_rest.size(), std::max<size_t>(1, clients_.size() / 4));
  if (n == 0) return;
  std::nth_element(at_rest.begin(), at_rest.begin() + (n - 1), at_rest.end());
  at_rest.resize(n);
  std::vector<MetaWrite> writes;
  writes.reserve(n);
  for (const auto& [touched, c] : at_rest) {
    const Entry& e = clients_.at(c);
    if (now_s - std::min(now_s, e.seen_s) >= options_.retention_s) continue;  // forgotten
    writes.push_back(MetaWrite{StoreKey(c), StoreValue(e.logged, e.seen_s)});
  }
  if (!writes.empty()) {
    if (store_ == nullptr) return;  // nowhere to put them: they stay
    const Status s = store_->WriteMeta(writes);
    if (!s.ok()) {
      LOG(WARNING) << "spilling " << writes.size() << " push marks: " << s.ToString()
                   << " (they stay in memory)";
      return;
    }
  }
  for (const auto& [touched, c] : at_rest) clients_.erase(c);
  spilled_ += writes.size();
  ExpireSpilled(now_s);
}

void PushDedup::ExpireSpilled(uint64_t now_s) {
  if (store_ == nullptr) return;
  static constexpr char kHex[] = "0123456789abcdef";
  const std::string prefix = std::string(kStorePrefix) + kHex[expire_cursor_];
  expire_cursor_ = (expire_cursor_ + 1) % 16;
  std::vector<MetaWrite> deletes;
  const Status scanned = store_->ScanMeta(prefix, [&](std::string_view key, std::string_view v) {
    uint64_t seen_s = 0;
    if (v.size() == 16) std::memcpy(&seen_s, v.data() + 8, 8);
    if (v.size() == 16 && now_s - std::min(now_s, seen_s) >= options_.retention_s) {
      deletes.push_back(MetaWrite{std::string(key), std::nullopt});
    }
  });
  Status s = scanned.ok() && !deletes.empty() ? store_->WriteMeta(deletes) : scanned;
  if (!s.ok()) {
    LOG(WARNING) << "deleting expired push marks: " << s.ToString();
    return;
  }
  expired_ += deletes.size();
}

void PushDedup::Accept(uint64_t client, uint64_t seq) {
  if (client == 0) return;
  Entry& e = Touch(client);
  e.accepted = std::max(e.accepted, seq);
  e.returned.erase(seq);  // the refused one is back: the gap moves to the next, if any
}

void PushDedup::Logged(uint64_t client, uint64_t seq) {
  if (client == 0) return;
  Entry& e = Touch(client);
  e.logged = std::max(e.logged, seq);
  e.accepted = std::max(e.accepted, seq);
  e.returned.erase(e.returned.begin(), e.returned.upper_bound(e.logged));
}

void PushDedup::Abandon(uint64_t client, uint64_t seq, bool resend) {
  auto it = clients_.find(client);
  if (client == 0 || it == clients_.end()) return;
  Entry& e = it->second;
  if (e.accepted == seq) e.accepted = std::max(e.logged, seq - 1);
  if (!resend) e.returned.erase(seq);
  if (resend && seq > e.logged) OpenGap(e, seq);
}

void PushDedup::Refused(uint64_t client, uint64_t seq) {
  if (client == 0) return;
  // Touched even when unknown here: the client's next pushes of this sequence are checked
  // against the gap, not taken as new (kUnknown) while it is on its way again.
  Entry& e = Touch(client);
  if (seq > e.logged) OpenGap(e, seq);
}

void PushDedup::OpenGap(Entry& e, uint64_t seq) {
  const auto now = std::chrono::steady_clock::now();
  if (!GapOpen(e)) e.returned.clear();  // those left past the window block nothing any more
  e.returned.insert(seq);
  e.returned_at = now;
}

bool PushDedup::GapOpen(const Entry& e) const {
  return !e.returned.empty() &&
         std::chrono::steady_clock::now() - e.returned_at < options_.resend_window;
}

void PushDedup::ClearGap(uint64_t client, uint64_t seq) {
  auto it = clients_.find(client);
  if (client != 0 && it != clients_.end()) it->second.returned.erase(seq);
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
