// The deployment files against the code they deploy (label deploy): deploy/k8s/*.yaml parsed with
// yaml-cpp (kinds, probes, metrics port, annotations, securityContext, resources, the disruption
// budget, the counts the comments say must agree, and every flag passed to tessera-server and
// tessera-worker against the flags the built binaries know), deploy/Dockerfile (its CMake options
// exist, its user is the manifests' runAsUser, its binaries are on PATH) and
// deploy/grafana/tessera-dashboard.json (every tessera_ metric it queries is served by a running
// tessera-server or tessera-worker).
#include <yaml-cpp/yaml.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/cluster_fixture.h"

namespace {

namespace fs = std::filesystem;
using tessera::testing::HttpGet;
using tessera::testing::PickFreePort;
using tessera::testing::RunCommand;

const fs::path kSource = TESSERA_SOURCE_DIR;
const fs::path kManifests = kSource / "deploy" / "k8s";

std::string ReadFile(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

struct Doc {
  std::string file;
  YAML::Node node;
};

// Every document of every deploy/k8s/*.yaml (or of `dir`), in file order; a parse error fails
// the test.
std::vector<Doc> LoadManifests(const fs::path& dir = kManifests) {
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir)) {
    const fs::path ext = e.path().extension();
    if (ext == ".yaml" || ext == ".yml") files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  std::vector<Doc> docs;
  for (const auto& f : files) {
    try {
      for (const YAML::Node& n : YAML::LoadAllFromFile(f.string())) {
        if (!n.IsNull()) docs.push_back({f.filename().string(), n});
      }
    } catch (const YAML::Exception& e) {
      ADD_FAILURE() << f.filename() << " does not parse: " << e.what();
    }
  }
  return docs;
}

// The one document of `kind` (failing the test when there is none or several).
YAML::Node Find(const std::vector<Doc>& docs, const std::string& kind) {
  YAML::Node found;
  int n = 0;
  for (const Doc& d : docs) {
    if (d.node["kind"] && d.node["kind"].as<std::string>() == kind) {
      found = d.node;
      ++n;
    }
  }
  EXPECT_EQ(n, 1) << "documents of kind " << kind;
  return found;
}

YAML::Node Container(const YAML::Node& workload, const std::string& name) {
  for (const YAML::Node& c : workload["spec"]["template"]["spec"]["containers"]) {
    if (c["name"].as<std::string>() == name) return c;
  }
  ADD_FAILURE() << "no container " << name << " in " << workload["kind"].as<std::string>();
  return YAML::Node();
}

// The containers and init containers of a workload's pod template.
std::vector<YAML::Node> AllContainers(const YAML::Node& workload) {
  std::vector<YAML::Node> out;
  const YAML::Node pod = workload["spec"]["template"]["spec"];
  for (const char* key : {"initContainers", "containers"}) {
    if (pod[key]) {
      for (const YAML::Node& c : pod[key]) out.push_back(c);
    }
  }
  return out;
}

// The start script of a container: its `args` joined.
std::string Script(const YAML::Node& container) {
  std::string s;
  for (const YAML::Node& a : container["args"]) s += a.as<std::string>() + "\n";
  return s;
}

// The names of the --flags of the `exec PROGRAM ...` command in `script` (its backslash-continued
// lines), in order.
std::vector<std::string> ExecFlags(const std::string& script, const std::string& program) {
  const size_t at = script.find("exec " + program);
  if (at == std::string::npos) return {};
  std::string command;
  std::istringstream lines(script.substr(at));
  for (std::string line; std::getline(lines, line);) {
    const bool more = !line.empty() && line.back() == '\\';
    command += (more ? line.substr(0, line.size() - 1) : line) + " ";
    if (!more) break;
  }
  std::vector<std::string> flags;
  std::istringstream words(command);
  for (std::string w; words >> w;) {
    if (w.rfind("--", 0) == 0) flags.push_back(w.substr(2, w.find('=') - 2));
  }
  return flags;
}

// The flag names `binary --helpfull` lists (gflags' "    -name (description)" lines).
std::set<std::string> BinaryFlags(const std::string& binary) {
  std::string out;
  const int rc = RunCommand({binary, "--helpfull"}, &out);
  EXPECT_EQ(rc, 0) << binary << " --helpfull: " << out.substr(0, 500);
  std::set<std::string> flags;
  static const std::regex kFlag(R"(^    -([A-Za-z0-9_]+) \()");
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    std::smatch m;
    if (std::regex_search(line, m, kFlag)) flags.insert(m[1]);
  }
  return flags;
}

