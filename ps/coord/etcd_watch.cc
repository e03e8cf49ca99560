// The watch thread: one streaming POST /v3/watch at a time, reconnected from the next revision
// whenever the stream breaks.
#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "ps/coord/etcd_http_internal.h"
#include "ps/coord/etcd_json_internal.h"

namespace tessera::internal {

using nlohmann::json;

namespace {

class WatchThread final : public EtcdWatch {
 public:
  WatchThread(const EtcdOptions& etcd, std::shared_ptr<EtcdToken> token, const WatchOptions& watch,
              WatchCallback callback)
      : etcd_(etcd),
        token_(std::move(token)),
        watch_(watch),
        callback_(std::move(callback)),
        next_revision_(watch.start_revision) {
    thread_ = std::thread([this] { Run(); });
  }
  ~WatchThread() override { Stop(); }

  void Stop() override;
  int64_t next_revision() const override { return next_revision_.load(); }
  int connects() const override { return connects_.load(); }
  Status last_error() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return last_error_;
  }

 private:
  void Run();
  // One stream, from connect to its end; true when it delivered or confirmed anything.
  bool StreamOnce();
  // Handles one JSON line of the stream; false ends the stream (canceled, or not understood).
  bool HandleLine(std::string_view line, bool* progressed);
  bool HandleResult(const json& result, bool* progressed);
  void SetError(Status s) {
    std::lock_guard<std::mutex> lock(mu_);
    last_error_ = std::move(s);
  }
  json CreateRequest() const;

  const EtcdOptions etcd_;
  const std::shared_ptr<EtcdToken> token_;
  const WatchOptions watch_;
  const WatchCallback callback_;
  std::atomic<int64_t> next_revision_;
  std::atomic<int> connects_{0};
  std::atomic<bool> stopping_{false};
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::string refused_token_;           // the watch thread's own
  bool done_ = false;                   // guarded by mu_
  httplib::Client* current_ = nullptr;  // guarded by mu_: the stream's client, to stop it
  Status last_error_;                   // guarded by mu_
  std::thread thread_;
};

void WatchThread::Stop() {
  if (!thread_.joinable()) return;
  if (std::this_thread::get_id() == thread_.get_id()) {  // from the callback: no self-join
    stopping_ = true;
    return;
  }
  std::unique_lock<std::mutex> lock(mu_);
  stopping_ = true;
  // The thread may be between its check of stopping_ and its connect, where one stop() would
  // find no socket to shut: repeat until it has left.
  while (!done_) {
    if (current_ != nullptr) current_->stop();
    cv_.notify_all();
    cv_.wait_for(lock, std::chrono::milliseconds(20));
  }
  lock.unlock();
  thread_.join();
}

void WatchThread::Run() {
  int backoff = watch_.reconnect_backoff_ms;
  while (!stopping_) {
    const bool progressed = StreamOnce();
    if (stopping_) break;
    if (progressed) backoff = watch_.reconnect_backoff_ms;
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, std::chrono::milliseconds(backoff), [this] { return stopping_.load(); });
    backoff = std::min(backoff * 2, watch_.reconnect_backoff_ms * 8);
  }
  std::lock_guard<std::mutex> lock(mu_);
  done_ = true;
  cv_.notify_all();
}

json WatchThread::CreateRequest() const {
  json create = {{"key", Base64(watch_.key)}};
  if (watch_.prefix) create["range_end"] = Base64(EtcdClient::PrefixEnd(watch_.key));
  if (next_revision_ > 0) create["start_revision"] = std::to_string(next_revision_.load());
  return {{"create_request", create}};
}

