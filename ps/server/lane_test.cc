// The lane's reordering of reads (Lane::ServeWaitingReads, Task::Pass): a lane with a real
// memory store and its reply socket read back here, tasks handed to it as the I/O thread does.
#include "ps/server/lane_internal.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <cstdint>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "ps/optimizer.h"
#include "ps/routing.h"
#include "ps/table_spec.h"
#include "storage/test_util_internal.h"

namespace tessera::internal {
namespace {

using Pass = Task::Pass;
using namespace std::chrono_literals;

class LaneTest : public ::testing::Test {
 protected:
  void SetUp() override {
    replies_.bind(kEndpoint);
    replies_.set(zmq::sockopt::rcvtimeo, 10000);
    engine_ = NewMemoryStorageEngine();
    auto store = engine_->OpenLane(0, 1);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    lane_ = std::make_unique<Lane>(0, std::move(store).value(), ctx_, kEndpoint,
                                   /*write_back_interval_ms=*/1000, /*max_dirty_bytes=*/0);
  }
  void TearDown() override {
    Release();  // a test that failed early must not leave the lane held
    if (lane_ != nullptr) lane_->Stop();
  }

  // Holds the lane with a part that runs `first` (if any), then waits for Release(); returns
  // once the lane runs it, so that what is submitted next waits in the lane's queue and goes
  // in its next batch.
  void HoldLane(std::function<void(Lane&)> first = nullptr) {
    auto started = std::make_shared<std::promise<void>>();
    std::future<void> running = started->get_future();
    lane_->Submit(Part("Z", "blocker", Pass::kNone, false, [this, first, started](Lane& lane) {
      if (first) first(lane);
      started->set_value();
      go_.wait();
    }));
    running.wait();
  }
  void Release() {
    if (!released_) release_.set_value();
    released_ = true;
  }
  void Record(const std::string& name) {
    std::lock_guard<std::mutex> g(mu_);
    ran_.push_back(name);
  }

  // The scenario of the two passing tests: a push of connection A that runs `before` (if any),
  // records "push A half" and serves the waiting reads. Behind it: a read of B (passes), a read
  // of A (its own push stands before it: keeps its turn), a push of C then a read of D (passes
  // both), admin work then a read of E (nothing passes admin work).
  Task PushServingReadsHalfway(std::function<void()> before = nullptr) {
    return Part("A", "push A", Pass::kWrite, true, [this, before](Lane& lane) {
      if (before) before();
      Record("push A half");
      lane.ServeWaitingReads();
    });
  }
  void SubmitPartsBehindPushA() {
    lane_->Submit(Part("B", "read B", Pass::kRead, false));
    lane_->Submit(Part("A", "read A", Pass::kRead, false));
    lane_->Submit(Part("C", "push C", Pass::kWrite, true));
    lane_->Submit(Part("D", "read D", Pass::kRead, false));
    lane_->Submit(Part("X", "admin", Pass::kNone, false));
    lane_->Submit(Part("E", "read E", Pass::kRead, false));
  }

  // A part of request `name` from connection `conn` that records `name` when it runs (and
  // runs `body` first, if any).
  Task Part(const std::string& conn, const std::string& name, Pass pass, bool writes,
            std::function<void(Lane&)> body = nullptr) {
    auto p = std::make_shared<Pending>();
    p->identity = zmq::message_t(conn.data(), conn.size());
    p->header.request_id = ++next_id_;
    names_[p->header.request_id] = name;
    p->header.op = pass == Pass::kRead ? Op::kSparsePull : Op::kSparsePush;
    auto run = [this, name, body](Lane& lane) {
      if (body) body(lane);
      Record(name);
      return Status::OK();
    };
    return Task{p, run, writes, /*seq=*/writes ? next_id_ : 0, pass};
  }
  // The next `n` replies' request names, in the order the lane sent them.
  std::vector<std::string> Replies(size_t n) {
    std::vector<std::string> out;
    for (size_t i = 0; i < n; ++i) {
      zmq::message_t identity, envelope;
      if (!replies_.recv(identity) || !replies_.recv(envelope)) break;
      Header h;
      EXPECT_TRUE(DecodeHeader(envelope.data(), envelope.size(), &h).ok());
      const std::string& name = names_.at(h.request_id);
      for (bool more = envelope.more(); more;) {
        zmq::message_t data;
        if (!replies_.recv(data)) break;
        data_[name] = data.to_string();
        more = data.more();
      }
      out.push_back(name);
    }
    return out;
  }
  std::vector<std::string> Ran() {
    std::lock_guard<std::mutex> g(mu_);
    return ran_;
  }

