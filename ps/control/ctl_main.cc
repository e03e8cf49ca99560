// tessera-ctl: operations on a running Tessera cluster.
#include <gflags/gflags.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "ps/cli.h"
#include "ps/client/client.h"
#include "ps/curve.h"
#include "ps/routing.h"
#ifdef TESSERA_CTL_COORD
#include "ps/control/scale.h"
#include "ps/coord/cluster_map.h"
#include "ps/coord/coordinator_url.h"
#include "ps/coord/etcd_map_source.h"
#include "ps/coord/membership.h"
#include "ps/coord/slot_map_store.h"
#endif

DEFINE_string(cluster, "", "Server endpoints in rank order, comma-separated, or @FILE");
DEFINE_int64(timeout_s, 3600, "Give up after this many seconds");
DEFINE_bool(delta, false, "export: only the rows updated since the previous export");
DEFINE_string(admin_root, "",
              "The servers' --admin_root as this machine sees it (the same shared directory): "
              "checkpoint and export write their marker files there. NAMEs are relative to it");
DEFINE_string(curve_server_key_file, "",
              "File holding the servers' CurveZMQ public key, for clusters started with "
              "--curve_secret_key_file");
DEFINE_string(curve_client_key_file, "",
              "File holding this tool's own CurveZMQ secret key (tessera-ctl keygen DIR "
              "--key_name=admin): a key in the servers' --admin_clients may checkpoint, "
              "restore, export and move slots; without it the tool uses a fresh key, which "
              "the servers give no admin rights");
DEFINE_string(key_name, "server",
              "keygen: the key pair's file names, DIR/NAME.key and DIR/NAME.pub (server, peer "
              "for --curve_peer_key_file, admin, or a client's name)");
DEFINE_string(coordinator, "",
              "map: etcd://HOST:PORT/PREFIX, the etcd and key prefix of the cluster's map "
              "(docs/elasticity.md); etcd://USER@HOST:PORT/PREFIX: as etcd user USER, password read "
              "from the file $TESSERA_ETCD_PASSWORD_FILE names");
DEFINE_string(servers, "",
              "map init: the servers' endpoints in server-id order, comma-separated, or @FILE "
              "(each server's --cluster entry; server id = its --rank)");
DEFINE_uint32(replication, 1,
              "map init: copies of each slot and dense part: 1 (none) or 2 (each also gets a "
              "backup, the next server id after its primary, which takes its pushes before "
              "they are acknowledged; needs at least 2 servers)");
DEFINE_double(pace, 0.5,
              "scale: share of wall time spent moving; after each batch the controller waits "
              "so that training gets the servers' cores in between (1: no pause)");
DEFINE_uint32(batch_slots, 1024,
              "scale: slots moved per map flip (requests for a moving slot wait while its "
              "batch is copied)");

