#include "ps/metrics/http_endpoint.h"

#include <httplib.h>

#include <sys/socket.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

namespace tessera::metrics {

// cpp-httplib's server runs its accept loop on `thread` and requests on its own thread pool.
// (civetweb, tried first, starts its threads with a fixed 100 KiB stack, which the static TLS
// of the CUDA libraries in tessera-worker does not fit: pthread_create failed.)
struct HttpEndpoint::Impl {
  httplib::Server server;
  std::thread thread;
  std::atomic<bool> listen_returned{false};
};

HttpEndpoint::HttpEndpoint(const Registry* registry)
    : registry_(registry), impl_(std::make_unique<Impl>()) {}

Result<std::unique_ptr<HttpEndpoint>> HttpEndpoint::Start(const HttpEndpointOptions& options,
                                                          const Registry* registry) {
  if (options.port == 0 || options.port > 65535) {
    return Status::InvalidArgument("metrics port must be in 1..65535, got " +
                                   std::to_string(options.port));
  }
  if (options.address.empty() || options.address.find_first_of(", ") != std::string::npos) {
    return Status::InvalidArgument("metrics address must be an IP address or host name, got '" +
                                   options.address + "'");
  }
  std::unique_ptr<HttpEndpoint> e(new HttpEndpoint(registry));
  HttpEndpoint* self = e.get();
  httplib::Server& s = e->impl_->server;
  const size_t threads = options.threads == 0 ? 1 : options.threads;
  s.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  // SO_REUSEADDR only: cpp-httplib's default adds SO_REUSEPORT, with which a second process
  // on the same port would bind too and take half of the scrapes.
  s.set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  s.set_read_timeout(10, 0);
  s.set_write_timeout(10, 0);
  s.Get("/metrics", [self](const httplib::Request&, httplib::Response& res) {
    res.set_content(self->registry_->Text(), "text/plain; version=0.0.4; charset=utf-8");
  });
  s.Get("/healthz", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("ok\n", "text/plain");
  });
  s.Get("/readyz", [self](const httplib::Request&, httplib::Response& res) {
    auto [code, body] = self->Readiness();
    res.status = code;
    res.set_content(body, "text/plain");
  });
  s.set_error_handler([](const httplib::Request&, httplib::Response& res) {
    if (res.status == 404) {
      res.set_content("not found; try /metrics, /healthz or /readyz\n", "text/plain");
    }
  });
  const std::string where = options.address + ":" + std::to_string(options.port);
  errno = 0;
  if (!s.bind_to_port(options.address, static_cast<int>(options.port))) {
    return Status::Unavailable("cannot serve metrics on " + where + ": " +
                               (errno != 0 ? std::strerror(errno) : "bind failed"));
  }
  e->port_ = options.port;
  Impl* impl = e->impl_.get();
  impl->thread = std::thread([impl] {
    impl->server.listen_after_bind();
    impl->listen_returned = true;
  });
  // stop() is a no-op until the accept loop runs: an endpoint destroyed right after Start would
  // otherwise wait in join() forever. The loop starts at once; wait for it.
  while (!s.is_running() && !impl->listen_returned) {
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  return e;
}

HttpEndpoint::~HttpEndpoint() {
  impl_->server.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

void HttpEndpoint::SetReady(bool ready, const std::string& reason) {
  MutexLock l(mu_);
  ready_ = ready;
  not_ready_reason_ = reason;
}

std::pair<int, std::string> HttpEndpoint::Readiness() {
  MutexLock l(mu_);
  if (ready_) return {200, "ready\n"};
  return {503, "not ready: " + not_ready_reason_ + "\n"};
}

}  // namespace tessera::metrics
