// Exactly-once pushes across a fail-over that does not retire the dead primary (issue 35 item
// 14; docs/wire-protocol.md, "Exactly-once pushes"). Three real tessera-server processes with
// --coordinator in a real etcd, `map init --replication=2`, no backup rebuild
// (--rebuild_backups=false), so that after server 0 dies, server 1 is the primary of its own
// slots (backed up by server 2) and of server 0's (with no backup).
//
// A client's push to server 1's own slots is forwarded to server 2, which logs it; server 1 is
// killed before it reads server 2's answer. The promotion gives server 1's own slots to server
// 2, and server 1 stays in the map (server 0's old slots have no live backup), so the client
// does not retire it: the push waits to be sent to it again. Server 1 restarts on its data dir
// and refuses the resend as stale (it never logged the push). Server 2 holds it, under the
// client's number counted in server 1's sequence: the client must send it there under that
// number (answered as a retry), not under a new one (applied a second time).
//
// The moment "forwarded, logged by the backup, answer not read by the primary" is made by
// signals, not by timing: the backup is stopped (SIGSTOP) before the push, so the forward
// waits in its socket; once the primary counts it forwarded, the primary is stopped, the backup
// resumed (it logs and answers into the stopped primary's socket), and once the backup's log
// moved the primary is killed.
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "ps/client/client.h"
#include "ps/routing.h"
#include "tests/cluster_fixture.h"
#include "tests/elastic/etcd_fixture.h"
#include "tests/elastic/replicated_cluster.h"
#include "tests/raw_peer.h"

namespace tessera::testing {
namespace {

using std::chrono::seconds;

constexpr char kPrefix[] = "tessera/failover-exactly-once";

// True once process `pid` is stopped (state T in /proc/PID/stat): a SIGSTOP takes effect
// after kill() returns.
bool Stopped(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const size_t close = stat.rfind(')');  // the command name may hold spaces
  return close != std::string::npos && close + 2 < stat.size() && stat[close + 2] == 'T';
}

// The TCP sockets of process `pid` (their inodes).
std::set<std::string> SocketInodes(pid_t pid) {
  std::set<std::string> inodes;
  const std::string dir = "/proc/" + std::to_string(pid) + "/fd";
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string target = std::filesystem::read_symlink(e.path(), ec).string();
    if (!ec && target.rfind("socket:[", 0) == 0) {
      inodes.insert(target.substr(8, target.size() - 9));
    }
  }
  return inodes;
}

// Bytes that arrived on the connection from process `from` to the server listening on
// `to_port` (owned by process `to`) and that `to` has not read yet: the receive queue of
// `to`'s end (/proc/net/tcp), found through `from`'s end (the one whose remote port is
// `to_port`). -1 when there is no such connection.
int64_t UnreadBytes(pid_t from, pid_t to, uint32_t to_port) {
  struct Row {
    uint32_t local_port, remote_port;
    uint64_t rx;
    std::string inode;
  };
  std::vector<Row> rows;
  std::ifstream f("/proc/net/tcp");
  std::string line;
  std::getline(f, line);  // the header
  while (std::getline(f, line)) {
    std::istringstream in(line);
    std::string sl, local, remote, st, queues, tr, retr, uid, timeout, inode;
    in >> sl >> local >> remote >> st >> queues >> tr >> retr >> uid >> timeout >> inode;
    if (local.size() < 6 || remote.size() < 6 || queues.size() < 17) continue;
    rows.push_back({static_cast<uint32_t>(std::stoul(local.substr(local.find(':') + 1), nullptr, 16)),
                    static_cast<uint32_t>(std::stoul(remote.substr(remote.find(':') + 1), nullptr, 16)),
                    std::stoull(queues.substr(queues.find(':') + 1), nullptr, 16), inode});
  }
  const std::set<std::string> mine = SocketInodes(from), theirs = SocketInodes(to);
  for (const Row& a : rows) {
    if (!mine.count(a.inode) || a.remote_port != to_port) continue;
    for (const Row& b : rows) {
      if (theirs.count(b.inode) && b.local_port == to_port && b.remote_port == a.local_port) {
        return static_cast<int64_t>(b.rx);
      }
    }
  }
  return -1;
}

uint32_t PortOf(const std::string& endpoint) {
  return static_cast<uint32_t>(std::stoul(endpoint.substr(endpoint.rfind(':') + 1)));
}

class FailoverExactlyOnceTest : public ReplicatedClusterTest {
 protected:
  FailoverExactlyOnceTest() : ReplicatedClusterTest(kPrefix) {
    server_flags_ = {"--rebuild_backups=false"};
  }

