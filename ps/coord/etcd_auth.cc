// etcd's user/password authentication for the client: a token from /v3/auth/authenticate,
// sent as the Authorization header, renewed once when etcd no longer knows it.
#include <utility>

#include "ps/coord/etcd_http_internal.h"

namespace tessera::internal {

using nlohmann::json;

Result<std::string> EtcdToken::Authenticate(const EtcdOptions& options) {
  const char* path = "/v3/auth/authenticate";
  Result<json> j =
      PostJson(options, path, {{"name", options.user}, {"password", options.password}});
  if (!j.ok()) {
    const Status& s = j.status();
    // Nothing answered: retryable as it is. Any answer of etcd's (wrong user or password, auth
    // not enabled) is this user's failure. etcd's message never repeats the password.
    if (s.code() == StatusCode::kUnavailable || s.code() == StatusCode::kDeadlineExceeded) {
      return s;
    }
    return Status(s.code(),
                  "etcd authentication failed for user " + options.user + ": " + s.message());
  }
  auto token = j->find("token");
  if (token == j->end() || !token->is_string() || token->get<std::string>().empty()) {
    return Status::Corruption(CallName(options, path) + ": no token in the answer");
  }
  ++authentications_;
  return token->get<std::string>();
}

Result<std::string> EtcdToken::Get(const EtcdOptions& options) {
  if (options.user.empty()) return std::string();
  // One authentication at a time (bounded by the call's timeout): threads that find no token
  // wait for the one being fetched instead of each asking etcd for its own.
  MutexLock lock(mu_);
  if (token_.empty()) {
    TESSERA_ASSIGN_OR_RETURN(token_, Authenticate(options));
  }
  return token_;
}

Result<std::string> EtcdToken::Renew(const EtcdOptions& options, const std::string& stale) {
  if (options.user.empty()) return std::string();
  MutexLock lock(mu_);
  if (!token_.empty() && token_ != stale) return token_;
  token_.clear();
  TESSERA_ASSIGN_OR_RETURN(token_, Authenticate(options));
  return token_;
}

bool IsInvalidToken(const Status& s) {
  return !s.ok() && s.message().find("invalid auth token") != std::string::npos;
}

Status ExplainAuthRequired(const EtcdOptions& options, Status s) {
  if (!options.user.empty() || s.ok()) return s;
  // etcd 3.4 answers a call without a token "user name is empty" when its auth is enabled.
  if (s.message().find("user name is empty") == std::string::npos) return s;
  return Status(StatusCode::kInvalidArgument,
                s.message() +
                    ": etcd has authentication enabled and no etcd user was given "
                    "(etcd://USER@HOST:PORT/PREFIX and a password file)");
}

namespace {

// A refused token: an error answer, or a streaming call's 200 answer {"error": {...}}.
bool TokenRefused(const Result<json>& r) {
  if (!r.ok()) return IsInvalidToken(r.status());
  auto error = r->find("error");
  return error != r->end() && error->dump().find("invalid auth token") != std::string::npos;
}

}  // namespace

Result<json> AuthedPost(const EtcdOptions& options, EtcdToken* token, std::string_view path,
                        const json& body) {
  TESSERA_ASSIGN_OR_RETURN(std::string current, token->Get(options));
  Result<json> r = PostJson(options, path, body, current);
  if (!current.empty() && TokenRefused(r)) {
    // etcd forgot the token (simple tokens expire after --auth-token-ttl idle, and a restart
    // forgets them all): once more with a new one.
    TESSERA_ASSIGN_OR_RETURN(current, token->Renew(options, current));
    r = PostJson(options, path, body, current);
  }
  if (!r.ok()) return ExplainAuthRequired(options, r.status());
  return r;
}

}  // namespace tessera::internal
