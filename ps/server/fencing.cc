// Fencing by cluster map version (docs/elasticity.md): the map a server follows, and the check
// every data request passes before anything of it is logged or applied.
#include "ps/server/server_impl_internal.h"

namespace tessera::internal {

Status ServerImpl::SetClusterMap(uint64_t version, const SlotMap& primary) {
  if (!options_.follow_cluster_map) {
    return Status::FailedPrecondition(
        "server " + std::to_string(options_.rank) +
        " follows no cluster map (ServerOptions::follow_cluster_map is off)");
  }
  if (version == 0) return Status::InvalidArgument("cluster map version 0 is the static cluster");
  auto next = std::make_shared<const ClusterMapState>(ClusterMapState{version, primary});
  std::lock_guard<std::mutex> l(map_mu_);
  if (map_ != nullptr && map_->version >= version) return Status::OK();
  map_ = std::move(next);
  map_version_.store(version, std::memory_order_release);
  return Status::OK();
}

const ServerImpl::ClusterMapState* ServerImpl::CurrentMap() {
  const uint64_t v = map_version_.load(std::memory_order_acquire);
  if (v == 0) return nullptr;
  if (io_map_ == nullptr || io_map_->version != v) {
    std::lock_guard<std::mutex> l(map_mu_);
    io_map_ = map_;
  }
  return io_map_.get();
}

bool ServerImpl::IsRetriedPush(const Header& h) const {
  const bool push =
      h.op == Op::kSparsePush || h.op == Op::kSparsePushPull || h.op == Op::kDensePush;
  return push && h.client_id != 0 &&
         dedup_.Check(h.client_id, h.client_seq) != PushDedup::Verdict::kNew;
}

Status ServerImpl::CheckMapVersion(const Header& h, bool exempt_retries) {
  if (!options_.follow_cluster_map) return Status::OK();
  const ClusterMapState* map = CurrentMap();
  const uint64_t mine = map == nullptr ? 0 : map->version;
  if (h.map_version == mine) return Status::OK();
  // A retry of a push this server already took applies nothing again: it is answered as a
  // retry (AnsweredAsRetry) at any version, so that a client resending it after a lost reply
  // does not send it again elsewhere under a new sequence number.
  if (exempt_retries && IsRetriedPush(h)) return Status::OK();
  ++stale_map_refusals_;
  if (h.map_version < mine) {
    return Status::FailedPrecondition(
        "stale cluster map: request has version " + std::to_string(h.map_version) +
        ", server " + std::to_string(options_.rank) + " is at " + std::to_string(mine) +
        "; nothing of it was applied");
  }
  return Status::FailedPrecondition(
      "stale cluster map on the server: request has version " + std::to_string(h.map_version) +
      ", server " + std::to_string(options_.rank) + " is still at " + std::to_string(mine) +
      " (it has not seen the newer map yet); nothing of it was applied");
}

}  // namespace tessera::internal