  // The stored map's version, and the primary of key `key`'s slot in it (-1: no map).
  uint64_t StoredVersion() {
    auto m = store_->Load();
    return m.ok() ? m->version : 0;
  }
  int PrimaryOfKey(uint64_t key) {
    auto m = store_->Load();
    return m.ok() ? m->primary[SlotOfKey(key)] : -1;
  }
  // Every live server and the client at the stored version.
  bool AllAt(Client& c, const std::vector<uint32_t>& servers) {
    const uint64_t v = StoredVersion();
    if (v == 0 || c.cluster_map_version() != v) return false;
    for (uint32_t r : servers) {
      if (ServerStat(r, "map_version") != static_cast<int64_t>(v)) return false;
    }
    return true;
  }
};

TEST_F(FailoverExactlyOnceTest, APushItsDeadPrimaryForwardedIsAppliedOnceAfterTheRestart) {
  auto c = CoordinatorClient();
  ASSERT_NE(c, nullptr);
  const Table t = Sparse(*c, "emb");
  // Server 1's own slots, backed up by server 2 (the first 10 for a first push).
  const std::vector<uint64_t> all = KeysOf(1, 110);
  const std::vector<uint64_t> keys(all.begin() + 10, all.end());

  // Server 0 dies: its slots go to server 1, without a backup (no rebuild).
  cluster_->Kill(0);
  ASSERT_TRUE(WaitForPromotion(0, seconds(kTtlS + 30))) << "server 0 was not replaced";
  ASSERT_TRUE(WaitFor([&] { return AllAt(*c, {1, 2}); }, seconds(30)));
  ASSERT_EQ(PrimaryOfKey(keys[0]), 1);

  // A first push opens server 1's link to its backup (connected on first use).
  const std::vector<uint64_t> warm(all.begin(), all.begin() + 10);
  ASSERT_TRUE(c->Wait(c->Push(t, warm, std::vector<float>(warm.size() * kDim, 1.0f))).ok());
  ASSERT_GE(ServerStat(1, "replicated_pushes"), 1);
  const int64_t logged_on_2 = ServerStat(2, "log_last_seq");
  ASSERT_GE(logged_on_2, 1);

  // The push is forwarded by server 1 to its stopped backup, server 2: it waits, unread, in
  // server 2's end of the link.
  const pid_t primary = cluster_->pid(1), backup = cluster_->pid(2);
  const uint32_t backup_port = PortOf(cluster_->endpoints()[2]);
  ASSERT_EQ(UnreadBytes(primary, backup, backup_port), 0);
  ASSERT_EQ(kill(backup, SIGSTOP), 0);
  ASSERT_TRUE(WaitFor([&] { return Stopped(backup); }, seconds(10)));
  const std::vector<float> g(keys.size() * kDim, 1.0f);
  Handle push = c->Push(t, keys, g);
  const int64_t forward_bytes = static_cast<int64_t>(keys.size() * (8 + kDim * 4));
  const bool was_forwarded = WaitFor(
      [&] { return UnreadBytes(primary, backup, backup_port) >= forward_bytes; }, seconds(10));
  // Server 1 stops before server 2 can answer; server 2 then logs the push and answers into
  // the stopped server's socket.
  ASSERT_EQ(kill(primary, SIGSTOP), 0);
  ASSERT_TRUE(WaitFor([&] { return Stopped(primary); }, seconds(10)));
  ASSERT_EQ(kill(backup, SIGCONT), 0);
  ASSERT_TRUE(was_forwarded) << "server 1 did not forward the push";
  ASSERT_TRUE(WaitFor([&] { return ServerStat(2, "log_last_seq") > logged_on_2; }, seconds(10)))
      << "server 2 did not log the forwarded push: " << [&] {
           auto st = admin_->ServerStats(2);
           return st.ok() ? *st : st.status().ToString();
         }();
  // Server 1 dies without having read the answer (it logs a push only after that).
  cluster_->Kill(1);

  // Server 1's own slots go to server 2; server 0's old slots have no live backup, so server 1
  // keeps them and stays in the map (a client does not retire it).
  ASSERT_TRUE(WaitFor([&] { return PrimaryOfKey(keys[0]) == 2; }, seconds(kTtlS + 30)))
      << "server 1's slots were not promoted";
  auto m = store_->Load();
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ASSERT_FALSE(m->servers[1].address.empty()) << "server 1 was retired";
  ASSERT_NE(std::count(m->primary.begin(), m->primary.end(), 1), 0);

  // Server 1 comes back on its data dir and refuses the client's resend as stale.
  ASSERT_TRUE(cluster_->Restart(1).ok());
  const Status s = c->Wait(push, DeadlineAfterMs(60000));
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_GE(ServerStat(1, "stale_map_refusals"), 1) << "the resend did not reach server 1";

  // Acknowledged once, applied once: SGD with lr 1 from zeros reads -1.
  ASSERT_TRUE(WaitFor([&] { return AllAt(*c, {1, 2}); }, seconds(30)));
  std::vector<float> out(keys.size() * kDim, -999.0f);
  const Status pulled = c->Wait(c->Pull(t, keys, out.data()));
  ASSERT_TRUE(pulled.ok()) << pulled.ToString();
  size_t twice = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] != -1.0f && ++twice <= 3) {
      ADD_FAILURE() << "key " << keys[i / kDim] << " element " << i % kDim << ": " << out[i]
                    << ", the one acknowledged push reads -1";
    }
  }
  EXPECT_EQ(twice, 0u);
  EXPECT_EQ(ServerStat(2, "retried_pushes"), 1) << "server 2 did not take the resend for a retry";
}

