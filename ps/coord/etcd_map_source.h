// The cluster map record in etcd as a ClusterMapSource (ps/cluster_map_source.h), for the
// processes that follow the map: tessera-server --coordinator, clients, tessera-ctl.
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>

#include "ps/cluster_map_source.h"
#include "ps/coord/coordinator_url.h"
#include "ps/coord/etcd_client.h"
#include "ps/coord/slot_map_store.h"

namespace tessera {

/// Options of EtcdClusterMapSource.
struct EtcdMapSourceOptions {
  /// Timeout of each etcd call, in milliseconds. Default: 5000.
  int timeout_ms = 5000;
  /// While no map record exists, how often a watch looks for one, in milliseconds.
  /// Default: 500.
  int absent_poll_ms = 500;
};

/// PREFIX/slotmap of the etcd named by a --coordinator URL, read and watched through
/// SlotMapStore. Thread-safe; destruction stops the watch and joins its threads.
class EtcdClusterMapSource final : public ClusterMapSource {
 public:
  static Result<std::unique_ptr<EtcdClusterMapSource>> Create(
      const CoordinatorUrl& url, const EtcdMapSourceOptions& options = {});
  ~EtcdClusterMapSource() override;

  Result<RoutingMap> Load() override;
  Status Watch(RoutingMapCallback callback) override;

  /// The map record's routing part (servers' addresses, primaries, dense_servers; importing
  /// and backups when any slot has one; dense_primary and dense_backup as the map has them).
  static Result<RoutingMap> ToRoutingMap(const ClusterMap& map);

 private:
  EtcdClusterMapSource(std::unique_ptr<EtcdClient> etcd, std::string prefix,
                       const EtcdMapSourceOptions& options);
  // The watch's starter: retries SlotMapStore::Watch until a record exists or Stop.
  void StartWatchLoop(RoutingMapCallback callback);

  const EtcdMapSourceOptions options_;
  std::unique_ptr<EtcdClient> etcd_;
  SlotMapStore store_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;                   // guarded by mu_
  bool watching_ = false;                   // guarded by mu_
  std::unique_ptr<ClusterMapWatch> watch_;  // guarded by mu_
  std::thread starter_;
};

}  // namespace tessera
