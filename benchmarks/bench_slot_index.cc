// bench_slot_index: filling the server's row index (SlotIndex, storage/slot_index_internal.h)
// from a scan of another index, as a slot move, a lane merge or a restore does: the keys of a
// table of --keys keys, in that table's order, inserted into an empty one. "shared" gives both
// tables the same hash (what every table had before per-table seeds: the keys then arrive
// sorted by home entry and pile up into one run), "own" gives each table its own seed (what
// SlotIndex() does now), and "random" inserts the same keys shuffled (the baseline of a fill
// with no order). Alternating repetitions, medians; keys/s inserted, on one thread.
//
//   bench_slot_index [--quick] [--reps=N] [--keys=N]
//
// The last line is one JSON object.
#include <gflags/gflags.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "benchmarks/bench_stats.h"
#include "storage/slot_index_internal.h"

DEFINE_bool(quick, false, "Fewer repetitions (under 10 s)");
DEFINE_int32(reps, 0, "Repetitions per side (0: 3 with --quick, else 7)");
DEFINE_uint64(keys, 600000, "Keys in the scanned table (600k: 0.57 of its 2^20 entries)");

namespace {

using tessera::internal::SlotIndex;

// Inserts `keys` into an empty table, seeded 0 (the scanned table's seed) with `shared`, else
// with a seed of its own; returns keys/s. (The cost is in the fill: the run a scan order builds
// is spread again when the table doubles, so the final table's probes look normal.)
double Fill(const std::vector<uint64_t>& keys, bool shared) {
  const auto t0 = std::chrono::steady_clock::now();
  SlotIndex target = shared ? SlotIndex(0) : SlotIndex();
  for (uint64_t k : keys) target.TryEmplace(k, 0);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return static_cast<double>(keys.size()) / s;
}

}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage("filling a SlotIndex in another index's order: shared vs own seeds");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  const int reps = FLAGS_reps > 0 ? FLAGS_reps : (FLAGS_quick ? 3 : 7);
  SlotIndex source(0);
  std::mt19937_64 rng(5);
  while (source.size() < FLAGS_keys) source.TryEmplace(rng(), 0);
  std::vector<uint64_t> scanned;
  source.ForEach([&](uint64_t key, uint32_t) {
    scanned.push_back(key);
    return true;
  });
  std::vector<uint64_t> shuffled = scanned;
  std::shuffle(shuffled.begin(), shuffled.end(), rng);

  std::vector<double> shared, own, random;
  for (int r = 0; r < reps; ++r) {
    shared.push_back(Fill(scanned, true));
    own.push_back(Fill(scanned, false));
    random.push_back(Fill(shuffled, false));
  }
  const double m_shared = tessera::bench::Median(shared), m_own = tessera::bench::Median(own),
               m_random = tessera::bench::Median(random);
  std::printf("bench_slot_index: %zu keys scanned from a table of %zu entries, %d reps per side "
              "(alternating), medians; keys/s inserted on one thread\n",
              scanned.size(), source.capacity(), reps);
  std::printf("%-8s %14s\n", "side", "keys/s");
  std::printf("%-8s %14.3e\n", "shared", m_shared);
  std::printf("%-8s %14.3e\n", "own", m_own);
  std::printf("%-8s %14.3e\n", "random", m_random);
  std::printf("{\"bench\": \"slot_index\", \"keys\": %zu, \"reps\": %d, "
              "\"fill_scan_order_own_vs_shared\": %.4g, \"fill_scan_order_own_vs_random\": %.4g, "
              "\"shared_keys_per_s\": %.4g, \"own_keys_per_s\": %.4g}\n",
              scanned.size(), reps, m_own / m_shared, m_own / m_random, m_shared, m_own);
  return 0;
}