// The race a fail-over met under load (FailoverTest.KillPrimaryDuringTrainingLosesNoAcknowledgedPush,
// one acknowledged push missing): the client sends the pushes its dead primary had not answered
// to the new primary back to back, under the dead one's numbers (client_origin). The first was
// refused for its map version (the new primary had not seen the promotion yet) and is sent again
// under its number; the next came after the map and was taken, which put the mark above the
// first, whose resend was then answered as a retry and applied nowhere. Now the next one waits
// (Unavailable) until the first came again, and both are applied, once each.
TEST_F(FailoverExactlyOnceTest, APushRefusedForItsMapIsNotHiddenByALaterOneOfItsSequence) {
  auto c = CoordinatorClient();
  ASSERT_NE(c, nullptr);
  const Table t = Sparse(*c, "emb");
  const std::vector<uint64_t> keys = KeysOf(1, 50);
  cluster_->Kill(1);
  ASSERT_TRUE(WaitForPromotion(1, seconds(kTtlS + 30)));
  ASSERT_TRUE(WaitFor([&] { return AllAt(*c, {0, 2}); }, seconds(30)));
  const uint64_t v = StoredVersion();
  ASSERT_GE(v, 2u);
  RawPeer to_new(cluster_->endpoints()[2]);
  auto push = [&](uint64_t seq, uint64_t map_version, float g) {
    Header h = SparseHeader(Op::kSparsePush, t.id, keys.size(), kDim);
    h.map_version = map_version;
    h.client_id = 4242;
    h.client_seq = seq;
    h.client_origin = 2;  // counted in server 1's sequence
    return to_new.Call(h, {Bytes(keys), Bytes(std::vector<float>(keys.size() * kDim, g))});
  };
  // Push 5 of server 1's sequence, routed by the map before the promotion: nothing applied.
  Header r = push(5, 1, 1.0f);
  ASSERT_EQ(r.status, StatusCode::kFailedPrecondition) << r.message;
  // Push 6, routed by the current map, before 5 came again: it waits for 5.
  r = push(6, v, 10.0f);
  EXPECT_EQ(r.status, StatusCode::kUnavailable) << r.message;
  // 5 again under its number, then 6 again.
  r = push(5, v, 1.0f);
  ASSERT_EQ(r.status, StatusCode::kOk) << r.message;
  r = push(6, v, 10.0f);
  ASSERT_EQ(r.status, StatusCode::kOk) << r.message;
  std::vector<float> out(keys.size() * kDim, -999.0f);
  Status s = c->Wait(c->Pull(t, keys, out.data()));
  ASSERT_TRUE(s.ok()) << s.ToString();
  for (size_t i = 0; i < out.size(); ++i) {
    ASSERT_EQ(out[i], -11.0f) << "key " << keys[i / kDim] << ": pushes 5 and 6, once each";
  }
}

}  // namespace
}  // namespace tessera::testing