// The value of `--NAME=VALUE` in `script` ("" when absent).
std::string FlagValue(const std::string& script, const std::string& name) {
  std::smatch m;
  const std::regex re("--" + name + "=([^ \\\\\\n]+)");
  return std::regex_search(script, m, re) ? std::string(m[1]) : std::string();
}

// The containerPort of the port named `name`, or -1.
int NamedPort(const YAML::Node& container, const std::string& name) {
  for (const YAML::Node& p : container["ports"]) {
    if (p["name"] && p["name"].as<std::string>() == name) return p["containerPort"].as<int>();
  }
  return -1;
}

std::string EnvValue(const YAML::Node& container, const std::string& name) {
  for (const YAML::Node& e : container["env"]) {
    if (e["name"].as<std::string>() == name && e["value"]) return e["value"].as<std::string>();
  }
  return "";
}

// ---------------------------------------------------------------- manifests

TEST(DeployManifests, EveryDocumentParsesWithApiVersionKindAndName) {
  const std::vector<Doc> docs = LoadManifests();
  ASSERT_GE(docs.size(), 5u);
  for (const Doc& d : docs) {
    ASSERT_TRUE(d.node.IsMap()) << d.file;
    EXPECT_TRUE(d.node["apiVersion"]) << d.file;
    ASSERT_TRUE(d.node["kind"]) << d.file;
    EXPECT_TRUE(d.node["metadata"]["name"]) << d.file << " " << d.node["kind"].as<std::string>();
  }
}

TEST(DeployManifests, KindsPresent) {
  std::multiset<std::string> kinds;
  for (const Doc& d : LoadManifests()) kinds.insert(d.node["kind"].as<std::string>());
  for (const char* k : {"Service", "PersistentVolumeClaim", "StatefulSet", "PodDisruptionBudget",
                        "Job"}) {
    EXPECT_EQ(kinds.count(k), 1u) << k;
  }
}

// startupProbe and readinessProbe on /readyz, livenessProbe on /healthz, all on the port named
// metrics, whose number is the server's --metrics_port.
TEST(DeployManifests, ServerProbesUseTheMetricsEndpoint) {
  const std::vector<Doc> docs = LoadManifests();
  const YAML::Node server = Container(Find(docs, "StatefulSet"), "server");
  ASSERT_TRUE(server);
  const std::string port = FlagValue(Script(server), "metrics_port");
  ASSERT_FALSE(port.empty()) << "tessera-server gets no --metrics_port";
  EXPECT_EQ(NamedPort(server, "metrics"), std::stoi(port))
      << "the port named metrics vs --metrics_port";
  for (auto [probe, path] : {std::pair{"startupProbe", "/readyz"},
                             std::pair{"readinessProbe", "/readyz"},
                             std::pair{"livenessProbe", "/healthz"}}) {
    const YAML::Node p = server[probe];
    ASSERT_TRUE(p) << "no " << probe;
    ASSERT_TRUE(p["httpGet"]) << probe << " is not an HTTP probe";
    EXPECT_EQ(p["httpGet"]["path"].as<std::string>(), path) << probe;
    EXPECT_EQ(p["httpGet"]["port"].as<std::string>(), "metrics") << probe;
    EXPECT_FALSE(p["tcpSocket"]) << probe;
  }
  // Recovery replays the request log: the liveness probe must not kill a server before the
  // startup probe has given it minutes.
  const YAML::Node s = server["startupProbe"];
  const int period = s["periodSeconds"] ? s["periodSeconds"].as<int>() : 10;
  const int failures = s["failureThreshold"] ? s["failureThreshold"].as<int>() : 3;
  EXPECT_GE(period * failures, 600) << "startupProbe allows only " << period * failures << " s";
}

