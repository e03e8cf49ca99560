// tessera-server: one shard of a Tessera cluster.
#include <gflags/gflags.h>
#include <glog/logging.h>
#include <malloc.h>
#include <signal.h>
#include <sys/resource.h>

#include <cstdio>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include <zmq.h>

#include <atomic>
#include <mutex>
#include <thread>

#include "ps/cli.h"
#include "ps/control/scale_internal.h"
#include "ps/coord/coordinator_url.h"
#include "ps/coord/etcd_map_source.h"
#include "ps/coord/failover.h"
#include "ps/coord/membership.h"
#include "ps/coord/slot_map_store.h"
#include "ps/curve.h"
#include "ps/message_pool_internal.h"
#include "ps/metrics/http_endpoint.h"
#include "ps/metrics/metrics.h"
#include "ps/routing.h"
#include "ps/server/server.h"

DEFINE_string(listen, "",
              "ZeroMQ endpoint to bind, e.g. tcp://0.0.0.0:7000 (default: this "
              "rank's entry of --cluster)");
DEFINE_uint32(rank, 0, "This server's rank: its index in --cluster");
DEFINE_string(cluster, "",
              "Ordered list of every server's endpoint, comma-separated, or @FILE with one per "
              "line. Required.");
DEFINE_uint32(lanes, 2, "Executor threads; each owns its slots' rows alone");
DEFINE_string(data_dir, "",
              "Directory of this server's RocksDB (rows, optimizer state, metadata). Empty: "
              "keep everything in memory (lost when the process ends)");
DEFINE_uint64(memory_budget_mb, 0,
              "Memory tier budget in MiB; rows beyond it live in RocksDB only (0: unbounded)");
DEFINE_string(request_log_dir, "",
              "With --data_dir: directory of the request log (default DATA_DIR/request-log); "
              "another device keeps pushes from waiting behind row and checkpoint fsyncs");
DEFINE_uint64(block_cache_mb, 64,
              "With --data_dir: RocksDB block cache in MiB (rows read back from disk)");
DEFINE_uint64(write_buffer_mb, 64,
              "With --data_dir: RocksDB memtables of all tables together, in MiB");
DEFINE_string(durability, "strict",
              "strict: an acknowledged push survives kill -9; relaxed: it may be lost for up "
              "to --relaxed_window_ms");
DEFINE_uint32(relaxed_window_ms, 100, "Longest loss window of relaxed durability, in ms");
DEFINE_bool(fsync, false, "fsync the write-ahead log before acknowledging (machine crashes)");
DEFINE_uint64(max_request_mb, 1024,
              "Largest request accepted, in MiB of keys and values it carries or produces");
DEFINE_uint32(maintenance_interval_ms, 1000, "Interval of eviction passes, in ms");
DEFINE_uint32(write_back_interval_ms, 1000,
              "With --data_dir: pushes are acknowledged once logged; changed rows are written "
              "back about this often per lane (0: before every acknowledgement)");
DEFINE_uint64(max_dirty_mb, 0,
              "With --data_dir: MiB of changed rows not yet written back beyond which pushes "
              "wait for the writer; with a budget, kept back from it for the write-back copies "
              "(0: a quarter of --memory_budget_mb, at most 64 a lane, or 1024 without a budget)");
DEFINE_int32(malloc_arena_max, -1,
             "glibc malloc arenas at most (M_ARENA_MAX); -1: 1 with --memory_budget_mb (freed "
             "memory is reused by every thread, so the process stays near its budget), else "
             "glibc's default; 0: glibc's default");
DEFINE_uint64(message_pool_mb, 64,
              "MiB of pull-reply buffers (64 KiB and up) kept for reuse after ZeroMQ sends them: "
              "no fresh pages per large reply. Part of the process's memory beside the budget");
DEFINE_string(curve_secret_key_file, "",
              "File holding this server's CurveZMQ secret key (tessera-ctl keygen): every "
              "connection is then encrypted and authenticated. Empty: plain TCP");
