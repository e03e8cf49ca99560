// Fuzz soak (ctest label `fuzz`, opt-in): mutated requests over a real socket to a running
// server. Every message gets exactly one reply (OK or an error that decodes), the server never
// crashes, and a regular client is served correctly afterwards.
#include <gtest/gtest.h>

#include <chrono>
#include <random>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "ps/client/client.h"
#include "ps/codec.h"
#include "ps/server/server.h"

namespace tessera {
namespace {

constexpr int kSeconds = 20;

std::string Env(const Header& h) {
  std::string s;
  EncodeHeader(h, &s);
  return s;
}

TEST(FuzzServerTest, MutatedRequestsAreAllAnsweredAndTheServerSurvives) {
  ServerOptions so;
  so.listen = "tcp://127.0.0.1:*";
  so.lanes = 2;
  so.max_request_bytes = 8 << 20;
  auto server = Server::Create(so);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  ClientOptions co;
  co.servers = {(*server)->endpoint()};
  auto client = Client::Create(co);
  ASSERT_TRUE(client.ok());
  auto& c = **client;
  auto sparse = c.CreateTable(TableSpec::Sparse("s", 4));
  auto dense = c.CreateTable(TableSpec::Dense("d", 50000));
  ASSERT_TRUE(sparse.ok() && dense.ok());

  zmq::context_t ctx;
  zmq::socket_t peer(ctx, zmq::socket_type::dealer);
  peer.set(zmq::sockopt::linger, 0);
  peer.set(zmq::sockopt::rcvtimeo, 5000);
  peer.connect((*server)->endpoint());

  std::mt19937_64 rng(20261129);
  const Op ops[] = {Op::kSparsePull,  Op::kSparsePush, Op::kSparsePushPull,
                    Op::kDensePull,   Op::kDensePush,  Op::kGetTable,
                    Op::kCreateTable, Op::kPutMeta,    Op::kGetMeta,
                    Op::kStats,       Op::kPing};
  uint64_t sent = 0, answered = 0, errors = 0;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(kSeconds);
  while (std::chrono::steady_clock::now() < until) {
    // A plausible request...
    Header h;
    h.request_id = ++sent;
    h.op = ops[rng() % std::size(ops)];
    h.table_id = (rng() % 4 == 0) ? rng() : (rng() % 2 ? sparse->id : dense->id);
    h.elem_type = static_cast<ElemType>(rng() % 4);
    h.count = (rng() % 8 == 0) ? rng() : rng() % 300;
    h.dim = (rng() % 4 == 0) ? static_cast<uint32_t>(rng()) : 4;
    h.offset = rng() % 60000;
    h.worker_id = rng() % 3;
    h.num_workers = rng() % 3;
    h.staleness = -1;  // parked pulls would legitimately wait: keep them asynchronous
    h.clock = 0;
    h.name = std::string(rng() % 8, 'n');
    if (h.op == Op::kCreateTable && rng() % 2) {
      h.spec = TableSpec::Sparse("t" + std::to_string(rng() % 4), 1 + rng() % 8);
    }
    std::string env = Env(h);
    // ... then mutated: flipped bytes in the envelope, frames of random sizes.
    if (rng() % 2) {
      const int flips = 1 + rng() % 4;
      for (int f = 0; f < flips; ++f) env[rng() % env.size()] = static_cast<char>(rng());
    }
    // Requests that legitimately wait for other workers (a barrier, a pull parked by the
    // staleness bound, a checkpoint cut) get no reply until those arrive: not sent.
    Header as_sent;
    if (DecodeHeader(env.data(), env.size(), &as_sent).ok()) {
      const bool read = as_sent.op == Op::kSparsePull || as_sent.op == Op::kSparsePushPull ||
                        as_sent.op == Op::kDensePull;
      if (as_sent.op == Op::kBarrier || as_sent.op == Op::kCheckpoint ||
          as_sent.op == Op::kRestore || as_sent.op == Op::kExport ||
          (read && as_sent.staleness >= 0 && as_sent.num_workers > 0)) {
        --sent;
        continue;
      }
    }
    std::vector<zmq::message_t> parts;
    parts.emplace_back(env.data(), env.size());
    const int frames = rng() % 4;
    for (int f = 0; f < frames; ++f) {
      size_t n = (rng() % 3 == 0) ? h.count * 8 : rng() % 4096;
      n = std::min<size_t>(n, 1 << 20);
      std::string data(n, '\0');
      for (auto& ch : data) ch = static_cast<char>(rng() % 3 == 0 ? 0x7f : rng());
      parts.emplace_back(data.data(), data.size());
    }
    ASSERT_TRUE(zmq::send_multipart(peer, parts));
    std::vector<zmq::message_t> reply;
    auto got = zmq::recv_multipart(peer, std::back_inserter(reply));
    ASSERT_TRUE(got.has_value()) << "no reply to request " << sent << " (op "
                                 << static_cast<int>(h.op) << ")";
    Header r;
    Status ds = DecodeHeader(reply[0].data(), reply[0].size(), &r);
    ASSERT_TRUE(ds.ok()) << ds.ToString();
    ++answered;
    if (r.status != StatusCode::kOk) {
      ++errors;
      EXPECT_FALSE(r.message.empty()) << "an error reply says nothing";
    }
  }
  EXPECT_EQ(answered, sent);
  EXPECT_GT(errors, 0u);
  EXPECT_LT(errors, sent) << "some mutated requests are still valid and succeed";
  // The server still serves a regular client correctly.
  std::vector<uint64_t> keys = {1, 2, 3};
  std::vector<float> out(12);
  EXPECT_TRUE(c.Wait(c.Pull(*sparse, keys, out.data()), DeadlineAfterMs(5000)).ok());
  std::printf("fuzz: %llu requests in %d s, %llu answered with an error\n",
              static_cast<unsigned long long>(sent), kSeconds,
              static_cast<unsigned long long>(errors));
}

}  // namespace
}  // namespace tessera
