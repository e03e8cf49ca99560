#include "ps/coord/etcd_client.h"

#include <httplib.h>

#include <chrono>

#include "ps/coord/etcd_http_internal.h"
#include "ps/coord/etcd_json_internal.h"

namespace tessera {

using nlohmann::json;

namespace internal {

std::string CallName(const EtcdOptions& options, std::string_view path) {
  return "etcd " + options.host + ":" + std::to_string(options.port) + " " + std::string(path);
}

Result<json> PostJson(const EtcdOptions& options, std::string_view path, const json& body,
                      const std::string& token) {
  const std::string what = CallName(options, path);
  // A connection per call: calls of several threads never queue behind each other, and no
  // kept-alive socket goes stale when etcd restarts. On loopback a connect costs ~0.1 ms.
  httplib::Client http(options.host, options.port);
  const auto timeout = std::chrono::milliseconds(options.timeout_ms);
  http.set_connection_timeout(timeout);
  http.set_read_timeout(timeout);
  http.set_write_timeout(timeout);
  httplib::Request req;
  req.method = "POST";
  req.path = std::string(path);
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  if (!token.empty()) req.set_header("Authorization", token);
  int status = 0;
  std::string answer;
  req.response_handler = [&](const httplib::Response& r) {
    status = r.status;
    return true;
  };
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    answer.append(data, n);
    return true;
  };
  httplib::Response res;
  httplib::Error error = httplib::Error::Success;
  const auto start = std::chrono::steady_clock::now();
  const bool sent = http.send(req, res, error);
  // The gateway ends every error answer with HTTP trailer fields, which cpp-httplib 0.11 takes
  // for a broken chunked body (a Read error) after it has handed over the whole body: an answer
  // whose status line came and whose body is complete JSON is etcd's answer.
  const bool answered = status != 0 && error == httplib::Error::Read && json::accept(answer);
  if (!sent && !answered) {
    const auto waited = std::chrono::steady_clock::now() - start;
    const std::string why = httplib::to_string(error);
    // A read that ran out of time is a peer that accepted but did not answer; anything else
    // (refused, reset) is nothing listening or a connection lost: retryable.
    if (waited >= timeout || error == httplib::Error::ConnectionTimeout) {
      return Status::DeadlineExceeded(what + ": no answer within " +
                                      std::to_string(options.timeout_ms) + " ms (" + why + ")");
    }
    const char* how = error == httplib::Error::Connection ? "cannot connect"
                      : error == httplib::Error::Write    ? "connection lost while sending"
                                                          : "connection lost while receiving";
    return Status::Unavailable(what + ": " + how + " (" + why + ")");
  }
  if (status != 200) return HttpError(status, answer, what);
  Result<json> parsed = ParseJson(answer, what);
  if (parsed.ok() && !parsed->is_object()) {
    return Status::Corruption(what + ": the answer is not a JSON object");
  }
  return parsed;
}

}  // namespace internal

using internal::AuthedPost;
using internal::Base64;
using internal::CallName;

namespace {

// Every parse error of an answer names the call it came from.
template <typename T>
Result<T> Named(Result<T> r, const EtcdOptions& options, std::string_view path) {
  if (r.ok()) return r;
  return r.status().WithContext(CallName(options, path));
}

const char* TargetName(TxnCompare::Target t) {
  switch (t) {
    case TxnCompare::Target::kVersion:
      return "VERSION";
    case TxnCompare::Target::kCreateRevision:
      return "CREATE";
    case TxnCompare::Target::kModRevision:
      return "MOD";
  }
  return "MOD";
}

const char* TargetField(TxnCompare::Target t) {
  switch (t) {
    case TxnCompare::Target::kVersion:
      return "version";
    case TxnCompare::Target::kCreateRevision:
      return "create_revision";
    case TxnCompare::Target::kModRevision:
      return "mod_revision";
  }
  return "mod_revision";
}

json OpJson(const TxnOp& op) {
  if (op.kind == TxnOp::Kind::kGet) return {{"request_range", {{"key", Base64(op.key)}}}};
  json put = {{"key", Base64(op.key)}, {"value", Base64(op.value)}};
  if (op.lease != 0) put["lease"] = std::to_string(op.lease);
  return {{"request_put", put}};
}

json TxnJson(const TxnRequest& request) {
  json compares = json::array();
  for (const TxnCompare& c : request.compares) {
    compares.push_back({{"key", Base64(c.key)},
                        {"target", TargetName(c.target)},
                        {"result", "EQUAL"},
                        {TargetField(c.target), std::to_string(c.value)}});
  }
  json success = json::array(), failure = json::array();
  for (const TxnOp& op : request.success) success.push_back(OpJson(op));
  for (const TxnOp& op : request.failure) failure.push_back(OpJson(op));
  return {{"compare", compares}, {"success", success}, {"failure", failure}};
}

Result<TxnResult> ParseTxn(const json& j) {
  TxnResult out;
  out.succeeded = internal::BoolField(j, "succeeded");
  TESSERA_ASSIGN_OR_RETURN(out.revision, internal::HeaderRevision(j));
  auto responses = j.find("responses");
  if (responses == j.end()) return out;
  if (!responses->is_array()) return Status::Corruption("responses is not an array");
  for (const json& r : *responses) {
    auto range = r.find("response_range");
    if (range == r.end()) {
      out.results.emplace_back();
      continue;
    }
    TESSERA_ASSIGN_OR_RETURN(std::vector<KeyValue> kvs, internal::ParseKvs(*range));
    out.results.push_back(std::move(kvs));
  }
  return out;
}

}  // namespace

