#include "ps/coord/failover.h"

#include <algorithm>

#include "ps/coord/membership.h"
#include "ps/coord/slot_map_store.h"

namespace tessera {

uint32_t Promotion::slots_promoted() const {
  uint32_t n = 0;
  for (const auto& [pair, slots] : promoted) n += slots;
  return n;
}

uint32_t Promotion::dense_parts_promoted() const {
  uint32_t n = 0;
  for (const auto& [pair, parts] : dense_promoted) n += parts;
  return n;
}

namespace {

// PromoteBackups' rules for the dense parts of `p->map` (see failover.h); true when it changed
// any. A map without dense_primary gets one (part p on server p) when a part is promoted.
bool PromoteDenseParts(const std::vector<bool>& dead, Promotion* p) {
  ClusterMap& m = p->map;
  bool changed = false;
  for (uint32_t part = 0; part < m.dense_servers; ++part) {
    uint16_t backup = m.DenseBackup(part);
    const uint16_t from =
        m.dense_importing.empty() ? ClusterMap::kNoServer : m.dense_importing[part];
    // A fill of its backup (from its primary), or a move to its primary (from another server).
    const bool filling = from != ClusterMap::kNoServer && from == m.DensePrimary(part);
    const bool moving = from != ClusterMap::kNoServer && !filling;
    if (backup != ClusterMap::kNoServer && dead[backup]) {
      m.dense_backup[part] = backup = ClusterMap::kNoServer;
      if (filling) m.dense_importing[part] = ClusterMap::kNoServer;  // the fill ends with it
      ++p->dense_backups_cleared;
      changed = true;
    }
    const uint16_t primary = m.DensePrimary(part);
    if (!dead[primary]) continue;
    if ((filling && backup != ClusterMap::kNoServer) || moving) {
      // Its backup is still being filled, or the part is being copied into its primary: no
      // complete copy to promote (a move is left to the controller, as moving slots are).
      ++p->dense_unavailable[primary];
      continue;
    }
    // A backup left now is alive: the input validated (it has an address) and it is not dead.
    if (backup == ClusterMap::kNoServer) {
      ++p->dense_unavailable[primary];
      continue;
    }
    if (m.dense_primary.empty()) {
      for (uint32_t q = 0; q < m.dense_servers; ++q) {
        m.dense_primary.push_back(static_cast<uint16_t>(q));
      }
    }
    ++p->dense_promoted[{primary, backup}];
    m.dense_primary[part] = backup;
    m.dense_backup[part] = ClusterMap::kNoServer;
    changed = true;
  }
  return changed;
}

// Retires the dead servers of `p->map` that no slot and no dense part names. A dead server
// still named keeps its address: what it holds without a live copy is unavailable until it
// comes back. A retired id tells every client to stop waiting for it (its in-flight requests
// go to the promoted backups).
void RetireUnnamed(const std::vector<bool>& dead, Promotion* p) {
  ClusterMap& m = p->map;
  std::vector<bool> named(m.servers.size(), false);
  for (uint32_t slot = 0; slot < kNumSlots; ++slot) {
    named[m.primary[slot]] = true;
    if (m.backup[slot] != ClusterMap::kNoServer) named[m.backup[slot]] = true;
    if (m.importing[slot] != ClusterMap::kNoServer) named[m.importing[slot]] = true;
  }
  for (uint32_t part = 0; part < m.dense_servers; ++part) {
    named[m.DensePrimary(part)] = true;
    if (m.DenseBackup(part) != ClusterMap::kNoServer) named[m.DenseBackup(part)] = true;
    // A move's source holds the part until its copy is in.
    if (part < m.dense_importing.size() && m.dense_importing[part] != ClusterMap::kNoServer) {
      named[m.dense_importing[part]] = true;
    }
  }
  for (uint16_t id = 0; id < m.servers.size(); ++id) {
    if (!dead[id] || named[id]) continue;
    m.servers[id].address.clear();
    p->retired.push_back(id);
  }
}

}  // namespace

Result<Promotion> PromoteBackups(const ClusterMap& map, const std::vector<uint16_t>& dead_ids) {
  Status valid = map.Validate();
  if (!valid.ok()) return valid.WithContext("promoting backups");
  std::vector<bool> dead(map.servers.size(), false);
  for (uint16_t id : dead_ids) {
    if (id >= map.servers.size()) {
      return Status::InvalidArgument("promoting backups: dead server " + std::to_string(id) +
                                     " is not a server of cluster map v" +
                                     std::to_string(map.version) + " (" +
                                     std::to_string(map.servers.size()) + " servers)");
    }
    if (!map.servers[id].address.empty()) dead[id] = true;  // a retired id is dead already
  }
  Promotion p;
  p.map = map;
  ClusterMap& m = p.map;
  bool changed = false;
  for (uint32_t slot = 0; slot < kNumSlots; ++slot) {
    uint16_t& primary = m.primary[slot];
    uint16_t& backup = m.backup[slot];
    const uint16_t from = m.importing[slot];
    if (from != ClusterMap::kNoServer && (dead[primary] || dead[from])) {
      ++p.importing_untouched;  // a move under way: out of scope, left to the operator
      continue;
    }
    if (backup != ClusterMap::kNoServer && dead[backup]) {
      backup = ClusterMap::kNoServer;
      // A backup being filled (a rebuild) that died: the fill ends with it.
      if (from == primary) m.importing[slot] = ClusterMap::kNoServer;
      ++p.backups_cleared;
      changed = true;
    }
    if (!dead[primary]) continue;
    // A backup left now is alive: the input validated (it has an address) and it is not dead.
    if (backup == ClusterMap::kNoServer) {
      ++p.unavailable[primary];
      continue;
    }
    ++p.promoted[{primary, backup}];
    primary = backup;
    backup = ClusterMap::kNoServer;
    changed = true;
  }
  changed = PromoteDenseParts(dead, &p) || changed;
  RetireUnnamed(dead, &p);
  changed = changed || !p.retired.empty();
  if (changed) {
    m.version = map.version + 1;
    Status s = m.Validate();
    if (!s.ok()) return Status::Internal("promoting backups made an invalid map: " + s.ToString());
  }
  p.changed = changed;
  return p;
}

std::string DescribeMapChange(const ClusterMap& before, const ClusterMap& after) {
  std::vector<std::string> parts;
  const auto add = [&](uint32_t n, const std::string& what) {
    if (n > 0) parts.push_back(std::to_string(n) + " " + what);
  };
  for (uint16_t id = 0; id < after.servers.size(); ++id) {
    const std::string name = "server " + std::to_string(id) + " (" + after.servers[id].id + ")";
    if (id >= before.servers.size()) {
      parts.push_back(name + " was added");
    } else if (!before.servers[id].address.empty() && after.servers[id].address.empty()) {
      parts.push_back(name + " was retired");
    } else if (before.servers[id].address.empty() && !after.servers[id].address.empty()) {
      parts.push_back(name + " was taken in again");
    }
  }
  const bool whole = before.primary.size() == kNumSlots && after.primary.size() == kNumSlots &&
                     before.backup.size() == kNumSlots && after.backup.size() == kNumSlots &&
                     before.importing.size() == kNumSlots && after.importing.size() == kNumSlots;
  std::map<uint16_t, uint32_t> failed_over;  // old primary -> slots
  uint32_t moved = 0, unbacked = 0, backed = 0, copying = 0, settled = 0;
  for (uint32_t slot = 0; whole && slot < kNumSlots; ++slot) {
    const uint16_t p0 = before.primary[slot], p1 = after.primary[slot];
    const uint16_t b0 = before.backup[slot], b1 = after.backup[slot];
    if (p0 != p1 && p1 == b0) {
      ++failed_over[p0];
    } else if (p0 != p1) {
      ++moved;
    } else if (b0 != ClusterMap::kNoServer && b1 == ClusterMap::kNoServer) {
      ++unbacked;
    } else if (b0 != b1) {
      ++backed;
    }
    const uint16_t i0 = before.importing[slot], i1 = after.importing[slot];
    if (i0 == ClusterMap::kNoServer && i1 != ClusterMap::kNoServer) ++copying;
    if (i0 != ClusterMap::kNoServer && i1 == ClusterMap::kNoServer) ++settled;
  }
  for (const auto& [from, n] : failed_over) {
    add(n, "slots of server " + std::to_string(from) +
               " were failed over to their backups (a fail-over: server " +
               std::to_string(from) + " died)");
  }
  uint32_t dense_failed_over = 0;
  for (uint32_t part = 0; part < std::min(before.dense_servers, after.dense_servers); ++part) {
    const uint16_t p1 = after.DensePrimary(part);
    if (p1 != before.DensePrimary(part) && p1 == before.DenseBackup(part)) ++dense_failed_over;
  }
  add(dense_failed_over, "dense parts were failed over to their backups");
  add(moved, "slots moved to another primary (a scale)");
  add(unbacked, "slots lost their backup");
  add(backed, "slots were given a backup (a rebuild)");
  add(copying, "slots began a copy (a move or a backup fill)");
  add(settled, "slots finished or gave up a copy");
  std::string out;
  for (const std::string& p : parts) out += (out.empty() ? "" : "; ") + p;
  return out;
}

// Who is dead. A server of the map is dead when its member key is absent and this watcher saw
// it listed before. A simpler and weaker rule than "absent for longer than a grace after the
// watcher started": that one would, at a cold start of a replicated cluster whose servers come
// up one after another (a StatefulSet starts each pod after the previous one is ready, and
// opening RocksDB and replaying the request log can take minutes), promote the first server to
// primary of the slots of those not up yet and retire them for good (ids are never reused). A
// server that dies is seen alive before by every watcher that ran then; a death no running
// watcher saw (every other server restarted after it) is not acted on, and a promotion then
// would not be safe anyway: a backup that restarted may have missed pushes while it was down.

Result<std::unique_ptr<FailoverWatcher>> FailoverWatcher::Start(EtcdClient* etcd,
                                                                FailoverOptions options) {
  if (etcd == nullptr) return Status::InvalidArgument("failover watcher: no etcd client");
  if (options.prefix.empty() || options.prefix.front() != '/') {
    return Status::InvalidArgument("failover watcher: prefix must start with '/', got \"" +
                                   options.prefix + "\"");
  }
  if (options.self_id.empty()) return Status::InvalidArgument("failover watcher: no self_id");
  if (options.poll_ms <= 0) {
    return Status::InvalidArgument("failover watcher: poll_ms must be > 0, got " +
                                   std::to_string(options.poll_ms));
  }
  return std::unique_ptr<FailoverWatcher>(new FailoverWatcher(etcd, std::move(options)));
}

FailoverWatcher::FailoverWatcher(EtcdClient* etcd, FailoverOptions options)
    : etcd_(etcd), options_(std::move(options)) {
  thread_ = std::thread([this] { Loop(); });
}

FailoverWatcher::~FailoverWatcher() { Stop(); }

void FailoverWatcher::Stop() {
  std::lock_guard<std::mutex> once(stop_mu_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

Status FailoverWatcher::last_error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_error_;
}

void FailoverWatcher::Log(const std::string& line) const {
  if (options_.log) options_.log(line);
}

void FailoverWatcher::CheckBackedUp(const ClusterMap& map, const std::set<std::string>& listed) {
  if (!options_.on_unbacked) return;
  const auto now = std::chrono::steady_clock::now();
  if (now - last_unbacked_ < std::chrono::milliseconds(options_.unbacked_every_ms)) return;
  std::vector<bool> live(map.servers.size(), false);
  int n = 0, lowest = -1;
  for (uint16_t id = 0; id < map.servers.size(); ++id) {
    live[id] = !map.servers[id].address.empty() && listed.count(map.servers[id].id) > 0;
    if (!live[id]) continue;
    ++n;
    if (lowest < 0) lowest = id;
  }
  if (n < 2 || map.servers[lowest].id != options_.self_id) return;
  bool due = false;
  for (uint32_t slot = 0; slot < map.primary.size() && !due; ++slot) {
    due = map.backup[slot] == ClusterMap::kNoServer &&
          map.importing[slot] == ClusterMap::kNoServer && live[map.primary[slot]];
  }
  for (uint32_t part = 0; part < map.dense_backup.size() && !due; ++part) {
    const uint16_t p = map.DensePrimary(part);
    const bool filling = part < map.dense_importing.size() &&
                         map.dense_importing[part] != ClusterMap::kNoServer;
    due = map.dense_backup[part] == ClusterMap::kNoServer && !filling && p < live.size() && live[p];
  }
  if (!due) return;
  last_unbacked_ = now;
  options_.on_unbacked();
}

namespace {

// The id of the lowest server of `map` with an address when every such server is listed (-1
// when one is not, or there is none), and their number in *n.
int LowestWhenAllListed(const ClusterMap& map, const std::set<std::string>& listed, int* n) {
  int lowest = -1;
  *n = 0;
  for (uint16_t id = 0; id < map.servers.size(); ++id) {
    if (map.servers[id].address.empty()) continue;
    if (!listed.count(map.servers[id].id)) return -1;
    if (lowest < 0) lowest = id;
    ++*n;
  }
  return lowest;
}

}  // namespace

void FailoverWatcher::CheckJoined(const ClusterMap& map, const std::set<std::string>& listed,
                                  const std::set<std::string>& leaving) {
  if (!options_.on_joined) return;
  const auto now = std::chrono::steady_clock::now();
  if (now - last_joined_ < std::chrono::milliseconds(options_.unbacked_every_ms)) return;
  int n = 0;
  const int lowest = LowestWhenAllListed(map, listed, &n);
  if (lowest < 0 || map.servers[lowest].id != options_.self_id) return;
  // A server leaving (draining before it stops: its id retired, or about to be) is none to
  // take in.
  const auto joinable = [&](const std::string& id) {
    return listed.count(id) > 0 && leaving.count(id) == 0;
  };
  uint32_t joined = 0;
  while (joinable("server-" + std::to_string(map.servers.size() + joined))) ++joined;
  // Retired ids registered again (a server restarted under its old --rank).
  for (const MapServer& server : map.servers) {
    if (server.address.empty() && joinable(server.id)) ++joined;
  }
  // A server of the map that no slot names: added by a scale that stopped before moving slots
  // to it (the map's id list grows first).
  std::vector<bool> named(map.servers.size(), false);
  for (uint32_t slot = 0; slot < map.primary.size(); ++slot) {
    named[map.primary[slot]] = true;
    if (map.backup[slot] != ClusterMap::kNoServer) named[map.backup[slot]] = true;
  }
  bool idle = false;
  for (uint16_t id = 0; id < map.servers.size(); ++id) {
    idle = idle || (!map.servers[id].address.empty() && !named[id] &&
                    leaving.count(map.servers[id].id) == 0);
  }
  if (joined == 0 && !idle) return;
  last_joined_ = now;
  options_.on_joined(static_cast<uint32_t>(n) + joined);
}

void FailoverWatcher::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    lock.unlock();
    Status s = Round();
    if (!s.ok() && s.ToString() != last_logged_error_) {
      Log("fail-over watcher: " + s.ToString() + " (tried again every " +
          std::to_string(options_.poll_ms) + " ms)");
    }
    last_logged_error_ = s.ok() ? std::string() : s.ToString();
    lock.lock();
    last_error_ = s;
    ++rounds_;
    cv_.wait_for(lock, std::chrono::milliseconds(options_.poll_ms), [this] { return stopping_; });
  }
}

