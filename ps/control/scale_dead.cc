// The controller and servers that die during its run (docs/elasticity.md, "Backup rebuild"): a
// call to a server that no longer answers gives up once the server is no longer registered, and
// fills left flipped whose source or destination died are given up, so that a run never holds
// the controller lock waiting for a dead server until its deadline; a swap of the map lost to a
// fail-over says so and what to run.
#include <algorithm>

#include "ps/control/controller_internal.h"
#include "ps/coord/failover.h"

namespace tessera::internal::reshard {

Result<std::vector<bool>> Controller::Registered(const ClusterMap& map, bool with_leaving) {
  TESSERA_ASSIGN_OR_RETURN(std::vector<Member> members, ListMembers(etcd_, prefix_));
  std::vector<bool> live(map.servers.size(), false);
  for (uint16_t id = 0; id < map.servers.size(); ++id) {
    const MapServer& s = map.servers[id];
    live[id] = !s.address.empty() &&
               std::any_of(members.begin(), members.end(), [&](const Member& m) {
                 return m.id == s.id && (with_leaving || !m.leaving);
               });
  }
  return live;
}

Status Controller::StillThere(const Client* server, const Status& why,
                              SteadyClock::time_point since) {
  const uint16_t id = servers_.IdOf(server);
  const std::string name =
      id < map_.servers.size() ? "server " + std::to_string(id) + " (" + map_.servers[id].id + ")"
                               : std::string("a server");
  if (id < map_.servers.size()) {
    // A failed read of the members says nothing of the server: the time limit decides then.
    auto members = ListMembers(etcd_, prefix_);
    if (members.ok() &&
        std::none_of(members->begin(), members->end(),
                     [&](const Member& m) { return m.id == map_.servers[id].id; })) {
      return Status::Unavailable(name + " is not registered any more: it died while the " +
                                 "controller waited for it (" + why.ToString() +
                                 "); stopped, run again once the fail-over is done");
    }
  }
  if (SteadyClock::now() - since >= kUnreachableLimit) {
    return Status::Unavailable(name + " has not answered for " +
                               std::to_string(kUnreachableLimit.count()) + " s (" +
                               why.ToString() + "); stopped, run again");
  }
  return Status::OK();
}

Status Controller::DropDeadFills() {
  const auto filling = [&](uint32_t slot) {
    return map_.importing[slot] != ClusterMap::kNoServer &&
           map_.importing[slot] == map_.primary[slot];
  };
  const auto dense_filling = [&](uint32_t part) {
    return part < map_.dense_importing.size() &&
           map_.dense_importing[part] != ClusterMap::kNoServer &&
           map_.dense_importing[part] == map_.DensePrimary(part);
  };
  bool any = false;
  for (uint32_t slot = 0; slot < kNumSlots && !any; ++slot) any = filling(slot);
  for (uint32_t part = 0; part < map_.dense_servers && !any; ++part) any = dense_filling(part);
  if (!any) return Status::OK();
  // Leaving servers are alive: they still serve as a source.
  TESSERA_ASSIGN_OR_RETURN(std::vector<bool> live, Registered(map_, /*with_leaving=*/true));
  ClusterMap next = map_;
  uint32_t slots = 0, parts = 0;
  for (uint32_t slot = 0; slot < kNumSlots; ++slot) {
    if (!filling(slot) || (live[map_.primary[slot]] && live[map_.backup[slot]])) continue;
    next.backup[slot] = ClusterMap::kNoServer;
    next.importing[slot] = ClusterMap::kNoServer;
    ++slots;
  }
  for (uint32_t part = 0; part < map_.dense_servers; ++part) {
    if (!dense_filling(part) || (live[map_.DensePrimary(part)] && live[map_.dense_backup[part]])) {
      continue;
    }
    next.dense_backup[part] = ClusterMap::kNoServer;
    next.dense_importing[part] = ClusterMap::kNoServer;
    ++parts;
  }
  if (slots == 0 && parts == 0) return Status::OK();
  TESSERA_RETURN_IF_ERROR(Cas(std::move(next)));
  if (o_.log != nullptr) {
    std::fprintf(o_.log,
                 "gave up the backup fills of %u slots and %u dense parts whose source or backup "
                 "is not registered, at map version %llu\n",
                 slots, parts, static_cast<unsigned long long>(map_.version));
  }
  return Status::OK();
}

Status Controller::Cas(ClusterMap next) {
  next.version = map_.version + 1;
  Status s = store_.CompareAndSwap(map_.version, next);
  if (s.code() == StatusCode::kFailedPrecondition) return LostCas(s);
  TESSERA_RETURN_IF_ERROR(s);
  map_ = std::move(next);
  return Status::OK();
}

Status Controller::LostCas(const Status& lost) {
  auto now = store_.Load();
  if (!now.ok()) return lost;
  std::string msg = lost.message() +
                    ": another writer changed the map while this run held the controller lock "
                    "(fail-overs need no lock)";
  if (const std::string what = DescribeMapChange(map_, *now); !what.empty()) msg += ": " + what;
  msg += ". Nothing is lost (the next run finishes what this one left flipped)";
  std::string dead;
  if (auto live = Registered(*now, /*with_leaving=*/true); live.ok()) {
    for (uint16_t id = 0; id < now->servers.size(); ++id) {
      if (now->servers[id].address.empty() || (*live)[id]) continue;
      dead += (dead.empty() ? "" : ", ") + std::to_string(id) + " (" + now->servers[id].id + ")";
    }
  }
  if (!dead.empty()) {
    msg += "; server " + dead +
           " of the map is not registered: wait for its fail-over (its lease TTL), or restart "
           "it on its --data_dir (its slots without a live backup wait for it), then run "
           "`tessera-ctl " + command_ + "` again";
  } else {
    msg += "; run `tessera-ctl " + command_ + "` again: it starts from version " +
           std::to_string(now->version);
  }
  return Status::FailedPrecondition(msg);
}

}  // namespace tessera::internal::reshard
