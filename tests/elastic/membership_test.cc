// Membership against a real etcd: registration, listing, deregistration, a dead process's
// member expiring after its TTL, renewals keeping a member past several TTLs, a lost lease.
#include "ps/coord/membership.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>

#include "tests/elastic/etcd_fixture.h"

namespace tessera::testing {
namespace {

using std::chrono::seconds;

MembershipOptions Opts(const std::string& id, int64_t ttl_s) {
  MembershipOptions o;
  o.prefix = "/tessera/job";
  o.member_id = id;
  o.address = "tcp://127.0.0.1:" + std::to_string(7000 + id.size());
  o.ttl_s = ttl_s;
  return o;
}

// True when member `id` is listed; a failed read counts as "not listed" only after the caller
// asserted reads work.
bool Listed(EtcdClient& etcd, const std::string& id) {
  auto members = ListMembers(etcd, "/tessera/job");
  if (!members.ok()) return false;
  for (const Member& m : *members) {
    if (m.id == id) return true;
  }
  return false;
}

TEST_F(EtcdTest, RegisterListDeregister) {
  auto a = Membership::Register(client_.get(), Opts("s-a", 10));
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  auto b = Membership::Register(client_.get(), Opts("s-bb", 10));
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  auto members = ListMembers(*client_, "/tessera/job");
  ASSERT_TRUE(members.ok()) << members.status().ToString();
  ASSERT_EQ(members->size(), 2u);
  EXPECT_EQ((*members)[0].id, "s-a");
  EXPECT_EQ((*members)[0].address, "tcp://127.0.0.1:7003");
  EXPECT_EQ((*members)[0].lease, (*a)->lease_id());
  EXPECT_EQ((*members)[1].id, "s-bb");

  // The same id while its holder lives: refused, and the holder keeps its key.
  auto dup = Membership::Register(client_.get(), Opts("s-a", 10));
  EXPECT_EQ(dup.status().code(), StatusCode::kAlreadyExists) << dup.status().ToString();
  EXPECT_EQ((*ListMembers(*client_, "/tessera/job"))[0].lease, (*a)->lease_id());

  // Leaving (a drain before it stops): still listed, under the same lease, marked.
  EXPECT_FALSE((*members)[0].leaving);
  ASSERT_TRUE((*a)->MarkLeaving().ok());
  auto marked = ListMembers(*client_, "/tessera/job");
  ASSERT_TRUE(marked.ok()) << marked.status().ToString();
  ASSERT_EQ(marked->size(), 2u);
  EXPECT_TRUE((*marked)[0].leaving);
  EXPECT_EQ((*marked)[0].lease, (*a)->lease_id());
  EXPECT_EQ((*marked)[0].address, "tcp://127.0.0.1:7003");
  EXPECT_FALSE((*marked)[1].leaving);

  // A clean shutdown revokes the lease: the member is gone at once, not after its TTL.
  ASSERT_TRUE((*a)->Deregister().ok());
  EXPECT_TRUE((*a)->Deregister().ok());  // idempotent
  EXPECT_FALSE(Listed(*client_, "s-a"));
  EXPECT_TRUE(Listed(*client_, "s-bb"));
  b->reset();  // the destructor deregisters too
  EXPECT_TRUE(ListMembers(*client_, "/tessera/job")->empty());

  EXPECT_EQ(Membership::Register(client_.get(), Opts("bad/id", 10)).status().code(),
            StatusCode::kInvalidArgument);
}

// Forks a process that registers `id` and then only sleeps (its keepalive thread renews);
// returns its pid once it is registered, or -1.
pid_t SpawnMember(const EtcdOptions& etcd, const std::string& id, int64_t ttl_s) {
  int ready[2];
  if (pipe(ready) != 0) return -1;
  const pid_t parent = getpid();
  pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(1);
    close(ready[0]);
    auto client = EtcdClient::Create(etcd);
    if (!client.ok()) _exit(2);
    auto m = Membership::Register(client->get(), Opts(id, ttl_s));
    if (!m.ok()) _exit(3);
    char ok = 1;
    if (write(ready[1], &ok, 1) != 1) _exit(4);
    for (;;) pause();
  }
  close(ready[1]);
  char ok = 0;
  const bool registered = pid > 0 && read(ready[0], &ok, 1) == 1;
  close(ready[0]);
  if (!registered && pid > 0) {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    return -1;
  }
  return pid;
}

TEST_F(EtcdTest, DeadProcessDisappearsAfterItsTtl) {
  constexpr int64_t kTtl = 2;
  pid_t pid = SpawnMember(etcd_.options(), "dying", kTtl);
  ASSERT_GT(pid, 0) << "the member process did not register";
  ASSERT_TRUE(Listed(*client_, "dying"));
  kill(pid, SIGKILL);  // no deregistration, no more renewals
  waitpid(pid, nullptr, 0);
  const auto killed = std::chrono::steady_clock::now();
  ASSERT_TRUE(WaitFor([&] { return !Listed(*client_, "dying"); }, seconds(kTtl + 30)))
      << "the member outlived its lease";
  const double ms = MsSince(killed);
  // Not before the TTL minus one renewal period (the last renewal came at most ttl/3 before
  // the kill): it was the lease that removed it.
  EXPECT_GE(ms, kTtl * 1000 * 2 / 3 - 100);
  std::printf("lease expiry detected %.0f ms after kill -9 (TTL %lld s)\n", ms,
              static_cast<long long>(kTtl));
}

TEST_F(EtcdTest, RenewalsKeepAMemberPastSeveralTtls) {
  constexpr int64_t kTtl = 2;
  auto m = Membership::Register(client_.get(), Opts("steady", kTtl));
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ((*m)->ttl_s(), kTtl);
  // Listed at every look for 4 TTLs; an expired lease would remove it within one TTL.
  const auto until = std::chrono::steady_clock::now() + seconds(4 * kTtl);
  int looks = 0;
  while (std::chrono::steady_clock::now() < until) {
    ASSERT_TRUE(Listed(*client_, "steady")) << "gone after " << looks << " looks";
    ++looks;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_FALSE((*m)->lost());
  // Registered at t=0 with a 2 s lease and still there at 8 s: at least 3 renewals happened.
  EXPECT_GE((*m)->renewals(), 3);
  std::printf("%d looks over %lld s, %lld renewals\n", looks, static_cast<long long>(4 * kTtl),
              static_cast<long long>((*m)->renewals()));
}

TEST_F(EtcdTest, ALeaseRevokedBehindItsBackIsReportedLost) {
  std::atomic<int> told{0};
  MembershipOptions o = Opts("fenced", 2);
  o.on_lost = [&](const Status& s) {
    if (s.code() == StatusCode::kNotFound) ++told;
  };
  auto m = Membership::Register(client_.get(), o);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  // What an expiry during a long pause looks like to the member when it wakes up.
  ASSERT_TRUE(client_->RevokeLease((*m)->lease_id()).ok());
  ASSERT_TRUE(WaitFor([&] { return (*m)->lost(); }, seconds(30)));
  EXPECT_EQ((*m)->status().code(), StatusCode::kNotFound);
  EXPECT_NE((*m)->status().message().find("member fenced lost its lease"), std::string::npos)
      << (*m)->status().ToString();
  EXPECT_FALSE(Listed(*client_, "fenced"));
  EXPECT_TRUE((*m)->Deregister().ok());
  EXPECT_EQ(told.load(), 1);  // nothing left to revoke: not an error
}

// register_again: a lease revoked behind the member's back (what an expiry during a long pause
// looks like) is followed by a registration under a new lease, the same id, not lost; when
// another process took the id meanwhile, the registration is lost for good and that process
// keeps the key.
TEST_F(EtcdTest, ALostLeaseIsRegisteredAgain) {
  std::atomic<int> again{0}, lost{0};
  MembershipOptions o = Opts("again", 2);
  o.register_again = true;
  o.on_registered_again = [&](const Status& s) {
    if (s.code() == StatusCode::kNotFound) ++again;
  };
  o.on_lost = [&](const Status&) { ++lost; };
  auto m = Membership::Register(client_.get(), o);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  const int64_t first = (*m)->lease_id();
  ASSERT_TRUE(client_->RevokeLease(first).ok());
  ASSERT_TRUE(WaitFor([&] { return again.load() == 1; }, seconds(30)));
  EXPECT_FALSE((*m)->lost());
  EXPECT_EQ((*m)->registered_again(), 1);
  EXPECT_NE((*m)->lease_id(), first);
  auto members = ListMembers(*client_, "/tessera/job");
  ASSERT_TRUE(members.ok()) << members.status().ToString();
  ASSERT_EQ(members->size(), 1u);
  EXPECT_EQ((*members)[0].id, "again");
  EXPECT_EQ((*members)[0].lease, (*m)->lease_id());
  // Renewed under the new lease past its TTL.
  const int64_t renewed = (*m)->renewals();
  ASSERT_TRUE(WaitFor([&] { return (*m)->renewals() >= renewed + 4; }, seconds(30)));
  EXPECT_TRUE(Listed(*client_, "again"));

  // Lost again, and another process takes the id before it can register again.
  MembershipOptions other = Opts("again", 30);
  ASSERT_TRUE(client_->RevokeLease((*m)->lease_id()).ok());
  auto taken = Membership::Register(client_.get(), other);
  ASSERT_TRUE(taken.ok()) << taken.status().ToString();
  ASSERT_TRUE(WaitFor([&] { return (*m)->lost(); }, seconds(30)));
  EXPECT_EQ(lost.load(), 1);
  EXPECT_EQ(again.load(), 1);
  EXPECT_NE((*m)->status().message().find("already registered"), std::string::npos)
      << (*m)->status().ToString();
  EXPECT_EQ((*ListMembers(*client_, "/tessera/job"))[0].lease, (*taken)->lease_id());
  EXPECT_TRUE((*m)->Deregister().ok());
  EXPECT_TRUE(Listed(*client_, "again"));  // the other process's key stays

  // A lock is never taken again behind its holder's back.
  MembershipOptions lock = Opts("holder", 2);
  lock.key = ControllerKey("/tessera/job");
  lock.register_again = true;
  EXPECT_EQ(Membership::Register(client_.get(), lock).status().code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tessera::testing