// prometheus.io/{scrape,port,path} on both pod templates, port = --metrics_port = port metrics,
// and a --metrics_address that other hosts reach.
TEST(DeployManifests, PrometheusAnnotationsMatchTheMetricsPort) {
  const std::vector<Doc> docs = LoadManifests();
  for (auto [kind, name, program] : {std::tuple{"StatefulSet", "server", "tessera-server"},
                                     std::tuple{"Job", "worker", "tessera-worker"}}) {
    SCOPED_TRACE(kind);
    const YAML::Node w = Find(docs, kind);
    const YAML::Node c = Container(w, name);
    ASSERT_TRUE(c);
    const std::string port = FlagValue(Script(c), "metrics_port");
    ASSERT_FALSE(port.empty()) << program << " gets no --metrics_port";
    EXPECT_NE(port, "0");
    EXPECT_EQ(NamedPort(c, "metrics"), std::stoi(port));
    // Probes and scrapes come from outside the pod: the default address, 127.0.0.1, would
    // refuse them all (the liveness probe would restart every pod).
    const std::string address = FlagValue(Script(c), "metrics_address");
    EXPECT_FALSE(address.empty() || address == "127.0.0.1" || address == "localhost")
        << program << " serves its metrics port on 127.0.0.1 only (--metrics_address='"
        << address << "'): the kubelet and Prometheus cannot reach it";
    const YAML::Node a = w["spec"]["template"]["metadata"]["annotations"];
    ASSERT_TRUE(a) << "no pod annotations";
    EXPECT_EQ(a["prometheus.io/scrape"].as<std::string>(""), "true");
    EXPECT_EQ(a["prometheus.io/port"].as<std::string>(""), port);
    EXPECT_EQ(a["prometheus.io/path"].as<std::string>(""), "/metrics");
  }
}

// Non-root as the image's uid, no privilege escalation, no capabilities, a read-only root
// filesystem with an emptyDir where the start scripts write (/tmp).
TEST(DeployManifests, SecurityContextsRunAsTheImageUser) {
  const std::string dockerfile = ReadFile(kSource / "deploy" / "Dockerfile");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(dockerfile, m, std::regex(R"(\nUSER ([0-9]+))")))
      << "the Dockerfile has no numeric USER";
  const int image_uid = std::stoi(m[1]);
  EXPECT_NE(image_uid, 0);
  const std::vector<Doc> docs = LoadManifests();
  for (const char* kind : {"StatefulSet", "Job"}) {
    SCOPED_TRACE(kind);
    const YAML::Node w = Find(docs, kind);
    const YAML::Node pod = w["spec"]["template"]["spec"];
    const YAML::Node psc = pod["securityContext"];
    ASSERT_TRUE(psc) << "no pod securityContext";
    EXPECT_TRUE(psc["runAsNonRoot"].as<bool>(false));
    EXPECT_EQ(psc["runAsUser"].as<int>(-1), image_uid) << "runAsUser vs the Dockerfile's USER";
    EXPECT_TRUE(psc["fsGroup"]) << "volumes would not be writable by uid " << image_uid;
    std::map<std::string, YAML::Node> volumes;
    for (const YAML::Node& v : pod["volumes"]) volumes[v["name"].as<std::string>()] = v;
    for (const YAML::Node& c : AllContainers(w)) {
      const std::string name = c["name"].as<std::string>();
      const YAML::Node sc = c["securityContext"];
      ASSERT_TRUE(sc) << name << ": no securityContext";
      EXPECT_FALSE(sc["allowPrivilegeEscalation"].as<bool>(true)) << name;
      bool drops_all = false;
      for (const YAML::Node& cap : sc["capabilities"]["drop"]) {
        drops_all |= cap.as<std::string>() == "ALL";
      }
      EXPECT_TRUE(drops_all) << name << ": capabilities.drop lacks ALL";
      EXPECT_TRUE(sc["readOnlyRootFilesystem"].as<bool>(false)) << name;
      if (Script(c).find("/tmp/") != std::string::npos) {
        bool tmp_is_empty_dir = false;
        for (const YAML::Node& vm : c["volumeMounts"]) {
          if (vm["mountPath"].as<std::string>() == "/tmp") {
            tmp_is_empty_dir = bool(volumes[vm["name"].as<std::string>()]["emptyDir"]);
          }
        }
        EXPECT_TRUE(tmp_is_empty_dir) << name << " writes under /tmp on a read-only root";
      }
    }
  }
}

