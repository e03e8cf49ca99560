#include "ps/coord/slot_map_store.h"

#include <atomic>
#include <optional>
#include <utility>

namespace tessera {

namespace {

class MapWatch final : public ClusterMapWatch {
 public:
  MapWatch(const SlotMapStore& store, ClusterMapCallback callback)
      : store_(store), callback_(std::move(callback)) {}
  ~MapWatch() override {
    // Stop the stream first: its thread calls OnBatch, which uses the members below.
    if (watch_ != nullptr) watch_->Stop();
  }
  uint64_t delivered_version() const override { return delivered_.load(); }
  void set_watch(std::unique_ptr<EtcdWatch> w) { watch_ = std::move(w); }

  void OnBatch(const WatchBatch& batch) {
    if (batch.compacted_to > 0) {
      // Versions were missed for good; the current record is what matters.
      Deliver(store_.Load());
      return;
    }
    for (const WatchEvent& e : batch.events) {
      if (e.type == WatchEvent::Type::kDelete) continue;  // nothing to route by; keep the last
      Deliver(DecodeClusterMap(e.kv.value));
    }
  }

  void Deliver(const Result<ClusterMap>& map) {
    if (map.ok() && map->version <= delivered_) return;  // seen (a reload after compaction)
    if (map.ok()) delivered_ = map->version;
    callback_(map);
  }

 private:
  SlotMapStore store_;  // a copy (a pointer and the key): the watch may outlive the caller's
  const ClusterMapCallback callback_;
  std::atomic<uint64_t> delivered_{0};
  std::unique_ptr<EtcdWatch> watch_;
};

}  // namespace

SlotMapStore::SlotMapStore(EtcdClient* etcd, std::string prefix)
    : etcd_(etcd), key_(std::move(prefix) + "/slotmap") {}

Result<std::pair<ClusterMap, int64_t>> SlotMapStore::LoadWithRevision() {
  TESSERA_ASSIGN_OR_RETURN(std::optional<KeyValue> kv, etcd_->Get(key_));
  if (!kv.has_value()) return Status::NotFound("no cluster map at " + key_);
  Result<ClusterMap> map = DecodeClusterMap(kv->value);
  if (!map.ok()) return map.status().WithContext(key_);
  return std::make_pair(std::move(map).value(), kv->mod_revision);
}

Result<ClusterMap> SlotMapStore::Load() {
  TESSERA_ASSIGN_OR_RETURN(auto loaded, LoadWithRevision());
  return std::move(loaded.first);
}

Status SlotMapStore::Create(const ClusterMap& initial) {
  if (initial.version != 1) {
    return Status::InvalidArgument("the first cluster map has version 1, not " +
                                   std::to_string(initial.version));
  }
  TESSERA_ASSIGN_OR_RETURN(std::string record, EncodeClusterMap(initial));
  TxnRequest txn;
  txn.compares.push_back({key_, TxnCompare::Target::kVersion, 0});  // absent
  txn.success.push_back(TxnOp::Put(key_, record));
  txn.failure.push_back(TxnOp::Get(key_));
  TESSERA_ASSIGN_OR_RETURN(TxnResult r, etcd_->Txn(txn));
  if (r.succeeded) return Status::OK();
  std::string stored = "?";
  if (r.results.size() == 1 && r.results[0].size() == 1) {
    Result<ClusterMap> m = DecodeClusterMap(r.results[0][0].value);
    stored = m.ok() ? std::to_string(m->version) : "undecodable";
  }
  return Status::AlreadyExists("a cluster map already exists at " + key_ + " (version " + stored +
                               ")");
}

Status SlotMapStore::CompareAndSwap(uint64_t expected_version, const ClusterMap& next) {
  if (next.version != expected_version + 1) {
    return Status::InvalidArgument("cluster map CAS from version " +
                                   std::to_string(expected_version) + " must store version " +
                                   std::to_string(expected_version + 1) + ", not " +
                                   std::to_string(next.version));
  }
  TESSERA_ASSIGN_OR_RETURN(std::string record, EncodeClusterMap(next));
  TESSERA_ASSIGN_OR_RETURN(auto current, LoadWithRevision());
  if (current.first.version != expected_version) {
    return Status::FailedPrecondition("cluster map at " + key_ + " is at version " +
                                      std::to_string(current.first.version) + ", not " +
                                      std::to_string(expected_version));
  }
  // The version lives inside the value, so the atomic check is on the record's mod_revision:
  // any write after our read, whatever version it stored, changes it.
  TxnRequest txn;
  txn.compares.push_back({key_, TxnCompare::Target::kModRevision, current.second});
  txn.success.push_back(TxnOp::Put(key_, record));
  TESSERA_ASSIGN_OR_RETURN(TxnResult r, etcd_->Txn(txn));
  if (!r.succeeded) {
    return Status::FailedPrecondition("cluster map at " + key_ + " changed after version " +
                                      std::to_string(expected_version) +
                                      " was read (another writer won the compare-and-swap)");
  }
  return Status::OK();
}

Result<std::unique_ptr<ClusterMapWatch>> SlotMapStore::Watch(ClusterMapCallback callback,
                                                             const WatchOptions& tuning) {
  if (!callback) return Status::InvalidArgument("cluster map watch: no callback");
  TESSERA_ASSIGN_OR_RETURN(auto current, LoadWithRevision());
  auto watch = std::make_unique<MapWatch>(*this, std::move(callback));
  MapWatch* raw = watch.get();
  // The map read first, on this thread, then the stream from the revision after it: no change
  // falls between the two, and none is delivered before the map it follows.
  raw->Deliver(std::move(current.first));
  WatchOptions options = tuning;
  options.key = key_;
  options.prefix = false;
  options.start_revision = current.second + 1;
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<EtcdWatch> stream,
                           etcd_->Watch(options, [raw](const WatchBatch& b) { raw->OnBatch(b); }));
  raw->set_watch(std::move(stream));
  return std::unique_ptr<ClusterMapWatch>(std::move(watch));
}

}  // namespace tessera
