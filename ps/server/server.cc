// Start-up, recovery and shutdown of a server; the public Server facade.
#include "ps/server/server.h"

#include <glog/logging.h>

#include <charconv>
#include <chrono>

#include "ps/curve.h"
#include "ps/server/server_impl_internal.h"

namespace tessera {
namespace internal {

ServerImpl::ServerImpl(const ServerOptions& o)
    : options_(o),
      router_(ctx_, zmq::socket_type::router),
      replies_(ctx_, zmq::socket_type::pull),
      fence_(o.rank, o.num_servers, o.follow_cluster_map, SlotMap::Uniform(o.num_servers)) {}

ServerImpl::~ServerImpl() { Shutdown(); }

Status ServerImpl::Start() {
  if (options_.lanes == 0 || options_.lanes > 256) {
    return Status::InvalidArgument("lanes must be in 1..256");
  }
  if (options_.num_servers == 0 || options_.rank >= options_.num_servers) {
    return Status::InvalidArgument("rank " + std::to_string(options_.rank) +
                                   " is not below the number of servers " +
                                   std::to_string(options_.num_servers));
  }
  metrics::Registry* registry = options_.metrics;
  if (registry == nullptr) {
    own_registry_ = std::make_unique<metrics::Registry>();
    registry = own_registry_.get();
  }
  metrics_ = std::make_unique<ServerMetrics>(*registry, options_.rank, options_.num_servers,
                                             options_.lanes);
  const auto t0 = std::chrono::steady_clock::now();
  TESSERA_ASSIGN_OR_RETURN(engine_, OpenStorageEngine(options_.storage));
  const auto t_open = std::chrono::steady_clock::now();
  TESSERA_RETURN_IF_ERROR(CheckDataDirLayout());
  if (options_.push_dedup_max_clients == 0 || options_.push_dedup_retention_s == 0) {
    return Status::InvalidArgument(
        "push_dedup_max_clients and push_dedup_retention_s must be at least 1");
  }
  dedup_.Configure(PushDedupOptions{.max_clients = options_.push_dedup_max_clients,
                                    .retention_s = options_.push_dedup_retention_s},
                   engine_.get());
  log_ = std::make_unique<RequestLog>(engine_.get(), &dedup_);
  TESSERA_RETURN_IF_ERROR(BindSocket());
  const std::string reply_ep =
      "inproc://tessera-replies-" + std::to_string(reinterpret_cast<uintptr_t>(this));
  replies_.set(zmq::sockopt::rcvhwm, 0);
  replies_.bind(reply_ep);
  std::vector<std::unique_ptr<LaneStore>> stores;
  for (uint32_t i = 0; i < options_.lanes; ++i) {
    TESSERA_ASSIGN_OR_RETURN(auto store, engine_->OpenLane(i, options_.lanes));
    stores.push_back(std::move(store));
  }
  // Recovery runs on this thread before any lane thread exists.
  TESSERA_RETURN_IF_ERROR(RecoverTables(stores));
  TESSERA_RETURN_IF_ERROR(LoadFilled());
  TESSERA_RETURN_IF_ERROR(
      log_->Replay(stores, [this](uint64_t id) { return tables_.contains(id); }));
  if (engine_->durable()) {
    const auto secs = [](auto a, auto b) { return std::chrono::duration<double>(b - a).count(); };
    LOG(INFO) << "storage open in " << secs(t0, t_open) << " s, tables and request log in "
              << secs(t_open, std::chrono::steady_clock::now()) << " s";
  }
  for (uint32_t i = 0; i < options_.lanes; ++i) {
    lanes_.push_back(
        std::make_unique<Lane>(i, std::move(stores[i]), ctx_, reply_ep,
                               engine_->durable() ? options_.write_back_interval_ms : 0,
                               MaxDirtyBytesPerLane(options_.storage, options_.lanes)));
  }
  writer_ = std::make_unique<FileWriter>(ctx_, reply_ep);
  // The I/O thread publishes these after each maintenance pass; once here too, so that a scrape
  // right after the ready line finds every series (the thread may not have run yet on a
  // loaded machine: the storage engine's were missing in a CI run).
  PublishIoMetrics();
  io_.thread = std::thread([this] { IoLoop(); });
  LOG(INFO) << "tessera-server rank " << options_.rank << "/" << options_.num_servers
            << " listening on " << endpoint_ << " with " << options_.lanes << " lanes, "
            << (options_.storage.data_dir.empty() ? std::string("memory-only storage")
                                                  : "data in " + options_.storage.data_dir)
            << ", " << tables_.size() << " tables recovered";
  return Status::OK();
}

Status ServerImpl::ConfigureAccess() {
  const std::string& listen = options_.listen;
  access_ = AccessPolicy{
      .curve = !options_.curve_secret_key.empty(),
      .allow_remote_admin = options_.allow_remote_admin_without_curve,
      .local_endpoint = listen.starts_with("ipc://") || listen.starts_with("inproc://")};
  if (!access_.curve) {
    LOG(WARNING) << "CurveZMQ is off (no --curve_secret_key_file): connections are neither "
                 << "encrypted nor authenticated; forwarded pushes, slot moves, checkpoints, "
                 << "restores and exports are accepted "
                 << (access_.allow_remote_admin
                         ? "from ANY address (--allow_remote_admin_without_curve): anyone "
                           "who reaches this port can take them"
                         : "only from loopback");
    return Status::OK();
  }
  CurveAccess keys;
  TESSERA_ASSIGN_OR_RETURN(const std::string server_public,
                           CurvePublicKey(options_.curve_secret_key));
  if (options_.curve_peer_secret_key.empty()) {
    keys.peers.push_back(server_public);
  } else {
    auto peer = CurvePublicKey(options_.curve_peer_secret_key);
    if (!peer.ok()) return Status::InvalidArgument("peer key: " + peer.status().message());
    keys.peers.push_back(*peer);
  }
  keys.any_client = !options_.curve_authorized_clients.has_value();
  if (!keys.any_client) keys.clients = *options_.curve_authorized_clients;
  keys.admins = options_.curve_admin_clients;
  if (keys.any_client) {
    LOG(WARNING) << "CurveZMQ without --authorized_clients: any client that has the servers' "
                 << "public key may connect (for data ops; peer and admin ops need their keys)";
  }
  TESSERA_ASSIGN_OR_RETURN(zap_, ZapHandler::Create(ctx_, keys));
  return Status::OK();
}

Status ServerImpl::BindSocket() {
  router_.set(zmq::sockopt::linger, 0);
  TESSERA_RETURN_IF_ERROR(ConfigureRouterBounds());
  TESSERA_RETURN_IF_ERROR(ConfigureAccess());
  if (!options_.curve_secret_key.empty()) {
    try {
      router_.set(zmq::sockopt::zap_domain, "tessera");
      router_.set(zmq::sockopt::curve_server, 1);
      router_.set(zmq::sockopt::curve_secretkey, options_.curve_secret_key);
    } catch (const zmq::error_t& e) {
      return Status::InvalidArgument(std::string("CurveZMQ: ") + e.what());
    }
  }
  // A frame larger than the request limit plus slack is dropped by ZeroMQ with the
  // connection; requests that fit are checked against the limit with an error reply.
  router_.set(zmq::sockopt::maxmsgsize,
              static_cast<int64_t>(options_.max_request_bytes + (1 << 20)));
  try {
    router_.bind(options_.listen);
  } catch (const zmq::error_t& e) {
    return Status::Unavailable("cannot listen on '" + options_.listen + "': " + e.what());
  }
  endpoint_ = router_.get(zmq::sockopt::last_endpoint);
  return Status::OK();
}

void ServerImpl::Shutdown() {
  if (io_.stopped.exchange(true)) return;
  io_.stop.store(true);
  if (io_.thread.joinable()) io_.thread.join();
  for (auto& l : lanes_) l->Stop();
  if (writer_) writer_->Stop();
  lanes_.clear();
  writer_.reset();
  router_.close();
  zap_.reset();
  edge_.monitor.close();
  replies_.close();
  log_.reset();
  engine_.reset();
  metrics_.reset();  // its collectors leave the registry
}

// Refuses a data_dir written by a server of another rank or cluster size.
Status ServerImpl::CheckDataDirLayout() {
  if (!engine_->durable()) return Status::OK();
  // A server owns the slots of its rank in a cluster of its size: rows stored under another
  // layout would be served from the wrong server or not at all.
  const std::string mine = "rank " + std::to_string(options_.rank) + " of " +
                           std::to_string(options_.num_servers) + " servers";
  TESSERA_ASSIGN_OR_RETURN(auto stored, engine_->GetMeta("server/layout"));
  if (!stored) return engine_->PutMeta("server/layout", mine);
  if (*stored == mine) return Status::OK();
  // Following a cluster map, the map says which slots the server owns, not the size of
  // --cluster (which grows when servers are added): only the rank must match.
  const std::string rank = "rank " + std::to_string(options_.rank) + " of ";
  if (options_.follow_cluster_map && stored->rfind(rank, 0) == 0) {
    return engine_->PutMeta("server/layout", mine);
  }
  return Status::FailedPrecondition(
      "data_dir '" + options_.storage.data_dir + "' holds the rows of " + *stored +
      ", this server is " + mine +
      ": start it with that rank and cluster, or move the rows to this layout with "
      "tessera-ctl checkpoint and restore");
}

Status ServerImpl::RecoverTables(std::vector<std::unique_ptr<LaneStore>>& stores) {
  // A DropTable cut short by a crash (its table record is gone, its marker is not): the rows
  // left on disk are deleted now, before any lane reads them (control_ops.cc).
  std::vector<std::string> dropped;
  TESSERA_RETURN_IF_ERROR(engine_->ScanMeta(
      kDroppedTablePrefix, [&](std::string_view k, std::string_view) { dropped.emplace_back(k); }));
  for (const std::string& key : dropped) {
    uint64_t id = 0;
    const char* digits = key.data() + sizeof(kDroppedTablePrefix) - 1;
    const auto [end, ec] = std::from_chars(digits, key.data() + key.size(), id);
    if (ec != std::errc() || end != key.data() + key.size() || end == digits) {
      return Status::Corruption("unreadable drop marker '" + key + "'");
    }
    TESSERA_RETURN_IF_ERROR(engine_->DropTableData(id));
    const MetaWrite done[] = {{key, std::nullopt}};
    TESSERA_RETURN_IF_ERROR(engine_->WriteMeta(done));
    LOG(INFO) << "finished the drop of table id " << id << " that a restart interrupted";
  }
  std::vector<std::string> records;
  TESSERA_RETURN_IF_ERROR(engine_->ScanMeta(
      "table/", [&](std::string_view, std::string_view v) { records.emplace_back(v); }));
  for (const auto& r : records) {
    TESSERA_ASSIGN_OR_RETURN(TableSpec spec, DecodeTableSpec(r));
    const uint64_t id = TableIdForName(spec.name);
    for (auto& store : stores) TESSERA_RETURN_IF_ERROR(store->AddTable(id, spec));
    tables_.Add(id, spec);
  }
  return Status::OK();
}

}  // namespace internal

Result<std::unique_ptr<Server>> Server::Create(const ServerOptions& options) {
  auto impl = std::make_unique<internal::ServerImpl>(options);
  TESSERA_RETURN_IF_ERROR(impl->Start());
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

Server::Server(std::unique_ptr<internal::ServerImpl> impl) : impl_(std::move(impl)) {}
Server::~Server() { Shutdown(); }
const std::string& Server::endpoint() const { return impl_->endpoint(); }
void Server::Shutdown() { impl_->Shutdown(); }
Status Server::SetClusterMap(uint64_t version, const SlotMap& primary) {
  RoutingMap m;
  m.version = version;
  m.primary = primary;
  return impl_->SetClusterMap(m);
}
Status Server::SetClusterMap(const RoutingMap& map) { return impl_->SetClusterMap(map); }
Status Server::SetClusterMapLoader(std::function<Result<RoutingMap>()> load) {
  return impl_->SetClusterMapLoader(std::move(load));
}
uint64_t Server::cluster_map_version() const { return impl_->cluster_map_version(); }

}  // namespace tessera
