// The plans of tessera-ctl scale: which slots move and which server backs up each
// (scale_internal.h).
#include <algorithm>
#include <map>

#include "ps/control/scale_internal.h"
#include "ps/coord/cluster_map.h"

namespace tessera::internal {

std::vector<std::pair<uint32_t, uint16_t>> PlanMoves(const ClusterMap& m,
                                                     const std::vector<uint16_t>& targets) {
  const uint32_t n = static_cast<uint32_t>(targets.size());
  std::map<uint16_t, uint32_t> want, have;
  for (uint32_t i = 0; i < n; ++i) want[targets[i]] = kNumSlots / n + (i < kNumSlots % n ? 1 : 0);
  std::vector<uint32_t> given;
  for (uint32_t slot = 0; slot < kNumSlots; ++slot) {
    const uint16_t p = m.primary[slot];
    if (!want.count(p) || have[p] >= want[p]) {
      given.push_back(slot);
    } else {
      ++have[p];
    }
  }
  std::vector<std::pair<uint32_t, uint16_t>> moves;
  size_t next = 0;
  for (uint16_t t : targets) {
    for (; have[t] < want[t] && next < given.size(); ++have[t]) moves.push_back({given[next++], t});
  }
  return moves;
}

std::vector<uint16_t> PlanBackups(const ClusterMap& m, const std::vector<uint16_t>& primary,
                                  const std::vector<uint16_t>& targets) {
  const uint32_t n = static_cast<uint32_t>(targets.size());
  std::map<uint16_t, int64_t> room;
  for (uint32_t i = 0; i < n; ++i) room[targets[i]] = kNumSlots / n + (i < kNumSlots % n ? 1 : 0);
  std::vector<uint16_t> backup(kNumSlots, ClusterMap::kNoServer);
  std::map<uint16_t, std::vector<uint32_t>> backed_by;  // slots given each backup (may go stale)
  auto give = [&](uint32_t slot, uint16_t b) {
    backup[slot] = b;
    --room[b];
    backed_by[b].push_back(slot);
  };
  for (uint32_t slot = 0; slot < kNumSlots; ++slot) {
    const uint16_t b = m.backup[slot];
    if (b != primary[slot] && room.count(b) && room[b] > 0) give(slot, b);
  }
  if (n < 2) return backup;  // nothing can back up a slot of the only server
  for (uint32_t slot = 0; slot < kNumSlots; ++slot) {
    if (backup[slot] != ClusterMap::kNoServer) continue;
    const uint16_t p = primary[slot];
    uint16_t best = ClusterMap::kNoServer;
    for (uint16_t t : targets) {
      if (t != p && (best == ClusterMap::kNoServer || room[t] > room[best])) best = t;
    }
    if (room[best] > 0) {
      give(slot, best);
      continue;
    }
    // Every server but the primary is full, so the primary has room: a slot another server
    // backs up and the primary may back up passes to it, and this slot takes its place.
    bool swapped = false;
    for (uint16_t c : targets) {
      if (c == p) continue;
      std::vector<uint32_t>& list = backed_by[c];
      for (size_t k = list.size(); k-- > 0 && !swapped;) {
        const uint32_t q = list[k];
        if (backup[q] != c || primary[q] == p) continue;  // moved on, or the primary's own
        list[k] = list.back();
        list.pop_back();
        ++room[c];
        give(q, p);
        give(slot, c);
        swapped = true;
      }
      if (swapped) break;
    }
    if (!swapped) give(slot, best);  // over its share: no slot could pass (not reached)
  }
  return backup;
}

std::vector<uint16_t> PlanDense(const ClusterMap& m, const std::vector<uint16_t>& targets) {
  std::vector<uint16_t> primary(m.dense_servers);
  std::map<uint16_t, uint32_t> load;  // parts per target
  for (uint16_t t : targets) load[t] = 0;
  auto least = [&] {
    uint16_t to = targets.front();
    for (uint16_t t : targets) {
      if (load[t] < load[to]) to = t;
    }
    return to;
  };
  std::vector<uint32_t> homeless;
  for (uint32_t part = 0; part < m.dense_servers; ++part) {
    primary[part] = m.DensePrimary(part);
    if (load.count(primary[part])) {
      ++load[primary[part]];
    } else {
      homeless.push_back(part);
    }
  }
  // A drained server's parts: to their backup when it stays, else to the least loaded target.
  for (uint32_t part : homeless) {
    const uint16_t b = m.DenseBackup(part);
    primary[part] = load.count(b) ? b : least();
    ++load[primary[part]];
  }
  // Then one part at a time from the most loaded target to the least loaded, until they differ
  // by at most one: a part the receiver backs up first, else the highest-numbered one.
  for (;;) {
    const uint16_t to = least();
    uint16_t from = targets.front();
    for (uint16_t t : targets) {
      if (load[t] > load[from]) from = t;
    }
    if (load[from] <= load[to] + 1) break;
    int pick = -1;
    for (uint32_t part = 0; part < m.dense_servers; ++part) {
      if (primary[part] != from) continue;
      if (pick < 0 || m.DenseBackup(part) == to ||
          m.DenseBackup(static_cast<uint32_t>(pick)) != to) {
        pick = static_cast<int>(part);
      }
      if (m.DenseBackup(part) == to) break;
    }
    primary[pick] = to;
    --load[from];
    ++load[to];
  }
  return primary;
}

bool Replicated(const ClusterMap& m) { return m.Replicated() || !m.dense_backup.empty(); }

}  // namespace tessera::internal
