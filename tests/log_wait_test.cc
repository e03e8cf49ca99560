// A durable server writes each group of pushes to its request log on a thread of its own, and
// meanwhile answers reads that nothing orders after the group (docs/architecture.md, "Server:
// the I/O thread and lanes"): a serving pull of another connection does not wait for the disk,
// a pull of the pushing connection does, and sees the push.
//
// An in-process server on a RocksDB data directory (strict), real ZeroMQ sockets, requests sent
// by hand (tests/raw_peer.h); the test holds the group write (SetLogWriteHookForTesting) so
// that "while the log is written" is a state it controls, not a race it hopes to win.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ps/client/client.h"
#include "ps/codec.h"
#include "ps/server/log_wait_internal.h"
#include "ps/server/server.h"
#include "storage/test_util_internal.h"
#include "tests/cluster_fixture.h"
#include "tests/raw_peer.h"

namespace tessera {
namespace {

using std::chrono::milliseconds;
using testing::Bytes;
using testing::RawPeer;

constexpr uint32_t kDim = 4;
constexpr uint64_t kClient = 0x51a7e9ULL;
const std::vector<uint64_t> kKeys = {5, 6, 7};

std::vector<float> Floats(const std::string& bytes) {
  std::vector<float> v(bytes.size() / sizeof(float));
  std::memcpy(v.data(), bytes.data(), bytes.size());
  return v;
}

class LogWaitTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ServerOptions o;
    o.listen = "tcp://127.0.0.1:*";
    o.storage.data_dir = dir_.Sub("data");
    auto s = Server::Create(o);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    server_ = std::move(*s);
    ClientOptions co;
    co.servers = {server_->endpoint()};
    auto c = Client::Create(co);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    admin_ = std::move(*c);
    OptimizerSpec sgd;
    sgd.learning_rate = 1.0f;  // zeros initializer: a row reads minus the sum of its gradients
    auto t = admin_->CreateTable(TableSpec::Sparse("emb", kDim, sgd));
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    table_ = t->id;
  }
  void TearDown() override {
    Release();
    internal::SetLogWriteHookForTesting(nullptr);
    admin_.reset();
    server_.reset();
  }
  void Release() {
    if (!released_) release_.set_value();
    released_ = true;
  }

  internal::TempDir dir_;
  std::unique_ptr<Server> server_;
  std::unique_ptr<Client> admin_;
  uint64_t table_ = 0;
  std::promise<void> release_;
  bool released_ = false;
};

TEST_F(LogWaitTest, AReadOfAnotherConnectionIsAnsweredWhileTheGroupIsWrittenAndThePushersWaits) {
  // The next group write waits for the test.
  std::promise<void> entered;
  std::shared_future<void> go = release_.get_future().share();
  auto armed = std::make_shared<std::atomic<bool>>(true);
  internal::SetLogWriteHookForTesting([armed, go, &entered] {
    if (!armed->exchange(false)) return;
    entered.set_value();
    go.wait();
  });

  RawPeer pusher(server_->endpoint()), reader(server_->endpoint());
  Header push = testing::SparseHeader(Op::kSparsePush, table_, kKeys.size(), kDim);
  push.client_id = kClient;
  push.client_seq = 1;
  ASSERT_TRUE(pusher.Send(push, {Bytes(kKeys), Bytes(std::vector<float>(12, 2.0f))}));
  ASSERT_EQ(entered.get_future().wait_for(std::chrono::seconds(10)), std::future_status::ready)
      << "the push's group write never started";

  // The reader's pull is answered while the group write is held: the rows without the push.
  const Header pull = testing::SparseHeader(Op::kSparsePull, table_, kKeys.size(), kDim);
  ASSERT_TRUE(reader.Send(pull, {Bytes(kKeys)}));
  std::vector<std::string> data;
  const std::optional<Header> read = reader.NextReply(milliseconds(10000), &data);
  ASSERT_TRUE(read.has_value()) << "the reader waited for the pusher's log write";
  EXPECT_EQ(read->status, StatusCode::kOk) << read->message;
  ASSERT_EQ(data.size(), 1u);
  EXPECT_EQ(Floats(data[0]), std::vector<float>(12, 0.0f));

  // The pusher's own pull waits for its push's group, then sees the push.
  ASSERT_TRUE(pusher.Send(pull, {Bytes(kKeys)}));
  EXPECT_FALSE(pusher.NextReply(milliseconds(300)).has_value())
      << "a reply reached the pusher while its push's group write was held";
  Release();
  bool acked = false, read_own = false;
  for (int i = 0; i < 2; ++i) {
    const std::optional<Header> r = pusher.NextReply(milliseconds(10000), &data);
    ASSERT_TRUE(r.has_value()) << "no reply " << i << " after the group write";
    ASSERT_EQ(r->status, StatusCode::kOk) << r->message;
    if (r->op == Op::kSparsePush) {
      acked = true;
    } else {
      read_own = true;
      ASSERT_EQ(data.size(), 1u);
      EXPECT_EQ(Floats(data[0]), std::vector<float>(12, -2.0f));
    }
  }
  EXPECT_TRUE(acked && read_own);
  auto st = admin_->ServerStats(0);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_GE(testing::StatValue(*st, "reads_during_log_write"), 1);
}

}  // namespace
}  // namespace tessera