namespace {

constexpr char kCommands[] =
    "Commands:\n"
    "  checkpoint NAME  consistent checkpoint of the whole cluster into NAME\n"
    "                   (checkpoint, restore, export, stats and tables take --cluster or\n"
    "                   --coordinator; with --coordinator they run at one map version,\n"
    "                   holding the controller lock against scale and map rebuild)\n"
    "  restore NAME     load a checkpoint (taken by a cluster of any size)\n"
    "  export NAME      versioned serving export (values only) under NAME;\n"
    "                   --delta for the rows updated since the previous one\n"
    "                   NAMEs are relative to the servers' --admin_root; checkpoint\n"
    "                   and export need --admin_root (this machine's view of it)\n"
    "  stats            every server's counters\n"
    "  tables           the tables and their specs\n"
    "  keygen DIR       write a CurveZMQ key pair: DIR/server.key (secret, for\n"
    "                   --curve_secret_key_file) and DIR/server.pub (public);\n"
    "                   --key_name=NAME: DIR/NAME.key and DIR/NAME.pub (peer, admin, ...)\n"
    "  map init         create the cluster map PREFIX/slotmap of --coordinator: version 1,\n"
    "                   --servers owning uniform slot ranges; fails if a map exists;\n"
    "                   --replication=2: each slot's and dense part's backup is the\n"
    "                   next server\n"
    "  map show         print the cluster map of --coordinator\n"
    "  map rebuild      give every slot of a registered primary that has no backup one (the\n"
    "                   next registered server), copying its rows while clients train: run\n"
    "                   after a fail-over (servers do it themselves after promoting)\n"
    "  scale N          move slots online so that N servers share them evenly: adds\n"
    "                   servers registered with --coordinator (tessera-server --rank=ID\n"
    "                   --coordinator=...), drains and retires the highest ids; with\n"
    "                   backups, every slot and dense part keeps one\n";

constexpr tessera::cli::ToolInfo kTool{
    .name = "tessera-ctl",
    .usage = "usage: tessera-ctl (--cluster=EPS | --coordinator=URL) [--admin_root=DIR] COMMAND "
             "[ARGS]\n"
             "Operations on a running Tessera cluster.",
    .flags_file = __FILE__,
    .epilog = kCommands,
    .positional_args = true};

// A command and how many arguments it takes.
struct Command {
  const char* name;
  int args;
};
constexpr Command kCommandList[] = {{"checkpoint", 1}, {"restore", 1}, {"export", 1},
                                    {"stats", 0},      {"tables", 0},  {"keygen", 1},
                                    {"map", 1},        {"scale", 1}};

// Prints `why` (if any), the usage line and the commands to stderr; returns 2.
int Usage(const std::string& why = "") {
  if (!why.empty()) std::fprintf(stderr, "tessera-ctl: %s\n", why.c_str());
  std::fprintf(stderr, "%.*s\n\n%s(flags: tessera-ctl --help)\n",
               static_cast<int>(kTool.usage.size()), kTool.usage.data(), kCommands);
  return 2;
}

// The command line's command; null (after Usage) when it is missing, unknown or has the wrong
// number of arguments.
const Command* FindCommand(int argc, char** argv) {
  if (argc < 2) {
    Usage("missing command");
    return nullptr;
  }
  const std::string cmd = argv[1];
  for (const Command& c : kCommandList) {
    if (cmd != c.name) continue;
    if (argc - 2 != c.args) {
      Usage(cmd + (c.args == 0 ? " takes no argument" : " takes one argument"));
      return nullptr;
    }
    return &c;
  }
  Usage("unknown command '" + cmd + "'");
  return nullptr;
}

// keygen DIR: writes DIR/NAME.key (secret) and DIR/NAME.pub (public), NAME = --key_name.
int Keygen(const std::string& dir) {
  const std::string& name = FLAGS_key_name;
  if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..") {
    return Usage("--key_name must be a file name without '/', got '" + name + "'");
  }
  auto kp = tessera::GenerateCurveKeyPair();
  if (!kp.ok()) {
    std::fprintf(stderr, "tessera-ctl: %s\n", kp.status().ToString().c_str());
    return 1;
  }
  const std::string sec = dir + "/" + name + ".key", pub = dir + "/" + name + ".pub";
  FILE* f = std::fopen(sec.c_str(), "w");
  FILE* g = std::fopen(pub.c_str(), "w");
  if (f == nullptr || g == nullptr) {
    std::fprintf(stderr, "tessera-ctl: cannot write keys into %s\n", dir.c_str());
    if (f) std::fclose(f);
    if (g) std::fclose(g);
    return 1;
  }
  fchmod(fileno(f), 0600);
  std::fprintf(f, "%s\n", kp->secret_key.c_str());
  std::fprintf(g, "%s\n", kp->public_key.c_str());
  std::fclose(f);
  std::fclose(g);
  std::printf("wrote %s (secret) and %s (public)\n", sec.c_str(), pub.c_str());
  return 0;
}

// Client options from the flags (--curve_server_key_file, --timeout_s, --admin_root); false
// after printing why the key file could not be read.
bool BaseOptions(tessera::ClientOptions* o) {
  if (!FLAGS_curve_server_key_file.empty()) {
    auto key = tessera::ReadCurveKeyFile(FLAGS_curve_server_key_file);
    if (!key.ok()) {
      std::fprintf(stderr, "tessera-ctl: %s\n", key.status().ToString().c_str());
      return false;
    }
    o->curve_server_key = *key;
  }
  if (!FLAGS_curve_client_key_file.empty()) {
    auto key = tessera::ReadCurveKeyFile(FLAGS_curve_client_key_file);
    if (!key.ok()) {
      std::fprintf(stderr, "tessera-ctl: --curve_client_key_file: %s\n",
                   key.status().ToString().c_str());
      return false;
    }
    o->curve_client_secret_key = *key;
  }
  o->request_timeout_ms = FLAGS_timeout_s * 1000;
  o->admin_root = FLAGS_admin_root;
  return true;
}

