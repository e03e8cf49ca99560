// bench_dedup: the client's key dedup (ps/client/key_index_internal.h, what Client::Push and
// Pull do first with the caller's keys) against three other ways of doing the same work, in
// the same run, alternating repetitions, medians:
//   compact: the client's KeyIndex, 4-byte entries sized for the unique keys;
//   stamped: the table it replaced (16-byte key/index/stamp slots, 2n of them, emptied by a
//            new stamp per call);
//   absl:    an absl::flat_hash_map<uint64_t, uint32_t>, cleared and reserved per call;
//   sort:    (key, position) pairs std::sort'ed, then one pass assigning unique indices (the
//            unique keys come out in key order, not first-seen order).
// Every variant fills the same outputs: the unique keys and, per caller key, its unique index.
// Keys/s count the caller's keys, on one thread. Key sets: Zipf(1.05) over 10M ids, as
// bench_sparse draws them (100k and 1M keys a call), and uniform 100k keys over 10M ids.
//
//   bench_dedup [--quick] [--reps=N]
//
// The last line is one JSON object.
#include <absl/container/flat_hash_map.h>
#include <gflags/gflags.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "benchmarks/bench_keys.h"
#include "benchmarks/bench_stats.h"
#include "ps/client/key_index_internal.h"

DEFINE_bool(quick, false, "Fewer repetitions (under 20 s)");
DEFINE_int32(reps, 0, "Repetitions per variant and cell (0: 5 with --quick, else 11)");

namespace {

using BenchClock = std::chrono::steady_clock;
using tessera::Mix64;

// The client's previous dedup table: 2n slots of (key, index, stamp), emptied in O(1) by a new
// stamp per call. The baseline the compact table is measured against.
class StampedIndex {
 public:
  void Dedupe(std::span<const uint64_t> keys, std::vector<uint64_t>* unique, uint32_t* of) {
    const size_t n = keys.size();
    const size_t cap = std::bit_ceil(std::max<size_t>(16, 2 * n));
    if (cap > slots_.size()) {
      slots_.assign(cap, Slot{});
      stamp_ = 0;
    }
    mask_ = cap - 1;
    ++stamp_;
    unique->clear();
    unique->reserve(n);
    for (size_t i = 0; i < n; ++i) {
      for (size_t h = Mix64(keys[i]) & mask_;; h = (h + 1) & mask_) {
        Slot& s = slots_[h];
        if (s.stamp != stamp_) {
          s = Slot{keys[i], static_cast<uint32_t>(unique->size()), stamp_};
          of[i] = s.index;
          unique->push_back(keys[i]);
          break;
        }
        if (s.key == keys[i]) {
          of[i] = s.index;
          break;
        }
      }
    }
  }

 private:
  struct Slot {
    uint64_t key = 0;
    uint32_t index = 0;
    uint32_t stamp = 0;
  };
  std::vector<Slot> slots_;
  size_t mask_ = 0;
  uint32_t stamp_ = 0;
};

void AbslDedupe(std::span<const uint64_t> keys, std::vector<uint64_t>* unique, uint32_t* of) {
  thread_local absl::flat_hash_map<uint64_t, uint32_t> map;
  map.clear();
  map.reserve(keys.size() / 2);
  unique->clear();
  unique->reserve(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    auto [it, fresh] = map.try_emplace(keys[i], static_cast<uint32_t>(unique->size()));
    if (fresh) unique->push_back(keys[i]);
    of[i] = it->second;
  }
}

void SortDedupe(std::span<const uint64_t> keys, std::vector<uint64_t>* unique, uint32_t* of) {
  thread_local std::vector<std::pair<uint64_t, uint32_t>> pairs;
  pairs.resize(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) pairs[i] = {keys[i], static_cast<uint32_t>(i)};
  std::sort(pairs.begin(), pairs.end());
  unique->clear();
  unique->reserve(keys.size());
  for (size_t j = 0; j < pairs.size(); ++j) {
    if (j == 0 || pairs[j].first != pairs[j - 1].first) unique->push_back(pairs[j].first);
    of[pairs[j].second] = static_cast<uint32_t>(unique->size() - 1);
  }
}

struct Cell {
  std::string name;
  std::vector<double> rates[4];  // compact, stamped, absl, sort
};
constexpr const char* kVariants[4] = {"compact", "stamped", "absl", "sort"};

}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage("the client's key dedup against other ways of doing it");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  const int reps = FLAGS_reps > 0 ? FLAGS_reps : (FLAGS_quick ? 5 : 11);
  std::printf("bench_dedup: %d reps per variant and cell (rotating order), medians; keys/s "
              "count the caller's keys, one thread\n", reps);
  struct Set {
    std::string name;
    std::vector<std::vector<uint64_t>> batches;
  };
  const std::vector<Set> sets = {
      {"zipf/100k", tessera::bench::ZipfBatches(8, 100000, 10000000, 1.05, 42)},
      {"zipf/1M", tessera::bench::ZipfBatches(4, 1000000, 10000000, 1.05, 43)},
      {"uniform/100k", tessera::bench::UniformBatches(8, 100000, 10000000, 44)},
  };
  tessera::internal::KeyIndex compact;
  StampedIndex stamped;
  std::vector<Cell> cells;
  for (const Set& set : sets) {
    Cell cell{set.name, {}};
    std::vector<uint64_t> unique;
    std::vector<uint32_t> of(set.batches[0].size());
    size_t check = 0;  // unique keys found, summed: every variant must find the same
    for (int r = -1; r < reps; ++r) {  // r == -1: warm-up, not counted
      for (int k = 0; k < 4; ++k) {
        const int v = (k + std::max(r, 0)) % 4;
        size_t found = 0;
        const auto t0 = BenchClock::now();
        for (const auto& b : set.batches) {
          if (v == 0) compact.Dedupe(b, &unique, of.data());
          if (v == 1) stamped.Dedupe(b, &unique, of.data());
          if (v == 2) AbslDedupe(b, &unique, of.data());
          if (v == 3) SortDedupe(b, &unique, of.data());
          found += unique.size();
        }
        const double secs = std::chrono::duration<double>(BenchClock::now() - t0).count();
        if (check == 0) check = found;
        if (found != check) {
          std::fprintf(stderr, "bench_dedup: %s: %s found %zu unique keys, not %zu\n",
                       set.name.c_str(), kVariants[v], found, check);
          return 1;
        }
        if (r >= 0) {
          const size_t keys = set.batches.size() * set.batches[0].size();
          cell.rates[v].push_back(static_cast<double>(keys) / secs);
        }
      }
    }
    cells.push_back(std::move(cell));
  }
  std::printf("%-14s %14s %14s %14s %14s %11s\n", "cell", "compact", "stamped", "absl", "sort",
              "compact/st");
  std::string json = "{\"bench\": \"dedup\", \"reps\": " + std::to_string(reps);
  for (const Cell& c : cells) {
    double med[4];
    for (int v = 0; v < 4; ++v) med[v] = tessera::bench::Median(c.rates[v]);
    std::printf("%-14s %14.3e %14.3e %14.3e %14.3e %11.2f\n", c.name.c_str(), med[0], med[1],
                med[2], med[3], med[0] / med[1]);
    std::string key = c.name;
    std::replace(key.begin(), key.end(), '/', '_');
    for (int v = 0; v < 4; ++v) {
      json += ", \"" + key + "_" + kVariants[v] + "_keys_per_s\": " + std::to_string(med[v]);
    }
    json += ", \"" + key + "_compact_vs_stamped\": " + std::to_string(med[0] / med[1]);
  }
  std::printf("%s}\n", json.c_str());
  return 0;
}