namespace {

// A backup is promoted only while it is registered: one that has not come up yet (or went
// without this watcher seeing it) would take slots it cannot serve. "" when every new primary
// of `p` is listed, else why the promotion waits.
std::string UnregisteredBackup(const Promotion& p, const ClusterMap& map,
                               const std::set<std::string>& listed) {
  for (const auto* promoted : {&p.promoted, &p.dense_promoted}) {
    for (const auto& [pair, n] : *promoted) {
      const std::string& to = map.servers[pair.second].id;
      if (!listed.count(to)) {
        return "server " + std::to_string(pair.first) + " is dead but its backup " +
               std::to_string(pair.second) + " (" + to + ") is not registered: not promoted yet";
      }
    }
  }
  return "";
}

// The ids of `members`, and of those among them that are leaving (draining before they stop).
void ListedAndLeaving(const std::vector<Member>& members, std::set<std::string>* listed,
                      std::set<std::string>* leaving) {
  for (const Member& m : members) {
    listed->insert(m.id);
    if (m.leaving) leaving->insert(m.id);
  }
}

}  // namespace

void FailoverWatcher::LogPromotion(const Promotion& p) const {
  const std::string at = " at map version " + std::to_string(p.map.version);
  for (const auto& [pair, slots] : p.promoted) {
    Log("promoted server " + std::to_string(pair.second) + " to primary of " +
        std::to_string(slots) + " slots of dead server " + std::to_string(pair.first) + at);
  }
  for (const auto& [pair, parts] : p.dense_promoted) {
    Log("promoted server " + std::to_string(pair.second) + " to primary of " +
        std::to_string(parts) + " dense parts of dead server " + std::to_string(pair.first) + at);
  }
  if (p.backups_cleared > 0) {
    Log("removed a dead backup from " + std::to_string(p.backups_cleared) + " slots" + at);
  }
  if (p.dense_backups_cleared > 0) {
    Log("removed a dead backup from " + std::to_string(p.dense_backups_cleared) + " dense parts" +
        at);
  }
  for (uint16_t id : p.retired) {
    Log("retired dead server " + std::to_string(id) + " (" + p.map.servers[id].id + ")" + at);
  }
  if (p.importing_untouched > 0) {
    Log(std::to_string(p.importing_untouched) +
        " slots being resharded have a dead primary or source: left as they are" + at);
  }
}

