// The metrics endpoint under connections that never finish their request, read their answer
// slowly or send something else (issue 35, item 5): on its own (wrong requests, the read
// timeout, eviction and refusal at max_connections), and in a tessera-server process: it
// listens on 127.0.0.1 unless --metrics_address says otherwise, /healthz (the liveness probe)
// answers while hundreds of idle connections are open and while slow scrapers hold /metrics
// answers, and a request trickled in byte by byte is cut off.
#include <arpa/inet.h>
#include <errno.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "ps/metrics/http_endpoint.h"
#include "ps/metrics/metrics.h"
#include "tests/cluster_fixture.h"

namespace tessera {
namespace {

using testing::HttpGet;
using testing::PickFreePort;

int StatusCode(const std::string& response) {
  if (response.rfind("HTTP/1.", 0) != 0 || response.size() < 12) return 0;
  return std::stoi(response.substr(9, 3));
}

// A client socket connected to 127.0.0.1:`port` (connect waits at most 10 s), or -1.
// `rcvbuf` > 0 shrinks its receive buffer first, so that a client that reads slowly holds
// the server's answer back.
int Connect(uint32_t port, int rcvbuf = 0) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  if (rcvbuf > 0) setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf));
  timeval tv{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

bool SendAll(int fd, const std::string& s) {
  return send(fd, s.data(), s.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(s.size());
}

// Closes every descriptor of `fds` on scope exit.
struct Sockets {
  std::vector<int> fds;
  ~Sockets() {
    for (int fd : fds) close(fd);
  }
};

// A tessera-server with --metrics_port (and `flags`); its metrics port in *http_port.
testing::LocalClusterOptions ServerWithMetrics(uint32_t http_port,
                                               std::vector<std::string> flags = {}) {
  testing::LocalClusterOptions co = testing::Servers(1);
  co.extra_flags = std::move(flags);
  co.extra_flags.push_back("--metrics_port=" + std::to_string(http_port));
  return co;
}

// Sends `request` on a new connection and reads until the endpoint closes it (20 s at most).
std::string Exchange(uint32_t port, const std::string& request) {
  Sockets s;
  const int fd = Connect(port);
  if (fd < 0) return "";
  s.fds.push_back(fd);
  timeval tv{20, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  if (!SendAll(fd, request)) return "";
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = recv(fd, buf, sizeof(buf), 0)) > 0;) out.append(buf, n);
  return out;
}

// Waits up to 20 s for the endpoint to close `fd`; what it sent before, or "<open>".
std::string UntilClosed(int fd) {
  timeval tv{20, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  std::string out;
  char buf[4096];
  for (;;) {
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n > 0) {
      out.append(buf, n);
    } else if (n == 0 || errno == ECONNRESET) {
      return out;
    } else {
      return "<open>";
    }
  }
}

// "name{labels} value" lines of a scrape's body, by "name{labels}".
std::map<std::string, double> Parse(const std::string& response) {
  std::map<std::string, double> out;
  const size_t body = response.find("\r\n\r\n");
  std::istringstream in(body == std::string::npos ? "" : response.substr(body + 4));
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    const size_t sp = line.rfind(' ');
    out[line.substr(0, sp)] = std::stod(line.substr(sp + 1));
  }
  return out;
}

double Dropped(const metrics::Registry& r, const std::string& reason) {
  return Parse("\r\n\r\n" +
               r.Text())["tessera_http_connections_dropped_total{reason=\"" + reason + "\"}"];
}

