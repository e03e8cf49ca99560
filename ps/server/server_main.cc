// tessera-server: one shard of a Tessera cluster.
#include <gflags/gflags.h>
#include <glog/logging.h>
#include <malloc.h>
#include <signal.h>
#include <sys/resource.h>

#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ps/cli.h"
#include "ps/control/scale.h"
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
#include "storage/storage.h"

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
DEFINE_bool(repair_log, false,
            "Repair the request log of --data_dir (or --request_log_dir) and exit, without "
            "serving: keeps every record whose checksum verifies and prints what it dropped. "
            "Only with the server stopped (docs/operations.md, \"Recovery\")");
DEFINE_uint64(block_cache_mb, 64,
              "With --data_dir: RocksDB block cache in MiB (rows read back from disk)");
DEFINE_uint64(write_buffer_mb, 64,
              "With --data_dir: RocksDB memtables of all tables together, in MiB");
DEFINE_string(rocksdb_table_options, "",
              "With --data_dir: RocksDB column family options applied over Tessera's tuning of "
              "every table, as RocksDB's option string (e.g. \"write_buffer_size=33554432\"); "
              "for experiments, a bad string fails the start (docs/storage.md)");
DEFINE_string(durability, "strict",
              "strict: an acknowledged push survives kill -9; relaxed: it may be lost for up "
              "to --relaxed_window_ms");
DEFINE_uint32(relaxed_window_ms, 100, "Longest loss window of relaxed durability, in ms");
DEFINE_bool(fsync, false, "fsync the write-ahead log before acknowledging (machine crashes)");
DEFINE_uint64(max_request_mb, 1024,
              "Largest request accepted, in MiB of keys and values it carries or produces");
DEFINE_uint32(maintenance_interval_ms, 1000, "Interval of eviction passes, in ms");
DEFINE_uint32(write_back_interval_ms, 5000,
              "With --data_dir: pushes are acknowledged once logged; changed rows are written "
              "back and flushed about this often per lane, which bounds a restart's replay "
              "(0: before every acknowledgement)");
DEFINE_uint32(row_flush_interval_ms, 5000,
              "With --data_dir: rows of write-backs forced by --max_dirty_mb wait in RocksDB's "
              "memtables at most this long before a flush makes them durable (and moves the "
              "request log's mark on); 0: a flush after every write-back");
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
DEFINE_string(curve_peer_key_file, "",
              "With --curve_secret_key_file: file holding the peer secret key (tessera-ctl keygen "
              "DIR --key_name=peer), the same on every server: the servers' links to each other "
              "present it, and only its key may forward pushes and move slots. Empty: the server "
              "key pair doubles as the peer key pair");
DEFINE_string(authorized_clients, "",
              "With --curve_secret_key_file: file of the public keys (one per line, '#' comments) "
              "of the clients allowed to connect; any other key's handshake is refused. Empty: "
              "any client with the servers' public key may connect (data ops only)");
DEFINE_string(admin_clients, "",
              "With --curve_secret_key_file: file of the public keys (one per line) of operators: "
              "only they may checkpoint (or abort one), restore, export and move slots "
              "(tessera-ctl --curve_client_key_file)");
DEFINE_bool(allow_remote_admin_without_curve, false,
            "Without --curve_secret_key_file: accept forwarded pushes, slot moves, checkpoints, "
            "restores and exports from any address, not only from loopback (a network only the "
            "servers and their operators reach; prefer CurveZMQ)");
DEFINE_string(admin_root, "",
              "Directory under which checkpoint, restore and export name their directories "
              "(relative names, no '..', symbolic links must stay inside). Empty: those admin "
              "operations are refused");
DEFINE_uint32(checkpoint_cut_timeout_s, 120,
              "Longest a checkpoint waits for the workers to reach its cut (pushes of later "
              "steps wait meanwhile); then it is given up and training goes on");
DEFINE_uint32(restore_batch_rows, 65536,
              "Rows (or dense chunks) a restore hands one lane at a time, at most 16 MiB of "
              "floats (0: the default)");