EtcdClient::EtcdClient(const EtcdOptions& options)
    : options_(options),
      endpoint_(options.host + ":" + std::to_string(options.port)),
      token_(std::make_shared<internal::EtcdToken>()) {}

EtcdClient::~EtcdClient() = default;

int64_t EtcdClient::authentications() const { return token_->authentications(); }

Result<std::unique_ptr<EtcdClient>> EtcdClient::Create(const EtcdOptions& options) {
  if (options.host.empty()) return Status::InvalidArgument("etcd: empty host");
  if (options.port == 0) return Status::InvalidArgument("etcd " + options.host + ": port 0");
  if (options.user.empty() && !options.password.empty()) {
    return Status::InvalidArgument("etcd: a password without a user");
  }
  if (options.timeout_ms <= 0) {
    return Status::InvalidArgument("etcd: timeout_ms must be > 0, got " +
                                   std::to_string(options.timeout_ms));
  }
  return std::unique_ptr<EtcdClient>(new EtcdClient(options));
}

std::string EtcdClient::PrefixEnd(std::string_view prefix) {
  // etcd's rule (clientv3.GetPrefixRangeEnd): increment the last byte below 0xff and cut
  // there; a prefix of only 0xff bytes (or an empty one) ranges to the end of the key space.
  std::string end(prefix);
  for (size_t i = end.size(); i-- > 0;) {
    if (static_cast<unsigned char>(end[i]) < 0xff) {
      end[i] = static_cast<char>(static_cast<unsigned char>(end[i]) + 1);
      end.resize(i + 1);
      return end;
    }
  }
  return std::string(1, '\0');
}

Result<int64_t> EtcdClient::Put(std::string_view key, std::string_view value, int64_t lease) {
  json body = {{"key", Base64(key)}, {"value", Base64(value)}};
  if (lease != 0) body["lease"] = std::to_string(lease);
  TESSERA_ASSIGN_OR_RETURN(json j, AuthedPost(options_, token_.get(), "/v3/kv/put", body));
  return Named(internal::HeaderRevision(j), options_, "/v3/kv/put");
}

Result<std::optional<KeyValue>> EtcdClient::Get(std::string_view key) {
  TESSERA_ASSIGN_OR_RETURN(
      json j, AuthedPost(options_, token_.get(), "/v3/kv/range", {{"key", Base64(key)}}));
  TESSERA_ASSIGN_OR_RETURN(std::vector<KeyValue> kvs,
                           Named(internal::ParseKvs(j), options_, "/v3/kv/range"));
  if (kvs.empty()) return std::optional<KeyValue>();
  return std::optional<KeyValue>(std::move(kvs.front()));
}

Result<RangeResult> EtcdClient::GetPrefix(std::string_view prefix) {
  json body = {{"key", Base64(prefix)}, {"range_end", Base64(PrefixEnd(prefix))}};
  TESSERA_ASSIGN_OR_RETURN(json j, AuthedPost(options_, token_.get(), "/v3/kv/range", body));
  RangeResult out;
  TESSERA_ASSIGN_OR_RETURN(out.kvs, Named(internal::ParseKvs(j), options_, "/v3/kv/range"));
  TESSERA_ASSIGN_OR_RETURN(out.revision,
                           Named(internal::HeaderRevision(j), options_, "/v3/kv/range"));
  return out;
}

