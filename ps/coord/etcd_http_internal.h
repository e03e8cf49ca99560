// HTTP transport of the etcd client: one POST of a JSON body, and the watch thread's factory.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "ps/coord/etcd_client.h"
#include "ps/mutex.h"
#include "ps/status.h"

namespace tessera::internal {

/// The auth token of one client and its watches (etcd's auth, EtcdOptions::user). Thread-safe.
class EtcdToken {
 public:
  /// The current token, authenticating first when there is none. Empty without a user.
  Result<std::string> Get(const EtcdOptions& options) ABSL_LOCKS_EXCLUDED(mu_);
  /// A token other than `stale` (which etcd refused): the one another thread got meanwhile,
  /// or a new one from etcd.
  Result<std::string> Renew(const EtcdOptions& options, const std::string& stale)
      ABSL_LOCKS_EXCLUDED(mu_);
  int64_t authentications() const { return authentications_.load(); }

 private:
  Result<std::string> Authenticate(const EtcdOptions& options);
  Mutex mu_;
  std::string token_ ABSL_GUARDED_BY(mu_);
  std::atomic<int64_t> authentications_{0};
};

/// True for etcd's answer to a token it does not know (expired, or auth re-enabled).
bool IsInvalidToken(const Status& s);
/// `s`, reworded when etcd refused a call that carried no user because its auth is enabled.
Status ExplainAuthRequired(const EtcdOptions& options, Status s);

/// POSTs `body` to `path` on etcd and parses the answer, with `token` (when not empty) as the
/// Authorization header. Errors name "etcd ENDPOINT PATH".
Result<nlohmann::json> PostJson(const EtcdOptions& options, std::string_view path,
                                const nlohmann::json& body, const std::string& token = {});

/// PostJson with `token`'s token; a call refused for an invalid token is retried once with a
/// new one.
Result<nlohmann::json> AuthedPost(const EtcdOptions& options, EtcdToken* token,
                                  std::string_view path, const nlohmann::json& body);

/// "etcd HOST:PORT PATH", the start of every error message of a call.
std::string CallName(const EtcdOptions& options, std::string_view path);

/// Starts the thread of a watch (etcd_watch.cc).
std::unique_ptr<EtcdWatch> StartWatch(const EtcdOptions& options, std::shared_ptr<EtcdToken> token,
                                      const WatchOptions& watch, WatchCallback callback);

}  // namespace tessera::internal