DEFINE_uint32(restore_max_queued_batches, 0,
              "Most restore batches queued to the lanes and not yet applied; past it the "
              "checkpoint reader waits, so a restore's memory does not grow with the "
              "checkpoint (0: twice --lanes)");
DEFINE_uint32(idle_connection_timeout_s, 60,
              "A connection that sent no request for this long loses its place to one that "
              "needs it while --max_connections are open (0: never)");
DEFINE_uint32(max_connections, 1024,
              "Most client connections served at once; later ones are refused with "
              "ResourceExhausted until one closes (0: no limit). Needs as many file descriptors");
DEFINE_uint32(max_connections_per_ip, 0,
              "Most connections of one source IP address served at once, within "
              "--max_connections; later ones are refused until one of its own closes (0: no "
              "limit)");
DEFINE_uint32(max_in_flight_per_peer, 1024,
              "Most requests of one client connection in flight on the server (0: no limit)");
DEFINE_uint32(push_dedup_max_clients, 65536,
              "Clients whose push marks (exactly-once pushes) are held in memory; older ones "
              "are spilled to the data dir (the memory engine: its metadata map), never "
              "dropped before --push_dedup_retention_s");
DEFINE_uint32(push_dedup_retention_s, 3600,
              "Seconds a client's push mark is kept after its last push; must exceed the "
              "clients' retry window (ClientOptions::retry_for_ms, 120 s by default)");
DEFINE_uint32(send_hwm, 1000,
              "Replies queued for one client before it counts as not reading: its requests are "
              "then refused or dropped until it reads (0: unbounded)");
DEFINE_uint32(recv_hwm, 1000,
              "Requests queued from one client before the server stops reading its connection "
              "(0: unbounded)");
DEFINE_uint32(metrics_port, 0,
              "Serve Prometheus metrics (/metrics), /healthz and /readyz over HTTP on this port "
              "(0: off). /readyz answers 503 until recovery has finished");
DEFINE_string(metrics_address, "127.0.0.1",
              "Address the metrics port listens on: 127.0.0.1 (this machine only) by default; "
              "0.0.0.0 or the pod's IP where probes and scrapers come from outside");
DEFINE_string(coordinator, "",
              "etcd://HOST:PORT/PREFIX: register this server in etcd as PREFIX/members/"
              "server-RANK (its --cluster entry) under a lease, removed at shutdown "
              "(docs/elasticity.md), and follow the cluster map PREFIX/slotmap: data requests "
              "of another map version, and keys of slots the map gives another server, are "
              "refused (fencing; server id in the map = --rank). etcd://USER@HOST:PORT/PREFIX: as "
              "etcd user USER, password read from the file $TESSERA_ETCD_PASSWORD_FILE names. "
              "Empty: off");
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
  s->rocksdb_table_options = FLAGS_rocksdb_table_options;
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

// After a lost lease: says loudly when a fail-over retired this server's id meanwhile (it
// owns no slots until a scale takes it in again).
void LogIfRetired(tessera::EtcdClient& etcd, const std::string& prefix, uint32_t rank) {
  auto map = tessera::SlotMapStore(&etcd, prefix).Load();
  if (!map.ok() || rank >= map->servers.size() || !map->servers[rank].address.empty()) return;
  LOG(ERROR) << "--coordinator: server " << rank << " was retired from the cluster map (version "
             << map->version << ") while its lease was lost: it owns no slots and serves none "
             << "until a scale takes it in again (tessera-ctl scale, or --auto_join)";
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
  // A lost lease (a pause or an etcd outage past the TTL) is registered again, so that this
  // server's fail-over watcher (it acts only while its server is listed) and the others see it;
  // serving goes on meanwhile, fenced by the cluster map it follows.
  m.register_again = true;
  m.on_registered_again = [url, etcd = etcd->get(), id = m.member_id](const tessera::Status& s) {
    LOG(ERROR) << "--coordinator: " << s.ToString() << "; registered again as " << id;
    LogIfRetired(*etcd, url.prefix, FLAGS_rank);
  };
  m.on_lost = [](const tessera::Status& s) {
    LOG(ERROR) << "--coordinator: " << s.ToString()
               << "; not registered any more: serving goes on, fenced by the cluster map";
  };
  TESSERA_ASSIGN_OR_RETURN(*membership, tessera::Membership::Register(etcd->get(), m));
  LOG(INFO) << "registered as " << tessera::MemberKey(url.prefix, m.member_id) << " in "
            << url.ToString() << " (lease " << (*membership)->lease_id() << ", TTL "
            << (*membership)->ttl_s() << " s)";
  return tessera::Status::OK();
}