// A client of the servers `eps`. On failure prints why and returns null with the exit status
// in *exit_code.
std::unique_ptr<tessera::Client> Connect(const std::vector<std::string>& eps, int* exit_code) {
  tessera::ClientOptions o;
  o.servers = eps;
  if (!BaseOptions(&o)) {
    *exit_code = 2;
    return nullptr;
  }
  auto client = tessera::Client::Create(o);
  if (!client.ok()) {
    std::fprintf(stderr, "tessera-ctl: %s\n", client.status().ToString().c_str());
    *exit_code = 1;
    return nullptr;
  }
  return std::move(*client);
}

// Seconds since `t0`.
double SecondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// checkpoint DIR / restore DIR.
int CheckpointOrRestore(tessera::Client& c, const std::string& cmd, const std::string& dir,
                        tessera::Deadline deadline, std::chrono::steady_clock::time_point t0) {
  if (cmd == "checkpoint") {
    auto cut = c.Checkpoint(dir, deadline);
    if (!cut.ok()) {
      std::fprintf(stderr, "tessera-ctl: checkpoint failed: %s\n", cut.status().ToString().c_str());
      return 1;
    }
    std::printf("checkpoint written to %s at clock %lld in %.3f s\n", dir.c_str(),
                static_cast<long long>(*cut), SecondsSince(t0));
  } else {
    auto s = c.Restore(dir, deadline);
    if (!s.ok()) {
      std::fprintf(stderr, "tessera-ctl: restore failed: %s\n", s.ToString().c_str());
      return 1;
    }
    std::printf("restored %s onto %zu servers in %.3f s\n", dir.c_str(), c.server_ids().size(),
                SecondsSince(t0));
  }
  return 0;
}

// export ROOT.
int Export(tessera::Client& c, const char* root, tessera::Deadline deadline,
           std::chrono::steady_clock::time_point t0) {
  auto v = c.Export(root, FLAGS_delta, deadline);
  if (!v.ok()) {
    std::fprintf(stderr, "tessera-ctl: export failed: %s\n", v.status().ToString().c_str());
    return 1;
  }
  std::printf("export v%llu (%s) written to %s/v%llu in %.3f s\n",
              static_cast<unsigned long long>(*v), FLAGS_delta ? "delta" : "full", root,
              static_cast<unsigned long long>(*v), SecondsSince(t0));
  return 0;
}

// stats (every server's counters) / tables (the table lines of the first server's stats).
// `addresses`: each server id's endpoint.
int StatsOrTables(tessera::Client& c, const std::string& cmd,
                  const std::vector<std::string>& addresses, tessera::Deadline deadline) {
  const std::vector<uint32_t> ids = c.server_ids();
  for (uint32_t r : ids) {
    auto st = c.ServerStats(r, deadline);
    if (!st.ok()) {
      std::fprintf(stderr, "tessera-ctl: server %u: %s\n", r, st.status().ToString().c_str());
      return 1;
    }
    if (cmd == "stats") {
      std::printf("--- server %u (%s)\n%s", r, r < addresses.size() ? addresses[r].c_str() : "",
                  st->c_str());
    } else if (r == ids.front()) {
      std::istringstream in(*st);
      std::string line;
      while (std::getline(in, line)) {
        if (line.rfind("table ", 0) == 0) std::printf("%s\n", line.substr(6).c_str());
      }
    }
  }
  return 0;
}

// checkpoint, restore, export, stats or tables (`arg`: the NAME of the first three).
int RunDataCommand(tessera::Client& c, const std::string& cmd, const char* arg,
                   const std::vector<std::string>& addresses) {
  const auto deadline = tessera::DeadlineAfterMs(FLAGS_timeout_s * 1000);
  const auto t0 = std::chrono::steady_clock::now();
  if (cmd == "checkpoint" || cmd == "restore") {
    return CheckpointOrRestore(c, cmd, arg, deadline, t0);
  }
  if (cmd == "export") return Export(c, arg, deadline, t0);
  return StatsOrTables(c, cmd, addresses, deadline);
}

