// bench_generator: the synthetic data generator (worker/synthetic_data.h), fast (the default,
// from tables) against the slow exact reference (SyntheticOptions::reference_generator), same
// options, in the same run: CPU time of this thread per generated sample, read in batches of
// 1024 as the training loop reads them, alternating repetitions (A B, B A, ...), medians. Then
// Create's cost: a planted model whose tables are not built yet (a new seed each time), and
// one whose tables a live reader already holds.
//
//   bench_generator [--quick] [--reps=N] [--samples=N] [--max_cardinality=N] [--planted_dim=N]
//
// The last line is one JSON object.
#include <gflags/gflags.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <memory>
#include <string>
#include <vector>

#include "benchmarks/bench_stats.h"
#include "worker/synthetic_data.h"

DEFINE_bool(quick, false, "Fewer samples and repetitions (a few seconds)");
DEFINE_int32(reps, 0, "Repetitions per generator (0: 5 with --quick, else 11)");
DEFINE_uint64(samples, 0,
              "Samples per repetition of the fast generator; the reference gets a tenth "
              "(0: 200000 with --quick, else 1000000)");
DEFINE_uint64(max_cardinality, 20000, "Cap of the Criteo cardinalities (the job's default)");
DEFINE_uint32(planted_dim, 4, "Width of the planted vectors (the job's default)");

namespace {

using tessera::worker::Batch;
using tessera::worker::SyntheticOptions;
using tessera::worker::SyntheticReader;

double ThreadCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

SyntheticOptions Options(bool reference, uint64_t seed) {
  SyntheticOptions o;
  o.seed = seed;
  o.cardinalities = tessera::worker::CriteoLikeCardinalities(FLAGS_max_cardinality);
  o.planted_dim = FLAGS_planted_dim;
  o.reference_generator = reference;
  return o;
}

// Reads `n` samples in batches of 1024 (each batch cleared first); returns the CPU seconds and
// adds the click rate's numerator to *clicks.
double Generate(SyntheticReader* reader, uint64_t n, double* clicks) {
  Batch batch;
  const double t0 = ThreadCpuSeconds();
  for (uint64_t done = 0; done < n;) {
    batch.Clear(reader->schema());
    const uint32_t want = static_cast<uint32_t>(std::min<uint64_t>(1024, n - done));
    done += reader->Read(want, &batch).value();
    for (float y : batch.labels) *clicks += y;
  }
  return ThreadCpuSeconds() - t0;
}

}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage("the fast synthetic generator against the exact reference");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  const int reps = FLAGS_reps > 0 ? FLAGS_reps : (FLAGS_quick ? 5 : 11);
  const uint64_t fast_n = FLAGS_samples > 0 ? FLAGS_samples : (FLAGS_quick ? 200000 : 1000000);
  const uint64_t counts[2] = {fast_n, std::max<uint64_t>(fast_n / 10, 1)};
  const char* names[2] = {"fast", "reference"};
  std::printf(
      "bench_generator: %d reps per generator (alternating), medians; CPU time of one "
      "thread; %llu fast and %llu reference samples a rep; Criteo-like cardinalities "
      "capped at %llu, planted_dim %u\n",
      reps, static_cast<unsigned long long>(counts[0]), static_cast<unsigned long long>(counts[1]),
      static_cast<unsigned long long>(FLAGS_max_cardinality), FLAGS_planted_dim);

  std::unique_ptr<SyntheticReader> readers[2];
  for (int v = 0; v < 2; ++v) {
    auto r = SyntheticReader::Create(Options(v == 1, 1));
    if (!r.ok()) {
      std::fprintf(stderr, "bench_generator: %s\n", r.status().ToString().c_str());
      return 1;
    }
    readers[v] = std::move(*r);
  }
  double clicks[2] = {0, 0};
  uint64_t generated[2] = {0, 0};
  double warm = 0;
  Generate(readers[0].get(), counts[0] / 10, &warm);  // warm-up, not counted
  Generate(readers[1].get(), counts[1] / 10, &warm);
  const auto us = tessera::bench::AlternateRepetitions(2, reps, [&](size_t v, int) {
    generated[v] += counts[v];
    return 1e6 * Generate(readers[v].get(), counts[v], &clicks[v]) / static_cast<double>(counts[v]);
  });
  const double fast_us = tessera::bench::Median((*us)[0]);
  const double ref_us = tessera::bench::Median((*us)[1]);
  for (int v = 0; v < 2; ++v) {
    std::printf("%-10s %8.3f us/sample (CPU)  %10.0f samples/s  click rate %.4f\n", names[v],
                v == 0 ? fast_us : ref_us, 1e6 / (v == 0 ? fast_us : ref_us),
                clicks[v] / static_cast<double>(generated[v]));
  }
  std::printf("reference / fast: %.1fx\n", ref_us / fast_us);

  // Create: tables built (a seed not seen yet), and found (a live reader of the same model).
  std::vector<double> build_ms, shared_ms;
  size_t table_bytes = 0;
  uint32_t ranks = 0;
  for (int r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    auto fresh = SyntheticReader::Create(Options(false, 1000 + r));
    auto t1 = std::chrono::steady_clock::now();
    auto again = SyntheticReader::Create(Options(false, 1000 + r));
    auto t2 = std::chrono::steady_clock::now();
    if (!fresh.ok() || !again.ok() || !(*fresh)->SharesTablesWith(**again)) {
      std::fprintf(stderr, "bench_generator: the second reader did not share the tables\n");
      return 1;
    }
    build_ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    shared_ms.push_back(std::chrono::duration<double, std::milli>(t2 - t1).count());
    table_bytes = (*fresh)->table_bytes();
    ranks = (*fresh)->tabulated_ranks();
  }
  const double build = tessera::bench::Median(build_ms);
  const double shared = tessera::bench::Median(shared_ms);
  std::printf(
      "Create: %.1f ms building the tables (%.1f MiB, ranks 1..%u per field), %.3f ms "
      "sharing them\n",
      build, static_cast<double>(table_bytes) / (1 << 20), ranks, shared);
  std::printf(
      "{\"bench\": \"generator\", \"reps\": %d, \"fast_us_per_sample\": %.4f, "
      "\"reference_us_per_sample\": %.4f, \"reference_vs_fast\": %.2f, "
      "\"create_build_ms\": %.2f, \"create_shared_ms\": %.4f, \"table_bytes\": %zu, "
      "\"tabulated_ranks\": %u}\n",
      reps, fast_us, ref_us, ref_us / fast_us, build, shared, table_bytes, ranks);
  return 0;
}