// A version of the cluster map the watch delivered (or why it could not): `server` fences by
// it from now on.
void ApplyClusterMap(tessera::Server* server, const tessera::Result<tessera::RoutingMap>& m) {
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
  // A forwarded push ahead of the server's map has it read again (Server::SetClusterMapLoader)
  // through a source of its own, which the server owns (it outlives `source`).
  TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<tessera::EtcdClusterMapSource> reread,
                           tessera::EtcdClusterMapSource::Create(url));
  TESSERA_RETURN_IF_ERROR(server->SetClusterMapLoader([reread] { return reread->Load(); }));
  TESSERA_RETURN_IF_ERROR(source->Watch(
      [server](const tessera::Result<tessera::RoutingMap>& m) { ApplyClusterMap(server, m); }));
  return source;
}

// Writes a line of a server's controller (ps/control/scale.h) to glog, after `prefix` (the
// flag it serves).
tessera::ControlLog ControllerLog(std::string prefix) {
  return [prefix = std::move(prefix)](tessera::ControlLogLevel level, const std::string& line) {
    switch (level) {
      case tessera::ControlLogLevel::kDebug:
        VLOG(1) << prefix << line;
        break;
      case tessera::ControlLogLevel::kInfo:
        LOG(INFO) << prefix << line;
        break;
      case tessera::ControlLogLevel::kWarning:
        LOG(WARNING) << prefix << line;
        break;
    }
  };
}

// With --coordinator: the background controller of this server: backup rebuilds
// (--rebuild_backups) after each promotion it made and when one is due, and scales taking in
// new servers (--auto_join), on threads of their own.
std::unique_ptr<tessera::BackgroundController> StartControllers(
    const tessera::CoordinatorUrl& url, tessera::EtcdClient* etcd,
    const tessera::ClientOptions& peer) {
  tessera::BackgroundControllerOptions c;
  c.prefix = url.prefix;
  c.server_id = FLAGS_rank;
  c.lock_ttl_s = FLAGS_coordinator_ttl_s;
  c.pace = FLAGS_rebuild_pace;
  c.rebuild_backups = FLAGS_rebuild_backups;
  c.auto_join = FLAGS_auto_join;
  c.peer = peer;
  c.log = ControllerLog("--coordinator: ");
  return std::make_unique<tessera::BackgroundController>(etcd, std::move(c));
}

// --drain_on_stop, on SIGTERM: moves this server's slots to the others when it is the highest
// live id of the map (tessera::DrainServer says when it does not).
void DrainSelf(tessera::EtcdClient* etcd, const std::string& prefix,
               const tessera::ClientOptions& peer, tessera::Membership* membership) {
  tessera::DrainOptions d;
  d.prefix = prefix;
  d.server_id = FLAGS_rank;
  d.lock_ttl_s = FLAGS_coordinator_ttl_s;
  d.timeout_s = FLAGS_drain_timeout_s;
  d.peer = peer;
  d.log = ControllerLog("--drain_on_stop: ");
  tessera::DrainServer(*etcd, *membership, d);
}

