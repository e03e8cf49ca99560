// Dense pulls sent from the table's memory (one reply frame per server chunk, shared
// copy-on-write) against real tessera-server processes: while pushes change the table, every
// server chunk (kDenseChunkFloats floats at a multiple of kDenseChunkFloats) of a pull is the
// chunk as it was between two pushes, never half of one; and a request of a client that takes
// one frame only (kDensePullChunkFrames not set: an older build) still gets one frame.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "ps/client/client.h"
#include "ps/client/dense_reply_internal.h"
#include "ps/codec.h"
#include "ps/routing.h"
#include "tests/cluster_fixture.h"
#include "tests/raw_peer.h"

namespace tessera {
namespace {

using testing::LocalCluster;
using testing::RawPeer;

std::unique_ptr<Client> Connect(const LocalCluster& c) { return testing::ConnectClient(c); }

// SGD with step 1 from zeros: a push of gradients -1 adds exactly 1 to every element it covers.
TableSpec CountingTable(const std::string& name, uint64_t length) {
  OptimizerSpec sgd;
  sgd.kind = OptimizerKind::kSgd;
  sgd.learning_rate = 1.0f;
  return TableSpec::Dense(name, length, sgd);
}

// What a puller found wrong, or "" when every server chunk of `v` (a pull of the whole table)
// holds one whole number of pushes, no fewer than the same chunk in this puller's previous
// pull (`*last`, updated) and no more than `pushed_max` (pushes sent so far).
std::string CheckPull(const std::vector<float>& v, std::vector<float>* last, float pushed_max) {
  for (size_t c = 0; c * kDenseChunkFloats < v.size(); ++c) {
    const size_t b = c * kDenseChunkFloats, e = std::min(v.size(), b + kDenseChunkFloats);
    const float x = v[b];
    for (size_t i = b; i < e; ++i) {
      if (v[i] != x) {
        return "server chunk " + std::to_string(c) + " is torn: element " + std::to_string(b) +
               " is " + std::to_string(x) + ", element " + std::to_string(i) + " is " +
               std::to_string(v[i]);
      }
    }
    if (x != static_cast<float>(static_cast<int64_t>(x)) || x < (*last)[c] || x > pushed_max) {
      return "server chunk " + std::to_string(c) + " holds " + std::to_string(x) +
             ": not a whole number of pushes in [" + std::to_string((*last)[c]) + ", " +
             std::to_string(pushed_max) + "]";
    }
    (*last)[c] = x;
  }
  return "";
}

// One server (2 lanes), a dense table of 8 MiB (128 server chunks, the last one short): a
// client pushes +1 to the whole table (zero-copy, cut into 1 MiB requests) over and over while
// two others pull the whole table (1 MiB requests, each answered with one frame per server
// chunk from the table's memory). Every pulled server chunk is uniform (no push half applied
// in it), a whole number of pushes, never fewer than in the same puller's previous pull, and
// never more than were sent. After the last push the whole table holds exactly their count.
TEST(DensePullConsistencyTest, EveryPulledServerChunkIsAStateBetweenTwoPushes) {
  LocalCluster cluster(testing::Servers(1));
  ASSERT_TRUE(cluster.Start().ok());
  auto pusher = Connect(cluster);
  ASSERT_NE(pusher, nullptr);
  constexpr uint64_t kLength = 128 * kDenseChunkFloats - 4321;
  auto t = pusher->CreateTable(CountingTable("counting", kLength));
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  // The pullers run until the pusher is done; it goes on until they have pulled enough times
  // while it pushed (at least kMinPushes pushes, kMinPulls pulls each), so the two interleave.
  constexpr int kMinPushes = 60, kMinPulls = 25;
  std::atomic<int> pushes_sent{0};
  std::atomic<bool> done{false};
  std::atomic<int> pulls[2] = {0, 0};
  std::string failure[2];
  std::vector<std::thread> pullers;
  for (int w = 0; w < 2; ++w) {
    pullers.emplace_back([&, w] {
      auto c = Connect(cluster);
      if (c == nullptr) {
        failure[w] = "cannot connect";
        return;
      }
      auto table = c->GetTable("counting");
      if (!table.ok()) {
        failure[w] = table.status().ToString();
        return;
      }
      std::vector<float> v(kLength), last((kLength + kDenseChunkFloats - 1) / kDenseChunkFloats);
      while (!done.load()) {
        std::fill(v.begin(), v.end(), -1.0f);
        const Status s = c->Wait(c->DensePull(*table, 0, kLength, v.data()));
        // Read after the pull's reply: a push counted here was sent before the pull ended.
        const float sent = static_cast<float>(pushes_sent.load());
        if (!s.ok()) {
          failure[w] = "pull: " + s.ToString();
          return;
        }
        failure[w] = CheckPull(v, &last, sent);
        if (!failure[w].empty()) return;
        pulls[w].fetch_add(1);
      }
    });
  }
  auto grads = std::make_shared<const std::vector<float>>(kLength, -1.0f);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (pushes_sent.load() < kMinPushes || pulls[0].load() < kMinPulls ||
         pulls[1].load() < kMinPulls) {
    if (!failure[0].empty() || !failure[1].empty()) break;
    ASSERT_LT(std::chrono::steady_clock::now(), deadline)
        << "pushes " << pushes_sent.load() << ", pulls " << pulls[0].load() << " and "
        << pulls[1].load() << " after 60 s";
    pushes_sent.fetch_add(1);  // before it can be seen applied
    const Status s = pusher->Wait(pusher->DensePush(*t, 0, grads));
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  done.store(true);
  for (auto& th : pullers) th.join();
  EXPECT_EQ(failure[0], "");
  EXPECT_EQ(failure[1], "");
  std::vector<float> final_values(kLength, -1.0f);
  ASSERT_TRUE(pusher->Wait(pusher->DensePull(*t, 0, kLength, final_values.data())).ok());
  const float n = static_cast<float>(pushes_sent.load());
  EXPECT_EQ(std::count(final_values.begin(), final_values.end(), n),
            static_cast<std::ptrdiff_t>(kLength))
      << "the table does not hold " << n << " pushes everywhere";
}

// Raw DensePull requests of a range that starts and ends inside server chunks: without
// kDensePullChunkFrames the reply is one frame (what a client of an older build reads); with
// it, one frame per server chunk the range touches, in order. Both hold the same values, on a
// memory-only server (chunks shared) and on a RocksDB one (chunks copied into their frames).
class DensePullFramesTest : public ::testing::TestWithParam<bool> {
 protected:
  // One server, memory-only or RocksDB by the parameter, a client of it and a counting table
  // `name` of `length` floats whose element i holds i.
  void StartWithIotaTable(const std::string& name, uint64_t length) {
    testing::LocalClusterOptions options = testing::Servers(1);
    options.with_data_dirs = GetParam();
    cluster_ = std::make_unique<LocalCluster>(options);
    ASSERT_TRUE(cluster_->Start().ok());
    client_ = Connect(*cluster_);
    ASSERT_NE(client_, nullptr);
    auto t = client_->CreateTable(CountingTable(name, length));
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    table_ = *t;
    std::vector<float> g(length);
    for (uint64_t i = 0; i < length; ++i) g[i] = -static_cast<float>(i);
    ASSERT_TRUE(client_->Wait(client_->DensePush(table_, 0, g)).ok());
  }
  // A raw DensePull of [offset, offset + count) of the table, its frames in `frames`.
  Header RawPull(RawPeer& peer, uint64_t offset, uint64_t count, uint32_t dim,
                 std::vector<std::string>* frames) {
    Header h;
    h.op = Op::kDensePull;
    h.table_id = table_.id;
    h.elem_type = ElemType::kF32;
    h.offset = offset;
    h.count = count;
    h.dim = dim;
    return peer.Call(h, {}, frames);
  }
  // The frames' sizes; and that, joined, they hold elements offset .. offset + count - 1.
  static std::vector<size_t> ExpectIota(const std::vector<std::string>& frames, uint64_t offset,
                                        uint64_t count) {
    std::vector<size_t> sizes;
    std::string joined;
    for (const std::string& f : frames) {
      sizes.push_back(f.size());
      joined += f;
    }
    EXPECT_EQ(joined.size(), count * 4);
    std::vector<float> v(joined.size() / 4);
    std::memcpy(v.data(), joined.data(), v.size() * 4);
    for (uint64_t i = 0; i < v.size(); ++i) {
      if (v[i] != static_cast<float>(offset + i)) {
        ADD_FAILURE() << "element " << offset + i << " holds " << v[i];
        break;
      }
    }
    return sizes;
  }

  std::unique_ptr<LocalCluster> cluster_;
  std::unique_ptr<Client> client_;
  Table table_;
};

TEST_P(DensePullFramesTest, ReplyFramesFollowWhatTheRequestTakes) {
  constexpr uint64_t kLength = 3 * kDenseChunkFloats + 100;
  ASSERT_NO_FATAL_FAILURE(StartWithIotaTable("frames", kLength));
  constexpr uint64_t kOffset = 1000, kCount = 2 * kDenseChunkFloats + 500;  // 3 server chunks
  RawPeer peer(cluster_->endpoints()[0]);
  for (const uint32_t dim : {0u, kDensePullChunkFrames}) {
    std::vector<std::string> frames;
    const Header r = RawPull(peer, kOffset, kCount, dim, &frames);
    ASSERT_EQ(r.status, StatusCode::kOk) << r.message;
    EXPECT_EQ(r.offset, kOffset);
    EXPECT_EQ(r.count, kCount);
    const std::vector<size_t> sizes = ExpectIota(frames, kOffset, kCount);
    if (dim == 0) {
      EXPECT_EQ(sizes, std::vector<size_t>({kCount * 4}));
    } else {
      EXPECT_EQ(sizes, std::vector<size_t>({(kDenseChunkFloats - kOffset) * 4,
                                            kDenseChunkFloats * 4,
                                            (kOffset + kCount - 2 * kDenseChunkFloats) * 4}));
    }
  }
}

// The edges of the framing, on a table of exactly two server chunks: a pull of one float (at
// the start, at the last element, either side of the chunk border), a pull of two floats across
// the border, and the whole table. Without kDensePullChunkFrames one frame of all the values;
// with it one frame per server chunk touched, each cut to the range; the client reads both
// shapes into the caller's buffer (its pulls of the same ranges).
TEST_P(DensePullFramesTest, OneFloatChunkBordersAndAWholeTableOfWholeChunks) {
  constexpr uint64_t kC = kDenseChunkFloats, kLength = 2 * kC;
  ASSERT_NO_FATAL_FAILURE(StartWithIotaTable("edges", kLength));
  struct Range {
    uint64_t offset, count;
    std::vector<size_t> chunk_frames;  // frame sizes in bytes with kDensePullChunkFrames
  };
  const std::vector<Range> ranges = {
      {0, 1, {4}},           {kLength - 1, 1, {4}},      {kC - 1, 1, {4}},
      {kC, 1, {4}},          {kC - 1, 2, {4, 4}},        {0, kLength, {kC * 4, kC * 4}},
      {0, kC, {kC * 4}},     {kC, kC, {kC * 4}},
      {1, kLength - 2, {(kC - 1) * 4, (kC - 1) * 4}},
  };
  RawPeer peer(cluster_->endpoints()[0]);
  for (const Range& r : ranges) {
    SCOPED_TRACE("range [" + std::to_string(r.offset) + ", " + std::to_string(r.offset + r.count) +
                 ")");
    for (const uint32_t dim : {0u, kDensePullChunkFrames}) {
      std::vector<std::string> frames;
      const Header reply = RawPull(peer, r.offset, r.count, dim, &frames);
      ASSERT_EQ(reply.status, StatusCode::kOk) << reply.message;
      EXPECT_EQ(reply.dim, dim);
      EXPECT_EQ(ExpectIota(frames, r.offset, r.count),
                dim == 0 ? std::vector<size_t>{r.count * 4} : r.chunk_frames);
    }
    std::vector<float> out(r.count + 2, -1.0f);
    const Status s = client_->Wait(client_->DensePull(table_, r.offset, r.count, out.data() + 1));
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(out.front(), -1.0f) << "written before the caller's range";
    EXPECT_EQ(out.back(), -1.0f) << "written after the caller's range";
    for (uint64_t i = 0; i < r.count; ++i) {
      ASSERT_EQ(out[i + 1], static_cast<float>(r.offset + i)) << "element " << r.offset + i;
    }
  }
}

// Hostile `dim` values of dense requests: a DensePull's other than 0, 1 or 2, a DensePush's
// other than 0 (the request log keeps a push's dim, and one over its bound would make the log
// unreadable at the next start) are refused with InvalidArgument naming the value; nothing is
// applied, the server keeps serving, and after a kill and restart (the request log read again)
// the table holds exactly the accepted push.
TEST_P(DensePullFramesTest, HostileDimIsRefusedAndLosesNothing) {
  testing::LocalClusterOptions options = testing::Servers(1);
  options.with_data_dirs = GetParam();
  LocalCluster cluster(options);
  ASSERT_TRUE(cluster.Start().ok());
  constexpr uint64_t kLength = kDenseChunkFloats + 10;
  TableSpec spec = CountingTable("hostile", kLength);
  {
    auto c = Connect(cluster);
    ASSERT_NE(c, nullptr);
    auto t = c->CreateTable(spec);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    RawPeer peer(cluster.endpoints()[0]);
    Header h;
    h.table_id = t->id;
    h.elem_type = ElemType::kF32;
    h.offset = 0;
    h.count = kLength;
    const std::string minus_ones = testing::Bytes(std::vector<float>(kLength, -1.0f));
    for (const uint32_t dim : {3u, 4u, 1u << 20, (1u << 20) + 1, 0x80000000u, 0xffffffffu}) {
      h.op = Op::kDensePull;
      h.dim = dim;
      std::vector<std::string> frames;
      Header r = peer.Call(h, {}, &frames);
      EXPECT_EQ(r.status, StatusCode::kInvalidArgument) << "pull dim " << dim << ": " << r.message;
      EXPECT_NE(r.message.find("DensePull dim must be 0"), std::string::npos) << r.message;
      EXPECT_NE(r.message.find(std::to_string(dim)), std::string::npos) << r.message;
      EXPECT_TRUE(frames.empty());
    }
    for (const uint32_t dim : {1u, 2u, (1u << 20) + 1, 0x80000000u, 0xffffffffu}) {
      h.op = Op::kDensePush;
      h.dim = dim;
      Header r = peer.Call(h, {minus_ones});
      EXPECT_EQ(r.status, StatusCode::kInvalidArgument) << "push dim " << dim << ": " << r.message;
      EXPECT_NE(r.message.find("DensePush dim must be 0, got " + std::to_string(dim)),
                std::string::npos)
          << r.message;
    }
    // The server still serves: one push of +1 everywhere, then a pull sees exactly it.
    h.op = Op::kDensePush;
    h.dim = 0;
    const Header ok = peer.Call(h, {minus_ones});
    ASSERT_EQ(ok.status, StatusCode::kOk) << ok.message;
    std::vector<float> v(kLength, -1.0f);
    ASSERT_TRUE(c->Wait(c->DensePull(*t, 0, kLength, v.data())).ok());
    EXPECT_EQ(std::count(v.begin(), v.end(), 1.0f), static_cast<std::ptrdiff_t>(kLength));
  }
  if (!GetParam()) return;  // a memory-only server keeps nothing over a restart
  ASSERT_TRUE(cluster.Restart(0).ok()) << "the server does not start again";
  auto c = Connect(cluster);
  ASSERT_NE(c, nullptr);
  auto t = c->GetTable("hostile");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  std::vector<float> v(kLength, -1.0f);
  const Status s = c->Wait(c->DensePull(*t, 0, kLength, v.data()));
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(std::count(v.begin(), v.end(), 1.0f), static_cast<std::ptrdiff_t>(kLength))
      << "after the restart the table does not hold exactly the accepted push";
}

// Raw DensePull requests with kDensePullRunFrames: an index frame, then frames of several
// server chunks each, which together hold every chunk of the range once (read here with the
// client's own reader, CopyDenseReply). On a memory-only server a frame is the adjacent chunks
// of one lane within one run of the table's memory (DenseRuns: 8 lane chunks of a 2-lane
// server, 16 table chunks); a RocksDB server copies each lane's chunks into one frame.
TEST_P(DensePullFramesTest, RunFramesHoldEachChunkOnceAndOneFramePerLaneRun) {
  constexpr uint64_t kC = kDenseChunkFloats, kLength = 40 * kC + 7;
  ASSERT_NO_FATAL_FAILURE(StartWithIotaTable("runs", kLength));
  RawPeer peer(cluster_->endpoints()[0]);
  const std::vector<std::pair<uint64_t, uint64_t>> ranges = {
      {0, 16 * kC}, {1000, 20 * kC}, {kLength - 1, 1}, {0, kLength}, {kC - 1, 2}, {31 * kC, kC}};
  for (const auto& [offset, count] : ranges) {
    SCOPED_TRACE("range [" + std::to_string(offset) + ", " + std::to_string(offset + count) + ")");
    std::vector<std::string> frames;
    const Header reply = RawPull(peer, offset, count, kDensePullRunFrames, &frames);
    ASSERT_EQ(reply.status, StatusCode::kOk) << reply.message;
    EXPECT_EQ(reply.dim, kDensePullRunFrames);
    // The frames the design gives: one per (lane, run) touched, or per lane when copied.
    std::set<std::pair<uint32_t, uint64_t>> groups;
    for (uint64_t k = offset / kC; k <= (offset + count - 1) / kC; ++k) {
      groups.emplace(LaneOfChunk(table_.id, k, 2), GetParam() ? 0 : (k / 2) / 8);
    }
    EXPECT_EQ(frames.size(), 1 + groups.size());
    std::vector<zmq::message_t> msgs;
    for (const std::string& f : frames) msgs.emplace_back(f.data(), f.size());
    std::vector<float> v(count, -1.0f);
    ASSERT_TRUE(internal::CopyDenseReply(msgs, offset, count, v.data()))
        << frames.size() << " frame(s) of another shape";
    for (uint64_t i = 0; i < count; ++i) {
      ASSERT_EQ(v[i], static_cast<float>(offset + i)) << "element " << offset + i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Engines, DensePullFramesTest, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return std::string(info.param ? "RocksDb" : "Memory");
                         });

}  // namespace
}  // namespace tessera
