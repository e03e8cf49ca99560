// The tessera-worker binary's choice of reducer and of GPUs: the line that names the reducer a
// run uses, the refusal of --backend=cuda where the GPUs are missing (at once, never a hang),
// and, on a GPU machine (suites named Gpu*: label gpu), a CUDA run that trains like the CPU one
// and a multi-GPU node that reduces with NCCL. And the command line of every Tessera program
// (suite ToolsCli): --help and --version, tessera-ctl's commands, endpoint and enum flag checks,
// and a JSON report that stays valid whatever the --data path holds.
#include <gtest/gtest.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "ps/client/client.h"
#include "tests/worker/worker_cluster_fixture.h"
#include "worker/backend.h"

#if !defined(TESSERA_CTL_BINARY) || !defined(TESSERA_LOOKUP_BINARY) || \
    !defined(TESSERA_DEMO_BINARY) || !defined(TESSERA_VERSION)
#error "TESSERA_{CTL,LOOKUP,DEMO}_BINARY and TESSERA_VERSION must be defined"
#endif

namespace tessera {
namespace {

using testing::ChildProcess;
using testing::LocalCluster;
using testing::ProgramRun;
using testing::RunToEnd;

// A short BSP training run of one node: 20 steps of 256 samples per local rank.
std::vector<std::string> Args(const std::string& servers, const std::string& job,
                              const std::string& backend, uint32_t local_ranks) {
  return {TESSERA_WORKER_BINARY,
          "--servers=" + servers,
          "--job=" + job,
          "--backend=" + backend,
          "--local_ranks=" + std::to_string(local_ranks),
          "--consistency=bsp",
          "--train_samples=40000",
          "--test_samples=1000",
          "--batch_size=256",
          "--max_steps=20",
          "--synthetic_max_cardinality=2000",
          "--bottom_mlp=16",
          "--top_mlp=16",
          "--evaluate=false",
          "--request_timeout_ms=20000"};
}

// The mean training loss the worker reports; NaN when there is no such line.
double TrainLoss(const std::string& out) {
  std::smatch m;
  if (!std::regex_search(out, m, std::regex(R"(train loss ([0-9.]+))"))) return std::nan("");
  return std::stod(m[1]);
}

TEST(WorkerCli, ReducerLineNamesTheCpuReducer) {
  LocalCluster cluster(testing::Servers(1));
  ASSERT_TRUE(cluster.Start().ok());
  const std::string servers = cluster.endpoints()[0];
  ProgramRun two = RunToEnd(Args(servers, "cli2", "cpu", 2), cluster.dir() + "/two.log", 120);
  ASSERT_EQ(two.rc, 0) << two.out;
  EXPECT_NE(two.out.find("reducer: cpu (2 local ranks on CPU threads)"), std::string::npos)
      << two.out;
  EXPECT_NE(two.out.find("20 steps"), std::string::npos) << two.out;
  ProgramRun one = RunToEnd(Args(servers, "cli1", "cpu", 1), cluster.dir() + "/one.log", 120);
  ASSERT_EQ(one.rc, 0) << one.out;
  EXPECT_NE(one.out.find("reducer: none (1 local rank)"), std::string::npos) << one.out;
}

// --backend=null runs the whole training loop (data, pulls, pushes) without a model: the CPU
// reducer over 2 local ranks, every sample of the 20 steps, the loss of probabilities 0.5.
TEST(WorkerCli, NullBackendRunsTheFeedWithoutAModel) {
  LocalCluster cluster(testing::Servers(1));
  ASSERT_TRUE(cluster.Start().ok());
  ProgramRun r = RunToEnd(Args(cluster.endpoints()[0], "clinull", "null", 2),
                          cluster.dir() + "/null.log", 120);
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("reducer: cpu (2 local ranks on CPU threads)"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("trained 10240 samples"), std::string::npos) << r.out;  // 20 x 2 x 256
  EXPECT_NE(r.out.find("20 steps"), std::string::npos) << r.out;
  EXPECT_NEAR(TrainLoss(r.out), std::log(2.0), 1e-4) << r.out;
}

// No GPU here: --backend=cuda is refused before the worker connects anywhere (no server runs at
// that address), with the reason, for one rank and for an NCCL node.
TEST(WorkerCli, CudaBackendRefusedAtOnceWithoutAGpu) {
  std::string why;
  if (worker::CudaBackendAvailable(&why)) {
    GTEST_SKIP() << "a GPU is present: WorkerCliGpu covers --backend=cuda";
  }
  for (uint32_t ranks : {1u, 2u}) {
    ProgramRun r = RunToEnd(Args("tcp://127.0.0.1:9", "nogpu", "cuda", ranks),
                            ::testing::TempDir() + "/nogpu.log", 30);
    EXPECT_EQ(r.rc, 1) << r.out;
    EXPECT_LT(r.seconds, 10.0) << r.out;
    EXPECT_NE(r.out.find("--backend=cuda: no usable GPU"), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("reducer:"), std::string::npos) << r.out;
  }
}

// On a GPU: the CUDA backend trains the same 20 BSP steps to the CPU's loss; with 2 GPUs or more
// a node of 2 local ranks reduces with NCCL, with one GPU it is refused at once.
TEST(WorkerCliGpu, CudaRunsTrainLikeCpuAndMultiGpuNodesUseNccl) {
  auto gpus = worker::CudaDeviceCount();
  if (!gpus.ok()) GTEST_SKIP() << "no GPU: " << gpus.status().message();
  LocalCluster cluster(testing::Servers(1));
  ASSERT_TRUE(cluster.Start().ok());
  const std::string servers = cluster.endpoints()[0];
  ProgramRun cpu = RunToEnd(Args(servers, "gcpu", "cpu", 1), cluster.dir() + "/cpu.log", 300);
  ProgramRun cuda = RunToEnd(Args(servers, "gcuda", "cuda", 1), cluster.dir() + "/cuda.log", 300);
  ASSERT_EQ(cpu.rc, 0) << cpu.out;
  ASSERT_EQ(cuda.rc, 0) << cuda.out;
  EXPECT_NE(cuda.out.find("reducer: none (1 local rank)"), std::string::npos) << cuda.out;
  EXPECT_NEAR(TrainLoss(cuda.out), TrainLoss(cpu.out), 2e-3 * TrainLoss(cpu.out))
      << cpu.out << cuda.out;
  if (*gpus >= 2) {
    ProgramRun cpu2 = RunToEnd(Args(servers, "gcpu2", "cpu", 2), cluster.dir() + "/cpu2.log", 300);
    ProgramRun nccl = RunToEnd(Args(servers, "gnccl", "cuda", 2), cluster.dir() + "/nccl.log", 300);
    ASSERT_EQ(cpu2.rc, 0) << cpu2.out;
    ASSERT_EQ(nccl.rc, 0) << nccl.out;
    EXPECT_NE(nccl.out.find("reducer: nccl (2 local ranks on GPUs 0,1)"), std::string::npos)
        << nccl.out;
    EXPECT_NEAR(TrainLoss(nccl.out), TrainLoss(cpu2.out), 2e-3 * TrainLoss(cpu2.out))
        << cpu2.out << nccl.out;
  } else {
    ProgramRun two = RunToEnd(Args(servers, "g2", "cuda", 2), cluster.dir() + "/two.log", 30);
    EXPECT_EQ(two.rc, 1) << two.out;
    EXPECT_LT(two.seconds, 10.0) << two.out;
    EXPECT_NE(two.out.find("2 local ranks need 2 GPUs for NCCL"), std::string::npos) << two.out;
  }
}

// ---------------------------------------------------------------- every program's command line

// A program run to its end with `args` (stdout and stderr together).
ProgramRun RunTool(const std::vector<std::string>& args, const std::string& name) {
  // The pid in the name: ctest -j runs these tests side by side, and two of them running the
  // same tool wrote one log file (ToolsCli.Help... and ToolsCli.Version... failed together).
  return RunToEnd(
      args, ::testing::TempDir() + "/tool-" + name + "-" + std::to_string(getpid()) + ".log", 30);
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  return lines;
}

struct Tool {
  const char* binary;
  const char* name;
  const char* own_flag;  // a flag the program defines itself, as --help shows it
  bool glog;             // links glog (whose flags --helpfull then lists)
};
const Tool kTools[] = {
    {TESSERA_SERVER_BINARY, "tessera-server", "--cluster=STRING", true},
    {TESSERA_WORKER_BINARY, "tessera-worker", "--servers=STRING", true},
    {TESSERA_CTL_BINARY, "tessera-ctl", "--cluster=STRING", false},
    {TESSERA_LOOKUP_BINARY, "tessera-lookup", "--export_dir=STRING", false},
    {TESSERA_DEMO_BINARY, "tessera-demo", "--steps=UINT32", false},
};

// --help: exit 0, the usage line first, then the program's own flags; the flags of gflags
// itself and of glog (which --helpfull shows) are not listed.
TEST(ToolsCli, HelpListsTheProgramsOwnFlagsFirstAndExitsZero) {
  for (const Tool& t : kTools) {
    for (const char* help : {"--help", "-h"}) {
      ProgramRun r = RunTool({t.binary, help}, t.name);
      EXPECT_EQ(r.rc, 0) << t.name << " " << help << "\n" << r.out;
      const std::vector<std::string> lines = Lines(r.out);
      ASSERT_GE(lines.size(), 5u) << t.name << "\n" << r.out;
      EXPECT_EQ(lines[0].rfind(std::string("usage: ") + t.name, 0), 0u) << r.out;
      // The first flag listed is within the first lines, and it is one of the program's own.
      size_t first_flag = 0;
      while (first_flag < lines.size() && lines[first_flag].rfind("  --", 0) != 0) ++first_flag;
      EXPECT_LT(first_flag, 8u) << t.name << "\n" << r.out;
      EXPECT_NE(r.out.find(std::string("  ") + t.own_flag), std::string::npos)
          << t.name << "\n" << r.out;
      for (const char* other : {"tryfromenv", "undefok", "tab_completion_word", "logtostderr",
                                "minloglevel", "stderrthreshold", "vmodule"}) {
        EXPECT_EQ(r.out.find(other), std::string::npos) << t.name << " lists " << other << "\n"
                                                        << r.out;
      }
    }
    ProgramRun full = RunTool({t.binary, "--helpfull"}, t.name);
    EXPECT_EQ(full.rc, 0) << t.name << "\n" << full.out;
    EXPECT_NE(full.out.find("tryfromenv"), std::string::npos) << t.name << "\n" << full.out;
    if (t.glog) {
      EXPECT_NE(full.out.find("logtostderr"), std::string::npos) << t.name << "\n" << full.out;
    }
  }
  // Defaults read as typed: the worker's --dense_lr is 0.003, not 0.0030000000000000001.
  ProgramRun worker = RunTool({TESSERA_WORKER_BINARY, "--help"}, "worker-help");
  EXPECT_NE(worker.out.find("--dense_lr=DOUBLE  (default: 0.003)"), std::string::npos)
      << worker.out;
}

TEST(ToolsCli, VersionPrintsNameAndProjectVersion) {
  for (const Tool& t : kTools) {
    ProgramRun r = RunTool({t.binary, "--version"}, t.name);
    EXPECT_EQ(r.rc, 0) << t.name << "\n" << r.out;
    EXPECT_EQ(r.out, std::string(t.name) + " " + TESSERA_VERSION + "\n");
  }
}

TEST(ToolsCli, CtlListsItsCommandsAndRejectsUnknownOnes) {
  ProgramRun help = RunTool({TESSERA_CTL_BINARY, "--help"}, "ctl-help");
  EXPECT_EQ(help.rc, 0) << help.out;
  for (const char* cmd : {"checkpoint NAME", "restore NAME", "export NAME", "stats", "tables",
                          "keygen DIR"}) {
    EXPECT_NE(help.out.find(std::string("  ") + cmd), std::string::npos) << cmd << help.out;
  }
  ProgramRun none = RunTool({TESSERA_CTL_BINARY}, "ctl-none");
  EXPECT_EQ(none.rc, 2) << none.out;
  EXPECT_NE(none.out.find("tessera-ctl: missing command"), std::string::npos) << none.out;
  EXPECT_NE(none.out.find("checkpoint NAME"), std::string::npos) << none.out;
  ProgramRun unknown =
      RunTool({TESSERA_CTL_BINARY, "--cluster=tcp://127.0.0.1:9", "frobnicate"}, "ctl-unknown");
  EXPECT_EQ(unknown.rc, 2) << unknown.out;
  EXPECT_NE(unknown.out.find("tessera-ctl: unknown command 'frobnicate'"), std::string::npos)
      << unknown.out;
  EXPECT_NE(unknown.out.find("restore NAME"), std::string::npos) << unknown.out;
  ProgramRun arity = RunTool({TESSERA_CTL_BINARY, "--cluster=tcp://127.0.0.1:9", "checkpoint"},
                            "ctl-arity");
  EXPECT_EQ(arity.rc, 2) << arity.out;
  EXPECT_NE(arity.out.find("checkpoint takes one argument"), std::string::npos) << arity.out;
}

// A port of 99999 is refused before anything connects, naming the endpoint, by every program
// that reads a cluster list (ParseClusterList).
TEST(ToolsCli, PortOutOfRangeIsRefusedNamingTheEndpoint) {
  const std::string bad = "tcp://127.0.0.1:99999";
  const std::vector<std::vector<std::string>> runs = {
      {TESSERA_SERVER_BINARY, "--cluster=" + bad},
      {TESSERA_WORKER_BINARY, "--servers=" + bad},
      {TESSERA_CTL_BINARY, "--cluster=" + bad, "stats"},
      {TESSERA_LOOKUP_BINARY, "--cluster=" + bad, "--keys=1"},
      {TESSERA_DEMO_BINARY, "--cluster=" + bad},
      {TESSERA_SERVER_BINARY, "--cluster=tcp://127.0.0.1:7000", "--listen=" + bad},
  };
  for (const auto& args : runs) {
    ProgramRun r = RunTool(args, "port");
    EXPECT_EQ(r.rc, 2) << args[0] << "\n" << r.out;
    EXPECT_NE(r.out.find("'" + bad + "'"), std::string::npos) << args[0] << "\n" << r.out;
    EXPECT_NE(r.out.find("1..65535"), std::string::npos) << args[0] << "\n" << r.out;
  }
}

// Enum flags: a value outside the set is refused at once with the set and exit 2 (no server
// runs at the address).
TEST(ToolsCli, EnumFlagsAreChecked) {
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const std::string nowhere = "tcp://127.0.0.1:9";
  const std::vector<Case> cases = {
      {{TESSERA_WORKER_BINARY, "--servers=" + nowhere, "--backend=tpu"},
       "tessera-worker: --backend must be one of cpu, cuda, null (got 'tpu')"},
      {{TESSERA_WORKER_BINARY, "--servers=" + nowhere, "--pooling=max"},
       "tessera-worker: --pooling must be one of sum, mean (got 'max')"},
      {{TESSERA_WORKER_BINARY, "--servers=" + nowhere, "--consistency=eventual"},
       "tessera-worker: --consistency must be one of async, bsp, ssp (got 'eventual')"},
      {{TESSERA_WORKER_BINARY, "--servers=" + nowhere, "--model=bogus"},
       "--model: unknown model 'bogus' (known: dlrm, deepfm, dcn)"},
      {{TESSERA_WORKER_BINARY, "--servers=" + nowhere, "--early_stopping_metric=f1"},
       "--early_stopping_metric: unknown early stopping metric 'f1' (auc, logloss or both)"},
      {{TESSERA_SERVER_BINARY, "--cluster=" + nowhere, "--durability=lazy"},
       "tessera-server: --durability must be one of strict, relaxed (got 'lazy')"},
  };
  for (const Case& c : cases) {
    ProgramRun r = RunTool(c.args, "enum");
    EXPECT_EQ(r.rc, 2) << c.args.back() << "\n" << r.out;
    EXPECT_LT(r.seconds, 10.0) << r.out;
    EXPECT_NE(r.out.find(c.message), std::string::npos) << r.out;
  }
}

// A search of several workers without a common --search_id, a search id that cannot name
// tables, and an embedding init scale outside [0, 1] are refused at once with exit 2 and a line
// that says why (no server runs at the address).
TEST(WorkerCli, SearchIdAndInitScaleAreChecked) {
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const std::string nowhere = "--servers=tcp://127.0.0.1:9";
  const std::vector<Case> cases = {
      {{TESSERA_WORKER_BINARY, nowhere, "--num_workers=2", "--search=2"},
       "--search: with more than one worker, every worker needs the same search id "
       "(--search_id)"},
      {{TESSERA_WORKER_BINARY, nowhere, "--search=2", "--search_id=a.b"},
       "--search: the search id 'a.b' must be 1 to 32 letters, digits, '-' or '_'"},
      {{TESSERA_WORKER_BINARY, nowhere, "--emb_init_scale=-0.5"},
       "tessera-worker: --emb_init_scale must be in [0, 1]"},
  };
  for (const Case& c : cases) {
    ProgramRun r = RunTool(c.args, "search_id");
    EXPECT_EQ(r.rc, 2) << c.args.back() << "\n" << r.out;
    EXPECT_LT(r.seconds, 10.0) << r.out;
    EXPECT_NE(r.out.find(c.message), std::string::npos) << r.out;
  }
}

// tessera-lookup takes gflags' syntax like the others: --flag=value and --flag value.
TEST(ToolsCli, LookupTakesGflagsSyntax) {
  ProgramRun both = RunTool({TESSERA_LOOKUP_BINARY, "--cluster", "tcp://127.0.0.1:9",
                            "--export_dir=x", "--keys=1"},
                           "lookup-both");
  EXPECT_EQ(both.rc, 2) << both.out;
  EXPECT_NE(both.out.find("give exactly one of --cluster and --export_dir"), std::string::npos)
      << both.out;
  ProgramRun missing = RunTool({TESSERA_LOOKUP_BINARY, "--export_dir",
                               ::testing::TempDir() + "/no-export", "--keys=1"},
                              "lookup-missing");
  EXPECT_EQ(missing.rc, 1) << missing.out;  // the flags are fine; the export is not there
}

// The report line is written by a JSON library: a --data path holding '"' and '\\' reads back
// intact, and the training figures say whose they are.
TEST(ToolsCli, WorkerJsonReportStaysValidWithQuotesInThePath) {
  LocalCluster cluster(testing::Servers(1));
  ASSERT_TRUE(cluster.Start().ok());
  const std::string dir = cluster.dir() + "/odd \"name\" \\ dir";
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/clicks.libsvm";
  {
    std::ofstream f(path);
    std::mt19937 rng(7);
    for (int i = 0; i < 3000; ++i) {
      const int a = static_cast<int>(rng() % 50), b = static_cast<int>(rng() % 50);
      const bool click = (a + b) % 3 == 0 || rng() % 10 == 0;
      f << (click ? 1 : 0) << " " << a << ":1 " << 100 + b << ":1\n";
    }
  }
  ProgramRun r = RunToEnd({TESSERA_WORKER_BINARY, "--servers=" + cluster.endpoints()[0],
                           "--data=libsvm:" + path, "--job=json", "--batch_size=64",
                           "--bottom_mlp=8", "--top_mlp=8", "--request_timeout_ms=20000"},
                          cluster.dir() + "/json.log", 120);
  ASSERT_EQ(r.rc, 0) << r.out;
  const size_t start = r.out.rfind("\n{");
  ASSERT_NE(start, std::string::npos) << r.out;
  const std::string line = r.out.substr(start + 1, r.out.find('\n', start + 1) - start - 1);
  const nlohmann::json report = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(report.is_discarded()) << line;
  EXPECT_EQ(report.value("data", ""), "libsvm:" + path) << line;
  EXPECT_EQ(line.rfind("{\"data\":", 0), 0u) << line;  // scripts find the line by its first key
  ASSERT_TRUE(report.contains("train_samples_worker0")) << line;
  EXPECT_GT(report["train_samples_worker0"].get<double>(), 0) << line;
  // The job's totals (one worker here: its own figures), the rate measured over the training
  // phase's wall time.
  ASSERT_TRUE(report.contains("train_samples")) << line;
  EXPECT_EQ(report["train_samples"].get<double>(), report["train_samples_worker0"].get<double>());
  ASSERT_TRUE(report["train_seconds_cluster"].is_number()) << line;
  const double wall = report["train_seconds_cluster"].get<double>();
  EXPECT_GE(wall, report["train_seconds"].get<double>() * 0.99) << line;
  EXPECT_NEAR(report["samples_per_s_cluster"].get<double>(),
              report["train_samples"].get<double>() / wall, 1e-6 * wall + 1) << line;
  EXPECT_TRUE(report["test_auc"].is_number()) << line;
  EXPECT_TRUE(report["oracle_auc"].is_null()) << line;  // no planted model in a file
}

// The worker's learning-rate schedule reaches the servers with its pushes: with a warm-up of a
// billion steps (factor about 1e-9) five steps leave the global bias (Adam, zeros) at 0 to
// within 1e-6; without one, the same five steps move it by more than 1e-4. Bad schedule flags
// exit 2.
TEST(WorkerCli, LearningRateScheduleReachesTheServers) {
  LocalCluster cluster(testing::Servers(1));
  ASSERT_TRUE(cluster.Start().ok());
  const std::string servers = cluster.endpoints()[0];
  auto run = [&](const std::string& job, std::vector<std::string> more) {
    std::vector<std::string> a = Args(servers, job, "cpu", 1);
    for (auto& x : a) {
      if (x == "--max_steps=20") x = "--max_steps=5";
    }
    a.insert(a.end(), more.begin(), more.end());
    return RunToEnd(a, cluster.dir() + "/" + job + ".log", 120);
  };
  auto bias = [&](const std::string& job) {
    ClientOptions o;
    o.servers = {servers};
    auto c = Client::Create(o);
    if (!c.ok()) return std::nanf("");
    auto t = (*c)->GetTable(job + "/bias");
    float b = std::nanf("");
    if (!t.ok() || !(*c)->Wait((*c)->DensePull(*t, 0, 1, &b)).ok()) return std::nanf("");
    return b;
  };
  ProgramRun slow = run("warm", {"--lr_warmup_steps=1000000000"});
  ASSERT_EQ(slow.rc, 0) << slow.out;
  ProgramRun plain = run("plain", {});
  ASSERT_EQ(plain.rc, 0) << plain.out;
  const float b_slow = bias("warm"), b_plain = bias("plain");
  EXPECT_LT(std::fabs(b_slow), 1e-6f) << "bias after 5 steps of a warm-up: " << b_slow;
  EXPECT_GT(std::fabs(b_plain), 1e-4f) << "bias after 5 plain steps: " << b_plain;

  ProgramRun bad = run("bad", {"--lr_decay=step"});
  EXPECT_EQ(bad.rc, 2) << bad.out;
  EXPECT_NE(bad.out.find("--lr_decay"), std::string::npos) << bad.out;
  bad = run("bad2", {"--lr_decay=cosine", "--lr_final_scale=2"});
  EXPECT_EQ(bad.rc, 2) << bad.out;
}

// --metrics_port on a training worker: /readyz 200 while it trains and /metrics with its
// step, samples and loss from the progress reports.
TEST(WorkerMetrics, ScrapedWhileTraining) {
  LocalCluster cluster(testing::Servers(1));
  ASSERT_TRUE(cluster.Start().ok());
  const uint32_t port = testing::PickFreePort();
  std::vector<std::string> args = Args(cluster.endpoints()[0], "metrics", "cpu", 1);
  for (auto& a : args) {
    if (a == "--max_steps=20") a = "--max_steps=1000000";  // until the test kills it
  }
  args.push_back("--train_samples=100000000");
  args.push_back("--progress_interval_s=0.2");
  args.push_back("--metrics_port=" + std::to_string(port));
  args.push_back("--metrics_address=127.0.0.1");
  ChildProcess worker;
  ASSERT_TRUE(worker.Start(args, cluster.dir() + "/worker-metrics.log"));
  std::string body;
  bool ready = false;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (std::chrono::steady_clock::now() < until && worker.Running()) {
    ready = ready || testing::HttpGet(port, "/readyz").rfind("HTTP/1.1 200", 0) == 0;
    body = testing::HttpGet(port, "/metrics");
    std::smatch m;
    if (ready && std::regex_search(body, m, std::regex("\ntessera_worker_step ([0-9]+)\n")) &&
        std::stoull(m[1]) > 0) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(worker.Running()) << worker.Output();
  EXPECT_TRUE(ready) << "/readyz never answered 200 while the worker trained";
  std::smatch m;
  ASSERT_TRUE(std::regex_search(body, m, std::regex("\ntessera_worker_step ([0-9]+)\n")))
      << body;
  EXPECT_GT(std::stoull(m[1]), 0u) << body;
  ASSERT_TRUE(
      std::regex_search(body, m, std::regex("\ntessera_worker_samples_total ([0-9]+)\n")));
  EXPECT_GT(std::stoull(m[1]), 0u);
  // The loss of a click model starts near ln 2; a NaN or 0 would mean it is not being set.
  ASSERT_TRUE(std::regex_search(body, m, std::regex("\ntessera_worker_train_loss ([0-9.e+-]+)\n")))
      << body;
  EXPECT_GT(std::stod(m[1]), 0.01);
  EXPECT_LT(std::stod(m[1]), 5);
  EXPECT_NE(body.find("tessera_worker_info{worker_id=\"0\",num_workers=\"1\",backend=\"cpu\""),
            std::string::npos)
      << body;
  worker.Kill();
}

// --data=csv: with --schema trains on a CSV file with a header (a quoted field, ignored
// columns, one malformed line skipped with --skip_bad_lines and counted), and worker 0's
// report names metrics.csv and report.html in --out_dir.
TEST(WorkerCsv, TrainsOnACsvFileAndWritesTheReport) {
  LocalCluster cluster(testing::Servers(1));
  ASSERT_TRUE(cluster.Start().ok());
  const std::string path = cluster.dir() + "/clicks.csv";
  {
    std::ofstream f(path);
    f << "id,click,hour,site_id,app_id,price,note\n";
    std::mt19937 rng(11);
    for (int i = 0; i < 3000; ++i) {
      const int site = static_cast<int>(rng() % 40), app = static_cast<int>(rng() % 30);
      const bool click = static_cast<int>(rng() % 10) < (site < 10 ? 7 : 1);
      f << i << "," << (click ? 1 : 0) << "," << 14102100 + i % 24 << ",s" << site << ",a" << app
        << "," << (rng() % 1000) / 10.0 << ",\"a, b\"\n";
      if (i == 1500) f << "oops,1\n";
    }
  }
  const std::string out = cluster.dir() + "/run";
  ProgramRun r = RunToEnd(
      {TESSERA_WORKER_BINARY, "--servers=" + cluster.endpoints()[0], "--data=csv:" + path,
       "--schema=label=click;numeric=price:log;categorical=site_id,app_id,hour;header=true",
       "--skip_bad_lines", "--job=csv", "--epochs=2", "--batch_size=64", "--bottom_mlp=8",
       "--top_mlp=8", "--progress_interval_s=0.1", "--out_dir=" + out, "--request_timeout_ms=20000"},
      cluster.dir() + "/csv.log", 120);
  ASSERT_EQ(r.rc, 0) << r.out;
  const size_t start = r.out.rfind("\n{");
  ASSERT_NE(start, std::string::npos) << r.out;
  const std::string line = r.out.substr(start + 1, r.out.find('\n', start + 1) - start - 1);
  const nlohmann::json report = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(report.is_discarded()) << line;
  EXPECT_EQ(report.value("data", ""), "csv:" + path) << line;
  EXPECT_GT(report.value("steps", 0), 10) << line;
  EXPECT_GT(report.value("test_samples", 0), 250) << line;
  EXPECT_GT(report.value("test_auc", 0.0), 0.65) << line;  // the label follows the site
  EXPECT_EQ(report.value("skipped_lines", -1), 1) << line;
  EXPECT_EQ(report.value("metrics_csv", ""), out + "/metrics.csv") << line;
  ASSERT_EQ(report.value("report_html", ""), out + "/report.html") << line;
  std::ifstream html(out + "/report.html");
  std::stringstream page;
  page << html.rdbuf();
  EXPECT_NE(page.str().find("<polyline data-series=\"train_loss\""), std::string::npos);
  EXPECT_NE(page.str().find("<polyline data-series=\"validation_auc\""), std::string::npos);
}

}  // namespace
}  // namespace tessera