bool WatchThread::StreamOnce() {
  // With a user: the client's token, a new one when etcd refused it on the last stream (an
  // unknown token cancels the watch with "permission denied", or fails "invalid auth token").
  Result<std::string> token = token_->Get(etcd_);
  if (token.ok() && !token->empty() && refused_token_ == *token) {
    token = token_->Renew(etcd_, *token);
  }
  if (!token.ok()) {
    SetError(token.status());
    return false;
  }
  refused_token_.clear();
  httplib::Client http(etcd_.host, etcd_.port);
  http.set_connection_timeout(std::chrono::milliseconds(etcd_.timeout_ms));
  http.set_write_timeout(std::chrono::milliseconds(etcd_.timeout_ms));
  http.set_read_timeout(std::chrono::milliseconds(watch_.idle_reconnect_ms));
  httplib::Request req;
  req.method = "POST";
  req.path = "/v3/watch";
  req.body = CreateRequest().dump();
  req.set_header("Content-Type", "application/json");
  if (!token->empty()) req.set_header("Authorization", *token);
  int http_status = 0;
  bool progressed = false;
  bool keep_going = true;
  std::string pending;  // bytes after the last complete line
  req.response_handler = [&](const httplib::Response& r) {
    http_status = r.status;
    return !stopping_.load();
  };
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    pending.append(data, n);
    if (http_status != 200) return !stopping_.load();  // an error body: keep it whole
    size_t nl;
    while (keep_going && (nl = pending.find('\n')) != std::string::npos) {
      keep_going = HandleLine(std::string_view(pending).substr(0, nl), &progressed);
      pending.erase(0, nl + 1);
    }
    return keep_going && !stopping_.load();
  };
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return false;
    current_ = &http;
  }
  httplib::Response res;
  httplib::Error error = httplib::Error::Success;
  http.send(req, res, error);
  {
    std::lock_guard<std::mutex> lock(mu_);
    current_ = nullptr;
  }
  const std::string what = CallName(etcd_, "/v3/watch");
  if (http_status != 0 && http_status != 200) {
    SetError(ExplainAuthRequired(etcd_, HttpError(http_status, pending, what)));
  } else if (error != httplib::Error::Success && !stopping_ && keep_going) {
    SetError(Status::Unavailable(what + ": stream ended: " + httplib::to_string(error)));
  }
  if (!token->empty() && !progressed) {
    const Status last = last_error();
    if (IsInvalidToken(last) || last.message().find("permission denied") != std::string::npos) {
      refused_token_ = *token;
    }
  }
  return progressed;
}

bool WatchThread::HandleLine(std::string_view line, bool* progressed) {
  const std::string what = CallName(etcd_, "/v3/watch");
  if (line.find_first_not_of(" \r\t") == std::string_view::npos) return true;
  Result<json> j = ParseJson(line, what);
  if (!j.ok()) {
    SetError(j.status());
    return false;
  }
  auto result = j->find("result");
  if (result == j->end() || !result->is_object()) {
    // A stream error: {"error": {"grpc_code", "http_code", "message", ...}}.
    SetError(Status::Unavailable(what + ": stream error: " + j->dump()));
    return false;
  }
  return HandleResult(*result, progressed);
}

bool WatchThread::HandleResult(const json& result, bool* progressed) {
  const std::string what = CallName(etcd_, "/v3/watch");
  Result<int64_t> compacted = Int64Field(result, "compact_revision");
  if (compacted.ok() && *compacted > 0) {
    // Events before the compaction are gone: say so, and go on from the oldest that is left.
    next_revision_ = *compacted;
    WatchBatch batch;
    batch.compacted_to = *compacted;
    callback_(batch);
    *progressed = true;
    return false;
  }
  if (BoolField(result, "canceled")) {
    SetError(Status::Unavailable(what + ": etcd canceled the watch: " + result.dump()));
    return false;
  }
  if (BoolField(result, "created")) {
    ++connects_;
    *progressed = true;
    Result<int64_t> rev = HeaderRevision(result);
    // Without a start revision the watch begins after the revision it was created at.
    if (next_revision_ == 0 && rev.ok()) next_revision_ = *rev + 1;
  }
  auto events = result.find("events");
  if (events == result.end()) return true;
  if (!events->is_array()) {
    SetError(Status::Corruption(what + ": events is not an array"));
    return false;
  }
  WatchBatch batch;
  for (const json& e : *events) {
    WatchEvent ev;
    // PUT is the enum's default, so etcd leaves "type" out of a put event.
    const bool is_delete = e.is_object() && e.contains("type") && e["type"] == "DELETE";
    ev.type = is_delete ? WatchEvent::Type::kDelete : WatchEvent::Type::kPut;
    Result<KeyValue> kv = e.is_object() && e.contains("kv")
                              ? ParseKeyValue(e["kv"])
                              : Result<KeyValue>(Status::Corruption("an event without kv"));
    if (!kv.ok()) {
      SetError(kv.status().WithContext(what));
      return false;
    }
    ev.kv = std::move(kv).value();
    batch.events.push_back(std::move(ev));
  }
  if (batch.events.empty()) return true;
  next_revision_ = batch.events.back().kv.mod_revision + 1;
  *progressed = true;
  callback_(batch);
  return true;
}

}  // namespace

std::unique_ptr<EtcdWatch> StartWatch(const EtcdOptions& options, std::shared_ptr<EtcdToken> token,
                                      const WatchOptions& watch, WatchCallback callback) {
  return std::make_unique<WatchThread>(options, std::move(token), watch, std::move(callback));
}

}  // namespace tessera::internal