  static constexpr const char* kEndpoint = "inproc://lane-test-replies";
  zmq::context_t ctx_;
  zmq::socket_t replies_{ctx_, zmq::socket_type::pull};
  std::unique_ptr<StorageEngine> engine_;
  std::unique_ptr<Lane> lane_;
  uint64_t next_id_ = 0;
  std::map<uint64_t, std::string> names_;
  std::map<std::string, std::string> data_;  // each reply's last data frame, by request name
  std::mutex mu_;
  std::vector<std::string> ran_;
  std::promise<void> release_;
  std::shared_future<void> go_ = release_.get_future().share();
  bool released_ = false;
};

// The scenario of PushServingReadsHalfway with the reads arriving while the push runs (they
// wait in the lane's queue).
TEST_F(LaneTest, AReadOfAnotherConnectionPassesARunningPushButNotItsOwnOrAdminWork) {
  std::promise<void> started;
  lane_->Submit(PushServingReadsHalfway([&] {
    started.set_value();
    go_.wait();
  }));
  started.get_future().wait();  // the push runs: what follows waits in the lane's queue
  SubmitPartsBehindPushA();
  Release();
  const std::vector<std::string> replies = Replies(7);
  EXPECT_EQ(Ran(), (std::vector<std::string>{"push A half", "read B", "read D", "push A",
                                             "read A", "push C", "admin", "read E"}));
  // The passing reads are answered at once, push A at the end of its batch; in the next
  // batch the reads as soon as they ran (only pushes and work that writes no rows stand before
  // them), the rest at its end.
  EXPECT_EQ(replies, (std::vector<std::string>{"read B", "read D", "push A", "read A", "read E",
                                               "push C", "admin"}));
  EXPECT_EQ(lane_->reads_passed(), 2u);
}

// The same scenario with the push and everything behind it in one batch.
TEST_F(LaneTest, ReadsInTheSameBatchPassTheSameWay) {
  HoldLane();
  lane_->Submit(PushServingReadsHalfway());
  SubmitPartsBehindPushA();
  Release();
  ASSERT_EQ(Replies(1), std::vector<std::string>{"blocker"});
  const std::vector<std::string> replies = Replies(7);
  EXPECT_EQ(Ran(), (std::vector<std::string>{"blocker", "push A half", "read B", "read D",
                                             "push A", "read A", "push C", "admin", "read E"}));
  EXPECT_EQ(replies, (std::vector<std::string>{"read B", "read D", "read A", "read E", "push A",
                                               "push C", "admin"}));
  EXPECT_EQ(lane_->reads_passed(), 2u);
}

// A write the request log does not hold (a restore's rows: kNone, committed with the batch)
// keeps every later read of its batch waiting for the batch's end, even one that ran after it.
TEST_F(LaneTest, AReadAfterAnUnloggedWriteWaitsForItsBatch) {
  HoldLane();
  Task restore = Part("R", "restore", Pass::kNone, true);
  restore.seq = 0;
  lane_->Submit(std::move(restore));
  lane_->Submit(Part("B", "read B", Pass::kRead, false));
  Release();
  EXPECT_EQ(Replies(3), (std::vector<std::string>{"blocker", "restore", "read B"}));
  EXPECT_EQ(lane_->reads_passed(), 0u);
}

// A real push of 3,000 keys (two slices of kApplySlice) with a pull of the same keys in reverse
// order from another connection queued in the same batch: the pull goes after the push's first
// slice (it sees the rows of that slice applied and the others not yet), and the push still
// applies every key once, to its own keys (the pull ran on the lane's scratch buffers while
// the push held its own).
TEST_F(LaneTest, APullBetweenAPushsSlicesSeesItsFirstSliceAndLeavesItWhole) {
  constexpr uint32_t kDim = 2;
  constexpr size_t kKeys = kApplySlice + 952;  // two slices
  const TableSpec spec = TableSpec::Sparse("t", kDim, {OptimizerKind::kSgd, 1.0f});
  const uint64_t table = TableIdForName(spec.name);
  // The push and the pull go in the lane's next batch.
  HoldLane([&](Lane& lane) { ASSERT_TRUE(lane.store().AddTable(table, spec).ok()); });
  std::vector<uint64_t> keys(kKeys);
  for (size_t i = 0; i < kKeys; ++i) keys[i] = 1000 + 7 * i;
  const std::vector<float> grads(kKeys * kDim, 1.0f);
  std::vector<uint32_t> all(kKeys);
  for (uint32_t i = 0; i < kKeys; ++i) all[i] = i;
  Task push = Part("A", "push A", Pass::kWrite, true);
  push.pending->keys = keys.data();
  push.pending->values = grads.data();
  push.run = [&, pending = push.pending](Lane& lane) {
    return RunSparsePart(lane, *pending, all, table, kDim, true, false, 1.0f);
  };
  const std::vector<uint64_t> read_keys(keys.rbegin(), keys.rend());
  Task pull = Part("B", "pull B", Pass::kRead, false);
  Pending& pp = *pull.pending;
  pp.keys = read_keys.data();
  pp.header.count = kKeys;
  pp.header.dim = kDim;
  pp.out = zmq::message_t(kKeys * kDim * sizeof(float));
  pp.has_out = true;

  pull.run = [&](Lane& lane) {
    return RunSparsePart(lane, pp, all, table, kDim, false, true, 1.0f);
  };
  std::shared_ptr<Pending> pull_pending = pull.pending;
  lane_->Submit(std::move(push));
  lane_->Submit(std::move(pull));
  Release();
  ASSERT_EQ(Replies(3), (std::vector<std::string>{"blocker", "pull B", "push A"}));
  ASSERT_TRUE(pull_pending->outcome().ok()) << pull_pending->outcome().ToString();
  EXPECT_EQ(lane_->reads_passed(), 1u);

  // The rows of the first slice (the first kApplySlice keys) applied, the others not yet.
  std::vector<float> seen(kKeys * kDim);
  ASSERT_EQ(data_["pull B"].size(), seen.size() * sizeof(float));
  std::memcpy(seen.data(), data_["pull B"].data(), data_["pull B"].size());
  for (size_t j = 0; j < kKeys; ++j) {
    const float want = kKeys - 1 - j < kApplySlice ? -1.0f : 0.0f;
    ASSERT_EQ(seen[j * kDim], want) << "read key " << j;
  }

  // Every row as it is now, read through the lane.
  std::promise<std::vector<float>> rows;
  Task look = Part("Y", "look", Pass::kNone, false, [&](Lane& lane) {
    std::vector<float> v(kKeys * kDim);
    std::vector<float*> out(kKeys);
    for (size_t i = 0; i < kKeys; ++i) out[i] = v.data() + i * kDim;
    ASSERT_TRUE(lane.store().Lookup(table, keys, out).ok());
    rows.set_value(std::move(v));
  });
  lane_->Submit(std::move(look));
  const std::vector<float> after = rows.get_future().get();
  for (size_t i = 0; i < kKeys * kDim; ++i) ASSERT_EQ(after[i], -1.0f) << "element " << i;
}

// The periodic write-back of a durable lane (a real RocksDB store) and a snapshot being written
// (Lane::SnapshotBeingWritten): ticks that fall while the snapshot is written hand nothing
// off, up to kMaxWriteBackPostponement intervals after the last hand-off; once the snapshot is
// let go, the next tick hands off.
class LaneWriteBackTest : public ::testing::Test {
 protected:
  static constexpr uint32_t kIntervalMs = 1000;
  static constexpr uint64_t kTable = 7;

