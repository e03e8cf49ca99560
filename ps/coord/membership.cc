#include "ps/coord/membership.h"

#include <algorithm>
#include <chrono>
#include <thread>
#include <nlohmann/json.hpp>

#include "ps/coord/coordinator_url.h"

namespace tessera {

using nlohmann::json;

namespace {

std::string MembersPrefix(std::string_view prefix) { return std::string(prefix) + "/members/"; }

Result<Member> ParseMember(const KeyValue& kv, std::string_view prefix) {
  json j = json::parse(kv.value, nullptr, /*allow_exceptions=*/false);
  auto field = [&](const char* name) {
    return j.is_object() && j.contains(name) && j[name].is_string() ? j[name].get<std::string>()
                                                                    : std::string();
  };
  Member m;
  m.id = field("id");
  m.address = field("address");
  m.lease = kv.lease;
  m.leaving = j.is_object() && j.contains("leaving") && j["leaving"].is_boolean() &&
              j["leaving"].get<bool>();
  if (m.id.empty() || m.address.empty() || kv.key != MemberKey(prefix, m.id)) {
    return Status::Corruption("member record " + kv.key +
                              " is not {\"id\": <its key's id>, \"address\": ...}");
  }
  return m;
}

// The record a member key holds (ParseMember reads it back).
std::string MemberValue(const MembershipOptions& o, bool leaving) {
  json j{{"id", o.member_id}, {"address", o.address}};
  if (leaving) j["leaving"] = true;
  return j.dump();
}

Status CheckOptions(const MembershipOptions& o) {
  if (o.prefix.empty() || o.prefix.front() != '/') {
    return Status::InvalidArgument("membership: prefix must start with '/', got \"" + o.prefix +
                                   "\"");
  }
  TESSERA_RETURN_IF_ERROR(ValidateKeySegment(o.member_id, "member id"));
  if (o.address.empty()) return Status::InvalidArgument("membership: empty address");
  if (o.ttl_s <= 0 || o.keepalive_interval_ms < 0) {
    return Status::InvalidArgument("membership: ttl_s must be > 0 and the interval >= 0");
  }
  return Status::OK();
}

}  // namespace

std::string ControllerKey(std::string_view prefix) {
  return std::string(prefix) + "/controller";
}

Result<std::unique_ptr<Membership>> LockController(
    EtcdClient* etcd, const std::string& prefix, const std::string& holder, int64_t ttl_s,
    bool wait, std::chrono::steady_clock::time_point deadline) {
  MembershipOptions m;
  m.prefix = prefix;
  m.member_id = holder;
  m.address = "controller";
  m.ttl_s = ttl_s;
  m.key = ControllerKey(prefix);
  for (;;) {
    auto held = Membership::Register(etcd, m);
    if (held.ok() || held.status().code() != StatusCode::kAlreadyExists) return held;
    if (!wait || std::chrono::steady_clock::now() >= deadline) {
      return Status::FailedPrecondition(held.status().message() +
                                        ": another controller is changing the map; run again "
                                        "when it is done");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

std::string MemberKey(std::string_view prefix, std::string_view id) {
  return MembersPrefix(prefix) + std::string(id);
}

Result<std::vector<Member>> ListMembers(EtcdClient& etcd, std::string_view prefix) {
  TESSERA_ASSIGN_OR_RETURN(RangeResult range, etcd.GetPrefix(MembersPrefix(prefix)));
  std::vector<Member> out;
  for (const KeyValue& kv : range.kvs) {
    TESSERA_ASSIGN_OR_RETURN(Member m, ParseMember(kv, prefix));
    out.push_back(std::move(m));
  }
  return out;  // etcd returns a range in key order, which is id order under one prefix
}

namespace {

// The renewal period of a lease of `ttl_s` (MembershipOptions::keepalive_interval_ms).
int64_t RenewalPeriodMs(const MembershipOptions& o, int64_t ttl_s) {
  return o.keepalive_interval_ms > 0 ? o.keepalive_interval_ms
                                     : std::max<int64_t>(100, ttl_s * 1000 / 3);
}

// Grants a lease and creates the key of `options` under it (Register's contract).
Result<Lease> Claim(EtcdClient* etcd, const MembershipOptions& options, bool leaving) {
  TESSERA_ASSIGN_OR_RETURN(Lease lease, etcd->GrantLease(options.ttl_s));
  const std::string key =
      options.key.empty() ? MemberKey(options.prefix, options.member_id) : options.key;
  const std::string value = MemberValue(options, leaving);
  // Create only: a second live process with the same id must not take over the first's key.
  TxnRequest txn;
  txn.compares.push_back({key, TxnCompare::Target::kVersion, 0});
  txn.success.push_back(TxnOp::Put(key, value, lease.id));
  txn.failure.push_back(TxnOp::Get(key));
  Result<TxnResult> r = etcd->Txn(txn);
  if (!r.ok() || !r->succeeded) {
    etcd->RevokeLease(lease.id).IgnoreError();  // best effort: it expires anyway
    if (!r.ok()) return r.status().WithContext("registering " + key);
    if (!options.key.empty()) {
      // A lock: say who holds it (the record the failure branch read).
      std::string holder = "another process";
      if (!r->results.empty() && !r->results[0].empty()) {
        const json record =
            json::parse(r->results[0][0].value, nullptr, /*allow_exceptions=*/false);
        if (record.is_object() && record.contains("id") && record["id"].is_string()) {
          holder = record["id"].get<std::string>();
        }
      }
      return Status::AlreadyExists(key + " is held by " + holder + " (under another lease)");
    }
    return Status::AlreadyExists("member " + options.member_id + " is already registered (" + key +
                                 " exists under another lease)");
  }
  return lease;
}

}  // namespace

Result<std::unique_ptr<Membership>> Membership::Register(EtcdClient* etcd,
                                                         const MembershipOptions& options) {
  TESSERA_RETURN_IF_ERROR(CheckOptions(options));
  if (options.register_again && !options.key.empty()) {
    return Status::InvalidArgument("membership: a lock (" + options.key +
                                   ") is not registered again");
  }
  TESSERA_ASSIGN_OR_RETURN(Lease lease, Claim(etcd, options, /*leaving=*/false));
  return std::unique_ptr<Membership>(new Membership(etcd, options, lease));
}

Membership::Membership(EtcdClient* etcd, MembershipOptions options, Lease lease)
    : etcd_(etcd), options_(std::move(options)), lease_(lease) {
  thread_ = std::thread([this] { KeepAliveLoop(); });
}

int64_t Membership::lease_id() const {
  std::lock_guard<std::mutex> lock(mu_);
  return lease_.id;
}

int64_t Membership::ttl_s() const {
  std::lock_guard<std::mutex> lock(mu_);
  return lease_.ttl_s;
}

Membership::~Membership() { Deregister().IgnoreError(); }

Status Membership::MarkLeaving() {
  if (!options_.key.empty()) {
    return Status::FailedPrecondition("membership: a lock (" + options_.key + ") cannot leave");
  }
  int64_t lease = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    leaving_ = true;  // a registration made again is leaving too
    lease = lease_.id;
  }
  return etcd_->Put(MemberKey(options_.prefix, options_.member_id),
                    MemberValue(options_, /*leaving=*/true), lease)
      .status()
      .WithContext("marking " + options_.member_id + " as leaving");
}

bool Membership::RegisterAgain(const Status& lost, std::unique_lock<std::mutex>& lock) {
  const int64_t interval_ms = RenewalPeriodMs(options_, options_.ttl_s);
  while (!stopping_) {
    const bool leaving = leaving_;
    lock.unlock();
    Result<Lease> lease = Claim(etcd_, options_, leaving);
    lock.lock();
    if (lease.ok()) {
      if (stopping_) {
        // Deregister began meanwhile and will revoke the old lease: this one goes now.
        lock.unlock();
        etcd_->RevokeLease(lease->id).IgnoreError();
        lock.lock();
        return false;
      }
      lease_ = *lease;
      ++registered_again_;
      lock.unlock();
      if (options_.on_registered_again) options_.on_registered_again(lost);
      lock.lock();
      return true;
    }
    if (lease.status().code() == StatusCode::kAlreadyExists) {
      // Another live process registered the id while ours was lost: it is that member now.
      status_ = lost.WithContext(lease.status().ToString());
      return false;
    }
    // etcd unreachable or slow: tried again next period.
    cv_.wait_for(lock, std::chrono::milliseconds(interval_ms), [this] { return stopping_; });
  }
  return false;
}

void Membership::KeepAliveLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  const int64_t interval_ms = RenewalPeriodMs(options_, lease_.ttl_s);
  while (!stopping_) {
    cv_.wait_for(lock, std::chrono::milliseconds(interval_ms), [this] { return stopping_; });
    if (stopping_) break;
    const int64_t lease = lease_.id;
    lock.unlock();
    Result<int64_t> ttl = etcd_->KeepAlive(lease);
    lock.lock();
    if (ttl.ok()) {
      ++renewals_;
    } else if (ttl.status().code() == StatusCode::kNotFound) {
      // The lease is gone and with it the key: another server may already own our slots.
      status_ = ttl.status().WithContext("member " + options_.member_id + " lost its lease");
      if (options_.register_again && RegisterAgain(status_, lock)) continue;
      if (stopping_) {
        lease_.id = 0;  // nothing left for Deregister to revoke
        break;
      }
      lost_ = true;
      const Status lost = status_;
      lock.unlock();
      if (options_.on_lost) options_.on_lost(lost);
      return;
    }
    // Other errors (etcd restarting, a slow answer) are retried at the next tick: the lease
    // lives on in etcd until its TTL runs out.
  }
}

Status Membership::status() const {
  std::lock_guard<std::mutex> lock(mu_);
  return status_;
}

Status Membership::Deregister() {
  std::lock_guard<std::mutex> once(deregister_mu_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (deregistered_) return deregister_status_;
    deregistered_ = true;
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  Status s;
  const int64_t lease = lease_id();
  if (!lost_ && lease != 0) s = etcd_->RevokeLease(lease);
  std::lock_guard<std::mutex> lock(mu_);
  deregister_status_ = s;
  return s;
}

}  // namespace tessera
