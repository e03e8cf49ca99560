// A client of etcd 3.4's gRPC-JSON gateway (HTTP/1.1 + JSON): keys, transactions, leases and
// watches, for the cluster's membership and slot map (docs/elasticity.md).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ps/status.h"

namespace tessera {

namespace internal {
class EtcdToken;
}

/// Where etcd is and how long a call may take.
struct EtcdOptions {
  /// Host of etcd's client URL (a name or an IPv4 address). Default: 127.0.0.1.
  std::string host = "127.0.0.1";
  /// Port of etcd's client URL. Default: 2379.
  uint16_t port = 2379;
  /// Bound of each phase of a call (connect, send, receive), in milliseconds: a call that gets
  /// no answer fails with DeadlineExceeded (or Unavailable when nothing accepts the connection)
  /// after at most about twice this. Default: 5000.
  int timeout_ms = 5000;
  /// etcd user (etcd's auth, `etcdctl auth enable`); empty: no authentication. With a user
  /// the client gets a token from /v3/auth/authenticate and sends it with every call and watch,
  /// and gets a new one once when etcd says the token is invalid (expired). Default: empty.
  std::string user;
  /// The user's password; never logged nor put in a Status. Default: empty.
  std::string password;
};

/// One key as etcd stores it. Revisions are etcd's (cluster-wide, increasing with every write).
struct KeyValue {
  std::string key;
  std::string value;
  int64_t create_revision = 0;
  int64_t mod_revision = 0;
  /// Writes to the key since it was created (1 after the first put).
  int64_t version = 0;
  /// The lease the key is attached to; 0: none.
  int64_t lease = 0;
};

/// Keys read at one revision of the store.
struct RangeResult {
  std::vector<KeyValue> kvs;
  /// The store's revision when the read was served.
  int64_t revision = 0;
};

/// One comparison of a transaction: `target` of `key` must equal `value`. A key that does not
/// exist has version, create_revision and mod_revision 0.
struct TxnCompare {
  enum class Target { kVersion, kCreateRevision, kModRevision };
  std::string key;
  Target target = Target::kModRevision;
  int64_t value = 0;
};

/// One operation of a transaction branch: a put (with an optional lease) or a get of one key.
struct TxnOp {
  enum class Kind { kPut, kGet };
  Kind kind = Kind::kGet;
  std::string key;
  std::string value;
  int64_t lease = 0;
  static TxnOp Put(std::string key, std::string value, int64_t lease = 0) {
    return {Kind::kPut, std::move(key), std::move(value), lease};
  }
  static TxnOp Get(std::string key) { return {Kind::kGet, std::move(key), {}, 0}; }
};

/// If every comparison holds, `success` runs, else `failure`; atomically.
struct TxnRequest {
  std::vector<TxnCompare> compares;
  std::vector<TxnOp> success;
  std::vector<TxnOp> failure;
};

/// What a transaction did: which branch ran and, for each of its ops in order, the keys a get
/// found (empty for a put or a missing key).
struct TxnResult {
  bool succeeded = false;
  int64_t revision = 0;
  std::vector<std::vector<KeyValue>> results;
};

/// A granted lease.
struct Lease {
  int64_t id = 0;
  int64_t ttl_s = 0;
};

/// One change seen by a watch.
struct WatchEvent {
  enum class Type { kPut, kDelete };
  Type type = Type::kPut;
  /// For a delete only key and mod_revision are set.
  KeyValue kv;
};

/// What a watch delivers: the events of one revision range in order, or a notice that etcd
/// compacted the history the watch needed (`compacted_to` > 0: events before that revision are
/// lost; the watch goes on from it, and the reader should read the current state again).
struct WatchBatch {
  std::vector<WatchEvent> events;
  int64_t compacted_to = 0;
};

/// What to watch.
struct WatchOptions {
  /// The key, or the prefix when `prefix` is true.
  std::string key;
  bool prefix = false;
  /// First revision to deliver; 0: changes after the watch is created.
  int64_t start_revision = 0;
  /// Wait before reconnecting after the stream broke, in milliseconds (doubled on each failed
  /// attempt up to 8x). Default: 100.
  int reconnect_backoff_ms = 100;
  /// A stream that carried nothing for this long is reconnected (from the same revision), so a
  /// hung etcd is noticed; milliseconds. Default: 60000.
  int idle_reconnect_ms = 60000;
};

/// A running watch: its own thread and HTTP connection. The callback runs on that thread, one
/// batch at a time, in revision order; it must not destroy the watch. When the stream breaks
/// (etcd restarted, connection lost) the watch reconnects from the revision after the last one
/// it delivered, so no event is lost or repeated unless etcd compacted it. Destruction stops the
/// thread and waits for it (and for a running callback). Not copyable; Stop() is thread-safe.
class EtcdWatch {
 public:
  virtual ~EtcdWatch() = default;
  /// Stops the stream and joins the thread. Idempotent.
  virtual void Stop() = 0;
  /// The revision the watch will ask for when it (re)connects next.
  virtual int64_t next_revision() const = 0;
  /// Times etcd confirmed the stream ("created"), the first included.
  virtual int connects() const = 0;
  /// Why the last stream ended, when it ended with an error (OK otherwise); for diagnostics:
  /// the watch keeps reconnecting whatever the error.
  virtual Status last_error() const = 0;
};

using WatchCallback = std::function<void(const WatchBatch&)>;

/// A client of one etcd endpoint over its JSON gateway (`/v3/kv/*`, `/v3/lease/*`,
/// `/v3/watch`). Each unary call opens its own connection, so calls from several threads run
/// concurrently and a slow call does not delay another. Never throws; every error is a Status
/// whose message names etcd's endpoint, the API path and etcd's own error:
///   Unavailable: nothing answered at the endpoint (retryable);
///   DeadlineExceeded: connected but no answer within EtcdOptions::timeout_ms;
///   Corruption: the answer was not the JSON etcd sends;
///   other codes: etcd's gRPC error code (NotFound for an unknown lease, InvalidArgument, ...).
/// With EtcdOptions::user, a wrong user or password fails every call with InvalidArgument
/// "etcd authentication failed for user USER"; without one, an etcd with auth enabled fails
/// them with InvalidArgument saying that it requires a user.
/// Thread-safe.
class EtcdClient {
 public:
  /// Checks the options; does not connect (etcd may start later).
  static Result<std::unique_ptr<EtcdClient>> Create(const EtcdOptions& options);