#ifdef TESSERA_CTL_COORD
// The etcd client of --coordinator for command `what`; null after printing why, with the exit
// status in *exit_code (2: a usage error, 1: etcd unusable).
std::unique_ptr<tessera::EtcdClient> OpenCoordinator(const std::string& what,
                                                     tessera::CoordinatorUrl* url,
                                                     int* exit_code) {
  *exit_code = 2;
  if (FLAGS_coordinator.empty()) {
    Usage(what + " needs --coordinator");
    return nullptr;
  }
  auto parsed = tessera::CoordinatorUrl::Parse(FLAGS_coordinator);
  if (!parsed.ok()) {
    Usage("--coordinator: " + parsed.status().ToString());
    return nullptr;
  }
  *url = *parsed;
  auto etcd = tessera::EtcdClient::Create(url->etcd_options());
  if (!etcd.ok()) {
    std::fprintf(stderr, "tessera-ctl: %s\n", etcd.status().ToString().c_str());
    *exit_code = 1;
    return nullptr;
  }
  return std::move(*etcd);
}
#endif

#ifdef TESSERA_CTL_COORD
// map init: creates version 1 of the map of --servers with --replication copies of each slot.
int MapInit(tessera::SlotMapStore& store, const std::vector<std::string>& eps) {
  std::vector<tessera::MapServer> servers;
  for (size_t i = 0; i < eps.size(); ++i) {
    servers.push_back({"server-" + std::to_string(i), eps[i]});
  }
  auto map = tessera::ClusterMap::Replicated(std::move(servers), FLAGS_replication);
  if (!map.ok()) return Usage("--replication: " + map.status().message());
  tessera::Status s = store.Create(*map);
  if (!s.ok()) {
    std::fprintf(stderr, "tessera-ctl: map init: %s\n", s.ToString().c_str());
    return 1;
  }
  std::printf("cluster map version 1 of %zu server(s) created at %s%s\n", eps.size(),
              store.key().c_str(),
              FLAGS_replication == 2
                  ? " (replication 2: each slot's and dense part's backup is the next server)"
                  : "");
  return 0;
}

// map show: the version and replication factor, then per server id its member id, address and how many slots it is
// primary and backup of, then how many slots have a backup, and how many are being copied (a
// move or a fill under way, or left by a controller that died), then (a map with dense
// replication or moved dense parts) each dense part's primary and backup (-1: none), and the
// server each part is being copied from while any is.
int MapShow(tessera::SlotMapStore& store) {
  auto map = store.Load();
  if (!map.ok()) {
    std::fprintf(stderr, "tessera-ctl: map show: %s\n", map.status().ToString().c_str());
    return 1;
  }
  std::vector<uint32_t> slots(map->servers.size(), 0), backups(map->servers.size(), 0);
  uint32_t backed = 0;
  for (uint16_t p : map->primary) ++slots[p];
  for (uint16_t b : map->backup) {
    if (b == tessera::ClusterMap::kNoServer) continue;
    ++backups[b];
    ++backed;
  }
  std::printf("version %llu\nreplication %u\n", static_cast<unsigned long long>(map->version),
              map->replication);
  for (size_t i = 0; i < map->servers.size(); ++i) {
    std::printf("server %zu %s %s primary_slots %u backup_slots %u\n", i,
                map->servers[i].id.c_str(),
                map->servers[i].address.empty() ? "(retired)" : map->servers[i].address.c_str(),
                slots[i], backups[i]);
  }
  std::printf("slots_with_backup %u of %u\n", backed, tessera::kNumSlots);
  const auto copying = static_cast<uint32_t>(
      std::count_if(map->importing.begin(), map->importing.end(),
                    [](uint16_t s) { return s != tessera::ClusterMap::kNoServer; }));
  if (copying > 0) {
    std::printf("slots_being_copied %u (a move or backup fill; tessera-ctl scale finishes one "
                "left unfinished)\n", copying);
  }
  if (!map->dense_primary.empty() || !map->dense_backup.empty()) {
    auto ids = [&](const std::vector<uint16_t>& list, bool identity) {
      std::string out;
      for (uint32_t part = 0; part < map->dense_servers; ++part) {
        const uint16_t id = list.empty() ? (identity ? static_cast<uint16_t>(part)
                                                     : tessera::ClusterMap::kNoServer)
                                         : list[part];
        out += (part == 0 ? "" : ",") + (id == tessera::ClusterMap::kNoServer
                                             ? std::string("-1")
                                             : std::to_string(id));
      }
      return out;
    };
    std::printf("dense_parts primary %s backup %s%s\n", ids(map->dense_primary, true).c_str(),
                ids(map->dense_backup, false).c_str(),
                map->dense_importing.empty()
                    ? ""
                    : (" copying_from " + ids(map->dense_importing, false)).c_str());
  }
  return 0;
}