TEST(DeployManifests, EveryContainerHasResourceRequestsAndMemoryLimit) {
  const std::vector<Doc> docs = LoadManifests();
  for (const char* kind : {"StatefulSet", "Job"}) {
    for (const YAML::Node& c : AllContainers(Find(docs, kind))) {
      const std::string name = std::string(kind) + "/" + c["name"].as<std::string>();
      const YAML::Node r = c["resources"];
      ASSERT_TRUE(r) << name << ": no resources";
      EXPECT_TRUE(r["requests"]["cpu"]) << name;
      EXPECT_TRUE(r["requests"]["memory"]) << name;
      EXPECT_TRUE(r["limits"]["memory"]) << name;
    }
  }
}

TEST(DeployManifests, DisruptionBudgetCoversTheServers) {
  const std::vector<Doc> docs = LoadManifests();
  const YAML::Node pdb = Find(docs, "PodDisruptionBudget");
  const YAML::Node sts = Find(docs, "StatefulSet");
  ASSERT_TRUE(pdb && sts);
  EXPECT_EQ(pdb["spec"]["maxUnavailable"].as<int>(-1), 1);
  const YAML::Node want = sts["spec"]["selector"]["matchLabels"];
  const YAML::Node got = pdb["spec"]["selector"]["matchLabels"];
  ASSERT_TRUE(got.IsMap()) << "the budget selects no pods";
  EXPECT_EQ(got.size(), want.size());
  for (const auto& kv : want) {
    EXPECT_EQ(got[kv.first.as<std::string>()].as<std::string>(""), kv.second.as<std::string>())
        << "label " << kv.first.as<std::string>();
  }
}

// What the manifests' comments say must agree: TESSERA_NUM_SERVERS = replicas everywhere,
// TESSERA_NUM_WORKERS = completions = parallelism.
TEST(DeployManifests, CountsAgree) {
  const std::vector<Doc> docs = LoadManifests();
  const YAML::Node sts = Find(docs, "StatefulSet");
  const YAML::Node job = Find(docs, "Job");
  const std::string replicas = sts["spec"]["replicas"].as<std::string>();
  EXPECT_EQ(EnvValue(Container(sts, "server"), "TESSERA_NUM_SERVERS"), replicas);
  for (const YAML::Node& c : AllContainers(job)) {
    EXPECT_EQ(EnvValue(c, "TESSERA_NUM_SERVERS"), replicas) << c["name"].as<std::string>();
  }
  const std::string workers = EnvValue(Container(job, "worker"), "TESSERA_NUM_WORKERS");
  EXPECT_EQ(job["spec"]["completions"].as<std::string>(), workers);
  EXPECT_EQ(job["spec"]["parallelism"].as<std::string>(), workers);
}