// Requests that are not an HTTP/1.x GET or HEAD, or too long, are answered with the reason and
// counted; HEAD gets the head of the answer only.
TEST(HttpEndpoint, AnswersWrongRequestsWithTheirReason) {
  metrics::Registry r;
  auto e = metrics::HttpEndpoint::Start({.port = PickFreePort()}, &r);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  const uint32_t port = (*e)->port();
  const std::string post = Exchange(port, "POST /metrics HTTP/1.1\r\nHost: a\r\n\r\n");
  EXPECT_EQ(StatusCode(post), 405) << post;
  const std::string tls = Exchange(port, "\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03");
  EXPECT_EQ(StatusCode(tls), 400) << tls;
  EXPECT_NE(tls.find("does not start with a method"), std::string::npos) << tls;
  const std::string huge =
      Exchange(port, "GET /metrics HTTP/1.1\r\nCookie: " + std::string(10000, 'c') + "\r\n\r\n");
  EXPECT_EQ(StatusCode(huge), 431) << huge.substr(0, 200);
  const std::string head = Exchange(port, "HEAD /healthz HTTP/1.1\r\nHost: a\r\n\r\n");
  EXPECT_EQ(StatusCode(head), 200) << head;
  EXPECT_NE(head.find("Content-Length: 3\r\n"), std::string::npos) << head;
  EXPECT_EQ(head.substr(head.find("\r\n\r\n")), "\r\n\r\n") << "HEAD answered with a body";
  EXPECT_EQ(Dropped(r, "bad_request"), 3);
  // A request sent whole with the client's side shut down is still answered.
  Sockets s;
  const int fd = Connect(port);
  ASSERT_GE(fd, 0);
  s.fds.push_back(fd);
  ASSERT_TRUE(SendAll(fd, "GET /healthz HTTP/1.0\r\n\r\n"));
  shutdown(fd, SHUT_WR);
  EXPECT_EQ(StatusCode(UntilClosed(fd)), 200);
}

// A connection that sends nothing is answered 408 and closed after read_timeout_ms.
TEST(HttpEndpoint, ClosesAConnectionThatSendsNothing) {
  metrics::Registry r;
  auto e = metrics::HttpEndpoint::Start({.port = PickFreePort(), .read_timeout_ms = 300}, &r);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  Sockets s;
  const int fd = Connect((*e)->port());
  ASSERT_GE(fd, 0);
  s.fds.push_back(fd);
  const std::string answer = UntilClosed(fd);
  EXPECT_EQ(StatusCode(answer), 408) << answer;
  EXPECT_EQ(Dropped(r, "read_timeout"), 1);
}

// With max_connections open, a new connection closes the oldest one still sending its request;
// when every open one is busy with an answer (scrapes whose rendering a collector holds up), it
// gets 503. /healthz does not wait for that rendering.
TEST(HttpEndpoint, NewConnectionEvictsTheOldestIdleOneOrIsRefused) {
  metrics::Registry r;
  std::atomic<int> renderings{0};
  std::atomic<bool> hold{false}, release{false};
  r.AddCollector(&r, "t_slow", "A collector that waits for the test once it says so.",
                 metrics::Registry::Type::kGauge, [&] {
                   if (!hold.load()) return std::vector<metrics::Registry::Sample>{{{}, 1}};
                   ++renderings;
                   const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
                   while (!release.load() && std::chrono::steady_clock::now() < until) {
                     std::this_thread::sleep_for(std::chrono::milliseconds(1));
                   }
                   return std::vector<metrics::Registry::Sample>{{{}, 1}};
                 });
  auto e = metrics::HttpEndpoint::Start({.port = PickFreePort(), .max_connections = 2}, &r);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  const uint32_t port = (*e)->port();
  struct Release {
    std::atomic<bool>* flag;
    ~Release() { *flag = true; }
  } release_on_exit{&release};
  Sockets idle;
  for (int i = 0; i < 2; ++i) {
    idle.fds.push_back(Connect(port));
    ASSERT_GE(idle.fds.back(), 0);
  }
  ASSERT_TRUE(SendAll(idle.fds[1], "GET /heal"));
  EXPECT_EQ(StatusCode(HttpGet(port, "/healthz", 20000)), 200);
  EXPECT_EQ(UntilClosed(idle.fds[0]), "") << "the oldest idle connection was not closed";
  EXPECT_EQ(Dropped(r, "evicted"), 1);

  hold = true;
  Sockets scrapers;
  scrapers.fds.push_back(Connect(port));
  ASSERT_GE(scrapers.fds[0], 0);
  ASSERT_TRUE(SendAll(scrapers.fds[0], "GET /metrics HTTP/1.1\r\n\r\n"));
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (renderings.load() == 0 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_EQ(renderings.load(), 1) << "the scrape never started";
  // The scrape is being rendered: the probe is answered meanwhile (it makes room by closing
  // the other idle connection).
  EXPECT_EQ(StatusCode(HttpGet(port, "/healthz", 20000)), 200);
  scrapers.fds.push_back(Connect(port));
  ASSERT_GE(scrapers.fds[1], 0);
  ASSERT_TRUE(SendAll(scrapers.fds[1], "GET /metrics HTTP/1.1\r\n\r\n"));
  // Both open connections wait for a scrape: nothing to evict.
  const std::string refused = HttpGet(port, "/healthz", 20000);
  EXPECT_EQ(StatusCode(refused), 503) << refused;
  release = true;
  for (int fd : scrapers.fds) {
    const std::string scrape = UntilClosed(fd);
    EXPECT_EQ(StatusCode(scrape), 200) << scrape;
    EXPECT_NE(scrape.find("\nt_slow 1\n"), std::string::npos) << scrape;
  }
  EXPECT_EQ(Dropped(r, "refused"), 1);
  r.RemoveCollectors(&r);
}

// The local addresses (hex, as /proc/net/tcp{,6} print them) of the sockets of process `pid`'s
// network namespace that listen on `port`.
std::vector<std::string> ListeningAddresses(pid_t pid, uint32_t port) {
  std::vector<std::string> out;
  char want_port[8];
  std::snprintf(want_port, sizeof(want_port), "%04X", port);
  for (const char* table : {"tcp", "tcp6"}) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/net/" + table);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::istringstream f(line);
      std::string slot, local, remote, state;
      f >> slot >> local >> remote >> state;
      const size_t colon = local.rfind(':');
      if (state == "0A" && colon != std::string::npos && local.substr(colon + 1) == want_port) {
        out.push_back(local.substr(0, colon));
      }
    }
  }
  return out;
}

