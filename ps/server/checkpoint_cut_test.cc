#include <gtest/gtest.h>

#include <memory>

#include "ps/server/checkpoint_cut_internal.h"

namespace tessera::internal {
namespace {

std::shared_ptr<Pending> Request(Op op, int64_t clock, uint32_t num_workers = 2) {
  auto p = std::make_shared<Pending>();
  p->header.op = op;
  p->header.clock = clock;
  p->header.num_workers = num_workers;
  return p;
}

TEST(CheckpointCut, ParksOnlyPushesOfStepsAfterThePendingCut) {
  CheckpointCut cut;
  EXPECT_FALSE(cut.Park(Request(Op::kSparsePush, 9)));  // no cut pending
  cut.Begin(CutState{4, 2, "dir", Request(Op::kCheckpoint, 4)});
  EXPECT_TRUE(cut.pending());
  EXPECT_EQ(cut.state()->cut, 4);
  EXPECT_EQ(cut.Workers(0), 2u);  // no Clock yet: the cut's own count
  EXPECT_EQ(cut.Workers(1), 1u);  // the job went on with one worker
  EXPECT_EQ(cut.Workers(8), 2u);
  EXPECT_FALSE(cut.Park(Request(Op::kSparsePush, 4)));                     // a step up to the cut
  EXPECT_FALSE(cut.Park(Request(Op::kSparsePull, 5)));                     // a read
  EXPECT_FALSE(cut.Park(Request(Op::kSparsePush, 5, /*num_workers=*/0)));  // no clock
  EXPECT_TRUE(cut.Park(Request(Op::kSparsePush, 5)));
  EXPECT_TRUE(cut.Park(Request(Op::kDensePush, 6)));
  EXPECT_TRUE(cut.Park(Request(Op::kSparsePushPull, 5)));
  EXPECT_EQ(cut.parked_now(), 3u);
  EXPECT_TRUE(cut.Covers(Request(Op::kSparsePush, 4)->header));
  EXPECT_FALSE(cut.Covers(Request(Op::kSparsePush, 5)->header));
  EXPECT_FALSE(cut.Covers(Request(Op::kSparsePull, 3)->header));
}

TEST(CheckpointCut, TakingTheCutLeavesItsParkedRequestsInArrivalOrder) {
  CheckpointCut cut;
  cut.Begin(CutState{1, 2, "dir", Request(Op::kCheckpoint, 1)});
  auto a = Request(Op::kSparsePush, 3), b = Request(Op::kDensePush, 2);
  ASSERT_TRUE(cut.Park(a));
  ASSERT_TRUE(cut.Park(b));
  std::optional<CutState> taken = cut.Take();
  ASSERT_TRUE(taken.has_value());
  EXPECT_EQ(taken->dir, "dir");
  EXPECT_FALSE(cut.pending());
  EXPECT_FALSE(cut.Take().has_value());
  EXPECT_FALSE(cut.Park(Request(Op::kSparsePush, 9)));  // none pending now
  auto parked = cut.TakeParked();
  ASSERT_EQ(parked.size(), 2u);
  EXPECT_EQ(parked[0], a);
  EXPECT_EQ(parked[1], b);
  EXPECT_TRUE(cut.TakeParked().empty());
}

TEST(CheckpointCut, OneAtATimeAndNeverAtAClockAPushPassed) {
  CheckpointCut cut;
  EXPECT_TRUE(cut.CheckIdle().ok());
  cut.NotePush(Request(Op::kSparsePush, 7)->header);
  cut.NotePush(Request(Op::kSparsePush, 9, /*num_workers=*/0)->header);  // no clock
  EXPECT_EQ(cut.max_push_clock(), 7);
  EXPECT_TRUE(cut.CheckNotPassed(Request(Op::kCheckpoint, 7)->header).ok());
  Status passed = cut.CheckNotPassed(Request(Op::kCheckpoint, 6)->header);
  EXPECT_EQ(passed.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(passed.message().find("already passed"), std::string::npos) << passed.ToString();
  // A checkpoint without workers (num_workers 0) is taken at once: no cut to pass.
  EXPECT_TRUE(cut.CheckNotPassed(Request(Op::kCheckpoint, 0, 0)->header).ok());
  cut.Begin(CutState{7, 2, "dir", Request(Op::kCheckpoint, 7)});
  EXPECT_EQ(cut.CheckIdle().code(), StatusCode::kFailedPrecondition);
}

TEST(CheckpointCut, APendingCutExpiresAtItsDeadline) {
  CheckpointCut cut;
  const auto now = std::chrono::steady_clock::now();
  EXPECT_FALSE(cut.Expired(now));  // none pending
  cut.Begin(CutState{4, 2, "dir", Request(Op::kCheckpoint, 4)});
  EXPECT_FALSE(cut.Expired(now + std::chrono::hours(1)));  // no deadline
  cut.Take();
  CutState timed{4, 2, "dir", Request(Op::kCheckpoint, 4)};
  timed.deadline = now + std::chrono::seconds(5);
  cut.Begin(std::move(timed));
  EXPECT_FALSE(cut.Expired(now));
  EXPECT_TRUE(cut.Expired(now + std::chrono::seconds(5)));
}

}  // namespace
}  // namespace tessera::internal
