// The HTTP side of a process's metrics: GET /metrics (Prometheus text), /healthz (the process
// is alive) and /readyz (200 once the process serves, 503 with the reason before).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "ps/metrics/metrics.h"
#include "ps/mutex.h"
#include "ps/status.h"

namespace tessera::metrics {

struct HttpEndpointOptions {
  /// Address to listen on. Default: "0.0.0.0" (every interface, as a scraper in another pod
  /// needs); tests and single-machine runs use "127.0.0.1".
  std::string address = "0.0.0.0";
  /// TCP port, 1..65535. Required.
  uint32_t port = 0;
  /// Threads answering requests. Default: 2.
  uint32_t threads = 2;
};

/// An HTTP server (cpp-httplib) on its own threads. Not ready until SetReady(true). Thread-safe.
class HttpEndpoint {
 public:
  /// Listens and serves `registry` (which must outlive the endpoint). Unavailable when the
  /// address cannot be bound.
  static Result<std::unique_ptr<HttpEndpoint>> Start(const HttpEndpointOptions& options,
                                                     const Registry* registry);
  ~HttpEndpoint();  // stops serving; requests in progress finish first
  HttpEndpoint(const HttpEndpoint&) = delete;
  HttpEndpoint& operator=(const HttpEndpoint&) = delete;

  /// /readyz answers 200 when `ready`, else 503 with `reason` (e.g. "replaying the request log").
  void SetReady(bool ready, const std::string& reason = "");
  /// The port it listens on.
  uint32_t port() const { return port_; }

 private:
  struct Impl;
  explicit HttpEndpoint(const Registry* registry);
  // /readyz: the code and body to answer.
  std::pair<int, std::string> Readiness() ABSL_LOCKS_EXCLUDED(mu_);

  const Registry* registry_;
  std::unique_ptr<Impl> impl_;
  uint32_t port_ = 0;
  Mutex mu_;
  bool ready_ ABSL_GUARDED_BY(mu_) = false;
  std::string not_ready_reason_ ABSL_GUARDED_BY(mu_) = "starting";
};

}  // namespace tessera::metrics