// Without --metrics_address the endpoint listens on 127.0.0.1 only: no other interface of the
// machine (or pod) reaches it.
TEST(MetricsEndpointProcess, ListensOnLoopbackByDefault) {
  const uint32_t http_port = PickFreePort();
  testing::LocalCluster cluster(ServerWithMetrics(http_port));
  ASSERT_TRUE(cluster.Start().ok());
  EXPECT_EQ(StatusCode(HttpGet(http_port, "/healthz")), 200);
  const std::vector<std::string> addresses = ListeningAddresses(cluster.pid(0), http_port);
  ASSERT_EQ(addresses.size(), 1u) << "sockets listening on port " << http_port;
  EXPECT_EQ(addresses[0], "0100007F")
      << "the metrics port listens on " << addresses[0] << " (hex, /proc/net/tcp), not 127.0.0.1";
}

// --metrics_address=0.0.0.0 (what the Kubernetes manifests pass) listens on every interface.
TEST(MetricsEndpointProcess, ListensWhereMetricsAddressSays) {
  const uint32_t http_port = PickFreePort();
  testing::LocalCluster cluster(ServerWithMetrics(http_port, {"--metrics_address=0.0.0.0"}));
  ASSERT_TRUE(cluster.Start().ok());
  EXPECT_EQ(StatusCode(HttpGet(http_port, "/healthz")), 200);
  const std::vector<std::string> addresses = ListeningAddresses(cluster.pid(0), http_port);
  ASSERT_EQ(addresses.size(), 1u) << "sockets listening on port " << http_port;
  EXPECT_EQ(addresses[0], "00000000");
}