// Every --flag of `exec tessera-server ...` / `exec tessera-worker ...` is a flag of the binary
// built from this tree (a misspelt or removed flag stops the pod at start).
TEST(DeployManifests, EveryFlagExistsInTheBinary) {
  const std::vector<Doc> docs = LoadManifests();
  for (auto [kind, name, program, binary] :
       {std::tuple{"StatefulSet", "server", "tessera-server", TESSERA_SERVER_BINARY},
        std::tuple{"Job", "worker", "tessera-worker", TESSERA_WORKER_BINARY}}) {
    SCOPED_TRACE(program);
    const std::vector<std::string> used = ExecFlags(Script(Container(Find(docs, kind), name)),
                                                    program);
    ASSERT_GE(used.size(), 3u) << "no 'exec " << program << "' command with flags";
    const std::set<std::string> known = BinaryFlags(binary);
    ASSERT_TRUE(known.count("metrics_port")) << "could not read the flags of " << binary;
    for (const std::string& f : used) {
      const bool negated_bool = f.rfind("no", 0) == 0 && known.count(f.substr(2));
      EXPECT_TRUE(known.count(f) || negated_bool) << "--" << f << " is not a flag of " << program;
    }
  }
}

// deploy/k8s-elastic: the etcd the elastic servers follow, and the resharding Job. The member
// list matches the replicas and the peer Service; the client Service and port are the ones the
// documented TESSERA_COORDINATOR names; the servers' script passes --coordinator; the Job runs
// `tessera-ctl ... scale` with flags tessera-ctl has.
TEST(DeployManifests, ElasticEtcdAndScaleJobAgree) {
  const std::vector<Doc> docs = LoadManifests(kSource / "deploy" / "k8s-elastic");
  const YAML::Node sts = Find(docs, "StatefulSet");
  ASSERT_TRUE(sts);
  const YAML::Node etcd = Container(sts, "etcd");
  const std::string script = Script(etcd);
  const int replicas = sts["spec"]["replicas"].as<int>();
  EXPECT_GE(replicas, 3) << "fewer than 3 members lose the quorum with one down";
  int members = 0;
  for (size_t at = 0; (at = script.find("=http://etcd-", at)) != std::string::npos; ++at) {
    ++members;
  }
  EXPECT_EQ(members, replicas) << "--initial-cluster members vs replicas";
  EXPECT_NE(script.find("etcd-peers." ), std::string::npos);
  EXPECT_EQ(sts["spec"]["serviceName"].as<std::string>(), "etcd-peers");
  bool client_service = false;
  for (const Doc& d : docs) {
    if (d.node["kind"].as<std::string>() == "Service" &&
        d.node["metadata"]["name"].as<std::string>() == "etcd") {
      client_service = d.node["spec"]["ports"][0]["port"].as<int>() == 2379;
    }
  }
  EXPECT_TRUE(client_service) << "no Service etcd on port 2379";
  const YAML::Node job = Find(docs, "Job");
  const YAML::Node scale = Container(job, "scale");
  EXPECT_NE(EnvValue(scale, "TESSERA_COORDINATOR").find("@etcd."), std::string::npos);
  EXPECT_NE(EnvValue(scale, "TESSERA_COORDINATOR").find(":2379/"), std::string::npos);
  const std::string ctl = Script(scale);
  EXPECT_NE(ctl.find("scale \"$TESSERA_SERVERS\""), std::string::npos) << ctl;
  const std::set<std::string> known = BinaryFlags(TESSERA_CTL_BINARY);
  ASSERT_TRUE(known.count("coordinator"));
  for (const std::string& f : ExecFlags(ctl, "tessera-ctl")) {
    EXPECT_TRUE(known.count(f)) << "--" << f << " is not a flag of tessera-ctl";
  }
  // The servers' and workers' manifests follow the map when TESSERA_COORDINATOR is set.
  const std::vector<Doc> main_docs = LoadManifests();
  const YAML::Node server = Container(Find(main_docs, "StatefulSet"), "server");
  EXPECT_NE(Script(server).find("--coordinator=\"$TESSERA_COORDINATOR\""), std::string::npos);
  EXPECT_TRUE(EnvValue(server, "TESSERA_COORDINATOR").empty()) << "static by default";
  const YAML::Node worker = Container(Find(main_docs, "Job"), "worker");
  EXPECT_NE(Script(worker).find("--coordinator=$TESSERA_COORDINATOR"), std::string::npos);
  EXPECT_TRUE(EnvValue(worker, "TESSERA_COORDINATOR").empty()) << "static by default";
}