DEFINE_string(admin_root, "",
              "Directory under which checkpoint, restore and export name their directories "
              "(relative names, no '..', symbolic links must stay inside). Empty: those admin "
              "operations are refused");
DEFINE_uint32(max_connections, 1024,
              "Most client connections served at once; later ones are refused with "
              "ResourceExhausted until one closes (0: no limit). Needs as many file descriptors");
DEFINE_uint32(max_in_flight_per_peer, 1024,
              "Most requests of one client connection in flight on the server (0: no limit)");
DEFINE_uint32(send_hwm, 1000,
              "Replies queued for one client before it counts as not reading: its requests are "
              "then refused or dropped until it reads (0: unbounded)");
DEFINE_uint32(recv_hwm, 1000,
              "Requests queued from one client before the server stops reading its connection "
              "(0: unbounded)");
DEFINE_uint32(metrics_port, 0,
              "Serve Prometheus metrics (/metrics), /healthz and /readyz over HTTP on this port "
              "(0: off). /readyz answers 503 until recovery has finished");
DEFINE_string(metrics_address, "0.0.0.0", "Address the metrics port listens on");
DEFINE_string(coordinator, "",
              "etcd://HOST:PORT/PREFIX: register this server in etcd as PREFIX/members/"
              "server-RANK (its --cluster entry) under a lease, removed at shutdown "
              "(docs/elasticity.md), and follow the cluster map PREFIX/slotmap: data requests "
              "of another map version, and keys of slots the map gives another server, are "
              "refused (fencing; server id in the map = --rank). Empty: off");
DEFINE_uint32(coordinator_ttl_s, 10,
              "With --coordinator: lease TTL in seconds; a server that dies disappears from the "
              "members this long after its last renewal");
DEFINE_uint32(failover_poll_ms, 200,
              "With --coordinator: how often this server looks for dead servers of a replicated "
              "cluster map (tessera-ctl map init --replication=2) and promotes their slots' "
              "backups by a compare-and-swap of the map (every server does; one wins). 0: off");
DEFINE_bool(rebuild_backups, true,
            "With --failover_poll_ms: after this server promoted backups, give the slots left "
            "without one a new backup (the next live server) in the background, copying their "
            "rows while clients train (tessera-ctl map rebuild does the same by hand)");
DEFINE_bool(auto_join, false,
            "With --failover_poll_ms: when servers register under the next unused ids "
            "(--rank), the lowest live server of the map runs tessera-ctl scale's controller to "
            "take them in (so kubectl scale up needs no Job); off: they wait for a scale");
DEFINE_bool(drain_on_stop, false,
            "With --coordinator: on SIGTERM, when this server is the highest live id of the map, "
            "first move its slots and dense parts to the others and retire its id "
            "(tessera-ctl scale N-1), so that kubectl scale down of a StatefulSet (highest "
            "ordinal first) needs no Job and fails nothing over");
DEFINE_int32(drain_timeout_s, 600,
             "With --drain_on_stop: give up draining after this many seconds (the pod's "
             "terminationGracePeriodSeconds must be longer)");
DEFINE_double(rebuild_pace, 0.5,
              "Share of wall time a background backup rebuild spends copying (0, 1]: after "
              "each batch it waits (1/pace - 1) times as long as the batch took");

namespace {

constexpr tessera::cli::ToolInfo kTool{
    .name = "tessera-server",
    .usage = "usage: tessera-server --cluster=tcp://h0:7000,tcp://h1:7000 --rank=R "
             "[--data_dir=DIR]\n"
             "Serves one shard of a Tessera parameter-server cluster.",
    .flags_file = __FILE__};

// Raises the soft open-file limit to the hard one (a common default soft limit, 1024, is below
// what --max_connections plus RocksDB's files need) and warns when even that is too low.
void RaiseOpenFileLimit(uint32_t max_connections) {
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return;
  if (rl.rlim_cur < rl.rlim_max) {
    rlimit raised = rl;
    raised.rlim_cur = rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &raised) == 0) rl = raised;
  }
  const rlim_t want = rlim_t{max_connections} + 1024;  // + RocksDB, logs, sockets of our own
  if (max_connections != 0 && rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < want) {
    LOG(WARNING) << "the open-file limit is " << rl.rlim_cur
                 << ", below --max_connections=" << max_connections
                 << " + 1024 for storage: raise it (ulimit -n " << want
                 << " or more; see docs/operations.md) or lower --max_connections";
  }
}