  void SetUp() override {
    replies_.bind(kEndpoint);
    StorageOptions o;
    o.data_dir = dir_.path();
    auto engine = OpenStorageEngine(o);
    ASSERT_TRUE(engine.ok()) << engine.status().ToString();
    engine_ = std::move(engine).value();
    auto store = engine_->OpenLane(0, 1);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    OptimizerSpec adagrad;
    adagrad.kind = OptimizerKind::kAdagrad;
    ASSERT_TRUE((*store)->AddTable(kTable, TableSpec::Sparse("t", 4, adagrad)).ok());
    lane_ = std::make_unique<Lane>(0, std::move(store).value(), ctx_, kEndpoint, kIntervalMs,
                                   /*max_dirty_bytes=*/0);
  }
  void TearDown() override {
    if (lane_ != nullptr) lane_->Stop();
  }

  // A logged push of one new row, its reply read back.
  void Push() {
    const uint64_t seq = ++next_seq_;
    auto p = std::make_shared<Pending>();
    p->identity = zmq::message_t("c", 1);
    p->header.request_id = seq;
    p->header.op = Op::kSparsePush;
    auto run = [seq](Lane& lane) {
      const uint64_t key = seq;
      const float grad[4] = {0.1f, 0.1f, 0.1f, 0.1f};
      const float* grads[1] = {grad};
      ApplyContext ctx{lane.NextStep(), 0, 1.0f};
      return lane.store().Apply(kTable, std::span<const uint64_t>(&key, 1),
                                std::span<const float* const>(grads, 1), ctx);
    };
    lane_->Submit(Task{p, run, /*writes=*/true, seq, Task::Pass::kWrite});
    zmq::message_t identity, envelope;
    ASSERT_TRUE(replies_.recv(identity));
    ASSERT_TRUE(replies_.recv(envelope));
    while (envelope.more()) ASSERT_TRUE(replies_.recv(envelope));
  }
  // Pushes every 20 ms for `d`, or until the lane has started more than `hand_offs` hand-offs
  // (a write-back tick falls between the lane's batches); returns whether it has.
  bool PushFor(std::chrono::milliseconds d, uint64_t hand_offs = UINT64_MAX) {
    const auto end = std::chrono::steady_clock::now() + d;
    while (std::chrono::steady_clock::now() < end) {
      if (lane_->write_back_hand_offs() > hand_offs) return true;
      Push();
      std::this_thread::sleep_for(20ms);
    }
    return lane_->write_back_hand_offs() > hand_offs;
  }
  static double SecondsSince(std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  }