// The file names a container sees under `dir` from the Secret `secret` (its items' paths), or
// nothing when no volume of that Secret is mounted there.
std::set<std::string> SecretFiles(const YAML::Node& workload, const YAML::Node& container,
                                  const std::string& dir, const std::string& secret) {
  std::string volume;
  for (const YAML::Node& m : container["volumeMounts"]) {
    if (m["mountPath"].as<std::string>() == dir) volume = m["name"].as<std::string>();
  }
  std::set<std::string> files;
  for (const YAML::Node& v : workload["spec"]["template"]["spec"]["volumes"]) {
    if (v["name"].as<std::string>() != volume || !v["secret"]) continue;
    if (v["secret"]["secretName"].as<std::string>() != secret) continue;
    for (const YAML::Node& item : v["secret"]["items"]) files.insert(item["path"].as<std::string>());
  }
  return files;
}

// CurveZMQ is on (issue 35, item 13): the servers run with their key, the peer key and both
// allow-lists; the workers and the scale Job present their own keys; every key file is an item
// of the Secret tessera-curve mounted at /keys; and no pod sees a secret key it does not use.
TEST(DeployManifests, CurveOnWithKeysFromASecret) {
  const std::vector<Doc> docs = LoadManifests();
  const std::vector<Doc> elastic = LoadManifests(kSource / "deploy" / "k8s-elastic");
  struct Expect {
    YAML::Node workload;
    const char* container;
    const char* program;
    std::map<std::string, std::string> flags;  // flag -> file under /keys
  };
  const Expect expects[] = {
      {Find(docs, "StatefulSet"), "server", "tessera-server",
       {{"curve_secret_key_file", "server.key"}, {"curve_peer_key_file", "peer.key"},
        {"authorized_clients", "authorized_clients"}, {"admin_clients", "admin_clients"}}},
      {Find(docs, "Job"), "worker", "tessera-worker",
       {{"curve_server_key_file", "server.pub"}, {"curve_client_key_file", "worker.key"}}},
      {Find(elastic, "Job"), "scale", "tessera-ctl",
       {{"curve_server_key_file", "server.pub"}, {"curve_client_key_file", "admin.key"}}}};
  for (const Expect& e : expects) {
    SCOPED_TRACE(e.program);
    const YAML::Node c = Container(e.workload, e.container);
    const std::string script = Script(c);
    const std::set<std::string> mounted = SecretFiles(e.workload, c, "/keys", "tessera-curve");
    std::set<std::string> used;
    for (const auto& [flag, file] : e.flags) {
      EXPECT_EQ(FlagValue(script, flag), "/keys/" + file) << "--" << flag;
      EXPECT_TRUE(mounted.count(file)) << file << " is not an item of the Secret at /keys";
      used.insert(file);
    }
    // Only what the flags read: a worker never holds server.key, peer.key or admin.key.
    EXPECT_EQ(mounted, used);
  }
}

// etcd auth (issue 35): every container that passes --coordinator reads the etcd password from
// the file TESSERA_ETCD_PASSWORD_FILE names, an item of the Secret tessera-etcd-auth mounted
// there (optional: static clusters have none); the scale Job names the etcd user in its URL.
TEST(DeployManifests, EtcdPasswordFromASecretWhereverCoordinatorIsPassed) {
  const std::vector<Doc> docs = LoadManifests();
  const std::vector<Doc> elastic = LoadManifests(kSource / "deploy" / "k8s-elastic");
  int checked = 0;
  for (const std::vector<Doc>* set : {&docs, &elastic}) {
    for (const Doc& d : *set) {
      const std::string kind = d.node["kind"].as<std::string>();
      if (kind != "StatefulSet" && kind != "Job" && kind != "Deployment") continue;
      for (const YAML::Node& c : AllContainers(d.node)) {
        if (Script(c).find("--coordinator") == std::string::npos) continue;
        SCOPED_TRACE(c["name"].as<std::string>());
        ++checked;
        const std::string file = EnvValue(c, "TESSERA_ETCD_PASSWORD_FILE");
        ASSERT_FALSE(file.empty()) << "--coordinator without TESSERA_ETCD_PASSWORD_FILE";
        const size_t slash = file.rfind('/');
        ASSERT_NE(slash, std::string::npos) << file;
        const std::set<std::string> items =
            SecretFiles(d.node, c, file.substr(0, slash), "tessera-etcd-auth");
        EXPECT_EQ(items, std::set<std::string>{file.substr(slash + 1)})
            << file << " is not the one item of the Secret tessera-etcd-auth mounted there";
      }
    }
  }
  EXPECT_EQ(checked, 3) << "the servers, the workers and the scale Job pass --coordinator";
  const YAML::Node scale = Container(Find(elastic, "Job"), "scale");
  EXPECT_NE(EnvValue(scale, "TESSERA_COORDINATOR").find("etcd://tessera@"), std::string::npos);
}

