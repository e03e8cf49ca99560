#include "ps/metrics/http_endpoint.h"

#include <netdb.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <memory>
#include <string_view>
#include <thread>
#include <vector>

#include "ps/metrics/http_request_internal.h"

namespace tessera::metrics {
namespace {

using Clock = std::chrono::steady_clock;
using internal::HttpRequestHead;

// After an answer, a connection reads and drops what the client still sends for this long
// before it is closed, so that closing it with unread bytes (which sends a reset) does not
// destroy the answer on its way.
constexpr auto kLinger = std::chrono::seconds(1);
// When accept fails for want of descriptors or memory, the listening socket stays readable;
// it is left alone for this long instead of being retried in a busy loop.
constexpr auto kAcceptPause = std::chrono::milliseconds(100);
// Connections accepted per pass of the loop, so that a flood of connects cannot starve the
// answers to those already accepted.
constexpr int kAcceptsPerPass = 256;

const char* ReasonPhrase(int code) {
  switch (code) {
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 431:
      return "Request Header Fields Too Large";
    case 503:
      return "Service Unavailable";
    default:
      return "Error";
  }
}

// A whole HTTP/1.1 answer that closes its connection; without the body for HEAD.
std::string Response(int code, std::string_view type, std::string_view body, bool head_only) {
  std::string r = "HTTP/1.1 " + std::to_string(code) + " " + ReasonPhrase(code) +
                  "\r\nContent-Type: " + std::string(type) +
                  "\r\nContent-Length: " + std::to_string(body.size()) +
                  "\r\nConnection: close\r\n\r\n";
  if (!head_only) r.append(body);
  return r;
}

// Sends what the socket takes at once of `data`, for an answer on a connection that is closed
// right after (408, 503): a client that does not read loses it, the loop never waits.
void SendBestEffort(int fd, std::string_view data) {
  [[maybe_unused]] ssize_t n = send(fd, data.data(), data.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
}

// A non-blocking socket listening on `address`:`port`.
Result<int> Listen(const std::string& address, uint32_t port) {
  const std::string where = address + ":" + std::to_string(port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const int gai = getaddrinfo(address.c_str(), std::to_string(port).c_str(), &hints, &found);
  if (gai != 0 || found == nullptr) {
    return Status::InvalidArgument("cannot resolve the metrics address '" + address +
                                   "': " + gai_strerror(gai));
  }
  const int fd = socket(found->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  int err = errno;
  if (fd >= 0) {
    // SO_REUSEADDR only: with SO_REUSEPORT a second process on the same port would bind too
    // and take half of the scrapes.
    int yes = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    if (bind(fd, found->ai_addr, found->ai_addrlen) == 0 && listen(fd, SOMAXCONN) == 0) {
      freeaddrinfo(found);
      return fd;
    }
    err = errno;
    close(fd);
  }
  freeaddrinfo(found);
  return Status::Unavailable("cannot serve metrics on " + where + ": " + std::strerror(err));
}

}  // namespace

// Why an event loop: the endpoint was a cpp-httplib server with a thread per connection from a
// pool of 2, whose threads each waited up to 5 s on a connection that sent nothing; with 200
// idle connections open, /healthz (the liveness probe) answered after 496 s. Here one thread
// does every socket operation without blocking, over poll(): a connection that sends nothing,
// trickles its request or does not read its answer costs a descriptor and a few bytes, never a
// thread, and has a deadline for its whole request and its whole answer (not per read). The
// loop answers /healthz and /readyz itself (a few bytes, no lock but the readiness flag's);
// only /metrics, whose rendering walks the registry and its collectors under the registry's
// mutex, goes to the scrape thread, which renders once for every scrape waiting and hands the
// text back through `wake_fd`. So no probe waits behind a scrape, and at most
// max_connections descriptors are held: an answered connection, else the oldest one still
// sending its request, makes room for a new one (a probe sends its request at once; what has
// arrived is read and answered before a connection is chosen for eviction).
struct HttpEndpoint::Impl {
  enum class State { kReading, kScraping, kWriting, kLingering };
  struct Conn {
    int fd = -1;
    State state = State::kReading;
    Clock::time_point deadline;
    bool head_only = false;
    std::string in;   // the request so far (kReading)
    std::string out;  // the answer (kWriting)
    size_t sent = 0;
  };

  Impl(HttpEndpoint* endpoint, const HttpEndpointOptions& options, Registry* registry);
  ~Impl();
  void Loop();
  void ScrapeLoop();

  // The loop thread's steps.
  int PollTimeoutMs(Clock::time_point now) const;
  void AcceptAll(Clock::time_point now);
  bool EvictOldestIdle(Clock::time_point now);
  void Serve(uint64_t id, short revents, Clock::time_point now);
  void Read(uint64_t id, Conn& c, Clock::time_point now);
  void Route(uint64_t id, Conn& c, const HttpRequestHead& head, Clock::time_point now);
  void Answer(uint64_t id, Conn& c, int code, std::string_view type, std::string_view body,
              Clock::time_point now);
  void Write(uint64_t id, Conn& c, Clock::time_point now);
  void TakeScrapes(Clock::time_point now);
  void ExpireDeadlines(Clock::time_point now);
  void Close(uint64_t id);
  void Wake();

  HttpEndpoint* const endpoint;
  const HttpEndpointOptions options;
  Registry* const registry;
  int listen_fd = -1;
  int wake_fd = -1;  // eventfd: stop, or scrapes rendered
  std::atomic<bool> stopping{false};
  std::thread loop_thread;
  std::thread scrape_thread;
  Counter* evicted;
  Counter* refused;
  Counter* read_timeout;
  Counter* write_timeout;
  Counter* bad_request;

  // Touched by the loop thread only. Ids grow with each accept: the map is in accept order.
  std::map<uint64_t, Conn> conns;
  uint64_t next_id = 0;
  Clock::time_point accept_paused_until;

  // Between the loop and the scrape thread.
  Mutex mu;
  std::condition_variable cv;
  bool stop_scraping ABSL_GUARDED_BY(mu) = false;
  std::vector<uint64_t> to_scrape ABSL_GUARDED_BY(mu);
  std::vector<std::pair<uint64_t, std::shared_ptr<const std::string>>> scraped ABSL_GUARDED_BY(mu);
};

HttpEndpoint::Impl::Impl(HttpEndpoint* e, const HttpEndpointOptions& o, Registry* r)
    : endpoint(e), options(o), registry(r) {
  const std::string name = "tessera_http_connections_dropped_total";
  const std::string help =
      "Connections to the metrics endpoint it closed before answering them, by reason: evicted "
      "(the oldest still sending its request, to make room), refused (503: no room), "
      "read_timeout (request not complete in time), write_timeout (answer not read in time), "
      "bad_request (not an HTTP/1.x GET or HEAD, or too long).";
  evicted = &r->AddCounter(name, help, {{"reason", "evicted"}});
  refused = &r->AddCounter(name, help, {{"reason", "refused"}});
  read_timeout = &r->AddCounter(name, help, {{"reason", "read_timeout"}});
  write_timeout = &r->AddCounter(name, help, {{"reason", "write_timeout"}});
  bad_request = &r->AddCounter(name, help, {{"reason", "bad_request"}});
}

HttpEndpoint::Impl::~Impl() {
  stopping = true;
  if (wake_fd >= 0) Wake();
  if (loop_thread.joinable()) loop_thread.join();
  {
    MutexLock l(mu);
    stop_scraping = true;
  }
  cv.notify_all();
  if (scrape_thread.joinable()) scrape_thread.join();
  for (auto& [id, c] : conns) close(c.fd);
  if (listen_fd >= 0) close(listen_fd);
  if (wake_fd >= 0) close(wake_fd);
}

void HttpEndpoint::Impl::Wake() {
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t n = write(wake_fd, &one, sizeof(one));
}

void HttpEndpoint::Impl::Loop() {
  std::vector<pollfd> fds;
  std::vector<uint64_t> ids;
  while (!stopping.load()) {
    Clock::time_point now = Clock::now();
    fds.clear();
    ids.clear();
    fds.push_back({wake_fd, POLLIN, 0});
    // A negative descriptor is skipped by poll: no accepts while paused.
    fds.push_back({now >= accept_paused_until ? listen_fd : -1, POLLIN, 0});
    for (const auto& [id, c] : conns) {
      const short events = c.state == State::kWriting    ? POLLOUT
                           : c.state == State::kScraping ? 0
                                                         : POLLIN;
      fds.push_back({c.fd, events, 0});
      ids.push_back(id);
    }
    if (poll(fds.data(), fds.size(), PollTimeoutMs(now)) < 0 && errno != EINTR) {
      std::this_thread::sleep_for(kAcceptPause);  // EINVAL/ENOMEM: nothing better to do
      continue;
    }
    now = Clock::now();
    if (fds[0].revents != 0) {
      uint64_t count;
      [[maybe_unused]] ssize_t n = read(wake_fd, &count, sizeof(count));
      TakeScrapes(now);
    }
    for (size_t i = 0; i < ids.size(); ++i) {
      if (fds[i + 2].revents != 0) Serve(ids[i], fds[i + 2].revents, now);
    }
    if (fds[1].revents != 0) AcceptAll(now);
    ExpireDeadlines(now);
  }
}

int HttpEndpoint::Impl::PollTimeoutMs(Clock::time_point now) const {
  Clock::time_point next = Clock::time_point::max();
  if (accept_paused_until > now) next = accept_paused_until;
  for (const auto& [id, c] : conns) next = std::min(next, c.deadline);
  if (next == Clock::time_point::max()) return -1;
  if (next <= now) return 0;
  // Rounded up: waking a moment early would spin until the deadline.
  const auto ms = std::chrono::ceil<std::chrono::milliseconds>(next - now).count();
  return static_cast<int>(std::min<int64_t>(ms, 60'000));
}

void HttpEndpoint::Impl::AcceptAll(Clock::time_point now) {
  for (int n = 0; n < kAcceptsPerPass; ++n) {
    const int fd = accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == ECONNABORTED || errno == EINTR) continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        accept_paused_until = now + kAcceptPause;
      }
      return;  // EAGAIN: all taken
    }
    if (conns.size() >= options.max_connections && !EvictOldestIdle(now)) {
      refused->Inc();
      SendBestEffort(fd, Response(503, "text/plain",
                                  "too many connections to the metrics "
                                  "endpoint; try again\n",
                                  false));
      close(fd);
      continue;
    }
    Conn& c = conns[next_id++];
    c.fd = fd;
    c.deadline = now + std::chrono::milliseconds(options.read_timeout_ms);
  }
}

// Closes the oldest connection that is not waiting for or sending an answer: one already
// answered (lingering) first, else the oldest still sending its request. A request that has
// arrived but was not read yet (its connection accepted in the same pass) is read and served
// first, not evicted. False when every connection is busy with an answer.
bool HttpEndpoint::Impl::EvictOldestIdle(Clock::time_point now) {
  std::vector<uint64_t> reading;
  for (const auto& [id, c] : conns) {
    if (c.state == State::kLingering) {
      Close(id);
      return true;
    }
    if (c.state == State::kReading) reading.push_back(id);
  }
  for (uint64_t id : reading) {
    Read(id, conns.at(id), now);
    auto it = conns.find(id);
    if (it == conns.end()) return true;  // the client had left
    if (it->second.state == State::kReading) evicted->Inc();
    if (it->second.state == State::kReading || it->second.state == State::kLingering) {
      Close(id);
      return true;
    }
  }
  return false;
}

void HttpEndpoint::Impl::Serve(uint64_t id, short revents, Clock::time_point now) {
  auto it = conns.find(id);
  if (it == conns.end()) return;
  Conn& c = it->second;
  if ((revents & (POLLERR | POLLNVAL)) != 0) return Close(id);
  switch (c.state) {
    case State::kReading:
      return Read(id, c, now);
    case State::kWriting:
      return Write(id, c, now);
    case State::kScraping:
      return Close(id);  // POLLHUP: the client is gone
    case State::kLingering: {
      // Drops what arrives, a bounded amount per pass, until the client closes.
      char buf[4096];
      for (int reads = 0; reads < 16; ++reads) {
        const ssize_t n = recv(c.fd, buf, sizeof(buf), 0);
        if (n > 0) continue;
        if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) Close(id);
        return;
      }
      return;
    }
  }
}

void HttpEndpoint::Impl::Read(uint64_t id, Conn& c, Clock::time_point now) {
  char buf[4096];
  // A client may send its request and shut its side down (end of file): it still reads.
  bool eof = false;
  while (!eof && c.in.size() <= options.max_request_bytes) {
    const ssize_t n = recv(c.fd, buf, sizeof(buf), 0);
    if (n > 0) {
      c.in.append(buf, static_cast<size_t>(n));
    } else if (n == 0) {
      eof = true;
    } else if (errno == EINTR) {
      continue;
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      break;
    } else {
      return Close(id);
    }
  }
  if (c.in.size() > options.max_request_bytes) {
    bad_request->Inc();
    return Answer(id, c, 431, "text/plain",
                  "request head over " + std::to_string(options.max_request_bytes) + " bytes\n",
                  now);
  }
  const HttpRequestHead head = internal::ParseRequestHead(c.in);
  if (head.state == HttpRequestHead::State::kIncomplete) {
    if (eof) Close(id);  // the client left before finishing its request
    return;
  }
  if (head.state == HttpRequestHead::State::kBad) {
    bad_request->Inc();
    return Answer(id, c, 400, "text/plain", head.error + "\n", now);
  }
  Route(id, c, head, now);
}

void HttpEndpoint::Impl::Route(uint64_t id, Conn& c, const HttpRequestHead& head,
                               Clock::time_point now) {
  if (head.method != "GET" && head.method != "HEAD") {
    bad_request->Inc();
    return Answer(id, c, 405, "text/plain", "only GET and HEAD are served\n", now);
  }
  c.head_only = head.method == "HEAD";
  if (head.path == "/healthz") return Answer(id, c, 200, "text/plain", "ok\n", now);
  if (head.path == "/readyz") {
    auto [code, body] = endpoint->Readiness();
    return Answer(id, c, code, "text/plain", body, now);
  }
  if (head.path == "/metrics") {
    c.state = State::kScraping;
    c.in.clear();
    c.deadline = now + std::chrono::milliseconds(options.write_timeout_ms);
    {
      MutexLock l(mu);
      to_scrape.push_back(id);
    }
    cv.notify_one();
    return;
  }
  Answer(id, c, 404, "text/plain", "not found; try /metrics, /healthz or /readyz\n", now);
}

void HttpEndpoint::Impl::Answer(uint64_t id, Conn& c, int code, std::string_view type,
                                std::string_view body, Clock::time_point now) {
  c.out = Response(code, type, body, c.head_only);
  c.sent = 0;
  c.in.clear();
  c.state = State::kWriting;
  c.deadline = now + std::chrono::milliseconds(options.write_timeout_ms);
  Write(id, c, now);
}

void HttpEndpoint::Impl::Write(uint64_t id, Conn& c, Clock::time_point now) {
  while (c.sent < c.out.size()) {
    const ssize_t n = send(c.fd, c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL);
    if (n > 0) {
      c.sent += static_cast<size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      return;  // the rest when the socket takes more (POLLOUT)
    } else {
      return Close(id);
    }
  }
  shutdown(c.fd, SHUT_WR);
  c.out = std::string();
  c.state = State::kLingering;
  c.deadline = now + kLinger;
}

void HttpEndpoint::Impl::TakeScrapes(Clock::time_point now) {
  std::vector<std::pair<uint64_t, std::shared_ptr<const std::string>>> done;
  {
    MutexLock l(mu);
    done.swap(scraped);
  }
  for (const auto& [id, text] : done) {
    auto it = conns.find(id);
    // Gone (closed at its deadline, or the client left) or not this request: dropped.
    if (it == conns.end() || it->second.state != State::kScraping) continue;
    Answer(id, it->second, 200, "text/plain; version=0.0.4; charset=utf-8", *text, now);
  }
}

void HttpEndpoint::Impl::ExpireDeadlines(Clock::time_point now) {
  std::vector<uint64_t> expired;
  for (const auto& [id, c] : conns) {
    if (c.deadline <= now) expired.push_back(id);
  }
  for (uint64_t id : expired) {
    Conn& c = conns.at(id);
    if (c.state == State::kReading) {
      read_timeout->Inc();
      SendBestEffort(c.fd, Response(408, "text/plain",
                                    "request not complete within " +
                                        std::to_string(options.read_timeout_ms) + " ms\n",
                                    false));
    } else if (c.state != State::kLingering) {
      write_timeout->Inc();
    }
    Close(id);
  }
}

void HttpEndpoint::Impl::Close(uint64_t id) {
  auto it = conns.find(id);
  if (it == conns.end()) return;
  close(it->second.fd);
  conns.erase(it);
}

void HttpEndpoint::Impl::ScrapeLoop() {
  MutexLock l(mu);
  for (;;) {
    while (!stop_scraping && to_scrape.empty()) cv.wait(l.native());
    if (stop_scraping) return;
    std::vector<uint64_t> ids;
    ids.swap(to_scrape);
    l.Unlock();
    // One rendering answers every scrape that waited for it.
    auto text = std::make_shared<const std::string>(registry->Text());
    l.Lock();
    for (uint64_t id : ids) scraped.emplace_back(id, text);
    Wake();
  }
}

HttpEndpoint::HttpEndpoint(Registry* registry) : registry_(registry) {}

Result<std::unique_ptr<HttpEndpoint>> HttpEndpoint::Start(const HttpEndpointOptions& options,
                                                          Registry* registry) {
  auto out_of = [](const char* what, uint64_t v, uint64_t lo, uint64_t hi) {
    return Status::InvalidArgument(std::string("metrics ") + what + " must be in " +
                                   std::to_string(lo) + ".." + std::to_string(hi) + ", got " +
                                   std::to_string(v));
  };
  if (options.port == 0 || options.port > 65535) return out_of("port", options.port, 1, 65535);
  if (options.max_connections < 2 || options.max_connections > 65536) {
    return out_of("max_connections", options.max_connections, 2, 65536);
  }
  if (options.read_timeout_ms == 0 || options.read_timeout_ms > 3'600'000) {
    return out_of("read_timeout_ms", options.read_timeout_ms, 1, 3'600'000);
  }
  if (options.write_timeout_ms == 0 || options.write_timeout_ms > 3'600'000) {
    return out_of("write_timeout_ms", options.write_timeout_ms, 1, 3'600'000);
  }
  if (options.max_request_bytes < 256 || options.max_request_bytes > (1u << 20)) {
    return out_of("max_request_bytes", options.max_request_bytes, 256, 1u << 20);
  }
  if (options.address.empty() || options.address.find_first_of(", ") != std::string::npos) {
    return Status::InvalidArgument("metrics address must be an IP address or host name, got '" +
                                   options.address + "'");
  }
  std::unique_ptr<HttpEndpoint> e(new HttpEndpoint(registry));
  auto impl = std::make_unique<Impl>(e.get(), options, registry);
  TESSERA_ASSIGN_OR_RETURN(impl->listen_fd, Listen(options.address, options.port));
  impl->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (impl->wake_fd < 0) {
    return Status::Unavailable(std::string("metrics endpoint: eventfd: ") + std::strerror(errno));
  }
  Impl* i = impl.get();
  i->scrape_thread = std::thread([i] { i->ScrapeLoop(); });
  i->loop_thread = std::thread([i] { i->Loop(); });
  e->impl_ = std::move(impl);
  e->port_ = options.port;
  return e;
}

// The loop thread reads mu_ (Readiness): it stops before any field goes.
HttpEndpoint::~HttpEndpoint() { impl_.reset(); }

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