  static constexpr const char* kEndpoint = "inproc://lane-write-back-test-replies";
  TempDir dir_;
  zmq::context_t ctx_;
  zmq::socket_t replies_{ctx_, zmq::socket_type::pull};
  std::unique_ptr<StorageEngine> engine_;
  std::unique_ptr<Lane> lane_;
  uint64_t next_seq_ = 0;
};

TEST_F(LaneWriteBackTest, TicksWhileASnapshotIsWrittenHandNothingOffUpToTheLimit) {
  // Two hand-offs without a snapshot (the first at the lane's first batch).
  ASSERT_TRUE(PushFor(30s, 0)) << "no hand-off in 30 s";
  ASSERT_TRUE(PushFor(30s, 1)) << "no periodic hand-off in 30 s";
  auto last_hand_off = std::chrono::steady_clock::now();
  const uint64_t before = lane_->write_back_hand_offs();

  // While a snapshot is written: 1.5 intervals of pushes, across at least one tick, none
  // handed off. A hand-off is allowed kMaxWriteBackPostponement (4) intervals after the last
  // one: checked only where the pushes took under 3.5 of them (a machine slower than that
  // could see one, rightly).
  std::shared_ptr<void> writing = lane_->SnapshotBeingWritten();
  PushFor(std::chrono::milliseconds(kIntervalMs * 3 / 2));
  if (SecondsSince(last_hand_off) < 3.5 * kIntervalMs / 1000.0) {
    EXPECT_EQ(lane_->write_back_hand_offs(), before)
        << "a periodic hand-off while the snapshot was written";
    EXPECT_GE(lane_->write_backs_postponed(), 1u);
    // Counted per tick, not per batch that found it due (about 75 batches here): under 3.5
    // intervals, at most 4 ticks.
    EXPECT_LE(lane_->write_backs_postponed(), 4u);
  }
  // Let go: the next tick hands off.
  writing.reset();
  EXPECT_TRUE(PushFor(30s, before)) << "no hand-off after the snapshot was let go";
  last_hand_off = std::chrono::steady_clock::now();

  // Held for good: ticks are postponed, then a hand-off comes anyway.
  const uint64_t postponed = lane_->write_backs_postponed();
  const uint64_t held_from = lane_->write_back_hand_offs();
  writing = lane_->SnapshotBeingWritten();
  EXPECT_TRUE(PushFor(60s, held_from)) << "the postponement has no limit";
  if (SecondsSince(last_hand_off) < 30) {
    EXPECT_GE(lane_->write_backs_postponed(), postponed + 1);
  }
}

}  // namespace
}  // namespace tessera::internal
