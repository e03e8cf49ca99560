// A server's controllers (scale.h): the background rebuild after a fail-over, --auto_join's
// scale, and the drain before it stops.
#include <zmq.h>

#include <sstream>
#include <string>
#include <utility>

#include "ps/control/background_run_internal.h"
#include "ps/control/scale.h"
#include "ps/coord/membership.h"
#include "ps/coord/slot_map_store.h"

namespace tessera {
namespace internal {

BackgroundRun::~BackgroundRun() {
  std::thread running;
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;  // no Kick starts a thread from now on
    running = std::move(thread_);
  }
  // Joined without mu_: a run that ends takes mu_ to see whether it is due again.
  if (running.joinable()) running.join();
}

void BackgroundRun::Kick() {
  std::lock_guard<std::mutex> l(mu_);
  if (stop_) return;
  again_ = true;
  if (running_) return;
  if (thread_.joinable()) thread_.join();
  running_ = true;
  thread_ = std::thread([this] { Loop(); });
}

void BackgroundRun::Loop() {
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

}  // namespace internal

namespace {

void Log(const ControlLog& log, ControlLogLevel level, const std::string& line) {
  if (log) log(level, line);
}

// The options of a run of a server's background controller: its pace, stop flag and name on
// the controller lock, which it does not wait for (it is kicked again while the work is due).
ScaleOptions BackgroundScaleOptions(const BackgroundControllerOptions& b,
                                    const std::atomic<bool>* stop) {
  ScaleOptions o;
  o.pace = b.pace;
  o.deadline = DeadlineAfterMs(10 * 60 * 1000);
  o.cancel = stop;
  o.controller_id = "server-" + std::to_string(b.server_id);
  o.controller_ttl_s = b.lock_ttl_s;
  o.wait_for_controller = false;
  return o;
}

// Logs a background run's failure: kDebug when another controller held the lock (the work is
// kicked again while it is due), else kWarning.
void LogControllerFailure(const ControlLog& log, const char* what, const Status& s,
                          const char* by_hand) {
  if (s.code() == StatusCode::kFailedPrecondition &&
      s.message().find("another controller") != std::string::npos) {
    Log(log, ControlLogLevel::kDebug, std::string(what) + ": " + s.ToString());
  } else {
    Log(log, ControlLogLevel::kWarning,
        std::string(what) + ": " + s.ToString() + " (" + by_hand + " does it by hand)");
  }
}

// A backup rebuild (docs/elasticity.md, "Backup rebuild"): after a promotion this server
// made, or when its fail-over watcher finds one due.
void RebuildNow(EtcdClient* etcd, const BackgroundControllerOptions& b,
                const std::atomic<bool>* stop) {
  auto r = RebuildBackups(*etcd, b.prefix, b.peer, BackgroundScaleOptions(b, stop));
  if (!r.ok()) {
    LogControllerFailure(b.log, "backup rebuild", r.status(), "tessera-ctl map rebuild");
  } else if (r->slots_backed > 0 || r->dense_parts_backed > 0) {
    std::ostringstream line;
    line << "backup rebuild: " << r->slots_backed << " slots and " << r->dense_parts_backed
         << " dense parts given a backup, map version " << r->from_version << " -> "
         << r->to_version << ", " << r->rows_ahead + r->rows_in_hold << " rows copied in "
         << r->seconds << " s, longest hold " << r->max_hold_ms << " ms";
    Log(b.log, ControlLogLevel::kInfo, line.str());
  }
}

// --auto_join: a scale to `servers` that takes in the servers registered under the next ids.
void JoinNow(EtcdClient* etcd, const BackgroundControllerOptions& b, uint32_t servers,
             const std::atomic<bool>* stop) {
  ScaleOptions o = BackgroundScaleOptions(b, stop);
  o.servers = servers;
  auto r = ScaleCluster(*etcd, b.prefix, b.peer, o);
  if (!r.ok()) {
    LogControllerFailure(b.log, "taking in new servers", r.status(), "tessera-ctl scale");
    return;
  }
  std::ostringstream line;
  line << "took in new servers: " << servers << " servers, " << r->slots_moved
       << " slots moved and " << r->slots_backed << " given a backup, map version "
       << r->from_version << " -> " << r->to_version << " in " << r->seconds << " s";
  Log(b.log, ControlLogLevel::kInfo, line.str());
}

}  // namespace

ClientOptions PeerClientOptions(const std::string& curve_secret_key,
                                const std::string& curve_peer_secret_key) {
  ClientOptions o;
  o.request_timeout_ms = 30000;
  if (!curve_secret_key.empty()) {
    char public_key[41] = {};
    if (zmq_curve_public(public_key, curve_secret_key.c_str()) == 0) {
      o.curve_server_key = std::string(public_key, 40);
      o.curve_client_secret_key =
          curve_peer_secret_key.empty() ? curve_secret_key : curve_peer_secret_key;
    }
  }
  return o;
}

BackgroundController::BackgroundController(EtcdClient* etcd, BackgroundControllerOptions options)
    : etcd_(etcd), options_(std::move(options)) {
  if (options_.rebuild_backups) {
    rebuild_ = std::make_unique<internal::BackgroundRun>(
        [this](const std::atomic<bool>* stop) { RebuildNow(etcd_, options_, stop); });
  }
  if (options_.auto_join) {
    join_ = std::make_unique<internal::BackgroundRun>([this](const std::atomic<bool>* stop) {
      JoinNow(etcd_, options_, join_servers_.load(), stop);
    });
  }
}

// The runs stop in the order Stop() stops them.
BackgroundController::~BackgroundController() { Stop(); }

void BackgroundController::Rebuild() {
  if (rebuild_) rebuild_->Kick();
}

void BackgroundController::Join(uint32_t servers) {
  join_servers_ = servers;
  if (join_) join_->Kick();
}

void BackgroundController::Stop() {
  rebuild_.reset();
  join_.reset();
}

void DrainServer(EtcdClient& etcd, Membership& membership, const DrainOptions& d) {
  SlotMapStore store(&etcd, d.prefix);
  auto map = store.Load();
  if (!map.ok()) {
    Log(d.log, ControlLogLevel::kWarning,
        "cannot read the map, leaving undrained: " + map.status().ToString());
    return;
  }
  uint32_t live = 0, highest = 0;
  for (uint32_t id = 0; id < map->servers.size(); ++id) {
    if (map->servers[id].address.empty()) continue;
    ++live;
    highest = id;
  }
  const std::string self = std::to_string(d.server_id);
  if (live < 2 || highest != d.server_id) {
    Log(d.log, ControlLogLevel::kInfo,
        "not draining: server " + self +
            (live < 2 ? " is the last one"
                      : " is not the highest live id (" + std::to_string(highest) + ")"));
    return;
  }
  // Marked leaving first: no --auto_join watcher takes the id back, no rebuild picks it.
  if (Status s = membership.MarkLeaving(); !s.ok()) {
    Log(d.log, ControlLogLevel::kWarning, s.ToString() + "; draining anyway");
  }
  ScaleOptions o;
  o.servers = live - 1;
  o.deadline = DeadlineAfterMs(d.timeout_s * 1000);
  o.controller_id = "server-" + self + "-drain";
  o.controller_ttl_s = d.lock_ttl_s;
  o.wait_for_controller = true;
  Log(d.log, ControlLogLevel::kInfo,
      "moving server " + self + "'s slots to the other " + std::to_string(o.servers) + " servers");
  auto r = ScaleCluster(etcd, d.prefix, d.peer, o);
  if (!r.ok()) {
    Log(d.log, ControlLogLevel::kWarning,
        "the drain failed, leaving undrained: " + r.status().ToString());
    return;
  }
  std::ostringstream line;
  line << "drained: " << r->slots_moved << " slots and " << r->dense_parts_moved
       << " dense parts moved, " << r->slots_backed << " slots given a backup, map version "
       << r->from_version << " -> " << r->to_version << " in " << r->seconds << " s";
  Log(d.log, ControlLogLevel::kInfo, line.str());
}

}  // namespace tessera