// map rebuild: a backup for every slot of a registered primary that has none.
// The controller's options of `scale` and `map rebuild`: --batch_slots, --pace, --timeout_s,
// a line per batch on stdout.
tessera::ScaleOptions ControllerOptions() {
  tessera::ScaleOptions o;
  o.batch_slots = FLAGS_batch_slots;
  o.pace = FLAGS_pace;
  o.deadline = tessera::DeadlineAfterMs(FLAGS_timeout_s * 1000);
  o.log = stdout;
  return o;
}

int MapRebuild(tessera::EtcdClient& etcd, const tessera::CoordinatorUrl& url) {
  tessera::ClientOptions base;
  if (!BaseOptions(&base)) return 2;
  const tessera::ScaleOptions o = ControllerOptions();
  auto r = tessera::RebuildBackups(etcd, url.prefix, base, o);
  if (!r.ok()) {
    std::fprintf(stderr, "tessera-ctl: map rebuild: %s\n", r.status().ToString().c_str());
    return 1;
  }
  std::printf("rebuilt backups: map version %llu -> %llu, %u slots given a backup in %u "
              "batches, %u dense parts, %.2f s: %llu rows copied ahead, %llu during holds "
              "(%.1f MB); longest hold %.1f ms\n",
              static_cast<unsigned long long>(r->from_version),
              static_cast<unsigned long long>(r->to_version), r->slots_backed, r->batches,
              r->dense_parts_backed,
              r->seconds, static_cast<unsigned long long>(r->rows_ahead),
              static_cast<unsigned long long>(r->rows_in_hold), r->bytes_moved / 1e6,
              r->max_hold_ms);
  return 0;
}
#endif

// A data command on the cluster of --coordinator (needs tessera_coord): a client that follows
// its map. checkpoint, restore and export hold the controller lock for their run, so no
// scale or map rebuild moves slots under them (a fail-over still may: the servers refuse the
// request and the client takes it again at the new map version).
int DataCommandOnMap(const std::string& cmd, const char* arg) {
#ifdef TESSERA_CTL_COORD
  tessera::CoordinatorUrl url;
  int exit_code = 0;
  auto etcd = OpenCoordinator(cmd, &url, &exit_code);
  if (etcd == nullptr) return exit_code;
  tessera::ClientOptions o;
  if (!BaseOptions(&o)) return 2;
  auto source = tessera::EtcdClusterMapSource::Create(url);
  tessera::Result<tessera::RoutingMap> map =
      source.ok() ? (*source)->Load() : tessera::Result<tessera::RoutingMap>(source.status());
  std::unique_ptr<tessera::Membership> lock;
  if (map.ok() && cmd != "stats" && cmd != "tables") {
    auto held = tessera::LockController(etcd.get(), url.prefix, "tessera-ctl-" + cmd, 10, true,
                                        tessera::DeadlineAfterMs(FLAGS_timeout_s * 1000));
    if (!held.ok()) map = held.status();
    if (held.ok()) lock = std::move(*held);
  }
  if (!map.ok()) {
    std::fprintf(stderr, "tessera-ctl: %s: %s\n", cmd.c_str(), map.status().ToString().c_str());
    return 1;
  }
  auto client = tessera::Client::Create(o, std::move(*source));
  if (!client.ok()) {
    std::fprintf(stderr, "tessera-ctl: %s\n", client.status().ToString().c_str());
    return 1;
  }
  return RunDataCommand(**client, cmd, arg, map->addresses);
#else
  (void)arg;
  std::fprintf(stderr, "tessera-ctl: %s --coordinator: this build has no tessera_coord (a "
                       "client-only build): use a full build's tessera-ctl\n", cmd.c_str());
  return 2;
#endif
}

