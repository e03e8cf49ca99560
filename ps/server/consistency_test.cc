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

// A worker whose answer from a released barrier was lost sends the same request again (same
// client id and request id): it is answered at once instead of opening a round of its own
// that nobody else joins. Its next barrier call of the same name (a new request id) waits.
TEST(Consistency, AResentArrivalAtAReleasedBarrierIsAnsweredAtOnce) {
  Consistency c;
  Header h;
  h.name = "epoch";
  h.num_workers = 2;
  h.worker_id = 0;
  h.client_id = 0xabc;
  h.request_id = 7;
  EXPECT_TRUE(c.Arrive(zmq::message_t(), h).empty());
  Header other = h;
  other.worker_id = 1;
  other.client_id = 0xdef;
  other.request_id = 3;
  ASSERT_EQ(c.Arrive(zmq::message_t(), other).size(), 2u);
  auto again = c.Arrive(zmq::message_t(), h);  // the lost answer's resend
  ASSERT_EQ(again.size(), 1u);
  EXPECT_EQ(again[0].header.worker_id, 0u);
  EXPECT_EQ(again[0].header.request_id, 7u);
  EXPECT_EQ(c.barrier_waiters(), 0u);
  h.request_id = 8;  // the worker's next barrier of the same name
  EXPECT_TRUE(c.Arrive(zmq::message_t(), h).empty());
  EXPECT_EQ(c.barrier_waiters(), 1u);
  // Another client (a restarted worker) with the same request id is a new arrival too.
  other.client_id = 0x123;
  other.request_id = 3;
  ASSERT_EQ(c.Arrive(zmq::message_t(), other).size(), 2u);
  // Without a client id (an older client) every arrival counts.
  Header old = h;
  old.client_id = 0;
  EXPECT_TRUE(c.Arrive(zmq::message_t(), old).empty());
  EXPECT_TRUE(c.Arrive(zmq::message_t(), old).empty());
}

// A job that goes on with fewer workers (a scale-down, a worker that died) is sized by its
// latest Clock: the workers that left are not waited for (a checkpoint's cut, min_clock).
TEST(Consistency, TheJobsSizeFollowsItsLatestClock) {
  Consistency c;
  EXPECT_EQ(c.job_workers(), 0u);
  for (uint32_t w = 0; w < 4; ++w) c.SetClock(w, 3, 4);
  EXPECT_EQ(c.job_workers(), 4u);
  c.SetClock(0, 4, 2);
  EXPECT_EQ(c.job_workers(), 2u);
  c.SetClock(1, 4, 2);
  EXPECT_EQ(c.MinClock(c.job_workers()), 4);  // workers 2 and 3 (clock 3) left
  c.SetClock(1, 5, 0);  // a Clock without a job size leaves it
  EXPECT_EQ(c.job_workers(), 2u);
  c.SetClock(3, 6, 4);  // the job grew again
  EXPECT_EQ(c.job_workers(), 4u);
}

}  // namespace
}  // namespace tessera::internal