Result<int64_t> EtcdClient::Delete(std::string_view key) {
  TESSERA_ASSIGN_OR_RETURN(
      json j, AuthedPost(options_, token_.get(), "/v3/kv/deleterange", {{"key", Base64(key)}}));
  return Named(internal::Int64Field(j, "deleted"), options_, "/v3/kv/deleterange");
}

Result<int64_t> EtcdClient::DeletePrefix(std::string_view prefix) {
  json body = {{"key", Base64(prefix)}, {"range_end", Base64(PrefixEnd(prefix))}};
  TESSERA_ASSIGN_OR_RETURN(json j, AuthedPost(options_, token_.get(), "/v3/kv/deleterange", body));
  return Named(internal::Int64Field(j, "deleted"), options_, "/v3/kv/deleterange");
}

Result<TxnResult> EtcdClient::Txn(const TxnRequest& request) {
  TESSERA_ASSIGN_OR_RETURN(json j,
                           AuthedPost(options_, token_.get(), "/v3/kv/txn", TxnJson(request)));
  return Named(ParseTxn(j), options_, "/v3/kv/txn");
}

Status EtcdClient::Compact(int64_t revision) {
  json body = {{"revision", std::to_string(revision)}, {"physical", true}};
  return AuthedPost(options_, token_.get(), "/v3/kv/compaction", body).status();
}

Result<Lease> EtcdClient::GrantLease(int64_t ttl_s) {
  if (ttl_s <= 0) return Status::InvalidArgument("lease TTL must be > 0 s");
  TESSERA_ASSIGN_OR_RETURN(json j, AuthedPost(options_, token_.get(), "/v3/lease/grant",
                                              {{"TTL", std::to_string(ttl_s)}}));
  Lease lease;
  TESSERA_ASSIGN_OR_RETURN(lease.id,
                           Named(internal::Int64Field(j, "ID"), options_, "/v3/lease/grant"));
  TESSERA_ASSIGN_OR_RETURN(lease.ttl_s,
                           Named(internal::Int64Field(j, "TTL"), options_, "/v3/lease/grant"));
  if (lease.id == 0) return Status::Corruption(CallName(options_, "/v3/lease/grant") + ": no ID");
  return lease;
}

Result<int64_t> EtcdClient::KeepAlive(int64_t lease_id) {
  // The gateway maps the streaming LeaseKeepAlive onto one request: the body is one request
  // message, the answer one {"result": ...} line.
  const char* path = "/v3/lease/keepalive";
  TESSERA_ASSIGN_OR_RETURN(
      json j, AuthedPost(options_, token_.get(), path, {{"ID", std::to_string(lease_id)}}));
  auto result = j.find("result");
  if (result == j.end() || !result->is_object()) {
    if (j.contains("error")) return internal::HttpError(200, j.dump(), CallName(options_, path));
    return Status::Corruption(CallName(options_, path) + ": no result in the answer");
  }
  TESSERA_ASSIGN_OR_RETURN(int64_t ttl,
                           Named(internal::Int64Field(*result, "TTL"), options_, path));
  // etcd answers an expired or unknown lease with TTL 0 (the field left out), not an error.
  if (ttl <= 0) {
    return Status::NotFound(CallName(options_, path) + ": lease " + std::to_string(lease_id) +
                            " has expired or was revoked");
  }
  return ttl;
}

Status EtcdClient::RevokeLease(int64_t lease_id) {
  auto j =
      AuthedPost(options_, token_.get(), "/v3/lease/revoke", {{"ID", std::to_string(lease_id)}});
  return j.status();
}

Result<std::unique_ptr<EtcdWatch>> EtcdClient::Watch(const WatchOptions& options,
                                                     WatchCallback callback) {
  if (options.key.empty() && !options.prefix) return Status::InvalidArgument("watch: empty key");
  if (!callback) return Status::InvalidArgument("watch: no callback");
  if (options.start_revision < 0 || options.reconnect_backoff_ms <= 0 ||
      options.idle_reconnect_ms <= 0) {
    return Status::InvalidArgument("watch: start_revision must be >= 0, backoff and idle > 0");
  }
  return internal::StartWatch(options_, token_, options, std::move(callback));
}

}  // namespace tessera
