// Metrics and probes as an operator scrapes them: the HTTP endpoint on its own, a server's
// metrics after known traffic (in process, through ServerOptions::metrics), and a
// tessera-server process with --metrics_port whose /readyz is 503 while it recovers.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <thread>

#include "ps/client/client.h"
#include "ps/metrics/http_endpoint.h"
#include "ps/metrics/metrics.h"
#include "ps/server/server.h"
#include "tests/cluster_fixture.h"

namespace tessera {
namespace {

using testing::HttpGet;
using testing::PickFreePort;

// "name{labels} value" lines of a scrape, by "name{labels}".
std::map<std::string, double> Parse(const std::string& text) {
  std::map<std::string, double> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    const size_t sp = line.rfind(' ');
    out[line.substr(0, sp)] = std::stod(line.substr(sp + 1));
  }
  return out;
}

double Sum(const std::map<std::string, double>& m, const std::string& prefix) {
  double s = 0;
  for (const auto& [k, v] : m) {
    if (k.rfind(prefix, 0) == 0) s += v;
  }
  return s;
}

int StatusCode(const std::string& response) {
  if (response.rfind("HTTP/1.1 ", 0) != 0) return 0;
  return std::stoi(response.substr(9, 3));
}

TEST(HttpEndpoint, ServesMetricsHealthAndReadiness) {
  metrics::Registry r;
  r.AddCounter("t_scrape_me_total", "A counter.").Inc(7);
  auto e = metrics::HttpEndpoint::Start({.address = "127.0.0.1", .port = PickFreePort()}, &r);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  const uint32_t port = (*e)->port();
  const std::string m = HttpGet(port, "/metrics");
  EXPECT_EQ(StatusCode(m), 200) << m;
  EXPECT_NE(m.find("text/plain; version=0.0.4"), std::string::npos) << m;
  EXPECT_NE(m.find("\r\n\r\n# HELP t_scrape_me_total"), std::string::npos) << m;
  EXPECT_NE(m.find("t_scrape_me_total 7\n"), std::string::npos) << m;
  EXPECT_EQ(StatusCode(HttpGet(port, "/healthz")), 200);
  (*e)->SetReady(false, "replaying the request log");
  const std::string ready = HttpGet(port, "/readyz");
  EXPECT_EQ(StatusCode(ready), 503) << ready;
  EXPECT_NE(ready.find("replaying the request log"), std::string::npos) << ready;
  (*e)->SetReady(true);
  EXPECT_EQ(StatusCode(HttpGet(port, "/readyz")), 200);
  EXPECT_EQ(StatusCode(HttpGet(port, "/nope")), 404);
}

TEST(HttpEndpoint, RefusesABadPortAndAPortInUse) {
  metrics::Registry r;
  EXPECT_EQ(metrics::HttpEndpoint::Start({.address = "127.0.0.1", .port = 70000}, &r)
                .status()
                .code(),
            StatusCode::kInvalidArgument);
  auto first = metrics::HttpEndpoint::Start({.address = "127.0.0.1", .port = PickFreePort()}, &r);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  auto second =
      metrics::HttpEndpoint::Start({.address = "127.0.0.1", .port = (*first)->port()}, &r);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kUnavailable) << second.status().ToString();
}