// The endpoint to bind: --listen, else this rank's --cluster entry; false (after a message) when
// --listen is not one.
bool ListenFromFlags(const std::vector<std::string>& cluster, std::string* listen) {
  *listen = FLAGS_listen.empty() ? cluster[FLAGS_rank] : FLAGS_listen;
  tessera::Status s = tessera::ValidateEndpoint(*listen, /*allow_any_port=*/true);
  if (!s.ok()) tessera::cli::UsageError(kTool, "--listen: " + s.ToString());
  return s.ok();
}

// The storage flags; false (after a message) when one is bad.
bool StorageFromFlags(tessera::StorageOptions* s) {
  s->data_dir = FLAGS_data_dir;
  s->log_dir = FLAGS_request_log_dir;
  s->memory_budget_bytes = FLAGS_memory_budget_mb << 20;
  s->block_cache_bytes = FLAGS_block_cache_mb << 20;
  s->write_buffer_bytes = FLAGS_write_buffer_mb << 20;
  if (!tessera::cli::CheckOneOf(kTool, "durability", FLAGS_durability, {"strict", "relaxed"})) {
    return false;
  }
  s->durability = FLAGS_durability == "strict" ? tessera::Durability::kStrict
                                               : tessera::Durability::kRelaxed;
  s->relaxed_window_ms = FLAGS_relaxed_window_ms;
  s->fsync = FLAGS_fsync;
  return true;
}

// glibc gives each thread that contends for malloc an arena of its own and keeps what is freed
// there for that arena: rows, RocksDB blocks and requests freed on one thread and allocated on
// another left a budgeted server at 1.3-1.5x its budget plus overhead (docs/storage.md, "Memory
// bound"). Takes effect for arenas made later: call it before any thread starts.
// --message_pool_mb: the largest reply buffers waiting for reuse at a time.
void SizeMessagePool() {
  tessera::internal::MessagePool::Shared().set_max_retained(FLAGS_message_pool_mb << 20);
}

void LimitMallocArenas() {
  const int arenas =
      FLAGS_malloc_arena_max >= 0 ? FLAGS_malloc_arena_max : (FLAGS_memory_budget_mb != 0 ? 1 : 0);
  if (arenas > 0 && mallopt(M_ARENA_MAX, arenas) != 1) {
    LOG(WARNING) << "mallopt(M_ARENA_MAX, " << arenas << ") failed";
  }
}

// --coordinator checked before anything starts; false (after a message) when it is malformed.
bool CoordinatorFromFlags(std::optional<tessera::CoordinatorUrl>* url) {
  if (FLAGS_coordinator.empty()) return true;
  auto parsed = tessera::CoordinatorUrl::Parse(FLAGS_coordinator);
  if (!parsed.ok()) {
    tessera::cli::UsageError(kTool, "--coordinator: " + parsed.status().ToString());
    return false;
  }
  if (FLAGS_coordinator_ttl_s == 0) {
    tessera::cli::UsageError(kTool, "--coordinator_ttl_s must be > 0");
    return false;
  }
  *url = *parsed;
  return true;
}

