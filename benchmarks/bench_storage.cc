// Storage benchmark: Tessera's LaneStore (memory tier over RocksDB) against raw RocksDB Put/Get of
// the same row bytes, in the same run; strict vs relaxed durability; memory per row. Then the
// server tier with a table four times its memory budget against a memory-only server: pushes,
// pulls and the durable server's peak memory against the budget plus the documented overhead
// (bench_storage_server.h).
//
//   bench_storage [--quick] [--rows=N] [--dim=16] [--reps=5] [--dir=/tmp] [--server_rows=N]
//                 [--server_only]
//
// Prints a table, then (last line) one JSON object with the headline ratios.
#include <gflags/gflags.h>
#include <rocksdb/db.h>
#include <rocksdb/options.h>
#include <rocksdb/write_batch.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "benchmarks/bench_cluster.h"
#include "benchmarks/bench_stats.h"
#include "benchmarks/bench_storage_server.h"
#include "ps/routing.h"
#include "storage/rocksdb_tuning_internal.h"
#include "storage/storage.h"

DEFINE_bool(quick, false, "Small sizes and few repetitions (under a minute)");
DEFINE_uint64(rows, 0, "Rows in the table (0: 200000 with --quick, else 1000000)");
DEFINE_uint32(dim, 16, "Floats per row (the optimizer is Adagrad: as many state floats)");
DEFINE_int32(reps, 0, "Repetitions per measurement; medians are reported (0: 3 quick, else 5)");
DEFINE_string(dir, "", "Parent of the scratch directories (default: $TMPDIR or /tmp)");
DEFINE_string(rocksdb_table_options, "",
              "Extra RocksDB column-family options for both Tessera and raw RocksDB");
DEFINE_uint64(server_rows, 0,
              "Rows in the server-level part's table (0: 1000000 with --quick, else 4000000; "
              "the budget is a quarter of their value + state bytes)");
DEFINE_string(server_binary, "", "tessera-server (default: next to this program)");
DEFINE_bool(server_only, false,
            "Only the server-level part (a server at a quarter budget vs a memory-only one)");

