#include "ps/server/request_log_internal.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <optional>
#include <span>
#include <memory>
#include <string>
#include <vector>

#include "ps/routing.h"

namespace tessera::internal {
namespace {

constexpr uint64_t kTable = 1;
uint64_t g_key = 12345;
float g_grad = -1.0f;  // SGD, learning rate 1: each push adds 1

// The engine it wraps, except that recording the lane layout ("server/lanes") fails when
// asked: a crash right before that write.
class LayoutFailingEngine final : public StorageEngine {
 public:
  LayoutFailingEngine(std::unique_ptr<StorageEngine> e, bool fail)
      : e_(std::move(e)), fail_(fail) {}
  Result<std::unique_ptr<LaneStore>> OpenLane(uint32_t lane, uint32_t n) override {
    return e_->OpenLane(lane, n);
  }
  Status PutMeta(std::string_view k, std::string_view v) override {
    if (fail_ && k == "server/lanes") return Status::IOError("killed before server/lanes");
    return e_->PutMeta(k, v);
  }
  Result<std::optional<std::string>> GetMeta(std::string_view k) override {
    return e_->GetMeta(k);
  }
  Status ScanMeta(std::string_view prefix,
                  const std::function<void(std::string_view, std::string_view)>& fn) override {
    return e_->ScanMeta(prefix, fn);
  }
  bool durable() const override { return e_->durable(); }
  Status AppendLog(uint64_t seq, std::string_view entry) override {
    return e_->AppendLog(seq, entry);
  }
  Status AppendLogGroup(std::span<const LogEntry> entries) override {
    return e_->AppendLogGroup(entries);
  }
  Status ScanLog(uint64_t after,
                 const std::function<Status(uint64_t, std::string_view)>& fn) override {
    return e_->ScanLog(after, fn);
  }
  Status TruncateLog(uint64_t upto) override { return e_->TruncateLog(upto); }

 private:
  std::unique_ptr<StorageEngine> e_;
  const bool fail_;
};

// A server's storage without the server: the RocksDB engine, its lanes, the request log.
struct Storage {
  std::unique_ptr<StorageEngine> engine;
  PushDedup dedup;
  std::unique_ptr<RequestLog> log;
  std::vector<std::unique_ptr<LaneStore>> stores;
  Status replayed;

  Storage(const std::string& dir, Durability durability, uint32_t lanes = 1,
          bool fail_layout = false) {
    StorageOptions o;
    o.data_dir = dir;
    o.durability = durability;
    o.relaxed_window_ms = 100000;  // the buffer is written only when something asks
    auto e = OpenStorageEngine(o);
    EXPECT_TRUE(e.ok()) << e.status().ToString();
    if (!e.ok()) return;
    engine = std::make_unique<LayoutFailingEngine>(std::move(*e), fail_layout);
    const TableSpec spec = TableSpec::Sparse(
        "t", 1, OptimizerSpec{.kind = OptimizerKind::kSgd, .learning_rate = 1.0f});
    for (uint32_t l = 0; l < lanes; ++l) {
      auto lane = engine->OpenLane(l, lanes);
      EXPECT_TRUE(lane.ok()) << lane.status().ToString();
      if (!lane.ok()) return;
      stores.push_back(std::move(*lane));
      EXPECT_TRUE(stores.back()->AddTable(kTable, spec).ok());
    }
    log = std::make_unique<RequestLog>(engine.get(), &dedup);
    replayed = log->Replay(stores, [](uint64_t) { return true; });
    if (!fail_layout) {
      EXPECT_TRUE(replayed.ok()) << replayed.ToString();
    }
  }
  ~Storage() {
    log.reset();
    stores.clear();
    engine.reset();
  }
  bool ok() const { return log != nullptr && replayed.ok(); }
  LaneStore& Owner() { return *stores[LaneOfSlot(SlotOfKey(g_key), stores.size())]; }
  // Logs a push of client 7 (as the I/O thread does); its sequence number.
  uint64_t Log(uint64_t client_seq) {
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
    EXPECT_TRUE(log->WriteStaged().ok());
    return seq;
  }
  // Logs a push of client 7 and applies it, as the I/O thread and the lane do.
  void PushAndApply(uint64_t client_seq) {
    const uint64_t seq = Log(client_seq);
    const float* g = &g_grad;
    ASSERT_TRUE(Owner()
                    .Apply(kTable, std::span<const uint64_t>(&g_key, 1),
                           std::span<const float* const>(&g, 1), ApplyContext{1, 0, 1.0f})
                    .ok());
    for (auto& st : stores) st->SetAppliedSeq(seq);
  }
  float Value() {
    float v = 0;
    float* out = &v;
    EXPECT_TRUE(Owner()
                    .Lookup(kTable, std::span<const uint64_t>(&g_key, 1),
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

// A replay into a new lane layout commits the new lanes' rows and marks, then records the
// layout. Killed between the two, the next start must not apply the replayed entries again:
// the old layout's marks do not cover them, the new layout's do. (Applied twice: 2.)
TEST(RequestLogTest, AReplayIntoNewLanesKilledBeforeItRecordsThemAppliesNothingTwice) {
  for (uint32_t third : {2u, 1u}) {
    SCOPED_TRACE("restarted with " + std::to_string(third) + " lanes");
    const std::string dir =
        ::testing::TempDir() + "request_log_lanes_test_" + std::to_string(getpid());
    std::filesystem::remove_all(dir);
    {
      Storage s(dir, Durability::kStrict, 1);  // a push logged; killed before its lane runs
      ASSERT_TRUE(s.ok());
      s.Log(1);
    }
    {
      Storage s(dir, Durability::kStrict, 2, /*fail_layout=*/true);
      EXPECT_FALSE(s.replayed.ok());
    }
    {
      Storage s(dir, Durability::kStrict, third);
      ASSERT_TRUE(s.ok());
      EXPECT_EQ(s.Value(), 1.0f) << "a logged push applied twice";
    }
    std::filesystem::remove_all(dir);
  }
}

}  // namespace
}  // namespace tessera::internal
