// Fencing by cluster map version (docs/elasticity.md): the map a server follows, as every
// data request sees it, and the check each one passes before anything of it is logged or
// applied.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ps/cluster_map_source.h"
#include "ps/codec.h"
#include "ps/mutex.h"
#include "ps/routing.h"
#include "ps/status.h"

namespace tessera::internal {

/// One version of the cluster map as this server uses it: its primaries, backups, addresses,
/// and what it copies in or holds for a copy.
struct ClusterMapState {
  uint64_t version = 0;
  SlotMap primary;
  // The servers dense tables are spread over.
  uint32_t dense_servers = 0;
  // Per slot: this server is its primary and its rows are being copied here (empty: none).
  std::vector<bool> importing;
  // Per slot: this server is its backup and is being filled from its primary (a backup
  // rebuild); it holds the primary's forwarded pushes for it until the copy is in (empty:
  // none).
  std::vector<bool> filling;
  // Per slot not primaried here: the server its primary is moving from (the importing
  // source), whose pushes forwarded before it gave the slot up are still taken (empty: none;
  // RoutingMap::kNoBackup: not moving).
  std::vector<uint16_t> moving_from;
  // Per dense part: this server is its backup being filled from its primary, or its new
  // primary the part is moving to (empty: none). Either holds the part's requests until the
  // copy is in.
  std::vector<bool> dense_filling;
  // Per dense part: the server it is moving from (RoutingMap::kNoBackup: not moving; empty:
  // none moves).
  std::vector<uint16_t> dense_moving_from;
  // Replication: per slot, its backup server (RoutingMap::kNoBackup: none); empty: no slot
  // has one. The data endpoint of each server id, to reach backups.
  std::vector<uint16_t> backup;
  std::vector<std::string> addresses;
  // Dense part p: served by dense_primary[p], backed up by dense_backup[p] (empty: part p on
  // server p, no backup; RoutingMap).
  std::vector<uint16_t> dense_primary, dense_backup;
  uint32_t DenseOwner(uint32_t p) const { return p < dense_primary.size() ? dense_primary[p] : p; }
  uint16_t DenseBackup(uint32_t p) const {
    return p < dense_backup.size() ? dense_backup[p] : RoutingMap::kNoBackup;
  }
};

/// The map a server follows. Set() may run on any thread (the coordinator's watcher); every
/// other method belongs to the I/O thread, which reads the map through its own copy of the
/// pointer, refreshed when the version moves. Without `follow` the server serves the static
/// cluster (`static_owners`, `num_servers` dense parts) and Check() passes everything.
class MapFence {
 public:
  MapFence(uint32_t rank, uint32_t num_servers, bool follow, SlotMap static_owners)
      : rank_(rank),
        num_servers_(num_servers),
        follow_(follow),
        static_owners_(std::move(static_owners)) {}

  /// Validates map `m` and makes it current unless a newer one is (OK then too). Any thread.
  Status Set(const RoutingMap& m) ABSL_LOCKS_EXCLUDED(mu_);
  /// The version set last (0: none). Any thread.
  uint64_t version() const { return version_.load(std::memory_order_acquire); }
  bool follows() const { return follow_; }

  /// The map the I/O thread serves by; null when the server follows no map or has none yet.
  /// Notes a new one for TakeChanged().
  const ClusterMapState* Current() ABSL_LOCKS_EXCLUDED(mu_);
  /// True once after Current() saw a new map (the server then runs OnMapChanged).
  bool TakeChanged() {
    const bool changed = changed_;
    changed_ = false;
    return changed;
  }
  bool changed() const { return changed_; }

  /// The owner of each slot: the followed map's primaries, else the static cluster's.
  const SlotMap& Owners();
  /// The number of servers dense tables are spread over.
  uint32_t DenseServers();
  /// The map version an error reply carries (0: the server follows no map): the version the
  /// I/O thread last served by (Current()), which is the one a refusal was decided by; the
  /// version set last before the I/O thread served any. Not version(): a map set between a
  /// refusal and its reply would make a request refused as "the server is behind" look
  /// refused at its own version, which a client reports as final (the refused part of a push
  /// then never came again while the other parts were applied). Any thread.
  uint64_t ReplyVersion() const {
    if (!follow_) return 0;
    const uint64_t io = io_version_.load(std::memory_order_acquire);
    return io != kNotServed ? io : version();
  }

  /// True when data request `h` carries the server's map version, or the server follows no
  /// map; `*mine` gets the server's version.
  bool Matches(const Header& h, uint64_t* mine);
  /// The refusal of request `h` that carries another version than `mine`: FailedPrecondition
  /// naming both (counted in refusals()).
  Status Refuse(const Header& h, uint64_t mine);
  /// Counts a refusal found elsewhere (a key of a slot this server does not own).
  void CountRefusal() { ++refusals_; }
  uint64_t refusals() const { return refusals_; }

 private:
  const uint32_t rank_, num_servers_;
  const bool follow_;
  const SlotMap static_owners_;
  mutable Mutex mu_;
  std::shared_ptr<const ClusterMapState> map_ ABSL_GUARDED_BY(mu_);
  std::atomic<uint64_t> version_{0};
  // The version of the map Current() last returned (0: none); written by the I/O thread.
  static constexpr uint64_t kNotServed = ~uint64_t{0};
  std::atomic<uint64_t> io_version_{kNotServed};
  // I/O thread only.
  std::shared_ptr<const ClusterMapState> io_map_;
  bool changed_ = false;
  uint64_t refusals_ = 0;
};

}  // namespace tessera::internal