Status FailoverWatcher::Round() {
  SlotMapStore store(etcd_, options_.prefix);
  Result<ClusterMap> map = store.Load();
  if (map.status().code() == StatusCode::kNotFound) return Status::OK();  // no map yet
  if (!map.ok()) return map.status();
  // Not replicated: nothing can be promoted, and only servers joining matter. A replicated
  // map that a double failure left without any backup is still one: its rebuild is due.
  const bool replicated = map->Replicated();
  if (!replicated && !options_.on_joined) return Status::OK();
  TESSERA_ASSIGN_OR_RETURN(std::vector<Member> members, ListMembers(*etcd_, options_.prefix));
  std::set<std::string> listed, leaving;
  ListedAndLeaving(members, &listed, &leaving);
  // Without our own key we may be the one cut off: the others' absence means nothing then.
  if (!listed.count(options_.self_id)) return Status::OK();
  seen_alive_.insert(listed.begin(), listed.end());
  std::vector<uint16_t> dead;
  for (uint16_t id = 0; id < map->servers.size(); ++id) {
    const MapServer& s = map->servers[id];
    if (s.address.empty() || s.id == options_.self_id) continue;
    if (!listed.count(s.id) && seen_alive_.count(s.id)) dead.push_back(id);
  }
  if (dead.empty()) {
    CheckJoined(*map, listed, leaving);
    if (replicated) CheckBackedUp(*map, listed);
    return Status::OK();
  }
  if (!replicated) return Status::OK();
  TESSERA_ASSIGN_OR_RETURN(Promotion p, PromoteBackups(*map, dead));
  if (const std::string why = UnregisteredBackup(p, *map, listed); !why.empty()) {
    Log(why);
    return Status::OK();
  }
  std::string unavailable;
  for (const auto& [id, slots] : p.unavailable) {
    unavailable += (unavailable.empty() ? "" : "; ") + std::to_string(slots) +
                   " slots of dead server " + std::to_string(id) + " have no live backup";
  }
  for (const auto& [id, parts] : p.dense_unavailable) {
    unavailable += (unavailable.empty() ? "" : "; ") + std::to_string(parts) +
                   " dense parts of dead server " + std::to_string(id) + " have no live backup";
  }
  if (unavailable != last_unavailable_ && !unavailable.empty()) {
    Log(unavailable + ": they stay unavailable until it comes back (map version " +
        std::to_string(map->version) + ")");
  }
  last_unavailable_ = unavailable;
  if (!p.changed) {
    // Promoted already: what is left of the dead servers has no live copy and waits for them.
    // The slots of live primaries still need their backups back.
    CheckBackedUp(*map, listed);
    return Status::OK();
  }
  Status swapped = store.CompareAndSwap(map->version, p.map);
  // Another watcher (or writer) changed the map since the read: read it again next period.
  if (swapped.code() == StatusCode::kFailedPrecondition) return Status::OK();
  TESSERA_RETURN_IF_ERROR(swapped);
  ++promotions_;
  slots_promoted_ += p.slots_promoted();
  if (options_.on_promoted) options_.on_promoted(p);
  LogPromotion(p);
  return Status::OK();
}

}  // namespace tessera
