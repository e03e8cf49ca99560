// A client that sends pulls and never reads the replies, against a real tessera-server with its
// default flags: the server's resident memory stays under the bound docs/operations.md states
// (at most --send_hwm replies queued for that client), the client is throttled, and a normal
// client is served throughout. Label `faults`.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "ps/client/client.h"
#include "ps/codec.h"
#include "tests/cluster_fixture.h"
#include "tests/raw_peer.h"

namespace tessera {
namespace {

using testing::LocalCluster;
using testing::LocalClusterOptions;
using testing::MsSince;
using testing::StatValue;

// VmRSS of process `pid`, in bytes (0 if unreadable).
uint64_t ResidentBytes(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string key;
  while (in >> key) {
    if (key == "VmRSS:") {
      uint64_t kb = 0;
      in >> kb;
      return kb * 1024;
    }
    in.ignore(1 << 10, '\n');
  }
  return 0;
}

// A raw DEALER for a client that does not read: its own receive queue and kernel buffer are
// small, so the replies back up into the server quickly.
zmq::socket_t NonReadingDealer(zmq::context_t& ctx, const std::string& endpoint) {
  zmq::socket_t hog(ctx, zmq::socket_type::dealer);
  hog.set(zmq::sockopt::linger, 0);
  hog.set(zmq::sockopt::rcvhwm, 16);
  hog.set(zmq::sockopt::rcvbuf, 64 << 10);
  hog.connect(endpoint);
  return hog;
}

TEST(SlowReaderTest, AClientThatNeverReadsIsThrottledAndMemoryStaysBounded) {
  constexpr uint32_t kDim = 64, kKeys = 64;
  constexpr uint64_t kReplyBytes = uint64_t{kDim} * kKeys * sizeof(float);  // 16 KiB
  constexpr uint64_t kSendHwm = 1000;  // tessera-server's default --send_hwm
  // docs/operations.md: a client that does not read holds at most --send_hwm of its replies in
  // the server; the slack covers allocator and ZeroMQ buffers around them.
  constexpr uint64_t kBound = kSendHwm * kReplyBytes + (24u << 20);
  constexpr int kSeconds = 20;

  LocalCluster cluster(testing::Servers(1));
  ASSERT_TRUE(cluster.Start().ok());
  ClientOptions o;
  o.servers = cluster.endpoints();
  o.retry_for_ms = 0;  // a slow server must show as an error here, not as a retry
  auto created = Client::Create(o);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  Client& normal = **created;
  auto t = normal.CreateTable(TableSpec::Sparse("emb", kDim));
  ASSERT_TRUE(t.ok());
  std::vector<uint64_t> keys(kKeys);
  for (uint64_t k = 0; k < kKeys; ++k) keys[k] = k * 1000003;
  std::vector<float> out(kKeys * kDim);
  ASSERT_TRUE(normal.Wait(normal.Push(*t, keys, std::vector<float>(out.size(), 0.5f))).ok());
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(normal.Wait(normal.Pull(*t, keys, out.data())).ok());
  const pid_t pid = cluster.pid(0);
  const uint64_t baseline = ResidentBytes(pid);
  ASSERT_GT(baseline, 0u);

  // The client that never reads. It sends up to 4000 pulls a second.
  zmq::context_t ctx;
  zmq::socket_t hog = NonReadingDealer(ctx, cluster.endpoints()[0]);
  std::string env;
  EncodeHeader(testing::SparseHeader(Op::kSparsePull, t->id, kKeys, kDim), &env);
  const std::string key_bytes = testing::Bytes(keys);
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> sent{0};
  std::thread flood([&] {
    while (!stop.load()) {
      for (int i = 0; i < 4; ++i) {
        std::vector<zmq::message_t> parts;
        parts.emplace_back(env.data(), env.size());
        parts.emplace_back(key_bytes.data(), key_bytes.size());
        if (zmq::send_multipart(hog, parts, zmq::send_flags::dontwait)) ++sent;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });

  uint64_t peak = baseline;
  double worst_ms = 0;
  int served = 0, failed = 0;
  const auto t0 = std::chrono::steady_clock::now();
  while (MsSince(t0) < kSeconds * 1000.0) {
    const auto c0 = std::chrono::steady_clock::now();
    Status s = normal.Wait(normal.Pull(*t, keys, out.data()), DeadlineAfterMs(5000));
    worst_ms = std::max(worst_ms, MsSince(c0));
    (s.ok() ? served : failed)++;
    EXPECT_TRUE(s.ok()) << "normal client at " << MsSince(t0) << " ms: " << s.ToString();
    peak = std::max(peak, ResidentBytes(pid));
    if (peak - baseline > kBound) break;  // fail now rather than grow the machine's memory
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  stop = true;
  flood.join();
  auto stats = normal.ServerStats(0);
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  std::printf(
      "non-reading client sent %llu pulls in %.1f s; server RSS %.1f MiB -> peak %.1f MiB "
      "(+%.1f MiB, bound +%.1f MiB); normal client: %d pulls served, %d failed, slowest "
      "%.1f ms; dropped_replies %lld, throttled_requests %lld, stalled_peers %lld\n",
      static_cast<unsigned long long>(sent.load()), MsSince(t0) / 1000, baseline / 1048576.0,
      peak / 1048576.0, (peak - baseline) / 1048576.0, kBound / 1048576.0, served, failed, worst_ms,
      static_cast<long long>(StatValue(*stats, "dropped_replies")),
      static_cast<long long>(StatValue(*stats, "throttled_requests")),
      static_cast<long long>(StatValue(*stats, "stalled_peers")));
  EXPECT_LE(peak - baseline, kBound) << "server memory grew past the documented bound";
  EXPECT_GT(sent.load(), 20000u) << "the non-reading client did not get its pulls out";
  EXPECT_GT(served, 100);
  EXPECT_EQ(failed, 0);
  // The server noticed: replies it could not queue, requests refused unserved.
  EXPECT_GT(StatValue(*stats, "dropped_replies"), 0) << *stats;
  EXPECT_GT(StatValue(*stats, "throttled_requests"), 0) << *stats;
  EXPECT_EQ(StatValue(*stats, "stalled_peers"), 1) << *stats;
}

// The same for push replies of a server with a data dir: a push is logged at the end of the
// burst and then applied, and its reply sent, on the I/O thread (an idle lane runs it inline).
// Every request gets one reply, queued for the client or counted as dropped; a dropped one
// marks the client stalled, so that its later requests are refused instead of applied with
// their replies dropped unseen. (Dropped there, a reply was not counted at all, and the
// client went on being served until a lane's reply was dropped.)
TEST(SlowReaderTest, EveryPushReplyIsQueuedOrCountedAsDropped) {
  constexpr uint32_t kDim = 64, kKeys = 64;
  LocalClusterOptions options = testing::Servers(1);
  options.lanes = 1;  // a request of one lane, run inline when the lane is idle
  options.with_data_dirs = true;
  options.extra_flags = {"--send_hwm=64"};
  LocalCluster cluster(options);
  ASSERT_TRUE(cluster.Start().ok());
  ClientOptions o;
  o.servers = cluster.endpoints();
  o.retry_for_ms = 0;
  auto created = Client::Create(o);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  Client& normal = **created;
  auto t = normal.CreateTable(TableSpec::Sparse("emb", kDim));
  ASSERT_TRUE(t.ok());
  std::vector<uint64_t> keys(kKeys);
  for (uint64_t k = 0; k < kKeys; ++k) keys[k] = k * 1000003;
  auto stat = [&](const std::string& name) {
    auto stats = normal.ServerStats(0);
    EXPECT_TRUE(stats.ok()) << stats.status().ToString();
    return stats.ok() ? StatValue(*stats, name) : -1;
  };

  // Push-pulls (a 16 KiB reply each) from a raw DEALER that does not read, one at a time (each
  // its own burst, so that the idle lane runs it inline), until the server marks the DEALER
  // stalled (at most 30 s: only when broken), then 50 more, which it refuses unserved.
  zmq::context_t ctx;
  zmq::socket_t hog = NonReadingDealer(ctx, cluster.endpoints()[0]);
  std::string env;
  EncodeHeader(testing::SparseHeader(Op::kSparsePushPull, t->id, kKeys, kDim), &env);
  const std::string key_bytes = testing::Bytes(keys);
  const std::string grad_bytes = testing::Bytes(std::vector<float>(kKeys * kDim, 0.001f));
  int64_t sent = 0;
  auto send = [&] {
    std::vector<zmq::message_t> parts;
    parts.emplace_back(env.data(), env.size());
    parts.emplace_back(key_bytes.data(), key_bytes.size());
    parts.emplace_back(grad_bytes.data(), grad_bytes.size());
    if (zmq::send_multipart(hog, parts, zmq::send_flags::dontwait)) ++sent;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  };
  const auto t0 = std::chrono::steady_clock::now();
  while (stat("stalled_peers") != 1 && MsSince(t0) < 30000) {
    for (int i = 0; i < 20; ++i) send();
  }
  EXPECT_EQ(stat("stalled_peers"), 1) << "no reply to the client was noticed dropped";
  for (int i = 0; i < 50; ++i) send();
  std::vector<float> out(kKeys * kDim);
  EXPECT_TRUE(normal.Wait(normal.Pull(*t, keys, out.data()), DeadlineAfterMs(10000)).ok());

  // Now it reads: the replies it gets and those the server counts as dropped add up to its
  // requests (waiting up to 30 s for them: only when broken).
  int64_t replies = 0;
  const auto t1 = std::chrono::steady_clock::now();
  while (replies + stat("dropped_replies") < sent && MsSince(t1) < 30000) {
    std::vector<zmq::message_t> reply;
    while (zmq::recv_multipart(hog, std::back_inserter(reply), zmq::recv_flags::dontwait)) {
      ++replies;
      reply.clear();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const int64_t dropped = stat("dropped_replies");
  std::printf("non-reading client sent %lld push-pulls in %.1f s: %lld replies read, %lld "
              "dropped, %lld requests refused unserved\n",
              static_cast<long long>(sent), MsSince(t0) / 1000, static_cast<long long>(replies),
              static_cast<long long>(dropped),
              static_cast<long long>(stat("throttled_requests")));
  EXPECT_EQ(replies + dropped, sent) << "replies neither queued nor counted as dropped";
  EXPECT_GT(dropped, 0);
  EXPECT_GT(stat("throttled_requests"), 0);
}

}  // namespace
}  // namespace tessera
