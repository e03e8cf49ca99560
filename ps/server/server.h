// The Tessera server: one shard of the key space, its lanes and its storage.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ps/cluster_map_source.h"
#include "ps/routing.h"
#include "ps/status.h"
#include "storage/storage.h"

namespace tessera {

namespace internal {
class ServerImpl;
}
namespace metrics {
class Registry;
}

struct ServerOptions {
  /// ZeroMQ endpoint to bind, e.g. "tcp://127.0.0.1:7000" ("tcp://127.0.0.1:*" picks a free
  /// port; see Server::endpoint()). Required.
  std::string listen;
  /// This server's rank: its index in `cluster`. Default: 0.
  uint32_t rank = 0;
  /// Number of servers in the cluster (the slot map is SlotMap::Uniform(num_servers)).
  /// Default: 1.
  uint32_t num_servers = 1;
  /// Executor threads; each owns the rows of its slots alone. Default: 2.
  uint32_t lanes = 2;
  /// Largest request the server accepts, in bytes of keys + values it would hold or produce.
  /// Larger requests get ResourceExhausted. Default: 1 GiB.
  uint64_t max_request_bytes = uint64_t{1} << 30;
  /// Storage configuration (memory-only when storage.data_dir is empty).
  StorageOptions storage;
  /// Interval of the storage maintenance (eviction) pass, in milliseconds. Default: 1000.
  uint32_t maintenance_interval_ms = 1000;
  /// Durable storage: a push is acknowledged once its request-log entry is written (as durable
  /// as the durability mode says); each lane hands the rows it changed to the storage writer
  /// about this often (every lane at the same instants), which writes and flushes them and
  /// moves the log's truncation mark on. Recovery replays at most about one interval of pushes
  /// plus a write and a flush (StorageOptions::row_flush_interval_ms after hand-offs forced by
  /// max_dirty_bytes). A row changed many times within an interval is written once: on tables
  /// whose rows change every second, 5000 took about half the server CPU per key of 1000
  /// (docs/benchmarks.md).
  /// 0: commit the rows of every batch before answering (slow). Default: 5000.
  uint32_t write_back_interval_ms = 5000;
  /// CurveZMQ secret key of the server (40 Z85 characters). When set, every connection is
  /// encrypted and must present the matching public key (ClientOptions::curve_server_key).
  /// Default: empty (plain TCP).
  std::string curve_secret_key;
  /// With curve_secret_key: the CurveZMQ secret key this server's own links to the other
  /// servers present (replication, and its controller's slot moves); its public key gets the
  /// peer right (forwarded pushes, SlotExport/SlotImport/SlotDrop). All servers share this
  /// peer key pair. Default: empty: the server key pair doubles as the peer key pair.
  std::string curve_peer_secret_key;
  /// With curve_secret_key: the public keys (Z85) of the clients allowed to connect; any other
  /// key's handshake is refused (the peer and admin keys are always let in). nullopt: any key
  /// may connect as a client (data ops only). Default: nullopt.
  std::optional<std::vector<std::string>> curve_authorized_clients;
  /// With curve_secret_key: the public keys (Z85) of operators: Checkpoint (and its abort),
  /// Restore, Export and the slot ops are accepted only from these (and the slot ops from the
  /// peer key). Default: none.
  std::vector<std::string> curve_admin_clients;
  /// Without curve_secret_key the peer and admin ops are accepted only from loopback (or on
  /// an ipc:// endpoint); true: from any address (a network that only the servers and their
  /// operators can reach). Ignored with CurveZMQ. Default: false.
  bool allow_remote_admin_without_curve = false;
  /// Directory under which Checkpoint, Restore and Export name their directories: a request
  /// names a relative path (no "..") that must resolve inside it, symbolic links followed.
  /// Created if missing. Default: empty: those admin ops are refused (FailedPrecondition).
  std::string admin_root;
  /// Longest a checkpoint waits for the workers to reach its cut (the pushes of later steps
  /// wait meanwhile); then it is given up (DeadlineExceeded) and what it held goes on. 0: the
  /// default. Default: 120000 (2 minutes).
  uint32_t checkpoint_cut_timeout_ms = 120000;
  /// Rows (or dense chunks) a restore hands one lane at a time; a batch also ends at 16 MiB
  /// of floats. 0: the default. Default: 65,536.
  uint32_t restore_batch_rows = 65536;
  /// Most restore batches queued to the lanes and not yet applied: past it the checkpoint
  /// reader waits for a lane (back-pressure), so a restore holds at most this many batches
  /// plus one being filled per lane, whatever the checkpoint's size. 0: twice the lanes.
  /// Default: 0.
  uint32_t restore_max_queued_batches = 0;
  /// Most client connections served at once; later ones get ResourceExhausted for every
  /// request until an earlier one closes. Each takes a file descriptor (RLIMIT_NOFILE).
  /// 0: no limit. Default: 1024.
  uint32_t max_connections = 1024;
  /// A connection that sent no request for this long (counted from its accept when it never
  /// sent one) loses its place to a connection that needs one while --max_connections are
  /// open, so idle connections cannot lock clients out. 0: never. Default: 60000 (1 minute).
  uint32_t idle_connection_timeout_ms = 60000;
  /// Most connections of one source IP address served at once (within max_connections), so
  /// one host cannot take every place; its later ones wait, refused, until one of its own
  /// closes (or is idle and displaced). 0: no limit (the default: a node may run many
  /// workers, and all of a Kubernetes node's pods may share an address behind NAT).
  uint32_t max_connections_per_ip = 0;
  /// Most requests of one client (connection) in flight on the server (queued, running,
  /// parked by staleness or a checkpoint cut); more get ResourceExhausted. 0: no limit.
  /// Default: 1024.
  uint32_t max_in_flight_per_peer = 1024;
  /// Clients whose push marks (exactly-once pushes) are held in memory; past it the least
  /// recently seen are spilled to the storage engine's metadata and read back when they come
  /// again, never dropped (docs/wire-protocol.md, "Exactly-once pushes"). At least 1.
  /// Default: 65,536.
  uint32_t push_dedup_max_clients = 65536;
  /// Seconds a client's push mark is kept after its last push; then it is forgotten, and a
  /// later push of that client other than its first is refused with Aborted (the client
  /// library starts a new numbering and sends it again). Must exceed the longest
  /// ClientOptions::retry_for_ms of any client. At least 1. Default: 3600.
  uint32_t push_dedup_retention_s = 3600;
  /// Replies queued for one client that has not read them yet (ZMQ_SNDHWM, in messages).
  /// When a client's queue is full it is not reading: its later requests are refused or,
  /// while its queue stays full, dropped unanswered. 0: unbounded. Default: 1000.
  uint32_t send_hwm = 1000;
  /// Requests received from one client and not yet taken by the I/O thread (ZMQ_RCVHWM, in
  /// messages); beyond it the server stops reading that connection (TCP backpressure).
  /// 0: unbounded. Default: 1000.
  uint32_t recv_hwm = 1000;
  /// Where the server registers its metrics (tessera_server_*, tessera_storage_*; see
  /// docs/operations.md, "Metrics"). Not owned; must outlive the server. The server stops
  /// reading its state into it at Shutdown(). Default: null: the server keeps its own.
  metrics::Registry* metrics = nullptr;
  /// Fencing by cluster map version (docs/elasticity.md): the server follows a cluster map
  /// given by SetClusterMap (tessera-server --coordinator). A data request (sparse or dense
  /// push, pull, push-pull) whose map version differs from the server's is refused with
  /// FailedPrecondition ("stale cluster map: ...") and its reply carries the server's version;
  /// so is a sparse key of a slot the current map gives another server. A client's numbered
  /// push of a newer version than the server's waits for that map instead (at most 10 s, then
  /// Unavailable), and so do its client's later pushes. Until the first map
  /// arrives the server is at version 0 and routes by num_servers like a static server. False:
  /// versions are ignored (a static --cluster). Default: false.
  bool follow_cluster_map = false;
};

/// A running server. Create() binds the socket, opens (and recovers) storage and starts the
/// I/O thread and the lanes; the server then serves until Shutdown() or destruction.
/// Thread-safe: Shutdown() and endpoint() may be called from any thread.
class Server {
 public:
  static Result<std::unique_ptr<Server>> Create(const ServerOptions& options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  /// The endpoint actually bound (with the real port when the option asked for "*").
  const std::string& endpoint() const;
  /// Stops serving: requests in flight are answered or dropped, threads are joined. Idempotent.
  void Shutdown();
  /// Makes `version` with `primary` (the primary owner of each slot; this server is server id
  /// `rank`) the cluster map the server serves by, if it is newer than the current one (an
  /// older or equal version is ignored). Only with ServerOptions::follow_cluster_map
  /// (FailedPrecondition otherwise); InvalidArgument for version 0. Thread-safe: requests
  /// decoded after it returns are checked against the new map.
  Status SetClusterMap(uint64_t version, const SlotMap& primary);
  /// The same with the rest of a map: the slots being copied to their new primary (held by
  /// this server while it is that primary and the copy is not in: SlotImport) and the servers
  /// dense tables are spread over (RoutingMap::dense_servers; 0: num_servers).
  Status SetClusterMap(const RoutingMap& map);
  /// Where the server reads the newest stored cluster map (`load`: NotFound when none is
  /// stored; tessera-server --coordinator reads etcd). A forwarded push that names a map
  /// version ahead of the server's waits only until a read started after it came, on a
  /// thread of the server's, and is refused when that read found an older newest map (each
  /// map read is also served by, as SetClusterMap). Without a loader such a push waits its
  /// time limit. Once only (FailedPrecondition after); `load` runs until the server is
  /// destroyed, so it owns what it reads through. Thread-safe.
  Status SetClusterMapLoader(std::function<Result<RoutingMap>()> load);
  /// The version of the map the server serves by (0: none yet). Thread-safe.
  uint64_t cluster_map_version() const;

 private:
  explicit Server(std::unique_ptr<internal::ServerImpl> impl);
  std::unique_ptr<internal::ServerImpl> impl_;
};

}  // namespace tessera