// Registers this server as PREFIX/members/server-RANK with its --cluster entry; `etcd` is the
// client the registration borrows.
tessera::Status Register(const tessera::CoordinatorUrl& url, const std::string& address,
                         std::unique_ptr<tessera::EtcdClient>* etcd,
                         std::unique_ptr<tessera::Membership>* membership) {
  TESSERA_ASSIGN_OR_RETURN(*etcd, tessera::EtcdClient::Create(url.etcd_options()));
  tessera::MembershipOptions m;
  m.prefix = url.prefix;
  m.member_id = "server-" + std::to_string(FLAGS_rank);
  m.address = address;
  m.ttl_s = FLAGS_coordinator_ttl_s;
  // Routing does not depend on membership yet, so a lost registration is reported and serving
  // goes on (stopping would turn an etcd outage into a data outage).
  m.on_lost = [](const tessera::Status& s) {
    LOG(ERROR) << "--coordinator: " << s.ToString() << "; serving goes on (--cluster routing)";
  };
  TESSERA_ASSIGN_OR_RETURN(*membership, tessera::Membership::Register(etcd->get(), m));
  LOG(INFO) << "registered as " << tessera::MemberKey(url.prefix, m.member_id) << " in "
            << url.ToString() << " (lease " << (*membership)->lease_id() << ", TTL "
            << (*membership)->ttl_s() << " s)";
  return tessera::Status::OK();
}

// Follows PREFIX/slotmap: each newer version becomes the map `server` fences by (waiting for
// the record when none exists yet). The returned source owns the watch.
tessera::Result<std::unique_ptr<tessera::EtcdClusterMapSource>> FollowClusterMap(
    const tessera::CoordinatorUrl& url, tessera::Server* server) {
  TESSERA_ASSIGN_OR_RETURN(auto source, tessera::EtcdClusterMapSource::Create(url));
  // The record read before the ready line, so that a map that exists is in force before the
  // server is announced.
  auto first = source->Load();
  if (first.ok()) {
    TESSERA_RETURN_IF_ERROR(server->SetClusterMap(*first));
    LOG(INFO) << "--coordinator: serving by cluster map version " << first->version;
  } else if (first.status().code() == tessera::StatusCode::kNotFound) {
    LOG(INFO) << "--coordinator: no cluster map in " << url.ToString()
              << " yet: serving by --cluster (map version 0) until one is created";
  } else {
    return first.status();
  }
  TESSERA_RETURN_IF_ERROR(source->Watch([server](const tessera::Result<tessera::RoutingMap>& m) {
    if (!m.ok()) {
      LOG(ERROR) << "--coordinator: cluster map: " << m.status().ToString();
      return;
    }
    const uint64_t before = server->cluster_map_version();
    tessera::Status s = server->SetClusterMap(*m);
    if (!s.ok()) {
      LOG(ERROR) << "--coordinator: cluster map version " << m->version << ": " << s.ToString();
    } else if (m->version > before) {
      LOG(INFO) << "--coordinator: cluster map version " << before << " -> " << m->version;
    }
  }));
  return source;
}

// Runs `run` on a thread of its own after each Kick (once more when kicked while it runs): a
// controller of tessera-ctl (a backup rebuild, a scale taking in servers that registered).
// Thread-safe; destruction sets the stop flag `run` is given (a controller stops before its
// next batch) and joins.
class BackgroundRun {
 public:
  explicit BackgroundRun(std::function<void(const std::atomic<bool>*)> run)
      : run_(std::move(run)) {}
  ~BackgroundRun() {
    stop_ = true;
    std::lock_guard<std::mutex> l(mu_);
    if (thread_.joinable()) thread_.join();
  }
  void Kick() {
    std::lock_guard<std::mutex> l(mu_);
    if (stop_) return;
    again_ = true;
    if (running_) return;
    if (thread_.joinable()) thread_.join();
    running_ = true;
    thread_ = std::thread([this] { Loop(); });
  }

 private:
  void Loop() {
    for (;;) {
      {
        std::lock_guard<std::mutex> l(mu_);
        if (!again_ || stop_) {
          running_ = false;
          return;
        }
        again_ = false;
      }
      run_(&stop_);
    }
  }

