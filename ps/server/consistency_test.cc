#include <gtest/gtest.h>

#include "ps/server/consistency_internal.h"

namespace tessera::internal {
namespace {

std::shared_ptr<Pending> Read(int64_t clock, int32_t staleness, uint32_t workers) {
  auto p = std::make_shared<Pending>();
  p->header.op = Op::kSparsePull;
  p->header.clock = clock;
  p->header.staleness = staleness;
  p->header.num_workers = workers;
  return p;
}

TEST(Consistency, ReadsParkUntilTheSlowestWorkerIsWithinTheBound) {
  Consistency c;
  EXPECT_EQ(c.MinClock(2), 0);
  EXPECT_TRUE(c.AdmitOrPark(Read(1, 1, 2)));   // 0 >= 1 - 1
  EXPECT_FALSE(c.AdmitOrPark(Read(3, 1, 2)));  // 0 < 3 - 1: parked
  EXPECT_EQ(c.parked_now(), 1u);
  c.SetClock(0, 2, 2);
  EXPECT_EQ(c.MinClock(2), 0);  // worker 1 not heard from
  c.SetClock(1, 2, 2);
  EXPECT_EQ(c.MinClock(2), 2);
  EXPECT_EQ(c.MaxClock(), 2);
  auto parked = c.TakeParked();
  ASSERT_EQ(parked.size(), 1u);
  EXPECT_EQ(c.parked_now(), 0u);
  EXPECT_EQ(c.parked_total(), 1u);
  EXPECT_TRUE(c.AdmitOrPark(parked[0]));
  EXPECT_EQ(c.job_workers(), 2u);
}

TEST(Consistency, WritesAndUnboundedReadsNeverPark) {
  Consistency c;
  auto push = Read(100, 0, 4);
  push->header.op = Op::kSparsePush;
  EXPECT_TRUE(c.AdmitOrPark(push));
  EXPECT_TRUE(c.AdmitOrPark(Read(100, -1, 4)));  // asynchronous
  EXPECT_TRUE(c.AdmitOrPark(Read(100, 0, 0)));   // no job size
}

TEST(Consistency, BarrierAnswersEveryoneWhenTheLastArrives) {
  Consistency c;
  Header h;
  h.name = "epoch";
  h.num_workers = 2;
  h.worker_id = 0;
  EXPECT_TRUE(c.Arrive(zmq::message_t(), h).empty());
  EXPECT_TRUE(c.Arrive(zmq::message_t(), h).empty());  // worker 0 again replaces itself
  h.worker_id = 1;
  auto all = c.Arrive(zmq::message_t(), h);
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].header.worker_id, 0u);
  EXPECT_EQ(all[1].header.worker_id, 1u);
  h.worker_id = 0;
  EXPECT_TRUE(c.Arrive(zmq::message_t(), h).empty());  // a new round
}

}  // namespace
}  // namespace tessera::internal
