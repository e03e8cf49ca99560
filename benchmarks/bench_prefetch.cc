// bench_prefetch: the software prefetching of a server lane's sparse row updates, on against
// off in the same run (alternating repetitions, medians): SparseRows::FindOrCreate + Adagrad,
// the loop of MemoryLaneStore::Apply, for batches of 37k unique keys (what the client's dedup
// leaves of a 100k-key Zipf request in bench_sparse) drawn uniformly from tables of
// --rows_small and --rows_large rows of dim 16. Each key costs a hash probe, then its row and
// metadata: dependent cache misses once the table outgrows the caches. "off" runs the same
// loop without the PrefetchAhead calls. The lookup cells do the same for the loop of
// MemoryLaneStore::Lookup (Find, then the row's values copied out), which does not prefetch:
// they show why (prefetching measured slower there). Keys/s count unique keys, on one thread.

//
//   bench_prefetch [--quick] [--reps=N]
//
// The last line is one JSON object.
#include <gflags/gflags.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "benchmarks/bench_keys.h"
#include "benchmarks/bench_stats.h"
#include "ps/optimizer.h"
#include "storage/row_table_internal.h"

DEFINE_bool(quick, false, "Fewer repetitions and a smaller large table (under 30 s)");
DEFINE_int32(reps, 0, "Repetitions per cell and side (0: 5 with --quick, else 11)");
DEFINE_uint64(rows_small, 150000, "Rows of the small table (about what bench_sparse touches)");
DEFINE_uint64(rows_large, 0, "Rows of the large table (0: 2M with --quick, else 8M)");

namespace {

using BenchClock = std::chrono::steady_clock;
using tessera::bench::Median;

double Seconds(BenchClock::duration d) { return std::chrono::duration<double>(d).count(); }

// The server lane's update loop (MemoryLaneStore::Apply in storage/memory_engine.cc).
void Apply(tessera::internal::SparseRows& rows, const tessera::Optimizer& opt,
           const std::vector<uint64_t>& keys, const std::vector<float>& grads, uint32_t dim,
           bool prefetch) {
  const std::span<const uint64_t> span(keys);
  for (size_t i = 0; i < keys.size(); ++i) {
    if (prefetch) tessera::internal::PrefetchAhead(rows, span, i);
    bool created;
    tessera::RowMeta* meta;
    float* row = rows.FindOrCreate(keys[i], &created, &meta);
    ++meta->update_count;
    opt.Apply(row, row + dim, grads.data() + i * dim, dim, 0, dim, meta->update_count, 1.0f);
  }
}

// The server lane's lookup loop (MemoryLaneStore::Lookup): each key's row copied out.
void Lookup(const tessera::internal::SparseRows& rows, const std::vector<uint64_t>& keys,
            std::vector<float>& out, uint32_t dim, bool prefetch) {
  const std::span<const uint64_t> span(keys);
  for (size_t i = 0; i < keys.size(); ++i) {
    if (prefetch) tessera::internal::PrefetchAhead(rows, span, i);
    const float* row = rows.Find(keys[i]);
    if (row != nullptr) std::memcpy(out.data() + i * dim, row, sizeof(float) * dim);
  }
}

struct Cell {
  std::string name;
  double on = 0, off = 0;  // median keys/s
};

// Alternates off/on repetitions of `run(prefetch)` (which returns the keys it visited).
template <typename Run>
Cell Measure(const std::string& name, int reps, Run run) {
  std::vector<double> on, off;
  for (int r = 0; r < reps; ++r) {
    for (bool p : {r % 2 == 0, r % 2 != 0}) {
      const auto t0 = BenchClock::now();
      const double keys = run(p);
      const double rate = keys / Seconds(BenchClock::now() - t0);
      (p ? on : off).push_back(rate);
    }
  }
  return Cell{name, Median(on), Median(off)};
}

}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage("prefetching of a lane's sparse row updates, on vs off");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  const int reps = FLAGS_reps > 0 ? FLAGS_reps : (FLAGS_quick ? 5 : 11);
  const uint64_t rows_large = FLAGS_rows_large > 0 ? FLAGS_rows_large : (FLAGS_quick ? 2000000 : 8000000);
  const uint32_t dim = 16;
  std::printf("bench_prefetch: %d reps per side and cell (alternating), medians; keys/s on one "
              "thread\n", reps);
  std::vector<Cell> cells;

  // Server row updates: unique keys of such requests (37k each), uniform over the table.
  tessera::OptimizerSpec os;
  os.kind = tessera::OptimizerKind::kAdagrad;
  os.learning_rate = 0.01f;
  const auto opt = tessera::Optimizer::Make(os);
  for (uint64_t rows_n : {FLAGS_rows_small, rows_large}) {
    const tessera::TableSpec spec = tessera::TableSpec::Sparse("t", dim, os);
    tessera::internal::SparseRows rows(spec, opt.get());
    {
      std::vector<uint64_t> all(rows_n);
      for (uint64_t k = 0; k < rows_n; ++k) all[k] = tessera::bench::SpreadId(k + 1);
      bool created;
      for (uint64_t k : all) rows.FindOrCreate(k, &created);
    }
    const auto batches = tessera::bench::UniformBatches(8, 37000, rows_n, 11);
    std::vector<std::vector<uint64_t>> ids(batches.size());
    for (size_t b = 0; b < batches.size(); ++b) {
      for (uint64_t r : batches[b]) ids[b].push_back(tessera::bench::SpreadId(r + 1));
    }
    std::vector<float> grads(37000 * dim, 0.01f);
    cells.push_back(Measure("apply/" + std::to_string(rows_n) + "_rows", reps, [&](bool p) {
      double keys = 0;
      for (const auto& b : ids) {
        Apply(rows, *opt, b, grads, dim, p);
        keys += static_cast<double>(b.size());
      }
      return keys;
    }));
    std::vector<float> out(37000 * dim);
    cells.push_back(Measure("lookup/" + std::to_string(rows_n) + "_rows", reps, [&](bool p) {
      double keys = 0;
      for (const auto& b : ids) {
        Lookup(rows, b, out, dim, p);
        keys += static_cast<double>(b.size());
      }
      return keys;
    }));
  }

  std::printf("%-24s %14s %14s %8s\n", "cell", "off keys/s", "on keys/s", "on/off");
  for (const Cell& c : cells) {
    std::printf("%-24s %14.3e %14.3e %8.2f\n", c.name.c_str(), c.off, c.on, c.on / c.off);
  }
  std::printf("{\"bench\": \"prefetch\", \"reps\": %d", reps);
  for (const Cell& c : cells) {
    std::string key = c.name;
    for (char& ch : key) {
      if (ch == '/') ch = '_';
    }
    std::printf(", \"%s_on_vs_off\": %.4g, \"%s_on_keys_per_s\": %.4g", key.c_str(), c.on / c.off,
                key.c_str(), c.on);
  }
  std::printf("}\n");
  return 0;
}
