#include "ps/coord/etcd_map_source.h"

#include <chrono>
#include <utility>

namespace tessera {

Result<std::unique_ptr<EtcdClusterMapSource>> EtcdClusterMapSource::Create(
    const CoordinatorUrl& url, const EtcdMapSourceOptions& options) {
  TESSERA_ASSIGN_OR_RETURN(auto etcd, EtcdClient::Create(url.etcd_options(options.timeout_ms)));
  return std::unique_ptr<EtcdClusterMapSource>(
      new EtcdClusterMapSource(std::move(etcd), url.prefix, options));
}

EtcdClusterMapSource::EtcdClusterMapSource(std::unique_ptr<EtcdClient> etcd, std::string prefix,
                                           const EtcdMapSourceOptions& options)
    : options_(options), etcd_(std::move(etcd)), store_(etcd_.get(), std::move(prefix)) {}

EtcdClusterMapSource::~EtcdClusterMapSource() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (starter_.joinable()) starter_.join();
  std::unique_ptr<ClusterMapWatch> watch;
  {
    std::lock_guard<std::mutex> l(mu_);
    watch = std::move(watch_);
  }
  watch.reset();  // stops the stream, waits for a running callback
}

Result<RoutingMap> EtcdClusterMapSource::ToRoutingMap(const ClusterMap& map) {
  RoutingMap r;
  r.version = map.version;
  for (const MapServer& s : map.servers) r.addresses.push_back(s.address);
  TESSERA_ASSIGN_OR_RETURN(r.primary, map.PrimaryMap());
  r.dense_servers = map.dense_servers;
  // Empty when the map has none: part p on server p, no backup (RoutingMap::DenseOwner).
  r.dense_primary = map.dense_primary;
  r.dense_backup = map.dense_backup;
  r.dense_importing = map.dense_importing;
  for (uint16_t from : map.importing) {
    if (from != ClusterMap::kNoServer) {
      r.importing = map.importing;
      break;
    }
  }
  for (uint16_t b : map.backup) {
    if (b != ClusterMap::kNoServer) {
      r.backup = map.backup;
      break;
    }
  }
  return r;
}

Result<RoutingMap> EtcdClusterMapSource::Load() {
  TESSERA_ASSIGN_OR_RETURN(ClusterMap map, store_.Load());
  return ToRoutingMap(map);
}

Status EtcdClusterMapSource::Watch(RoutingMapCallback callback) {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (watching_) return Status::FailedPrecondition("this map source is watched already");
    watching_ = true;
  }
  starter_ = std::thread([this, cb = std::move(callback)]() mutable { StartWatchLoop(cb); });
  return Status::OK();
}

void EtcdClusterMapSource::StartWatchLoop(RoutingMapCallback callback) {
  auto deliver = [callback](const Result<ClusterMap>& m) {
    if (!m.ok()) {
      callback(m.status());
      return;
    }
    callback(ToRoutingMap(*m));
  };
  for (;;) {
    auto w = store_.Watch(deliver);
    std::unique_lock<std::mutex> l(mu_);
    if (stopping_) return;  // a watch started just now stops with `w`
    if (w.ok()) {
      watch_ = std::move(*w);
      return;
    }
    // No record yet (NotFound) or etcd away: look again, reporting what is not NotFound.
    if (w.status().code() != StatusCode::kNotFound) {
      l.unlock();
      callback(w.status());
      l.lock();
    }
    cv_.wait_for(l, std::chrono::milliseconds(options_.absent_poll_ms),
                 [this] { return stopping_; });
    if (stopping_) return;
  }
}

}  // namespace tessera
