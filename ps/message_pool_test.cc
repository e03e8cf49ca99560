#include "ps/message_pool_internal.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

namespace tessera::internal {
namespace {

TEST(MessagePoolTest, ALargeBufferComesBackForTheNextMessageOfItsClass) {
  MessagePool pool(size_t{1} << 20);
  const void* first = nullptr;
  {
    zmq::message_t m = pool.Message(100 << 10);
    ASSERT_EQ(m.size(), size_t{100} << 10);
    std::memset(m.data(), 7, m.size());
    first = m.data();
  }
  EXPECT_EQ(pool.retained(), size_t{128} << 10);  // its class: 2^17 bytes
  zmq::message_t again = pool.Message(128 << 10);
  EXPECT_EQ(again.data(), first);
  EXPECT_EQ(again.size(), size_t{128} << 10);
  EXPECT_EQ(pool.reused(), 1u);
  EXPECT_EQ(pool.retained(), 0u);
  // Another class gets its own buffer.
  zmq::message_t bigger = pool.Message(129 << 10);
  EXPECT_NE(bigger.data(), first);
  EXPECT_EQ(pool.reused(), 1u);
}

TEST(MessagePoolTest, SmallMessagesAreOrdinaryAndCopiesKeepTheirBytes) {
  MessagePool pool(size_t{1} << 20);
  { zmq::message_t small = pool.Message(MessagePool::kMinBytes - 1); }
  EXPECT_EQ(pool.retained(), 0u);
  std::vector<char> src(MessagePool::kMinBytes + 5);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<char>(i * 31);
  zmq::message_t c = pool.Copy(src.data(), src.size());
  ASSERT_EQ(c.size(), src.size());
  EXPECT_EQ(std::memcmp(c.data(), src.data(), src.size()), 0);
  zmq::message_t tiny = pool.Copy(src.data(), 3);
  EXPECT_EQ(std::memcmp(tiny.data(), src.data(), 3), 0);
}

TEST(MessagePoolTest, KeepsNoMoreThanItsLimit) {
  MessagePool pool(size_t{256} << 10);
  {
    std::vector<zmq::message_t> held;
    for (int i = 0; i < 3; ++i) held.push_back(pool.Message(128 << 10));
  }
  EXPECT_EQ(pool.retained(), size_t{256} << 10);  // two kept, the third freed
  pool.set_max_retained(0);
  { zmq::message_t m = pool.Message(128 << 10); }  // reused, then freed: over the new limit
  EXPECT_EQ(pool.reused(), 1u);
  EXPECT_EQ(pool.retained(), size_t{128} << 10);
}

TEST(MessagePoolTest, ZeroMQGivesTheBufferBackAfterSendingIt) {
  MessagePool pool(size_t{1} << 20);
  zmq::context_t ctx;
  zmq::socket_t a(ctx, zmq::socket_type::pair), b(ctx, zmq::socket_type::pair);
  a.bind("inproc://message_pool_test");
  b.connect("inproc://message_pool_test");
  zmq::message_t m = pool.Message(200 << 10);
  std::memset(m.data(), 3, m.size());
  zmq::message_t shared;
  shared.copy(m);  // a reference, as a client's retained retry copy is
  ASSERT_TRUE(a.send(m, zmq::send_flags::none).has_value());
  zmq::message_t got;
  ASSERT_TRUE(b.recv(got).has_value());
  EXPECT_EQ(got.size(), size_t{200} << 10);
  EXPECT_EQ(static_cast<const char*>(got.data())[1000], 3);
  EXPECT_EQ(pool.retained(), 0u);  // `got` and `shared` still refer to it
  got = zmq::message_t();
  EXPECT_EQ(pool.retained(), 0u);
  shared = zmq::message_t();
  EXPECT_EQ(pool.retained(), size_t{256} << 10);
}

// A shared message sends the owner's bytes themselves and holds the owner until ZeroMQ frees
// the message, also when a copy of the message (a frame queued twice) outlives the first.
TEST(SharedMessageTest, HoldsItsOwnerUntilTheLastCopyIsFreed) {
  auto owner = std::make_shared<std::vector<float>>(1000, 3.0f);
  std::weak_ptr<std::vector<float>> watch = owner;
  const float* data = owner->data();
  zmq::message_t copy;
  {
    zmq::message_t m = SharedMessage(data + 10, 40 * sizeof(float), std::move(owner));
    EXPECT_EQ(m.data(), data + 10);
    EXPECT_EQ(m.size(), 40 * sizeof(float));
    copy.copy(m);
  }
  EXPECT_FALSE(watch.expired()) << "released while a copy of the message was alive";
  copy.rebuild();
  EXPECT_TRUE(watch.expired()) << "not released once the message was freed";
}

}  // namespace
}  // namespace tessera::internal
