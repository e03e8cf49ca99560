// CopyDenseReply: the client reads a DensePull reply's frames into the caller's buffer only
// when their shape is exactly what the request asked for.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "ps/client/dense_reply_internal.h"

namespace tessera::internal {
namespace {

constexpr uint64_t kC = kDenseChunkFloats;

// Element i of the table holds i.
zmq::message_t Values(uint64_t b, uint64_t e) {
  std::vector<float> v;
  for (uint64_t i = b; i < e; ++i) v.push_back(static_cast<float>(i));
  return zmq::message_t(v.data(), v.size() * sizeof(float));
}
zmq::message_t Index(const std::vector<uint64_t>& v) {
  return zmq::message_t(v.data(), v.size() * sizeof(uint64_t));
}
// The part of chunk c in [offset, end).
zmq::message_t Part(uint64_t c, uint64_t offset, uint64_t end) {
  return Values(std::max(offset, c * kC), std::min(end, (c + 1) * kC));
}
// Frames of chunks `groups` (each a frame), their parts of [offset, end), after their index.
std::vector<zmq::message_t> RunReply(const std::vector<std::vector<uint64_t>>& groups,
                                     uint64_t offset, uint64_t end) {
  std::vector<uint64_t> index;
  std::vector<zmq::message_t> frames(1);
  for (const auto& g : groups) {
    index.push_back(g.size());
    std::string bytes;
    for (uint64_t c : g) {
      index.push_back(c);
      zmq::message_t p = Part(c, offset, end);
      bytes.append(static_cast<const char*>(p.data()), p.size());
    }
    frames.emplace_back(bytes.data(), bytes.size());
  }
  frames[0] = Index(index);
  return frames;
}

TEST(CopyDenseReplyTest, OneFrameAndFramesOfChunksInAnyOrderFillTheRange) {
  const uint64_t offset = 100, end = 5 * kC + 3, count = end - offset;  // chunks 0..5
  std::vector<float> out(count + 2, -1.0f);
  std::vector<zmq::message_t> one;
  one.push_back(Values(offset, end));
  ASSERT_TRUE(CopyDenseReply(one, offset, count, out.data() + 1));
  for (uint64_t i = 0; i < count; ++i) ASSERT_EQ(out[i + 1], offset + i);
  // Two lanes' frames: even chunks (cut at both ends of the range), odd chunks, the index
  // listing them out of table order.
  std::fill(out.begin(), out.end(), -1.0f);
  auto runs = RunReply({{4, 0, 2}, {1}, {5, 3}}, offset, end);
  ASSERT_TRUE(CopyDenseReply(runs, offset, count, out.data() + 1));
  EXPECT_EQ(out.front(), -1.0f);
  EXPECT_EQ(out.back(), -1.0f);
  for (uint64_t i = 0; i < count; ++i) ASSERT_EQ(out[i + 1], offset + i) << i;
  // One float, as one chunk frame.
  float x = -1;
  auto single = RunReply({{2}}, 2 * kC + 7, 2 * kC + 8);
  ASSERT_TRUE(CopyDenseReply(single, 2 * kC + 7, 1, &x));
  EXPECT_EQ(x, 2 * kC + 7);
}

TEST(CopyDenseReplyTest, EveryOtherShapeIsRefusedAndWritesNothing) {
  const uint64_t offset = 0, end = 3 * kC, count = end;
  std::vector<float> out(count, -1.0f);
  auto refused = [&](std::vector<zmq::message_t> frames, const char* what) {
    EXPECT_FALSE(CopyDenseReply(frames, offset, count, out.data())) << what;
    EXPECT_EQ(out, std::vector<float>(count, -1.0f)) << what << ": wrote";
  };
  std::vector<zmq::message_t> short_one;
  short_one.push_back(Values(0, end - 1));
  refused(std::move(short_one), "one frame short of the range");
  refused(RunReply({{0, 1}}, offset, end), "chunk 2 missing");
  refused(RunReply({{0, 1}, {2, 1}}, offset, end), "chunk 1 twice");
  refused(RunReply({{0, 1, 2, 3}}, offset, end), "chunk 3 outside the range");
  auto extra = RunReply({{0, 1, 2}}, offset, end);
  extra.emplace_back(std::string("x"));
  refused(std::move(extra), "a data frame the index does not name");
  auto big = RunReply({{0, 1, 2}}, offset, end);
  big[1] = Values(0, end + 1);
  refused(std::move(big), "a frame larger than its chunks");
  auto zero = RunReply({{0, 1, 2}}, offset, end);
  zero[0] = Index({0, 0, 1, 2});
  refused(std::move(zero), "a frame of no chunks");
  auto huge = RunReply({{0, 1, 2}}, offset, end);
  huge[0] = Index({~uint64_t{0}, 0, 1, 2});
  refused(std::move(huge), "a chunk count past the index");
  auto longer = RunReply({{0, 1, 2}}, offset, end);
  longer[0] = Index({3, 0, 1, 2, 7});
  refused(std::move(longer), "index entries left over");
  auto odd = RunReply({{0, 1, 2}}, offset, end);
  odd[0] = zmq::message_t(std::string(13, '\0'));
  refused(std::move(odd), "an index of 13 bytes");
  std::vector<zmq::message_t> none;
  refused(std::move(none), "no frames");
}

}  // namespace
}  // namespace tessera::internal