  const std::function<void(const std::atomic<bool>*)> run_;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  bool running_ = false, again_ = false;
  std::thread thread_;
};

// The options of a controller this server runs: its pace, stop flag and name on the
// controller lock, which it does not wait for (it is kicked again while the work is due).
tessera::internal::ScaleOptions BackgroundScaleOptions(const std::atomic<bool>* stop) {
  tessera::internal::ScaleOptions o;
  o.pace = FLAGS_rebuild_pace;
  o.deadline = tessera::DeadlineAfterMs(10 * 60 * 1000);
  o.cancel = stop;
  o.controller_id = "server-" + std::to_string(FLAGS_rank);
  o.controller_ttl_s = FLAGS_coordinator_ttl_s;
  o.wait_for_controller = false;
  return o;
}

// Logs a background controller's failure: at VLOG(1) when another controller held the lock
// (the work is kicked again while it is due), else as a warning.
void LogControllerFailure(const char* what, const tessera::Status& s, const char* by_hand) {
  if (s.code() == tessera::StatusCode::kFailedPrecondition &&
      s.message().find("another controller") != std::string::npos) {
    VLOG(1) << "--coordinator: " << what << ": " << s.ToString();
  } else {
    LOG(WARNING) << "--coordinator: " << what << ": " << s.ToString() << " (" << by_hand
                 << " does it by hand)";
  }
}

// A backup rebuild (docs/elasticity.md, "Backup rebuild"): after a promotion this server
// made, or when its fail-over watcher finds one due.
void RebuildNow(tessera::EtcdClient* etcd, const std::string& prefix,
                const tessera::ClientOptions& base, const std::atomic<bool>* stop) {
  auto r = tessera::internal::RebuildBackups(*etcd, prefix, base, BackgroundScaleOptions(stop));
  if (!r.ok()) {
    LogControllerFailure("backup rebuild", r.status(), "tessera-ctl map rebuild");
  } else if (r->slots_backed > 0 || r->dense_parts_backed > 0) {
    LOG(INFO) << "--coordinator: backup rebuild: " << r->slots_backed << " slots and "
              << r->dense_parts_backed << " dense parts given a backup, map version "
              << r->from_version << " -> " << r->to_version << ", "
              << r->rows_ahead + r->rows_in_hold << " rows copied in " << r->seconds
              << " s, longest hold " << r->max_hold_ms << " ms";
  }
}

// --auto_join: a scale to `servers` that takes in the servers registered under the next ids.
void JoinNow(tessera::EtcdClient* etcd, const std::string& prefix,
             const tessera::ClientOptions& base, uint32_t servers,
             const std::atomic<bool>* stop) {
  tessera::internal::ScaleOptions o = BackgroundScaleOptions(stop);
  o.servers = servers;
  auto r = tessera::internal::Scale(*etcd, prefix, base, o);
  if (!r.ok()) {
    LogControllerFailure("taking in new servers", r.status(), "tessera-ctl scale");
    return;
  }
  LOG(INFO) << "--coordinator: took in new servers: " << servers << " servers, "
            << r->slots_moved << " slots moved and " << r->slots_backed
            << " given a backup, map version " << r->from_version << " -> " << r->to_version
            << " in " << r->seconds << " s";
}