// With --failover_poll_ms > 0: the fail-over watcher of this server (ps/coord/failover.h),
// logging what it does, counting the slots it promoted in `registry`, and kicking
// `controllers` (a rebuild after each promotion it made and when one is due, a scale when
// servers register under the next ids); null when off.
tessera::Result<std::unique_ptr<tessera::FailoverWatcher>> WatchForFailures(
    const tessera::CoordinatorUrl& url, tessera::EtcdClient* etcd,
    tessera::metrics::Registry* registry, tessera::BackgroundController* controllers) {
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

// The options of the server from the flags (after --cluster and --rank were checked), and
// --coordinator; false (after a message) when a flag is bad.
// --curve_peer_key_file, --authorized_clients, --admin_clients and
// --allow_remote_admin_without_curve into `o`; false after printing why.
bool AccessFromFlags(tessera::ServerOptions* o) {
  o->allow_remote_admin_without_curve = FLAGS_allow_remote_admin_without_curve;
  const bool curve = !o->curve_secret_key.empty();
  for (const char* flag : {"curve_peer_key_file", "authorized_clients", "admin_clients"}) {
    if (!curve && !gflags::GetCommandLineFlagInfoOrDie(flag).current_value.empty()) {
      std::cerr << "tessera-server: --" << flag << " needs --curve_secret_key_file\n";
      return false;
    }
  }
  if (!FLAGS_curve_peer_key_file.empty()) {
    auto key = tessera::ReadCurveKeyFile(FLAGS_curve_peer_key_file);
    if (!key.ok()) {
      std::cerr << "tessera-server: --curve_peer_key_file: " << key.status().ToString() << "\n";
      return false;
    }
    o->curve_peer_secret_key = *key;
  }
  if (!FLAGS_authorized_clients.empty()) {
    auto keys = tessera::ReadCurveKeyList(FLAGS_authorized_clients);
    if (!keys.ok()) {
      std::cerr << "tessera-server: --authorized_clients: " << keys.status().ToString() << "\n";
      return false;
    }
    o->curve_authorized_clients = std::move(*keys);
  }
  if (!FLAGS_admin_clients.empty()) {
    auto keys = tessera::ReadCurveKeyList(FLAGS_admin_clients);
    if (!keys.ok()) {
      std::cerr << "tessera-server: --admin_clients: " << keys.status().ToString() << "\n";
      return false;
    }
    o->curve_admin_clients = std::move(*keys);
  }
  return true;
}

bool OptionsFromFlags(const std::vector<std::string>& cluster, tessera::ServerOptions* o,
                      std::optional<tessera::CoordinatorUrl>* coordinator) {
  if (!ListenFromFlags(cluster, &o->listen)) return false;
  // Seconds held in milliseconds (uint32): a larger value would wrap to a short timeout.
  constexpr uint32_t kMaxTimeoutS = UINT32_MAX / 1000;
  for (auto [name, value] : {std::pair{"checkpoint_cut_timeout_s", FLAGS_checkpoint_cut_timeout_s},
                             std::pair{"idle_connection_timeout_s",
                                       FLAGS_idle_connection_timeout_s}}) {
    if (value > kMaxTimeoutS) {
      std::cerr << "tessera-server: --" << name << "=" << value << " is over the bound "
                << kMaxTimeoutS << " (49 days)\n";
      return false;
    }
  }
  o->rank = FLAGS_rank;
  o->num_servers = static_cast<uint32_t>(cluster.size());
  o->lanes = FLAGS_lanes;
  o->max_request_bytes = FLAGS_max_request_mb << 20;
  o->maintenance_interval_ms = FLAGS_maintenance_interval_ms;
  o->write_back_interval_ms = FLAGS_write_back_interval_ms;
  o->storage.max_dirty_bytes = FLAGS_max_dirty_mb << 20;
  o->storage.row_flush_interval_ms = FLAGS_row_flush_interval_ms;
  o->admin_root = FLAGS_admin_root;
  o->checkpoint_cut_timeout_ms = FLAGS_checkpoint_cut_timeout_s * 1000;
  o->restore_batch_rows = FLAGS_restore_batch_rows;
  o->restore_max_queued_batches = FLAGS_restore_max_queued_batches;
  o->max_connections = FLAGS_max_connections;
  o->max_connections_per_ip = FLAGS_max_connections_per_ip;
  o->idle_connection_timeout_ms = FLAGS_idle_connection_timeout_s * 1000;
  o->max_in_flight_per_peer = FLAGS_max_in_flight_per_peer;
  o->send_hwm = FLAGS_send_hwm;
  if (FLAGS_push_dedup_max_clients == 0 || FLAGS_push_dedup_retention_s == 0) {
    std::cerr << "tessera-server: --push_dedup_max_clients and --push_dedup_retention_s must "
                 "be at least 1\n";
    return false;
  }
  o->push_dedup_max_clients = FLAGS_push_dedup_max_clients;
  o->push_dedup_retention_s = FLAGS_push_dedup_retention_s;
  o->recv_hwm = FLAGS_recv_hwm;
  RaiseOpenFileLimit(FLAGS_max_connections);
  if (!StorageFromFlags(&o->storage)) return false;
  if (!CoordinatorFromFlags(coordinator)) return false;
  if (!FLAGS_curve_secret_key_file.empty()) {
    auto key = tessera::ReadCurveKeyFile(FLAGS_curve_secret_key_file);
    if (!key.ok()) {
      std::cerr << "tessera-server: --curve_secret_key_file: " << key.status().ToString() << "\n";
      return false;
    }
    o->curve_secret_key = *key;
  }
  return AccessFromFlags(o);
}

// What tessera-server runs, in the order it starts them (and destroys them in reverse).
struct Running {
  tessera::metrics::Registry registry;
  std::unique_ptr<tessera::metrics::HttpEndpoint> http;
  std::unique_ptr<tessera::Server> server;
  std::unique_ptr<tessera::EtcdClient> etcd;
  std::unique_ptr<tessera::Membership> membership;
  std::unique_ptr<tessera::EtcdClusterMapSource> map_source;
  std::unique_ptr<tessera::FailoverWatcher> failover;
  std::unique_ptr<tessera::BackgroundController> controllers;
};

// Starts the metrics endpoint (first: probes see a live process, /healthz, that is not ready,
// /readyz 503, while storage opens and the request log replays) and the server. 0, or the exit
// code after a message.
int StartServer(tessera::ServerOptions o, bool follow_cluster_map, Running* r) {
  if (FLAGS_metrics_port != 0) {
    auto e = tessera::metrics::HttpEndpoint::Start(
        {.address = FLAGS_metrics_address, .port = FLAGS_metrics_port}, &r->registry);
    if (!e.ok()) {
      std::cerr << "tessera-server: --metrics_port: " << e.status().ToString() << "\n";
      return 2;
    }
    r->http = std::move(*e);
    r->http->SetReady(false, "recovering: opening storage and replaying the request log");
  }
  o.metrics = &r->registry;
  o.follow_cluster_map = follow_cluster_map;
  auto server = tessera::Server::Create(o);
  if (!server.ok()) {
    std::cerr << "tessera-server: cannot start: " << server.status().ToString() << "\n";
    return 1;
  }
  r->server = std::move(*server);
  return 0;
}

// --coordinator, once the server serves: registers it, follows the cluster map, starts the
// background controller and the fail-over watcher. 0, or the exit code after a message (and
// after undoing what it started and shutting the server down).
int StartCoordination(const tessera::CoordinatorUrl& url, const std::string& address,
                      const tessera::ClientOptions& peer, Running* r) {
  tessera::Status s = Register(url, address, &r->etcd, &r->membership);
  if (!s.ok()) {
    std::cerr << "tessera-server: --coordinator: cannot register: " << s.ToString() << "\n";
    r->server->Shutdown();
    return 1;
  }
  auto followed = FollowClusterMap(url, r->server.get());
  if (!followed.ok()) {
    std::cerr << "tessera-server: --coordinator: cannot follow the cluster map: "
              << followed.status().ToString() << "\n";
    (void)r->membership->Deregister();
    r->server->Shutdown();
    return 1;
  }
  r->map_source = std::move(*followed);
  r->controllers = StartControllers(url, r->etcd.get(), peer);
  auto watcher = WatchForFailures(url, r->etcd.get(), &r->registry, r->controllers.get());
  if (!watcher.ok()) {
    std::cerr << "tessera-server: --failover_poll_ms: " << watcher.status().ToString() << "\n";
    r->map_source.reset();
    (void)r->membership->Deregister();
    r->server->Shutdown();
    return 2;
  }
  r->failover = std::move(*watcher);
  return 0;
}

// Waits for a stop signal, then stops in order: not ready, no more promotions, the background
// runs, the drain (--drain_on_stop), the registration, the map watch, the server.
void WaitAndStop(sigset_t* stop_signals, const std::optional<tessera::CoordinatorUrl>& coordinator,
                 const tessera::ClientOptions& peer, Running* r) {
  int sig = 0;
  sigwait(stop_signals, &sig);
  LOG(INFO) << "signal " << sig << ": shutting down";
  if (r->http) r->http->SetReady(false, "shutting down");
  if (r->failover) {
    // A server going away promotes nothing any more (before it leaves the members).
    LOG(INFO) << "--coordinator: promotions made by this server: " << r->failover->promotions()
              << " (" << r->failover->slots_promoted() << " slots)";
    r->failover.reset();
  }
  if (r->controllers) r->controllers->Stop();  // a rebuild or scale stops before its next batch
  if (FLAGS_drain_on_stop && r->etcd && r->membership) {
    DrainSelf(r->etcd.get(), coordinator->prefix, peer, r->membership.get());
  }
  if (r->membership) {
    // Leave the members first: nobody should pick a server that is going away.
    tessera::Status s = r->membership->Deregister();
    if (!s.ok()) LOG(WARNING) << "--coordinator: deregistering: " << s.ToString();
  }
  r->map_source.reset();  // stops the watch before the server it feeds
  r->server->Shutdown();
}

// --repair_log: repairs the request log and returns the exit status.
int RepairLog() {
  tessera::StorageOptions s;
  s.data_dir = FLAGS_data_dir;
  s.log_dir = FLAGS_request_log_dir;
  auto lines = tessera::RepairRequestLog(s);
  if (!lines.ok()) {
    std::cerr << "tessera-server: --repair_log: " << lines.status().ToString() << "\n";
    return 1;
  }
  for (const std::string& line : *lines) std::printf("%s\n", line.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  tessera::cli::ParseCommandLine(kTool, &argc, &argv);
  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv[0]);
  if (FLAGS_repair_log) return RepairLog();
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
  std::optional<tessera::CoordinatorUrl> coordinator;
  if (!OptionsFromFlags(*cluster, &o, &coordinator)) return 2;

  // Block the stop signals in every thread; the main thread waits for them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  Running r;
  if (int rc = StartServer(o, coordinator.has_value(), &r); rc != 0) return rc;
  // Registered only once it serves, and before the ready line: who sees the line finds it.
  // The server's own calls to the others present the peer key pair (ps/control/scale.h).
  const tessera::ClientOptions peer =
      tessera::PeerClientOptions(o.curve_secret_key, o.curve_peer_secret_key);
  if (coordinator) {
    const int rc = StartCoordination(*coordinator, (*cluster)[FLAGS_rank], peer, &r);
    if (rc != 0) return rc;
  }
  if (r.http) r.http->SetReady(true);  // before the ready line: who sees the line sees /readyz 200
  // A line tests and scripts wait for.
  std::printf("tessera-server ready rank=%u endpoint=%s\n", FLAGS_rank,
              r.server->endpoint().c_str());
  std::fflush(stdout);
  WaitAndStop(&stop_signals, coordinator, peer, &r);
  LOG(INFO) << "stopped";
  return 0;
}
