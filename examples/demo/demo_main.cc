// tessera-demo: a client workload against a running cluster. Creates a sparse and a dense
// table, pushes and pulls for a number of steps and prints what it did.
#include <gflags/gflags.h>

#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "ps/cli.h"
#include "ps/client/client.h"
#include "ps/routing.h"

DEFINE_string(cluster, "", "Comma-separated server endpoints (or @FILE)");
DEFINE_uint32(steps, 50, "Push/pull rounds");
DEFINE_uint32(batch, 4096, "Keys per sparse request");
DEFINE_uint32(dim, 16, "Embedding width");
DEFINE_uint64(dense, 1 << 20, "Dense tensor length (floats)");

namespace {

constexpr tessera::cli::ToolInfo kTool{
    .name = "tessera-demo",
    .usage = "usage: tessera-demo --cluster=EPS [--steps=N]\n"
             "A client workload against a running cluster: creates a sparse and a dense table, "
             "pushes and pulls\nfor --steps rounds and prints what it did.",
    .flags_file = __FILE__};

// Prints each server's stats (those that answer).
void PrintServerStats(tessera::Client& c) {
  for (uint32_t r = 0; r < c.num_servers(); ++r) {
    auto st = c.ServerStats(r);
    if (st.ok()) {
      std::printf("--- server %u\n%s", r, st->c_str());
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  tessera::cli::ParseCommandLine(kTool, &argc, &argv);
  auto endpoints = tessera::ParseClusterList(FLAGS_cluster);
  if (!endpoints.ok()) {
    std::fprintf(stderr, "tessera-demo: %s\n", endpoints.status().ToString().c_str());
    return 2;
  }
  tessera::ClientOptions o;
  o.servers = *endpoints;
  auto client = tessera::Client::Create(o);
  if (!client.ok()) {
    std::fprintf(stderr, "tessera-demo: %s\n", client.status().ToString().c_str());
    return 1;
  }
  auto& c = **client;
  tessera::OptimizerSpec adagrad;
  adagrad.kind = tessera::OptimizerKind::kAdagrad;
  adagrad.learning_rate = 0.05f;
  auto emb = c.CreateTable(
      tessera::TableSpec::Sparse("demo/embedding", FLAGS_dim, adagrad,
                                 {tessera::InitializerKind::kUniform, -0.01f, 0.01f, 1}));
  auto mlp = c.CreateTable(tessera::TableSpec::Dense("demo/mlp", FLAGS_dense, adagrad));
  if (!emb.ok() || !mlp.ok()) {
    std::fprintf(stderr, "tessera-demo: create tables: %s %s\n", emb.status().ToString().c_str(),
                 mlp.status().ToString().c_str());
    return 1;
  }
  std::printf(
      "cluster: %u servers; tables: demo/embedding (sparse, dim %u, adagrad), "
      "demo/mlp (dense, %llu floats)\n",
      c.num_servers(), FLAGS_dim, static_cast<unsigned long long>(FLAGS_dense));
  std::mt19937_64 rng(1);
  std::vector<uint64_t> keys(FLAGS_batch);
  std::vector<float> grads(size_t{FLAGS_batch} * FLAGS_dim), values(grads.size());
  std::vector<float> dense(FLAGS_dense), dgrad(FLAGS_dense, 0.001f);
  // Skewed keys with duplicates: a few hot ids and a long tail. The same batch every step, so
  // the pulled rows show the optimizer's progress.
  for (auto& k : keys) k = (rng() % 4 == 0) ? rng() % 64 : rng() % 1000000;
  const auto t0 = std::chrono::steady_clock::now();
  uint64_t pushed = 0, pulled = 0;
  double first_norm = 0, last_norm = 0;
  for (uint32_t step = 0; step < FLAGS_steps; ++step) {
    auto h = c.Pull(*emb, keys, values.data());
    if (auto s = c.Wait(h); !s.ok()) {
      std::fprintf(stderr, "pull: %s\n", s.ToString().c_str());
      return 1;
    }
    double norm = 0;
    for (size_t i = 0; i < values.size(); ++i) {
      grads[i] = values[i];  // gradient of 0.5*|w|^2: shrinks the rows towards 0
      norm += values[i] * values[i];
    }
    if (step == 0) first_norm = norm;
    last_norm = norm;
    auto hp = c.Push(*emb, keys, grads);
    auto hd = c.DensePush(*mlp, 0, dgrad);
    auto hdp = c.DensePull(*mlp, 0, FLAGS_dense, dense.data());
    for (auto* hh : {&hp, &hd, &hdp}) {
      if (auto s = c.Wait(*hh); !s.ok()) {
        std::fprintf(stderr, "step %u: %s\n", step, s.ToString().c_str());
        return 1;
      }
    }
    pushed += keys.size();
    pulled += keys.size();
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf(
      "steps %u: pulled %llu and pushed %llu sparse rows, pushed and pulled %u x %.1f MiB "
      "dense in %.2f s\n",
      FLAGS_steps, static_cast<unsigned long long>(pulled), static_cast<unsigned long long>(pushed),
      FLAGS_steps, FLAGS_dense * 4.0 / (1 << 20), secs);
  std::printf("sparse |w|^2 of a batch: first step %.4f, last step %.4f (adagrad shrinks it)\n",
              first_norm, last_norm);
  std::printf("dense[0] after %u pushes of 0.001: %.6f\n", FLAGS_steps, dense[0]);
  PrintServerStats(c);
  return last_norm < first_norm ? 0 : 1;
}