// Known traffic against an in-process server: every request counted once under its op, its
// latency observed once, errors under the op that failed, lane state after a maintenance pass.
TEST(ServerMetrics, CountRequestsLatencyErrorsAndLaneState) {
  metrics::Registry registry;
  ServerOptions o;
  o.listen = "tcp://127.0.0.1:*";
  o.maintenance_interval_ms = 50;
  o.metrics = &registry;
  auto server = Server::Create(o);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  ClientOptions co;
  co.servers = {(*server)->endpoint()};
  auto client = Client::Create(co);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  auto table = (*client)->CreateTable(TableSpec::Sparse("emb", 4));
  ASSERT_TRUE(table.ok()) << table.status().ToString();
  std::vector<uint64_t> keys(10);
  for (uint64_t i = 0; i < keys.size(); ++i) keys[i] = i * 7919;
  std::vector<float> grads(keys.size() * 4, 0.5f), out(keys.size() * 4);
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE((*client)->Wait((*client)->Push(*table, keys, grads)).ok());
  }
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE((*client)->Wait((*client)->Pull(*table, keys, out.data())).ok());
  }
  EXPECT_EQ((*client)->GetTable("no_such_table").status().code(), StatusCode::kNotFound);

  auto m = Parse(registry.Text());
  EXPECT_EQ(m["tessera_server_requests_total{op=\"sparse_push\"}"], 3);
  EXPECT_EQ(m["tessera_server_requests_total{op=\"sparse_pull\"}"], 2);
  EXPECT_EQ(m["tessera_server_request_duration_seconds_count{op=\"sparse_push\"}"], 3);
  EXPECT_EQ(m["tessera_server_request_duration_seconds_count{op=\"sparse_pull\"}"], 2);
  EXPECT_EQ(
      m["tessera_server_request_duration_seconds_bucket{op=\"sparse_push\",le=\"+Inf\"}"], 3);
  EXPECT_GT(m["tessera_server_request_duration_seconds_sum{op=\"sparse_push\"}"], 0);
  EXPECT_EQ(m["tessera_server_request_errors_total{op=\"get_table\"}"], 1);
  EXPECT_EQ(m["tessera_server_request_errors_total{op=\"sparse_push\"}"], 0);
  EXPECT_EQ(m["tessera_server_request_duration_seconds_count{op=\"get_table\"}"], 1);
  EXPECT_EQ(m["tessera_server_request_duration_seconds_count{op=\"create_table\"}"], 1);
  EXPECT_GT(m["tessera_server_received_bytes_total"], 3 * grads.size() * sizeof(float));
  EXPECT_GT(m["tessera_server_sent_bytes_total"], 2 * out.size() * sizeof(float));
  EXPECT_EQ(m["tessera_server_info{rank=\"0\",num_servers=\"1\",version=\"" +
              std::string(TESSERA_TEST_VERSION) + "\"}"],
            1);

  // Lane and I/O-thread state arrive with the next maintenance passes.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < until) {
    m = Parse(registry.Text());
    if (m["tessera_server_push_keys_total"] == 30 &&
        Sum(m, "tessera_storage_rows_in_memory{") == keys.size() &&
        m["tessera_table_rows_in_memory{table=\"emb\"}"] == keys.size() &&
        m["tessera_server_push_marks_in_memory"] == 1) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(m["tessera_server_push_keys_total"], 30);
  EXPECT_EQ(m["tessera_server_pull_keys_total"], 20);
  EXPECT_EQ(Sum(m, "tessera_storage_rows_in_memory{"), keys.size());
  EXPECT_EQ(Sum(m, "tessera_storage_applies_total{"), 30);
  EXPECT_EQ(m["tessera_server_tables"], 1);
  // The one client's push marks, and the hardening counters (present, nothing to count yet).
  EXPECT_EQ(m["tessera_server_push_marks_in_memory"], 1);
  for (const char* zero :
       {"tessera_server_unknown_client_pushes_total", "tessera_server_push_marks_spilled_total",
        "tessera_server_idle_connections_displaced_total",
        "tessera_server_replica_held_expired_total",
        "tessera_server_replica_refused_ahead_total"}) {
    EXPECT_EQ(m.count(zero), 1u) << zero;
    EXPECT_EQ(m[zero], 0) << zero;
  }
  // By table: the rows of "emb" on every lane, and their bytes (4 floats of value each, and
  // Adagrad's state, at least).
  EXPECT_EQ(m["tessera_table_rows_in_memory{table=\"emb\"}"], keys.size());
  EXPECT_GE(m["tessera_table_memory_bytes{table=\"emb\"}"], keys.size() * 4 * sizeof(float));
  EXPECT_EQ(m["tessera_table_memory_bytes{table=\"emb\"}"],
            Sum(m, "tessera_storage_memory_bytes{"));

  // After shutdown the server's state is no longer read; its counters stay.
  (*server)->Shutdown();
  m = Parse(registry.Text());
  EXPECT_EQ(m.count("tessera_storage_rows_in_memory{lane=\"0\"}"), 0u);
  EXPECT_EQ(m["tessera_server_requests_total{op=\"sparse_push\"}"], 3);
}

