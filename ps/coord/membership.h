// Server membership in etcd: each live server holds PREFIX/members/<id> under a lease.
#pragma once

#include <atomic>
#include <condition_variable>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ps/coord/etcd_client.h"
#include "ps/status.h"

namespace tessera {

/// One registered server, as read from etcd.
struct Member {
  std::string id;
  /// Its data endpoint, e.g. "tcp://10.0.0.5:7000".
  std::string address;
  /// The lease that keeps it registered.
  int64_t lease = 0;
  /// It is leaving (Membership::MarkLeaving: draining before it stops): alive, but not one
  /// to give slots or backups to, nor to take back.
  bool leaving = false;
};

/// Options of a server's registration.
struct MembershipOptions {
  /// The cluster's key prefix (CoordinatorUrl::prefix), e.g. "/tessera/job1". Required.
  std::string prefix;
  /// The server's id: one key segment ([A-Za-z0-9._-], see ValidateKeySegment). Required.
  std::string member_id;
  /// The server's data endpoint, stored in the member record. Required.
  std::string address;
  /// Lease TTL in seconds: a server that stops renewing disappears this long after its last
  /// renewal (plus etcd's expiry check, up to 0.5 s). Default: 10.
  int64_t ttl_s = 10;
  /// Renewal period in milliseconds; 0: a third of the TTL, so two renewals in a row may fail
  /// (etcd briefly away) without losing the registration. Default: 0.
  int keepalive_interval_ms = 0;
  /// Called once, on the renewal thread, when the registration is lost for good (with
  /// status()); must not destroy the Membership. Default: none.
  std::function<void(const Status&)> on_lost;
  /// When a renewal finds the lease gone, register again (a new lease, the same key, created
  /// only while no other process holds it), tried every renewal period until it is made or
  /// the Membership is destroyed; lost for good (on_lost) only when another live process has
  /// registered the id meanwhile. False: a lost lease is lost for good. For a member key only
  /// (a lock, `key`, is never taken again behind its holder's back). Default: false.
  bool register_again = false;
  /// With `register_again`: called on the renewal thread after each registration made again,
  /// with why the one before was lost; must not destroy the Membership. Default: none.
  std::function<void(const Status&)> on_registered_again;
  /// The key to hold instead of PREFIX/members/<member_id>: a lock held by this member while
  /// it lives (ControllerKey). Default: empty (the member key).
  std::string key;
};

/// The key of the cluster's controller lock: PREFIX/controller. Whoever changes the map by more
/// than one compare-and-swap (tessera-ctl scale, a backup rebuild) holds it under a lease for
/// the whole run, so two never interleave; a holder that dies frees it within its TTL.
std::string ControllerKey(std::string_view prefix);

class Membership;

/// Takes the controller lock of `prefix` (ControllerKey) for `holder` (a key segment) under a
/// lease of `ttl_s`, kept alive until the returned handle is destroyed. While another process
/// holds it: waits (`wait`) until `deadline`, then, or at once, FailedPrecondition naming the
/// holder. Map changes of more than one step (scale, map rebuild) and the cluster-wide
/// snapshots of tessera-ctl (checkpoint, restore, export) hold it, so neither runs across
/// the other.
Result<std::unique_ptr<Membership>> LockController(
    EtcdClient* etcd, const std::string& prefix, const std::string& holder, int64_t ttl_s,
    bool wait, std::chrono::steady_clock::time_point deadline);

/// The key of member `id` under `prefix`: PREFIX/members/ID.
std::string MemberKey(std::string_view prefix, std::string_view id);

/// The live members under `prefix` (keys PREFIX/members/*), in id order. A record that is not
/// a member record is Corruption naming its key.
Result<std::vector<Member>> ListMembers(EtcdClient& etcd, std::string_view prefix);

/// A server's registration. Register() grants a lease and creates the member key under it
/// (AlreadyExists when another live process holds the id); a background thread renews the
/// lease every keepalive interval. If a renewal finds the lease gone (the process was stopped
/// or cut off past the TTL), it registers again with `register_again`; without it (or when
/// another process took the id meanwhile) the registration is lost for good: lost() turns true
/// and status() says why; the owner must stop serving as that member. Destruction
/// deregisters (revokes the lease, so the key goes at once) and joins the thread.
/// Thread-safe. Borrows `etcd`, which must outlive it.
class Membership {
 public:
  static Result<std::unique_ptr<Membership>> Register(EtcdClient* etcd,
                                                      const MembershipOptions& options);
  ~Membership();
  Membership(const Membership&) = delete;
  Membership& operator=(const Membership&) = delete;

  /// Stops renewing and revokes the lease. Idempotent; the first call's result is returned.
  Status Deregister();
  /// Marks the member record as leaving (Member::leaving), under the same lease: it stays
  /// registered until Deregister. For a member key only (FailedPrecondition for a lock).
  Status MarkLeaving();
  /// The member key's lease (the latest one, after a registration made again).
  int64_t lease_id() const;
  /// The lease TTL etcd granted, in seconds.
  int64_t ttl_s() const;
  /// True once the registration is lost for good.
  bool lost() const { return lost_.load(); }
  /// OK, or why the registration was lost (for good, or the last time before it was made
  /// again).
  Status status() const;
  /// Renewals that etcd answered.
  int64_t renewals() const { return renewals_.load(); }
  /// Registrations made again after a lost lease (`register_again`).
  int64_t registered_again() const { return registered_again_.load(); }

 private:
  Membership(EtcdClient* etcd, MembershipOptions options, Lease lease);
  void KeepAliveLoop();
  // After the lease `lost` was found gone (mu_ held by `lock`): registers again until it is
  // made, the Membership stops, or another process holds the key. True when registered.
  bool RegisterAgain(const Status& lost, std::unique_lock<std::mutex>& lock);

  EtcdClient* const etcd_;
  const MembershipOptions options_;
  std::atomic<bool> lost_{false};
  std::atomic<int64_t> renewals_{0};
  std::atomic<int64_t> registered_again_{0};
  std::mutex deregister_mu_;  // held through a whole Deregister(): later callers wait for it
  mutable std::mutex mu_;
  std::condition_variable cv_;
  Lease lease_;                // guarded by mu_ (changed by the renewal thread only)
  bool leaving_ = false;       // guarded by mu_
  bool stopping_ = false;      // guarded by mu_
  bool deregistered_ = false;  // guarded by mu_
  Status status_;              // guarded by mu_
  Status deregister_status_;   // guarded by mu_
  std::thread thread_;
};

}  // namespace tessera