// --drain_on_stop, on SIGTERM: when this server is the highest live id of the map (a
// StatefulSet scaled down stops its highest ordinal first), a scale to one server fewer moves
// its slots, dense parts and the backups it holds to the others and retires its id. Its member
// record says it is leaving meanwhile, so no --auto_join watcher takes the retired but still
// registered id back (nor gives it a slot). Logs why when it does not drain.
void DrainSelf(tessera::EtcdClient* etcd, const std::string& prefix,
               const tessera::ClientOptions& base, tessera::Membership* membership) {
  tessera::SlotMapStore store(etcd, prefix);
  auto map = store.Load();
  if (!map.ok()) {
    LOG(WARNING) << "--drain_on_stop: cannot read the map, leaving undrained: "
                 << map.status().ToString();
    return;
  }
  uint32_t live = 0, highest = 0;
  for (uint32_t id = 0; id < map->servers.size(); ++id) {
    if (map->servers[id].address.empty()) continue;
    ++live;
    highest = id;
  }
  if (live < 2 || highest != FLAGS_rank) {
    LOG(INFO) << "--drain_on_stop: not draining: server " << FLAGS_rank
              << (live < 2 ? " is the last one" : " is not the highest live id (" +
                                                     std::to_string(highest) + ")");
    return;
  }
  // Marked leaving first: no --auto_join watcher takes the id back, no rebuild picks it.
  if (tessera::Status s = membership->MarkLeaving(); !s.ok()) {
    LOG(WARNING) << "--drain_on_stop: " << s.ToString() << "; draining anyway";
  }
  tessera::internal::ScaleOptions o;
  o.servers = live - 1;
  o.deadline = tessera::DeadlineAfterMs(int64_t{FLAGS_drain_timeout_s} * 1000);
  o.controller_id = "server-" + std::to_string(FLAGS_rank) + "-drain";
  o.controller_ttl_s = FLAGS_coordinator_ttl_s;
  o.wait_for_controller = true;
  LOG(INFO) << "--drain_on_stop: moving server " << FLAGS_rank << "'s slots to the other "
            << o.servers << " servers";
  auto r = tessera::internal::Scale(*etcd, prefix, base, o);
  if (!r.ok()) {
    LOG(WARNING) << "--drain_on_stop: the drain failed, leaving undrained: "
                 << r.status().ToString();
    return;
  }
  LOG(INFO) << "--drain_on_stop: drained: " << r->slots_moved << " slots and "
            << r->dense_parts_moved << " dense parts moved, " << r->slots_backed
            << " slots given a backup, map version " << r->from_version << " -> "
            << r->to_version << " in " << r->seconds << " s";
}

// The client options of this server's own calls to the others (a rebuild): the servers share
// one CurveZMQ key pair, so the public key of --curve_secret_key_file is theirs.
tessera::ClientOptions PeerClientOptions(const std::string& curve_secret_key) {
  tessera::ClientOptions o;
  o.request_timeout_ms = 30000;
  if (!curve_secret_key.empty()) {
    char public_key[41] = {};
    if (zmq_curve_public(public_key, curve_secret_key.c_str()) == 0) {
      o.curve_server_key = std::string(public_key, 40);
    }
  }
  return o;
}

// With --failover_poll_ms > 0: the fail-over watcher of this server (ps/coord/failover.h),
// logging what it does and counting the slots it promoted in `registry`, and running backup
// rebuilds (--rebuild_backups) after each promotion it made and when one is due, and scales
// taking in new servers (--auto_join), on threads of their own; null when off.
class Controllers {
 public:
  Controllers(tessera::EtcdClient* etcd, std::string prefix, tessera::ClientOptions base)
      : etcd_(etcd), prefix_(std::move(prefix)), base_(std::move(base)) {
    if (FLAGS_rebuild_backups) {
      rebuild_ = std::make_unique<BackgroundRun>(
          [this](const std::atomic<bool>* stop) { RebuildNow(etcd_, prefix_, base_, stop); });
    }
    if (FLAGS_auto_join) {
      join_ = std::make_unique<BackgroundRun>([this](const std::atomic<bool>* stop) {
        JoinNow(etcd_, prefix_, base_, join_servers_.load(), stop);
      });
    }
  }
  void Rebuild() {
    if (rebuild_) rebuild_->Kick();
  }
  bool joins() const { return join_ != nullptr; }
  void Join(uint32_t servers) {
    join_servers_ = servers;
    if (join_) join_->Kick();
  }
  // Stops the runs before their next batches.
  void Stop() {
    rebuild_.reset();
    join_.reset();
  }

