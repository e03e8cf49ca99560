// A backup's second look at the cluster map (docs/elasticity.md, "Replication and
// fail-over"): a forwarded push that names a map version ahead of this server's is held only
// until the map was read again from its store (etcd), off the I/O thread; a version still
// ahead of the store's newest is refused (no primary forwards under a map that is not stored).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <optional>
#include <thread>

#include "ps/cluster_map_source.h"
#include "ps/mutex.h"
#include "ps/status.h"

namespace tessera::internal {

/// Reads the cluster map from its store on request, on a thread of its own, and hands each map
/// read to `apply` (the server then serves by it, if it is newer). Requests that come while a
/// read runs share the next read. Thread-safe; the destructor joins the thread (a read in
/// progress finishes first).
class MapRecheck {
 public:
  /// Reads the store's newest map (NotFound: none stored); any thread of MapRecheck's.
  using Load = std::function<Result<RoutingMap>()>;
  using Apply = std::function<void(const RoutingMap&)>;

  explicit MapRecheck(Apply apply) : apply_(std::move(apply)) {}
  ~MapRecheck();
  MapRecheck(const MapRecheck&) = delete;
  MapRecheck& operator=(const MapRecheck&) = delete;

  /// Sets the store reader and starts the thread; once only (FailedPrecondition after).
  Status SetLoader(Load load) ABSL_LOCKS_EXCLUDED(mu_);
  /// True once a loader is set: NewestSince() will answer.
  bool enabled() const ABSL_LOCKS_EXCLUDED(mu_);
  /// Asks for a read that starts after this call; returns its ticket (0 without a loader).
  uint64_t Request() ABSL_LOCKS_EXCLUDED(mu_);
  /// The version of the store's newest map as a read that started after `ticket` was issued
  /// found it (0: no map stored); nullopt until such a read succeeded.
  std::optional<uint64_t> NewestSince(uint64_t ticket) const ABSL_LOCKS_EXCLUDED(mu_);
  /// Reads that failed (the store did not answer); those requests wait for the next one.
  uint64_t failed_reads() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Run() ABSL_LOCKS_EXCLUDED(mu_);

  const Apply apply_;
  mutable Mutex mu_;
  std::condition_variable cv_;
  Load load_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t requested_ ABSL_GUARDED_BY(mu_) = 0;  // the last ticket issued
  uint64_t started_ ABSL_GUARDED_BY(mu_) = 0;    // the last ticket a read started for
  uint64_t done_ ABSL_GUARDED_BY(mu_) = 0;       // the last ticket a read succeeded for
  uint64_t newest_ ABSL_GUARDED_BY(mu_) = 0;     // the version that read found
  uint64_t failed_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

}  // namespace tessera::internal