// Tessera's etcd client has no TLS: a NetworkPolicy keeps etcd's client port to the
// Tessera pods (the labels of the servers, the workers and the scale Job) and its peer port to
// the members.
TEST(DeployManifests, EtcdReachableOnlyFromTesseraPods) {
  const std::vector<Doc> docs = LoadManifests(kSource / "deploy" / "k8s-elastic");
  const YAML::Node policy = Find(docs, "NetworkPolicy");
  ASSERT_TRUE(policy);
  EXPECT_EQ(policy["spec"]["podSelector"]["matchLabels"]["app"].as<std::string>(), "etcd");
  std::set<std::string> client_apps;
  bool peer_port_from_etcd = false;
  for (const YAML::Node& rule : policy["spec"]["ingress"]) {
    ASSERT_TRUE(rule["from"]) << "an ingress rule without `from` lets every pod in";
    const int port = rule["ports"][0]["port"].as<int>();
    for (const YAML::Node& from : rule["from"]) {
      const YAML::Node sel = from["podSelector"];
      ASSERT_TRUE(sel) << "only pod selectors";
      if (port == 2380) peer_port_from_etcd = sel["matchLabels"]["app"].as<std::string>() == "etcd";
      if (port != 2379) continue;
      for (const YAML::Node& ex : sel["matchExpressions"]) {
        for (const YAML::Node& v : ex["values"]) client_apps.insert(v.as<std::string>());
      }
    }
  }
  EXPECT_TRUE(peer_port_from_etcd);
  const std::vector<Doc> main_docs = LoadManifests();
  std::set<std::string> tessera_apps;
  for (const YAML::Node& w : {Find(main_docs, "StatefulSet"), Find(main_docs, "Job"),
                              Find(docs, "Job")}) {
    tessera_apps.insert(w["spec"]["template"]["metadata"]["labels"]["app"].as<std::string>());
  }
  EXPECT_EQ(client_apps, tessera_apps);
}

// ---------------------------------------------------------------- Dockerfile

TEST(DeployDockerfile, CMakeOptionsExistAndBinariesAreOnPath) {
  const std::string dockerfile = ReadFile(kSource / "deploy" / "Dockerfile");
  const std::string cmake = ReadFile(kSource / "CMakeLists.txt");
  ASSERT_FALSE(dockerfile.empty());
  int options = 0;
  static const std::regex kDefine(R"(-D([A-Za-z0-9_]+)=)");
  for (std::sregex_iterator it(dockerfile.begin(), dockerfile.end(), kDefine), end; it != end;
       ++it) {
    const std::string var = (*it)[1];
    if (var.rfind("CMAKE_", 0) == 0) continue;  // CMake's own
    ++options;
    EXPECT_TRUE(std::regex_search(cmake, std::regex("option\\(\\s*" + var + "\\s")))
        << "-D" << var << " is not an option() of CMakeLists.txt";
  }
  EXPECT_GE(options, 3);
  EXPECT_NE(dockerfile.find("-DTESSERA_ENABLE_CUDA=OFF"), std::string::npos);
  EXPECT_NE(dockerfile.find("cmake --install build --prefix /opt/tessera"), std::string::npos);
  EXPECT_TRUE(std::regex_search(dockerfile, std::regex(R"(\nENV PATH=/opt/tessera/bin:)")))
      << "the manifests run tessera-server and tessera-worker from PATH";
}

