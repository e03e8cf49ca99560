// The HTTP side of a process's metrics: GET /metrics (Prometheus text), /healthz (the process
// is alive) and /readyz (200 once the process serves, 503 with the reason before).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "ps/metrics/metrics.h"
#include "ps/mutex.h"
#include "ps/status.h"

namespace tessera::metrics {

struct HttpEndpointOptions {
  /// Address to listen on (an IP address or a host name). Default: "127.0.0.1", reachable from
  /// this machine only; in a Kubernetes pod, where the kubelet's probes and Prometheus come
  /// from outside, "0.0.0.0" (every interface of the pod) or the pod's IP.
  std::string address = "127.0.0.1";
  /// TCP port, 1..65535. Required.
  uint32_t port = 0;
  /// Connections open at once, 2..65536. When a new one would exceed it, the oldest that has
  /// not finished sending its request is closed; when none is in that state, the new one is
  /// answered 503 and closed. Default: 64.
  uint32_t max_connections = 64;
  /// Milliseconds a connection has, from its accept, to send its whole request head; then it
  /// is answered 408 and closed, however slowly bytes keep coming. 1..3600000. Default: 5000.
  uint32_t read_timeout_ms = 5000;
  /// Milliseconds an answer has, from the complete request, to be rendered and read by the
  /// client; then the connection is closed. 1..3600000. Default: 10000.
  uint32_t write_timeout_ms = 10000;
  /// Largest request head in bytes; a longer one is answered 431. 256..1048576. Default: 8192.
  uint32_t max_request_bytes = 8192;
};

/// An HTTP/1.x server on two threads of its own: one event loop that does every socket
/// operation without blocking and answers /healthz and /readyz itself, and one that renders
/// /metrics. Each answer closes its connection (no keep-alive). Not ready until SetReady(true).
/// Counts the connections it drops in tessera_http_connections_dropped_total{reason}.
/// Thread-safe.
class HttpEndpoint {
 public:
  /// Listens and serves `registry` (which must outlive the endpoint; the endpoint's own
  /// counters are added to it). InvalidArgument for bad options, Unavailable when the address
  /// cannot be bound.
  static Result<std::unique_ptr<HttpEndpoint>> Start(const HttpEndpointOptions& options,
                                                     Registry* registry);
  ~HttpEndpoint();  // stops serving and closes every connection, answered or not
  HttpEndpoint(const HttpEndpoint&) = delete;
  HttpEndpoint& operator=(const HttpEndpoint&) = delete;

  /// /readyz answers 200 when `ready`, else 503 with `reason` (e.g. "replaying the request log").
  void SetReady(bool ready, const std::string& reason = "");
  /// The port it listens on.
  uint32_t port() const { return port_; }

 private:
  struct Impl;
  explicit HttpEndpoint(Registry* registry);
  // /readyz: the code and body to answer.
  std::pair<int, std::string> Readiness() ABSL_LOCKS_EXCLUDED(mu_);

  Registry* registry_;
  std::unique_ptr<Impl> impl_;
  uint32_t port_ = 0;
  Mutex mu_;
  bool ready_ ABSL_GUARDED_BY(mu_) = false;
  std::string not_ready_reason_ ABSL_GUARDED_BY(mu_) = "starting";
};

}  // namespace tessera::metrics