// Seconds the server spent on "tables and request log" at its last start (its log line).
double RecoverySeconds(const std::string& log_path) {
  std::ifstream in(log_path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  static const std::regex re("tables and request log in ([0-9.e+-]+) s");
  double last = -1;
  for (std::sregex_iterator it(text.begin(), text.end(), re), end; it != end; ++it) {
    last = std::stod((*it)[1]);
  }
  return last;
}

// A tessera-server process: /metrics after traffic; after kill -9 with a long request log,
// /healthz answers while /readyz is 503 until the log is replayed, then 200.
TEST(ServerMetricsProcess, ScrapeAndReadinessDuringRecovery) {
  constexpr int kPushes = 20;
  const uint32_t http_port = PickFreePort();
  testing::LocalClusterOptions co = testing::Servers(1);
  co.with_data_dirs = true;
  // No write-back during the test: every push stays in the request log for the restart.
  co.extra_flags = {"--metrics_port=" + std::to_string(http_port), "--metrics_address=127.0.0.1",
                    "--write_back_interval_ms=600000"};
  testing::LocalCluster cluster(co);
  ASSERT_TRUE(cluster.Start().ok());
  EXPECT_EQ(StatusCode(HttpGet(http_port, "/readyz")), 200);
  {
    ClientOptions o;
    o.servers = cluster.endpoints();
    auto client = Client::Create(o);
    ASSERT_TRUE(client.ok()) << client.status().ToString();
    auto table = (*client)->CreateTable(TableSpec::Sparse("emb", 16));
    ASSERT_TRUE(table.ok()) << table.status().ToString();
    // About 1 s of log replay on a 2-core machine.
    std::vector<uint64_t> keys(50000);
    std::vector<float> grads(keys.size() * 16, 0.01f);
    for (int round = 0; round < kPushes; ++round) {
      for (uint64_t i = 0; i < keys.size(); ++i) keys[i] = round * 7 + i * 104729;
      ASSERT_TRUE((*client)->Wait((*client)->Push(*table, keys, grads)).ok());
    }
  }
  const std::string scrape = HttpGet(http_port, "/metrics");
  ASSERT_EQ(StatusCode(scrape), 200) << scrape.substr(0, 300);
  auto m = Parse(scrape.substr(scrape.find("\r\n\r\n") + 4));
  EXPECT_EQ(m["tessera_server_requests_total{op=\"sparse_push\"}"], kPushes);
  EXPECT_EQ(m["tessera_server_request_duration_seconds_count{op=\"sparse_push\"}"], kPushes);
  EXPECT_NE(scrape.find("tessera_server_request_duration_seconds_bucket{op=\"sparse_push\",le="),
            std::string::npos);

  cluster.Kill(0);
  // Poll /readyz from before the restart until it answers 200.
  std::atomic<bool> stop{false};
  int not_ready = 0, health_ok_while_not_ready = 0;
  std::string not_ready_body;
  std::thread poller([&] {
    while (!stop.load()) {
      const std::string r = HttpGet(http_port, "/readyz", 2000);
      const int code = StatusCode(r);
      if (code == 200) return;
      if (code == 503) {
        ++not_ready;
        not_ready_body = r;
        if (StatusCode(HttpGet(http_port, "/healthz", 2000)) == 200) ++health_ok_while_not_ready;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  });
  Status restarted = cluster.Restart(0);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < until &&
         StatusCode(HttpGet(http_port, "/readyz")) != 200) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  stop = true;
  poller.join();
  ASSERT_TRUE(restarted.ok()) << restarted.ToString();
  EXPECT_EQ(StatusCode(HttpGet(http_port, "/readyz")), 200);
  const double recovery = RecoverySeconds(cluster.log_path(0));
  ASSERT_GE(recovery, 0) << "no recovery line in " << cluster.log_path(0);
  std::printf("recovery of %.3f s; /readyz answered 503 %d times\n", recovery, not_ready);
  if (not_ready > 0) {
    EXPECT_NE(not_ready_body.find("recovering"), std::string::npos) << not_ready_body;
    EXPECT_GT(health_ok_while_not_ready, 0);
  } else if (recovery >= 0.5) {
    ADD_FAILURE() << "recovery took " << recovery << " s and /readyz never answered 503";
  } else {
    GTEST_LOG_(INFO) << "recovery took only " << recovery
                     << " s: too short to see /readyz 503 (not checked)";
  }
}

}  // namespace
}  // namespace tessera
