#include "ps/server/request_log_internal.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "ps/routing.h"

namespace tessera::internal {
namespace {

constexpr uint64_t kTable = 1;
uint64_t g_key = 12345;
float g_grad = -1.0f;  // SGD, learning rate 1: each push adds 1

// A server's storage without the server: the RocksDB engine, one lane, the request log.
struct Storage {
  std::unique_ptr<StorageEngine> engine;
  PushDedup dedup;
  std::unique_ptr<RequestLog> log;
  std::vector<std::unique_ptr<LaneStore>> stores;

  Storage(const std::string& dir, Durability durability) {
    StorageOptions o;
    o.data_dir = dir;
    o.durability = durability;
    o.relaxed_window_ms = 100000;  // the buffer is written only when something asks
    auto e = OpenStorageEngine(o);
    EXPECT_TRUE(e.ok()) << e.status().ToString();
    if (!e.ok()) return;
    engine = std::move(*e);
    auto lane = engine->OpenLane(0, 1);
    EXPECT_TRUE(lane.ok()) << lane.status().ToString();
    stores.push_back(std::move(*lane));
    const TableSpec spec = TableSpec::Sparse(
        "t", 1, OptimizerSpec{.kind = OptimizerKind::kSgd, .learning_rate = 1.0f});
    EXPECT_TRUE(stores[0]->AddTable(kTable, spec).ok());
    log = std::make_unique<RequestLog>(engine.get(), &dedup);
    const Status s = log->Replay(stores, [](uint64_t) { return true; });
    EXPECT_TRUE(s.ok()) << s.ToString();
  }
  ~Storage() {
    log.reset();
    stores.clear();
    engine.reset();
  }
  bool ok() const { return log != nullptr; }
  // Logs a push of client 7 and applies it, as the I/O thread and the lane do.
  void PushAndApply(uint64_t client_seq) {
    auto p = std::make_shared<Pending>();
    p->header.op = Op::kSparsePush;
    p->header.table_id = kTable;
    p->header.count = 1;
    p->header.dim = 1;
    p->header.client_id = 7;
    p->header.client_seq = client_seq;
    p->keys = &g_key;
    p->values = &g_grad;
    const uint64_t seq = log->Stage(p);
    ASSERT_TRUE(log->WriteStaged().ok());
    const float* g = &g_grad;
    ASSERT_TRUE(stores[0]
                    ->Apply(kTable, std::span<const uint64_t>(&g_key, 1),
                            std::span<const float* const>(&g, 1), ApplyContext{1, 0, 1.0f})
                    .ok());
    stores[0]->SetAppliedSeq(seq);
  }
  float Value() {
    float v = 0;
    float* out = &v;
    EXPECT_TRUE(stores[0]
                    ->Lookup(kTable, std::span<const uint64_t>(&g_key, 1),
                             std::span<float* const>(&out, 1))
                    .ok());
    return v;
  }
};

constexpr const char* kChildDirEnv = "TESSERA_REQUEST_LOG_TEST_DIR";

// The child of the test below: two pushes logged (buffered) and applied, the lane's rows
// written back, then kill -9.
TEST(RequestLogTest, RelaxedPushesThenKilled) {
  const char* dir = getenv(kChildDirEnv);
  if (dir == nullptr) GTEST_SKIP() << "run by AWriteBackNeverStoresAMarkAheadOfTheLogFile";
  Storage s(dir, Durability::kRelaxed);
  if (!s.ok()) _exit(2);
  s.PushAndApply(4);
  s.PushAndApply(5);
  if (!s.stores[0]->Commit().ok()) _exit(3);
  raise(SIGKILL);
  _exit(4);
}

// Relaxed mode keeps log entries in a buffer for up to the relaxed window. A write-back of
// rows (with the lane's applied mark) must put the entries up to that mark in the log file
// first: with the mark on disk ahead of the file, a kill -9 lost the buffered entries, the next
// run appended after the gap, and every later start failed (Corruption: record 6 follows 3).
TEST(RequestLogTest, AWriteBackNeverStoresAMarkAheadOfTheLogFile) {
  const std::string dir = ::testing::TempDir() + "request_log_test_" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  {
    Storage s(dir, Durability::kStrict);
    ASSERT_TRUE(s.ok());
    for (uint64_t i = 1; i <= 3; ++i) ASSERT_NO_FATAL_FAILURE(s.PushAndApply(i));
    ASSERT_TRUE(s.stores[0]->Commit().ok());
  }
  // Relaxed: two pushes buffered and applied, their rows written back, then kill -9. In a
  // process of its own (this test's binary, running the test below): RocksDB's background
  // threads do not survive a fork.
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    setenv(kChildDirEnv, dir.c_str(), 1);
    execl("/proc/self/exe", "request_log_test_child",
          "--gtest_filter=RequestLogTest.RelaxedPushesThenKilled", static_cast<char*>(nullptr));
    _exit(127);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status)) << "the child exited " << WEXITSTATUS(status);
  {
    Storage s(dir, Durability::kRelaxed);
    ASSERT_TRUE(s.ok());
    EXPECT_EQ(s.Value(), 5.0f);
    ASSERT_NO_FATAL_FAILURE(s.PushAndApply(6));
  }
  {
    Storage s(dir, Durability::kStrict);  // it failed to open here
    ASSERT_TRUE(s.ok());
    EXPECT_EQ(s.Value(), 6.0f);
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tessera::internal