namespace {

using Clock = std::chrono::steady_clock;
using tessera::Status;
using tessera::bench::AlternateRepetitions;
using tessera::bench::Median;

constexpr size_t kBatch = 10000;          // keys per apply / lookup call
constexpr size_t kDurableBatch = 100000;  // keys per push in the durability comparison

void Die(const Status& s, const char* what) {
  if (s.ok()) return;
  std::fprintf(stderr, "bench_storage: %s: %s\n", what, s.ToString().c_str());
  std::exit(1);
}
void Die(const rocksdb::Status& s, const char* what) {
  if (s.ok()) return;
  std::fprintf(stderr, "bench_storage: %s: %s\n", what, s.ToString().c_str());
  std::exit(1);
}

// Keys are spread like feature ids (hashed), so neighbours in the table are not neighbours here.
uint64_t KeyOf(uint64_t i) { return tessera::Mix64(i + 1); }

class Scratch {
 public:
  explicit Scratch(const std::string& name) {
    std::string base = FLAGS_dir;
    if (base.empty()) {
      const char* t = std::getenv("TMPDIR");
      base = t != nullptr && *t != '\0' ? t : "/tmp";
    }
    path_ = base + "/tessera_bench_" + name + "_" + std::to_string(getpid());
    std::filesystem::remove_all(path_);
  }
  ~Scratch() { std::filesystem::remove_all(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// ------------------------------------------------------------------ Tessera
struct Tessera {
  std::unique_ptr<tessera::StorageEngine> engine;
  std::unique_ptr<tessera::LaneStore> lane;
  uint64_t id = tessera::TableIdForName("bench");
};

Tessera OpenTessera(const std::string& dir, uint64_t budget, tessera::Durability durability) {
  tessera::StorageOptions o;
  o.data_dir = dir;
  o.memory_budget_bytes = budget;
  o.durability = durability;
  o.rocksdb_table_options = FLAGS_rocksdb_table_options;
  auto e = tessera::OpenStorageEngine(o);
  Die(e.status(), "open");
  Tessera t;
  t.engine = std::move(e).value();
  auto l = t.engine->OpenLane(0, 1);
  Die(l.status(), "open lane");
  t.lane = std::move(l).value();
  tessera::OptimizerSpec adagrad{tessera::OptimizerKind::kAdagrad, 0.01f};
  adagrad.initial_accumulator = 0.1f;
  Die(t.lane->AddTable(
          t.id, tessera::TableSpec::Sparse("bench", FLAGS_dim, adagrad,
                                           {tessera::InitializerKind::kUniform, -0.01f, 0.01f, 1})),
      "add table");
  return t;
}

// Applies one gradient to each of keys; commits.
void TesseraApply(Tessera& t, const std::vector<uint64_t>& keys, uint64_t step) {
  static std::vector<float> grad;
  grad.assign(FLAGS_dim, 0.001f);
  std::vector<const float*> g(keys.size(), grad.data());
  Die(t.lane->Apply(t.id, keys, g, {step, 1}), "apply");
  Die(t.lane->Commit(), "commit");
}

void TesseraLookup(Tessera& t, const std::vector<uint64_t>& keys, std::vector<float>& out) {
  out.resize(keys.size() * FLAGS_dim);
  std::vector<float*> o(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) o[i] = &out[i * FLAGS_dim];
  Die(t.lane->Lookup(t.id, keys, o), "lookup");
}

void Populate(Tessera& t, uint64_t rows) {
  std::vector<uint64_t> keys;
  for (uint64_t i = 0; i < rows; i += kBatch) {
    keys.clear();
    for (uint64_t j = i; j < std::min(rows, i + kBatch); ++j) keys.push_back(KeyOf(j));
    TesseraApply(t, keys, 0);
  }
}

// ------------------------------------------------------------------ raw RocksDB
// Opened with the storage library's own RocksDB configuration for the default StorageOptions
// (storage/rocksdb_tuning_internal.h: the DB options and TunedTableOptions, the same block cache
// size, --rocksdb_table_options over it), so the comparison measures Tessera's layer, not a
// different configuration.
struct Raw {
  std::unique_ptr<rocksdb::DB> db;
};

Raw OpenRaw(const std::string& dir) {
  tessera::StorageOptions so;
  so.data_dir = dir;
  so.rocksdb_table_options = FLAGS_rocksdb_table_options;
  auto tuning = tessera::internal::TuneRocksDb(so);
  Die(tuning.status(), "raw tuning");
  const rocksdb::Options o(tuning->db, tuning->table);
  rocksdb::DB* db = nullptr;
  Die(rocksdb::DB::Open(o, dir, &db), "raw open");
  return Raw{std::unique_ptr<rocksdb::DB>(db)};
}

// Tessera's key layout: 2-byte slot, 8-byte key, big-endian.
std::string RawKey(uint64_t key) {
  std::string k(10, '\0');
  const uint32_t slot = tessera::SlotOfKey(key);
  k[0] = static_cast<char>(slot >> 8);
  k[1] = static_cast<char>(slot);
  for (int i = 0; i < 8; ++i) k[2 + i] = static_cast<char>(key >> (56 - 8 * i));
  return k;
}

size_t RowBytes() { return size_t{2} * FLAGS_dim * sizeof(float) + 12; }

void RawPut(Raw& r, const std::vector<uint64_t>& keys) {
  static std::string value;
  value.assign(RowBytes(), '\1');
  rocksdb::WriteBatch b;
  for (uint64_t k : keys) Die(b.Put(RawKey(k), value), "raw batch");
  Die(r.db->Write(rocksdb::WriteOptions(), &b), "raw write");
}

void RawGet(Raw& r, const std::vector<uint64_t>& keys, std::vector<float>& out) {
  std::vector<std::string> ks(keys.size());
  std::vector<rocksdb::Slice> slices(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    ks[i] = RawKey(keys[i]);
    slices[i] = ks[i];
  }
  std::vector<rocksdb::PinnableSlice> values(keys.size());
  std::vector<rocksdb::Status> st(keys.size());
  r.db->MultiGet(rocksdb::ReadOptions(), r.db->DefaultColumnFamily(), keys.size(), slices.data(),
                 values.data(), st.data());
  // Use the values as a caller would: copy the embedding out.
  out.resize(keys.size() * FLAGS_dim);
  for (size_t i = 0; i < keys.size(); ++i) {
    Die(st[i], "raw get");
    std::memcpy(&out[i * FLAGS_dim], values[i].data(), FLAGS_dim * sizeof(float));
  }
}

// ------------------------------------------------------------------ measurement
// Keys/s of `op` over `batches` batches of `batch` uniformly random keys; median of reps.
double Throughput(uint64_t rows, size_t batch, int batches, uint64_t seed,
                  const std::function<void(const std::vector<uint64_t>&)>& op) {
  std::vector<double> rates;
  std::mt19937_64 rng(seed);
  std::vector<std::vector<uint64_t>> work(batches, std::vector<uint64_t>(batch));
  for (int rep = 0; rep < FLAGS_reps; ++rep) {
    for (auto& w : work) {
      for (auto& k : w) k = KeyOf(rng() % rows);
    }
    const auto t0 = Clock::now();
    for (auto& w : work) op(w);
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    rates.push_back(static_cast<double>(batch) * batches / s);
  }
  return Median(rates);
}

struct Result {
  double apply = 0, lookup = 0, put = 0, get = 0, hit_rate = 0;
};

Result Compare(uint64_t rows, uint64_t budget, const char* label) {
  Scratch tdir(std::string("tessera_") + label), rdir(std::string("raw_") + label);
  Tessera t = OpenTessera(tdir.path(), budget, tessera::Durability::kStrict);
  Populate(t, rows);
  Raw raw = OpenRaw(rdir.path());
  {
    std::vector<uint64_t> keys;
    for (uint64_t i = 0; i < rows; i += kBatch) {
      keys.clear();
      for (uint64_t j = i; j < std::min(rows, i + kBatch); ++j) keys.push_back(KeyOf(j));
      RawPut(raw, keys);
    }
  }
  const int batches = FLAGS_quick ? 5 : 20;
  std::vector<float> out;
  uint64_t step = 1;
  Result r;
  // Warm both (block cache, memory tier) with one pass of reads.
  Throughput(rows, kBatch, batches, 99, [&](const auto& k) { TesseraLookup(t, k, out); });
  Throughput(rows, kBatch, batches, 99, [&](const auto& k) { RawGet(raw, k, out); });
  const auto before = t.lane->stats();
  r.lookup = Throughput(rows, kBatch, batches, 1, [&](const auto& k) { TesseraLookup(t, k, out); });
  const auto after = t.lane->stats();
  r.hit_rate = static_cast<double>(after.memory_hits - before.memory_hits) /
               static_cast<double>(after.lookups - before.lookups);
  r.get = Throughput(rows, kBatch, batches, 1, [&](const auto& k) { RawGet(raw, k, out); });
  r.apply =
      Throughput(rows, kBatch, batches, 2, [&](const auto& k) { TesseraApply(t, k, step++); });
  r.put = Throughput(rows, kBatch, batches, 2, [&](const auto& k) { RawPut(raw, k); });
  return r;
}

// Keys/s of 100k-key pushes (apply + commit) in the strict and the relaxed mode. The two engines
// take turns push by push (strict first, then relaxed first, ...) on the same keys, so drift in
// machine load hits both alike.
std::pair<double, double> DurablePush(uint64_t rows) {
  Scratch sdir("strict"), rdir("relaxed");
  Tessera strict = OpenTessera(sdir.path(), 0, tessera::Durability::kStrict);
  Tessera relaxed = OpenTessera(rdir.path(), 0, tessera::Durability::kRelaxed);
  Populate(strict, rows);
  Populate(relaxed, rows);
  std::mt19937_64 rng(3);
  std::vector<uint64_t> keys(kDurableBatch);
  int keys_of_round = -1;
  const int pushes = FLAGS_reps * (FLAGS_quick ? 3 : 5);
  auto rates = AlternateRepetitions(2, pushes, [&](size_t variant, int round) {
    if (round != keys_of_round) {  // new keys each round, the same for both engines
      for (auto& k : keys) k = KeyOf(rng() % rows);
      keys_of_round = round;
    }
    Tessera& t = variant == 0 ? strict : relaxed;
    const auto t0 = Clock::now();
    TesseraApply(t, keys, static_cast<uint64_t>(round + 1));
    const double sec = std::chrono::duration<double>(Clock::now() - t0).count();
    return kDurableBatch / sec;
  });
  return {Median((*rates)[0]), Median((*rates)[1])};
}

void Line(const char* what, double a, double b) {
  std::printf("%-44s %14.0f %14.0f %8.2f\n", what, a, b, b > 0 ? a / b : 0);
}

// The storage library alone (LaneStore vs raw RocksDB, strict vs relaxed, memory per row): prints
// its table and returns its JSON keys (with a trailing ", ").
std::string LibraryPart() {
  const uint64_t rows = FLAGS_rows;
  const double raw_bytes = 2.0 * FLAGS_dim * sizeof(float);

  // Memory per row: the whole table in the memory tier.
  double per_row = 0;
  {
    Scratch dir("memory");
    Tessera t = OpenTessera(dir.path(), 0, tessera::Durability::kStrict);
    Populate(t, rows);
    const auto s = t.lane->stats();
    per_row = static_cast<double>(s.bytes_in_memory) / static_cast<double>(s.rows_in_memory);
  }
  const uint64_t table_bytes = static_cast<uint64_t>(per_row * rows);

  const Result hot = Compare(rows, 0, "hot");
  const Result cold = Compare(rows, table_bytes / 10, "cold");
  const auto [strict, relaxed] = DurablePush(rows);

  std::printf(
      "bench_storage: %llu rows, dim %u, Adagrad (row %zu bytes on disk, %.0f raw), "
      "median of %d\n",
      static_cast<unsigned long long>(rows), FLAGS_dim, RowBytes(), raw_bytes, FLAGS_reps);
  std::printf("%-44s %14s %14s %8s\n", "measurement", "tessera keys/s", "rocksdb keys/s", "ratio");
  Line("in memory: apply+commit vs Put (10k batch)", hot.apply, hot.put);
  Line("in memory: lookup vs MultiGet (10k batch)", hot.lookup, hot.get);
  Line("10x budget: apply+commit vs Put (10k batch)", cold.apply, cold.put);
  Line("10x budget: lookup vs MultiGet (10k batch)", cold.lookup, cold.get);
  std::printf("%-44s %14.0f %14.0f %8.2f\n", "push 100k keys: strict vs relaxed", strict, relaxed,
              strict / relaxed);
  std::printf("%-44s %14.3f\n", "10x budget: lookup memory hit rate", cold.hit_rate);
  std::printf("%-44s %14.1f %14.0f %8.2f\n", "memory per row (bytes) vs raw value+state", per_row,
              raw_bytes, per_row / raw_bytes);
  char json[1024];
  std::snprintf(json, sizeof(json),
                "\"rows\": %llu, \"dim\": %u, \"strict_vs_relaxed_push\": %.3f, "
                "\"cold_lookup_vs_rocksdb_get\": %.3f, \"memory_per_row_vs_raw\": %.3f, "
                "\"hot_lookup_vs_rocksdb_get\": %.3f, \"hot_apply_vs_rocksdb_put\": %.3f, "
                "\"cold_apply_vs_rocksdb_put\": %.3f, \"cold_hit_rate\": %.3f, "
                "\"strict_push_keys_per_s\": %.0f, \"relaxed_push_keys_per_s\": %.0f, ",
                static_cast<unsigned long long>(rows), FLAGS_dim, strict / relaxed,
                cold.lookup / cold.get, per_row / raw_bytes, hot.lookup / hot.get,
                hot.apply / hot.put, cold.apply / cold.put, cold.hit_rate, strict, relaxed);
  return json;
}

}  // namespace

int main(int argc, char** argv) {
  tessera::bench::CleanUpOnStopSignals();
  gflags::SetUsageMessage("Tessera storage benchmark");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  if (FLAGS_rows == 0) FLAGS_rows = FLAGS_quick ? 200000 : 1000000;
  if (FLAGS_reps == 0) FLAGS_reps = FLAGS_quick ? 3 : 5;
  std::string library_json;
  if (!FLAGS_server_only) library_json = LibraryPart();
  tessera::bench::ServerBudgetOptions so;
  so.server_binary = FLAGS_server_binary.empty() ? tessera::bench::DefaultServerBinary(argv[0])
                                                 : FLAGS_server_binary;
  so.rows = FLAGS_server_rows != 0 ? FLAGS_server_rows : (FLAGS_quick ? 1000000 : 4000000);
  so.dim = FLAGS_dim;
  so.reps = FLAGS_reps;
  auto budget = tessera::bench::MeasureServerBudget(so);
  if (!budget.ok()) {
    std::fprintf(stderr, "bench_storage: server part: %s\n", budget.status().ToString().c_str());
    return 1;
  }
  const auto& b = *budget;
  std::printf(
      "server, %llu rows x dim %u (Adagrad), --memory_budget_mb=%llu (a quarter of the raw "
      "bytes), --block_cache_mb=%llu --write_buffer_mb=%llu, against a memory-only server; "
      "pushes and pulls of %u uniform keys, caller keys/s, median of %d\n",
      static_cast<unsigned long long>(so.rows), so.dim,
      static_cast<unsigned long long>(b.budget_mb),
      static_cast<unsigned long long>(so.block_cache_mb),
      static_cast<unsigned long long>(so.write_buffer_mb), so.batch, so.reps);
  std::printf("%-44s %14s %14s %8s\n", "measurement", "budget keys/s", "memory keys/s", "ratio");
  Line("server at 1/4 budget: push vs memory-only", b.push_budget, b.push_memory);
  Line("server at 1/4 budget: pull vs memory-only", b.pull_budget, b.pull_memory);
  std::printf(
      "%-44s %8.1f MiB peak (VmHWM) vs %llu budget + %.1f overhead (%.1f started + %llu cache "
      "+ %llu write buffers): %.2f\n",
      "server at 1/4 budget: memory", b.peak_rss_mb, static_cast<unsigned long long>(b.budget_mb),
      b.overhead_mb, b.base_rss_mb, static_cast<unsigned long long>(so.block_cache_mb),
      static_cast<unsigned long long>(so.write_buffer_mb), b.rss_vs_budget_plus_overhead);
  std::printf(
      "{%s\"server_rows\": %llu, \"server_budget_mb\": %llu, "
      "\"server_budget_push_vs_memory\": %.3f, \"server_budget_pull_vs_memory\": %.3f, "
      "\"server_budget_peak_rss_mb\": %.1f, \"server_budget_overhead_mb\": %.1f, "
      "\"rss_vs_budget_plus_overhead\": %.3f}\n",
      library_json.c_str(), static_cast<unsigned long long>(so.rows),
      static_cast<unsigned long long>(b.budget_mb), b.push_budget / b.push_memory,
      b.pull_budget / b.pull_memory, b.peak_rss_mb, b.overhead_mb, b.rss_vs_budget_plus_overhead);
  return 0;
}