// ---------------------------------------------------------------- Grafana dashboard

// The metric names (# TYPE lines) of /metrics at 127.0.0.1:port, polled until it answers or
// `running` turns false.
std::set<std::string> Scrape(uint32_t port, const std::atomic<bool>& running) {
  std::set<std::string> names;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  std::string r;
  while (running && std::chrono::steady_clock::now() < until) {
    r = HttpGet(port, "/metrics", 2000);
    if (r.rfind("HTTP/1.1 200", 0) == 0 || r.rfind("HTTP/1.0 200", 0) == 0) break;
    r.clear();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  static const std::regex kType(R"(# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) ([a-z]+))");
  for (std::sregex_iterator it(r.begin(), r.end(), kType), end; it != end; ++it) {
    const std::string name = (*it)[1];
    names.insert(name);
    if ((*it)[2] == "histogram") {
      for (const char* s : {"_bucket", "_sum", "_count"}) names.insert(name + s);
    }
  }
  return names;
}

// Every series a dashboard query names (tessera_...) is one a tessera-server or a tessera-worker
// process serves.
TEST(DeployGrafana, DashboardQueriesNameServedMetrics) {
  const fs::path path = kSource / "deploy" / "grafana" / "tessera-dashboard.json";
  YAML::Node dash;
  ASSERT_NO_THROW(dash = YAML::LoadFile(path.string())) << path;  // JSON is YAML
  ASSERT_TRUE(dash["panels"].IsSequence());
  std::set<std::string> queried;
  int targets = 0;
  static const std::regex kMetric(R"(\btessera_[a-z0-9_]+)");
  for (const YAML::Node& panel : dash["panels"]) {
    if (!panel["targets"]) continue;
    for (const YAML::Node& t : panel["targets"]) {
      const std::string expr = t["expr"].as<std::string>("");
      ++targets;
      for (std::sregex_iterator it(expr.begin(), expr.end(), kMetric), end; it != end; ++it) {
        queried.insert((*it)[0]);
      }
    }
  }
  ASSERT_GE(targets, 10);

  // A server with a data directory (RocksDB's metrics exist only then), and a worker whose
  // server list names a closed port: it serves its metrics while it tries to connect (about
  // 10 s), then exits.
  tessera::testing::LocalClusterOptions co = tessera::testing::Servers(1);
  co.with_data_dirs = true;
  const uint32_t server_port = PickFreePort();
  co.extra_flags = {"--metrics_port=" + std::to_string(server_port),
                    "--metrics_address=127.0.0.1"};
  tessera::testing::LocalCluster cluster(co);
  ASSERT_TRUE(cluster.Start().ok());
  std::atomic<bool> running{true};
  std::set<std::string> served = Scrape(server_port, running);
  ASSERT_TRUE(served.count("tessera_server_requests_total")) << "no scrape of tessera-server";

  const uint32_t worker_port = PickFreePort();
  std::string worker_out;
  std::thread worker([&] {
    RunCommand({TESSERA_WORKER_BINARY,
                "--servers=tcp://127.0.0.1:" + std::to_string(PickFreePort()),
                "--metrics_port=" + std::to_string(worker_port), "--metrics_address=127.0.0.1",
                "--retry_for_ms=0"},
               &worker_out, 60);
    running = false;
  });
  const std::set<std::string> worker_served = Scrape(worker_port, running);
  worker.join();
  ASSERT_TRUE(worker_served.count("tessera_worker_samples_total"))
      << "no scrape of tessera-worker: " << worker_out;
  served.insert(worker_served.begin(), worker_served.end());
  for (const std::string& m : queried) {
    EXPECT_TRUE(served.count(m)) << "the dashboard queries " << m
                                 << ", which neither tessera-server nor tessera-worker serves";
  }
}

}  // namespace
