// The cluster map in etcd: one record PREFIX/slotmap, changed only by compare-and-swap.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "ps/coord/cluster_map.h"
#include "ps/coord/etcd_client.h"
#include "ps/status.h"

namespace tessera {

/// A running watch of the cluster map; destruction stops it and waits for a running callback
/// (see SlotMapStore::Watch). delivered_version() is thread-safe.
class ClusterMapWatch {
 public:
  virtual ~ClusterMapWatch() = default;
  /// The highest version delivered so far (0: none).
  virtual uint64_t delivered_version() const = 0;
};

/// Called with each new version of the map, or with the error of a record that does not
/// decode (Corruption) or of a reload that failed.
using ClusterMapCallback = std::function<void(const Result<ClusterMap>&)>;

/// Reads and changes the cluster map record `PREFIX/slotmap`. Every change is a transaction
/// that compares the record's mod_revision with the one read, so of two writers that read the
/// same version exactly one succeeds. Borrows `etcd`, which must outlive the store and its
/// watches (a watch does not need the store). Thread-safe: it holds nothing but the key.
class SlotMapStore {
 public:
  SlotMapStore(EtcdClient* etcd, std::string prefix);

  /// The record's key: PREFIX/slotmap.
  const std::string& key() const { return key_; }

  /// The current map. NotFound when no map was created yet; Corruption when the record does
  /// not decode.
  Result<ClusterMap> Load();
  /// Stores `initial` (which must validate and have version 1) if there is no map yet;
  /// AlreadyExists (with the stored version) otherwise.
  Status Create(const ClusterMap& initial);
  /// Replaces the map at `expected_version` with `next`, whose version must be
  /// expected_version + 1 (InvalidArgument otherwise, or when it does not validate).
  /// FailedPrecondition when the stored map is at another version, or changed between the
  /// read and the write (another writer won); NotFound when there is no map.
  Status CompareAndSwap(uint64_t expected_version, const ClusterMap& next);
  /// Delivers the current map, then every later version, in order and each once, on the
  /// watch's thread (EtcdWatch's rules: the callback must not destroy the watch). Across an
  /// etcd restart the watch resumes where it was; if etcd compacted the revisions it missed it
  /// reads the map again and delivers it when newer. NotFound when there is no map yet.
  Result<std::unique_ptr<ClusterMapWatch>> Watch(ClusterMapCallback callback,
                                                 const WatchOptions& tuning = {});

 private:
  // The map and the mod_revision of its record.
  Result<std::pair<ClusterMap, int64_t>> LoadWithRevision();

  EtcdClient* const etcd_;
  const std::string key_;
};

}  // namespace tessera
