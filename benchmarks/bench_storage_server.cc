#include "benchmarks/bench_storage_server.h"

#include <sys/types.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "benchmarks/bench_cluster.h"
#include "benchmarks/bench_stats.h"
#include "ps/client/client.h"

namespace tessera::bench {
namespace {

using Clock = std::chrono::steady_clock;

// A field of /proc/<pid>/status in MiB (VmRSS, VmHWM), or 0 when it cannot be read.
double ProcStatusMb(pid_t pid, const std::string& field) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(field + ":", 0) == 0) return std::stod(line.substr(field.size() + 1)) / 1024;
  }
  return 0;
}

struct Server {
  explicit Server(const char* n) : name(n) {}
  const char* name;
  BenchCluster cluster;
  std::unique_ptr<Client> client;
  Table table;
  std::vector<double> push, pull;
};

Status Open(Server& s, const std::string& binary, const std::vector<std::string>& flags) {
  TESSERA_RETURN_IF_ERROR(s.cluster.Start(1, "process", binary, 2, flags));
  ClientOptions co;
  co.servers = s.cluster.endpoints();
  TESSERA_ASSIGN_OR_RETURN(s.client, Client::Create(co));
  return Status::OK();
}

Status CreateAndFill(Server& s, const ServerBudgetOptions& o) {
  const OptimizerSpec adagrad{.kind = OptimizerKind::kAdagrad, .learning_rate = 0.05f};
  TESSERA_ASSIGN_OR_RETURN(s.table, s.client->CreateTable(TableSpec::Sparse("b", o.dim, adagrad)));
  std::vector<uint64_t> keys;
  const std::vector<float> grads(size_t{o.batch} * o.dim, 0.01f);
  for (uint64_t first = 0; first < o.rows; first += o.batch) {
    keys.clear();
    for (uint64_t k = first; k < std::min(o.rows, first + o.batch); ++k) keys.push_back(k);
    TESSERA_RETURN_IF_ERROR(
        s.client->Wait(s.client->Push(s.table, keys, std::span(grads).first(keys.size() * o.dim)))
            .WithContext(std::string(s.name) + ": fill"));
  }
  return Status::OK();
}

// Caller keys per second of back-to-back pushes (push) or pulls, for at least `min_s`.
Result<double> Run(Server& s, const std::vector<std::vector<uint64_t>>& batches,
                   const ServerBudgetOptions& o, bool push) {
  const std::vector<float> grads(size_t{o.batch} * o.dim, 0.01f);
  std::vector<float> out(size_t{o.batch} * o.dim);
  const auto t0 = Clock::now();
  uint64_t keys = 0;
  for (size_t i = 0; i < 2 || Clock::now() - t0 < std::chrono::duration<double>(o.min_rep_s);
       ++i) {
    const auto& b = batches[i % batches.size()];
    TESSERA_RETURN_IF_ERROR(s.client->Wait(push ? s.client->Push(s.table, b, grads)
                                                : s.client->Pull(s.table, b, out.data()))
                                .WithContext(std::string(s.name) + (push ? ": push" : ": pull")));
    keys += b.size();
  }
  return keys / std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

Result<ServerBudgetResult> MeasureServerBudget(const ServerBudgetOptions& o) {
  ServerBudgetResult r;
  const uint64_t raw = o.rows * o.dim * 2 * sizeof(float);
  r.budget_mb = std::max<uint64_t>(1, (raw / 4) >> 20);
  const TempDir dir("tessera-bench-budget-");  // before the servers: they stop first
  Server budget("budget"), memory("memory");
  TESSERA_RETURN_IF_ERROR(Open(budget, o.server_binary,
                               {"--data_dir=" + dir.path() + "/data",
                                "--memory_budget_mb=" + std::to_string(r.budget_mb),
                                "--block_cache_mb=" + std::to_string(o.block_cache_mb),
                                "--write_buffer_mb=" + std::to_string(o.write_buffer_mb)}));
  r.base_rss_mb = ProcStatusMb(budget.cluster.pid(0), "VmRSS");
  TESSERA_RETURN_IF_ERROR(Open(memory, o.server_binary, {}));
  const std::vector<BenchCluster*> all = {&budget.cluster, &memory.cluster};
  for (Server* s : {&budget, &memory}) {
    RunOnly(all, s->cluster);
    TESSERA_RETURN_IF_ERROR(CreateAndFill(*s, o));
  }
  std::mt19937_64 rng(7);
  std::vector<std::vector<uint64_t>> batches(16);
  for (auto& b : batches) {
    for (uint32_t i = 0; i < o.batch; ++i) b.push_back(rng() % o.rows);
  }
  for (int rep = 0; rep < o.reps; ++rep) {
    for (Server* s : {&memory, &budget}) {
      RunOnly(all, s->cluster);
      TESSERA_ASSIGN_OR_RETURN(double push, Run(*s, batches, o, true));
      TESSERA_ASSIGN_OR_RETURN(double pull, Run(*s, batches, o, false));
      s->push.push_back(push);
      s->pull.push_back(pull);
    }
  }
  budget.cluster.Resume();
  r.peak_rss_mb = ProcStatusMb(budget.cluster.pid(0), "VmHWM");
  r.push_budget = Median(budget.push);
  r.push_memory = Median(memory.push);
  r.pull_budget = Median(budget.pull);
  r.pull_memory = Median(memory.pull);
  r.overhead_mb = r.base_rss_mb + static_cast<double>(o.block_cache_mb + o.write_buffer_mb);
  r.rss_vs_budget_plus_overhead = r.peak_rss_mb / (static_cast<double>(r.budget_mb) + r.overhead_mb);
  return r;
}

}  // namespace tessera::bench
