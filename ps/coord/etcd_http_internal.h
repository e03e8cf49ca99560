// HTTP transport of the etcd client: one POST of a JSON body, and the watch thread's factory.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "ps/coord/etcd_client.h"
#include "ps/status.h"

namespace tessera::internal {

/// POSTs `body` to `path` on etcd and parses the answer. Errors name "etcd ENDPOINT PATH".
Result<nlohmann::json> PostJson(const EtcdOptions& options, std::string_view path,
                                const nlohmann::json& body);

/// "etcd HOST:PORT PATH", the start of every error message of a call.
std::string CallName(const EtcdOptions& options, std::string_view path);

/// Starts the thread of a watch (etcd_watch.cc).
std::unique_ptr<EtcdWatch> StartWatch(const EtcdOptions& options, const WatchOptions& watch,
                                      WatchCallback callback);

}  // namespace tessera::internal
