// A child process for the kill -9 tests of rocksdb_engine_test.cc: streams committed batches into
// a RocksDB engine and reports each acknowledgement on stdout until it is killed.
//
//   storage_crash_helper DATA_DIR strict|relaxed WINDOW_MS FIRST_BATCH
//
// Batch b applies gradient (b + 1) to keys [b * kStride, b * kStride + kKeysPerBatch) of the SGD
// (learning rate 1, zero-initialized) table "crash" of dim kDim, then commits and prints
// "c <b> <CLOCK_MONOTONIC ms>". It never stops on its own.
#include <time.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "storage/storage.h"

namespace {
constexpr uint32_t kDim = 4;
constexpr uint64_t kStride = 50;
constexpr uint64_t kKeysPerBatch = 200;

long long MonotonicMs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<long long>(ts.tv_sec) * 1000 + ts.tv_nsec / 1000000;
}
}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: %s DATA_DIR strict|relaxed WINDOW_MS FIRST_BATCH\n", argv[0]);
    return 2;
  }
  tessera::StorageOptions options;
  options.data_dir = argv[1];
  options.durability = std::string(argv[2]) == "relaxed" ? tessera::Durability::kRelaxed
                                                         : tessera::Durability::kStrict;
  options.relaxed_window_ms = static_cast<uint32_t>(std::strtoul(argv[3], nullptr, 10));
  // A small budget, so that the cold path (read back from disk) is exercised too.
  options.memory_budget_bytes = 64 << 10;
  const uint64_t first = std::strtoull(argv[4], nullptr, 10);

  auto engine = tessera::OpenStorageEngine(options);
  if (!engine.ok()) {
    std::fprintf(stderr, "open: %s\n", engine.status().ToString().c_str());
    return 1;
  }
  auto lane = (*engine)->OpenLane(0, 1);
  if (!lane.ok()) return 1;
  const auto spec = tessera::TableSpec::Sparse("crash", kDim, {tessera::OptimizerKind::kSgd, 1.0f});
  const uint64_t id = tessera::TableIdForName(spec.name);
  if (!(*lane)->AddTable(id, spec).ok()) return 1;

  std::vector<uint64_t> keys(kKeysPerBatch);
  std::vector<float> grad(kDim);
  std::vector<const float*> grads(kKeysPerBatch, grad.data());
  for (uint64_t b = first;; ++b) {
    for (uint64_t j = 0; j < kKeysPerBatch; ++j) keys[j] = b * kStride + j;
    for (auto& g : grad) g = static_cast<float>(b + 1);
    tessera::ApplyContext ctx{b, 0};
    tessera::Status s = (*lane)->Apply(id, keys, grads, ctx);
    if (s.ok()) s = (*lane)->Commit();
    if (!s.ok()) {
      std::fprintf(stderr, "batch %llu: %s\n", static_cast<unsigned long long>(b),
                   s.ToString().c_str());
      return 1;
    }
    std::printf("c %llu %lld\n", static_cast<unsigned long long>(b), MonotonicMs());
    std::fflush(stdout);
  }
}