 private:
  tessera::EtcdClient* const etcd_;
  const std::string prefix_;
  const tessera::ClientOptions base_;
  std::atomic<uint32_t> join_servers_{0};
  std::unique_ptr<BackgroundRun> rebuild_, join_;
};

tessera::Result<std::unique_ptr<tessera::FailoverWatcher>> WatchForFailures(
    const tessera::CoordinatorUrl& url, tessera::EtcdClient* etcd,
    tessera::metrics::Registry* registry, Controllers* controllers) {
  if (FLAGS_failover_poll_ms == 0) return std::unique_ptr<tessera::FailoverWatcher>();
  tessera::FailoverOptions f;
  f.prefix = url.prefix;
  f.self_id = "server-" + std::to_string(FLAGS_rank);
  f.poll_ms = static_cast<int>(FLAGS_failover_poll_ms);
  f.log = [](const std::string& line) { LOG(INFO) << "--coordinator: " << line; };
  tessera::metrics::Counter* promoted = &registry->AddCounter(
      "tessera_failover_promoted_slots_total",
      "Slots whose backup this server made primary after their primary died (fail-over)");
  f.on_promoted = [promoted, controllers](const tessera::Promotion& p) {
    promoted->Inc(p.slots_promoted());
    controllers->Rebuild();
  };
  // A rebuild left undone (the promoting server died during it, or lost the controller lock to
  // a scale): the lowest live server runs it.
  f.on_unbacked = [controllers] { controllers->Rebuild(); };
  if (controllers->joins()) f.on_joined = [controllers](uint32_t n) { controllers->Join(n); };
  return tessera::FailoverWatcher::Start(etcd, std::move(f));
}

}  // namespace