  /// "HOST:PORT".
  const std::string& endpoint() const { return endpoint_; }

  /// Writes `key` = `value`, attached to `lease` when not 0. Returns the revision of the write.
  Result<int64_t> Put(std::string_view key, std::string_view value, int64_t lease = 0);
  /// The key, or nullopt when it does not exist.
  Result<std::optional<KeyValue>> Get(std::string_view key);
  /// Every key that starts with `prefix`, in key order.
  Result<RangeResult> GetPrefix(std::string_view prefix);
  /// Deletes `key`; returns how many keys were deleted (0 or 1).
  Result<int64_t> Delete(std::string_view key);
  /// Deletes every key that starts with `prefix`; returns how many.
  Result<int64_t> DeletePrefix(std::string_view prefix);
  /// Discards the history before `revision` (etcd's compaction): watches and reads of older
  /// revisions then fail. FailedPrecondition when it was compacted already.
  Status Compact(int64_t revision);
  /// Runs a transaction (compare-and-swap).
  Result<TxnResult> Txn(const TxnRequest& request);

  /// Grants a lease of `ttl_s` seconds (etcd may round it up to its minimum).
  Result<Lease> GrantLease(int64_t ttl_s);
  /// Renews a lease; returns its new TTL. NotFound when the lease has expired or was revoked.
  Result<int64_t> KeepAlive(int64_t lease_id);
  /// Revokes a lease, deleting its keys. NotFound when it no longer exists.
  Status RevokeLease(int64_t lease_id);

  /// Starts watching. The returned watch owns its thread; see EtcdWatch.
  Result<std::unique_ptr<EtcdWatch>> Watch(const WatchOptions& options, WatchCallback callback);

  /// The end of the key range of every key starting with `prefix` (etcd's range_end).
  static std::string PrefixEnd(std::string_view prefix);

  /// Tokens obtained from /v3/auth/authenticate so far, by calls and watches (0 without a
  /// user); for diagnostics and tests.
  int64_t authentications() const;

  ~EtcdClient();

 private:
  explicit EtcdClient(const EtcdOptions& options);
  EtcdOptions options_;
  std::string endpoint_;
  // Shared with the watches this client started, which may outlive it.
  std::shared_ptr<internal::EtcdToken> token_;
};

}  // namespace tessera
