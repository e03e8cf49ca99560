#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <thread>

#include "ps/server/request_internal.h"

namespace tessera::internal {
namespace {

TEST(PartCounter, GuardKeepsTheAnswerBackUntilEveryPartIsHandedOut) {
  PartCounter c;
  c.Add();
  EXPECT_FALSE(c.Done());  // the part finished while the guard is held
  c.Add(2);
  EXPECT_FALSE(c.Done());
  EXPECT_FALSE(c.Done());
  EXPECT_TRUE(c.Done());  // the guard: last
}

TEST(PartCounter, NoPartsAnswersAtTheGuard) {
  PartCounter c;
  EXPECT_TRUE(c.Done());
}

TEST(PartCounter, ExactlyOneThreadSeesTheLastPart) {
  for (int round = 0; round < 200; ++round) {
    PartCounter c;
    constexpr int kThreads = 8;
    c.Add(kThreads);
    std::atomic<int> last{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&] { last += c.Done() ? 1 : 0; });
    }
    last += c.Done() ? 1 : 0;  // the guard, racing the parts
    for (auto& t : threads) t.join();
    ASSERT_EQ(last.load(), 1) << "round " << round;
  }
}

TEST(Pending, FirstErrorWins) {
  Pending p;
  EXPECT_TRUE(p.outcome().ok());
  p.Fail(Status::NotFound("a"));
  p.Fail(Status::Internal("b"));
  EXPECT_EQ(p.outcome().code(), StatusCode::kNotFound);
  EXPECT_EQ(p.outcome().message(), "a");
}

TEST(FinishPart, RepliesOnceWithTheFirstError) {
  zmq::context_t ctx;
  zmq::socket_t pull(ctx, zmq::socket_type::pull), push(ctx, zmq::socket_type::push);
  pull.bind("inproc://finish-part-test");
  push.connect("inproc://finish-part-test");
  Pending p;
  p.header.request_id = 77;
  p.header.op = Op::kSparsePush;
  p.parts.Add(2);
  FinishPart(p, Status::InvalidArgument("bad row"), push);
  FinishPart(p, Status::OK(), push);
  zmq::message_t msg;
  EXPECT_FALSE(pull.recv(msg, zmq::recv_flags::dontwait));  // the guard is still held
  FinishPart(p, Status::OK(), push);
  std::vector<zmq::message_t> parts;
  for (;;) {
    zmq::message_t m;
    ASSERT_TRUE(pull.recv(m, zmq::recv_flags::none));
    const bool more = m.more();
    parts.push_back(std::move(m));
    if (!more) break;
  }
  ASSERT_EQ(parts.size(), 2u);  // identity, envelope
  Header h;
  ASSERT_TRUE(DecodeHeader(parts[1].data(), parts[1].size(), &h).ok());
  EXPECT_EQ(h.request_id, 77u);
  EXPECT_EQ(h.status, StatusCode::kInvalidArgument);
  EXPECT_EQ(h.message, "bad row");
  EXPECT_FALSE(pull.recv(msg, zmq::recv_flags::dontwait));  // answered once
}

TEST(FirstNonFinite, FindsTheFirstNanOrInfinity) {
  std::vector<float> v(5000, 1.0f);
  EXPECT_EQ(FirstNonFinite(v.data(), v.size()), kAllFinite);
  v[4097] = std::numeric_limits<float>::infinity();
  v[4500] = std::nanf("");
  EXPECT_EQ(FirstNonFinite(v.data(), v.size()), 4097u);
  EXPECT_EQ(FirstNonFinite(v.data(), 4097), kAllFinite);
  v[3] = -std::numeric_limits<float>::infinity();
  EXPECT_EQ(FirstNonFinite(v.data(), v.size()), 3u);
}

TEST(SplitKeysByLane, EveryKeyOnceInItsLaneInRequestOrder) {
  std::vector<uint64_t> keys;
  for (uint64_t k = 0; k < 1000; ++k) keys.push_back(k * 7919 + 3);
  keys.push_back(keys[10]);  // a duplicate stays a separate index
  for (uint32_t lanes : {1u, 3u, 4u}) {
    KeySplit split;
    ASSERT_EQ(SplitKeysByLane(keys.data(), keys.size(), lanes, nullptr, 0, &split), kAllOwned);
    ASSERT_EQ(split.size(), lanes);
    std::vector<int> seen(keys.size(), 0);
    for (uint32_t l = 0; l < lanes; ++l) {
      for (size_t j = 0; j < split[l].size(); ++j) {
        const uint32_t i = split[l][j];
        ++seen[i];
        EXPECT_EQ(LaneOfSlot(SlotOfKey(keys[i]), lanes), l);
        if (j > 0) {
          EXPECT_LT(split[l][j - 1], i);
        }
      }
    }
    for (int s : seen) EXPECT_EQ(s, 1);
  }
}

TEST(SplitKeysByLane, StopsAtTheFirstKeyAnotherServerOwns) {
  const SlotMap map = SlotMap::Uniform(2);
  std::vector<uint64_t> keys;
  uint64_t k = 0;
  while (keys.size() < 5) {  // keys of server 0
    if (map.ServerOfSlot(SlotOfKey(k)) == 0) keys.push_back(k);
    ++k;
  }
  while (map.ServerOfSlot(SlotOfKey(k)) != 1) ++k;
  keys.push_back(k);
  keys.push_back(keys[0]);
  KeySplit split;
  EXPECT_EQ(SplitKeysByLane(keys.data(), keys.size(), 2, &map, 0, &split), 5u);
  EXPECT_EQ(SplitKeysByLane(keys.data(), 5, 2, &map, 0, &split), kAllOwned);
}

TEST(SplitDenseByLane, SegmentsCoverTheRangeOnceAlongChunkBorders) {
  const uint64_t table = 12345;
  for (uint32_t lanes : {1u, 2u, 3u}) {
    for (auto [offset, count] :
         std::vector<std::pair<uint64_t, uint64_t>>{{0, 1},
                                                    {5, kDenseChunkFloats},
                                                    {kDenseChunkFloats - 1, 2},
                                                    {100, 5 * kDenseChunkFloats + 7}}) {
      DenseSplit split = SplitDenseByLane(table, offset, count, lanes);
      ASSERT_EQ(split.size(), lanes);
      uint64_t covered = 0;
      std::vector<bool> pos_seen(count, false);
      for (uint32_t l = 0; l < lanes; ++l) {
        for (const DenseSegment& s : split[l]) {
          EXPECT_EQ(LaneOfChunk(table, s.chunk, lanes), l);
          ASSERT_LT(s.begin, s.end);
          ASSERT_LE(s.end, kDenseChunkFloats);
          // The segment's elements in the table are its chunk's, at the request's positions.
          EXPECT_EQ(s.chunk * kDenseChunkFloats + s.begin, offset + s.pos);
          for (uint64_t i = 0; i < s.end - s.begin; ++i) {
            ASSERT_FALSE(pos_seen[s.pos + i]);
            pos_seen[s.pos + i] = true;
          }
          covered += s.end - s.begin;
        }
      }
      EXPECT_EQ(covered, count) << "offset " << offset << " count " << count;
    }
  }
}

}  // namespace
}  // namespace tessera::internal