int main(int argc, char** argv) {
  tessera::cli::ParseCommandLine(kTool, &argc, &argv);
  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv[0]);
  LimitMallocArenas();  // before any thread exists
  SizeMessagePool();
  auto cluster = tessera::ParseClusterList(FLAGS_cluster);
  if (!cluster.ok()) {
    std::cerr << "tessera-server: --cluster: " << cluster.status().ToString() << "\n";
    return 2;
  }
  if (FLAGS_rank >= cluster->size()) {
    std::cerr << "tessera-server: --rank=" << FLAGS_rank << " but --cluster lists "
              << cluster->size() << " server(s)\n";
    return 2;
  }
  tessera::ServerOptions o;
  if (!ListenFromFlags(*cluster, &o.listen)) return 2;
  o.rank = FLAGS_rank;
  o.num_servers = static_cast<uint32_t>(cluster->size());
  o.lanes = FLAGS_lanes;
  o.max_request_bytes = FLAGS_max_request_mb << 20;
  o.maintenance_interval_ms = FLAGS_maintenance_interval_ms;
  o.write_back_interval_ms = FLAGS_write_back_interval_ms;
  o.storage.max_dirty_bytes = FLAGS_max_dirty_mb << 20;
  o.admin_root = FLAGS_admin_root;
  o.max_connections = FLAGS_max_connections;
  o.max_in_flight_per_peer = FLAGS_max_in_flight_per_peer;
  o.send_hwm = FLAGS_send_hwm;
  o.recv_hwm = FLAGS_recv_hwm;
  RaiseOpenFileLimit(FLAGS_max_connections);
  if (!StorageFromFlags(&o.storage)) return 2;
  std::optional<tessera::CoordinatorUrl> coordinator;
  if (!CoordinatorFromFlags(&coordinator)) return 2;
  if (!FLAGS_curve_secret_key_file.empty()) {
    auto key = tessera::ReadCurveKeyFile(FLAGS_curve_secret_key_file);
    if (!key.ok()) {
      std::cerr << "tessera-server: --curve_secret_key_file: " << key.status().ToString() << "\n";
      return 2;
    }
    o.curve_secret_key = *key;
  }

  // Block the stop signals in every thread; the main thread waits for them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  // The metrics endpoint comes up first: probes see a live process (/healthz) that is not
  // ready (/readyz 503) while storage opens and the request log replays.
  tessera::metrics::Registry registry;
  std::unique_ptr<tessera::metrics::HttpEndpoint> http;
  if (FLAGS_metrics_port != 0) {
    auto e = tessera::metrics::HttpEndpoint::Start(
        {.address = FLAGS_metrics_address, .port = FLAGS_metrics_port}, &registry);
    if (!e.ok()) {
      std::cerr << "tessera-server: --metrics_port: " << e.status().ToString() << "\n";
      return 2;
    }
    http = std::move(*e);
    http->SetReady(false, "recovering: opening storage and replaying the request log");
  }
  o.metrics = &registry;
  o.follow_cluster_map = coordinator.has_value();
  auto server = tessera::Server::Create(o);
  if (!server.ok()) {
    std::cerr << "tessera-server: cannot start: " << server.status().ToString() << "\n";
    return 1;
  }
  // Registered only once it serves, and before the ready line: who sees the line finds it.
  std::unique_ptr<tessera::EtcdClient> etcd;
  std::unique_ptr<tessera::Membership> membership;
  std::unique_ptr<tessera::EtcdClusterMapSource> map_source;
  std::unique_ptr<tessera::FailoverWatcher> failover;
  std::unique_ptr<Controllers> controllers;
  if (coordinator) {
    tessera::Status s = Register(*coordinator, (*cluster)[FLAGS_rank], &etcd, &membership);
    if (!s.ok()) {
      std::cerr << "tessera-server: --coordinator: cannot register: " << s.ToString() << "\n";
      (*server)->Shutdown();
      return 1;
    }
    auto followed = FollowClusterMap(*coordinator, server->get());
    if (!followed.ok()) {
      std::cerr << "tessera-server: --coordinator: cannot follow the cluster map: "
                << followed.status().ToString() << "\n";
      (void)membership->Deregister();
      (*server)->Shutdown();
      return 1;
    }
    map_source = std::move(*followed);
    controllers = std::make_unique<Controllers>(etcd.get(), coordinator->prefix,
                                                PeerClientOptions(o.curve_secret_key));
    auto watcher = WatchForFailures(*coordinator, etcd.get(), &registry, controllers.get());
    if (!watcher.ok()) {
      std::cerr << "tessera-server: --failover_poll_ms: " << watcher.status().ToString() << "\n";
      map_source.reset();
      (void)membership->Deregister();
      (*server)->Shutdown();
      return 2;
    }
    failover = std::move(*watcher);
  }
  if (http) http->SetReady(true);  // before the ready line: who sees the line sees /readyz 200
  // A line tests and scripts wait for.
  std::printf("tessera-server ready rank=%u endpoint=%s\n", FLAGS_rank,
              (*server)->endpoint().c_str());
  std::fflush(stdout);
  int sig = 0;
  sigwait(&stop_signals, &sig);
  LOG(INFO) << "signal " << sig << ": shutting down";
  if (http) http->SetReady(false, "shutting down");
  if (failover) {
    // A server going away promotes nothing any more (before it leaves the members).
    LOG(INFO) << "--coordinator: promotions made by this server: " << failover->promotions()
              << " (" << failover->slots_promoted() << " slots)";
    failover.reset();
  }
  if (controllers) controllers->Stop();  // a rebuild or scale stops before its next batch
  if (FLAGS_drain_on_stop && etcd && membership) {
    DrainSelf(etcd.get(), coordinator->prefix, PeerClientOptions(o.curve_secret_key),
              membership.get());
  }
  if (membership) {
    // Leave the members first: nobody should pick a server that is going away.
    tessera::Status s = membership->Deregister();
    if (!s.ok()) LOG(WARNING) << "--coordinator: deregistering: " << s.ToString();
  }
  map_source.reset();  // stops the watch before the server it feeds
  (*server)->Shutdown();
  LOG(INFO) << "stopped";
  return 0;
}