// map init / map show / map rebuild (needs tessera_coord, absent from a client-only build).
int Map(const std::string& sub) {
#ifdef TESSERA_CTL_COORD
  if (sub != "init" && sub != "show" && sub != "rebuild") {
    return Usage("map takes init, show or rebuild, got '" + sub + "'");
  }
  std::vector<std::string> eps;
  if (sub == "init") {
    auto parsed = tessera::ParseClusterList(FLAGS_servers);
    if (!parsed.ok()) return Usage("--servers: " + parsed.status().ToString());
    eps = std::move(*parsed);
    // Usage errors before etcd is asked anything.
    if (FLAGS_replication != 1 && FLAGS_replication != 2) {
      return Usage("--replication must be 1 or 2, got " + std::to_string(FLAGS_replication));
    }
    if (FLAGS_replication == 2 && eps.size() < 2) {
      return Usage("--replication=2 needs at least 2 --servers, got " +
                   std::to_string(eps.size()));
    }
  }
  tessera::CoordinatorUrl url;
  int exit_code = 0;
  auto etcd = OpenCoordinator("map " + sub, &url, &exit_code);
  if (etcd == nullptr) return exit_code;
  if (sub == "rebuild") return MapRebuild(*etcd, url);
  tessera::SlotMapStore store(etcd.get(), url.prefix);
  return sub == "init" ? MapInit(store, eps) : MapShow(store);
#else
  (void)sub;
  std::fprintf(stderr, "tessera-ctl: map: this build has no tessera_coord (a client-only "
                       "build): use a full build's tessera-ctl\n");
  return 2;
#endif
}

// scale N (needs tessera_coord).
int Scale(const std::string& arg) {
#ifdef TESSERA_CTL_COORD
  char* end = nullptr;
  const unsigned long n = std::strtoul(arg.c_str(), &end, 10);
  if (arg.empty() || *end != '\0' || n == 0 || n > 65534) {
    return Usage("scale takes a number of servers in 1..65534, got '" + arg + "'");
  }
  tessera::CoordinatorUrl url;
  int exit_code = 0;
  auto etcd = OpenCoordinator("scale", &url, &exit_code);
  if (etcd == nullptr) return exit_code;
  tessera::ClientOptions base;
  if (!BaseOptions(&base)) return 2;
  tessera::ScaleOptions o = ControllerOptions();
  o.servers = static_cast<uint32_t>(n);
  auto r = tessera::ScaleCluster(*etcd, url.prefix, base, o);
  if (!r.ok()) {
    std::fprintf(stderr, "tessera-ctl: scale: %s\n", r.status().ToString().c_str());
    return 1;
  }
  std::printf("scaled to %lu servers: map version %llu -> %llu, %u slots moved and %u given "
              "a backup in %u flips, %u dense parts moved, %.2f s: %llu rows copied ahead, "
              "%llu during holds (%.1f MB); longest hold %.1f ms\n",
              n, static_cast<unsigned long long>(r->from_version),
              static_cast<unsigned long long>(r->to_version), r->slots_moved, r->slots_backed,
              r->batches, r->dense_parts_moved,
              r->seconds, static_cast<unsigned long long>(r->rows_ahead),
              static_cast<unsigned long long>(r->rows_in_hold), r->bytes_moved / 1e6,
              r->max_hold_ms);
  return 0;
#else
  (void)arg;
  std::fprintf(stderr, "tessera-ctl: scale: this build has no tessera_coord (a client-only "
                       "build): use a full build's tessera-ctl\n");
  return 2;
#endif
}

}  // namespace

int main(int argc, char** argv) {
  tessera::cli::ParseCommandLine(kTool, &argc, &argv);
  const Command* command = FindCommand(argc, argv);
  if (command == nullptr) return 2;
  const std::string cmd = command->name;
  if (cmd == "keygen") return Keygen(argv[2]);
  if (cmd == "map") return Map(argv[2]);
  if (cmd == "scale") return Scale(argv[2]);
  const char* arg = command->args == 1 ? argv[2] : "";
  if (!FLAGS_coordinator.empty()) {
    if (!FLAGS_cluster.empty()) {
      return Usage("--cluster and --coordinator both name the cluster: give one");
    }
    return DataCommandOnMap(cmd, arg);
  }
  auto eps = tessera::ParseClusterList(FLAGS_cluster);
  if (!eps.ok()) {
    std::fprintf(stderr, "tessera-ctl: --cluster: %s\n", eps.status().ToString().c_str());
    return 2;
  }
  int exit_code = 0;
  std::unique_ptr<tessera::Client> client = Connect(*eps, &exit_code);
  if (client == nullptr) return exit_code;
  return RunDataCommand(*client, cmd, arg, *eps);
}