// 200 connections that never finish a request (half send nothing, half a partial request
// line): /healthz still answers 200 well within its client's 20 s, /metrics too, and the
// connections the endpoint dropped to make room are counted.
TEST(MetricsEndpointProcess, HealthzAnswersWithTwoHundredIdleConnectionsOpen) {
  constexpr int kIdle = 200;
  const uint32_t http_port = PickFreePort();
  testing::LocalCluster cluster(ServerWithMetrics(http_port));
  ASSERT_TRUE(cluster.Start().ok());
  Sockets idle;
  for (int i = 0; i < kIdle; ++i) {
    const int fd = Connect(http_port);
    ASSERT_GE(fd, 0) << "connection " << i;
    idle.fds.push_back(fd);
    if (i % 2 == 1) {
      ASSERT_TRUE(SendAll(fd, "GET /metrics HTTP/1.1\r\nHost: 12"));
    }
  }
  const std::string health = HttpGet(http_port, "/healthz", 20000);
  EXPECT_EQ(StatusCode(health), 200) << "with " << kIdle << " idle connections: '" << health << "'";
  const std::string scrape = HttpGet(http_port, "/metrics", 20000);
  ASSERT_EQ(StatusCode(scrape), 200) << scrape.substr(0, 300);
  // At most HttpEndpointOptions::max_connections (64) are open at once, the scrape's own
  // included: of the 200 idle ones, at least 200 - 63 were dropped, by eviction or by their
  // timeout, before the scrape was rendered.
  const auto m = Parse(scrape);
  const double dropped = m.at("tessera_http_connections_dropped_total{reason=\"evicted\"}") +
                         m.at("tessera_http_connections_dropped_total{reason=\"read_timeout\"}");
  EXPECT_GE(dropped, kIdle - 63);
}

// A request sent one byte every 200 ms (a slow-loris client) is cut off after the endpoint's
// read timeout for the whole request, not served after 30 s: per-read timeouts would let it
// hold its connection for as long as it trickles.
TEST(MetricsEndpointProcess, RequestTrickledInIsCutOff) {
  const uint32_t http_port = PickFreePort();
  testing::LocalCluster cluster(ServerWithMetrics(http_port));
  ASSERT_TRUE(cluster.Start().ok());
  const std::string request =
      "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: " + std::string(110, 'x') +
      "\r\n\r\n";
  ASSERT_GE(request.size(), 150u);  // 30 s at 5 bytes a second
  Sockets s;
  const int fd = Connect(http_port);
  ASSERT_GE(fd, 0);
  s.fds.push_back(fd);
  std::string answer;
  bool closed = false;
  size_t sent = 0;
  for (; sent < request.size() && !closed; ++sent) {
    if (send(fd, &request[sent], 1, MSG_NOSIGNAL) != 1) {
      closed = true;
      break;
    }
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 200) == 1) {
      char buf[512];
      const ssize_t n = recv(fd, buf, sizeof(buf), 0);
      if (n <= 0) {
        closed = true;
      } else {
        answer.append(buf, n);
      }
    }
  }
  EXPECT_TRUE(closed) << "the whole request went out, one byte per 200 ms (" << request.size()
                      << " bytes), and the connection was still open";
  EXPECT_LT(sent, request.size());
  EXPECT_NE(StatusCode(answer), 200) << answer;
}

// 32 scrapers that ask for /metrics and then read their answer slowly (256 bytes every 100 ms
// through a tiny receive buffer): /healthz does not wait behind them. (The endpoint with a
// thread per connection from a pool of 2 did not answer it within 20 s.)
TEST(MetricsEndpointProcess, SlowScrapesDoNotDelayHealthz) {
  constexpr int kScrapers = 32;
  const uint32_t http_port = PickFreePort();
  testing::LocalCluster cluster(ServerWithMetrics(http_port));
  ASSERT_TRUE(cluster.Start().ok());
  const std::string full = HttpGet(http_port, "/metrics", 20000);
  ASSERT_EQ(StatusCode(full), 200);
  ASSERT_GT(full.size(), 20000u) << "the scrape is too small to hold a slow reader back";
  Sockets scrapers;
  for (int i = 0; i < kScrapers; ++i) {
    const int fd = Connect(http_port, /*rcvbuf=*/1024);
    ASSERT_GE(fd, 0);
    scrapers.fds.push_back(fd);
    ASSERT_TRUE(SendAll(fd, "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"));
  }
  // A scrape is in progress: its first bytes arrived.
  pollfd p{scrapers.fds[0], POLLIN, 0};
  ASSERT_EQ(poll(&p, 1, 20000), 1) << "the first scrape never started";
  std::atomic<bool> stop{false};
  std::thread reader([&] {
    char buf[256];
    while (!stop.load()) {
      for (int fd : scrapers.fds) recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  const std::string health = HttpGet(http_port, "/healthz", 20000);
  stop = true;
  reader.join();
  EXPECT_EQ(StatusCode(health), 200) << "with " << kScrapers << " slow scrapes: '" << health << "'";
}

}  // namespace
}  // namespace tessera
