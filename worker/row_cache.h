// A worker-side cache of hot sparse rows with bounded staleness, in front of another ParamStore.
#pragma once

#include <cstdint>
#include <memory>

#include "ps/status.h"
#include "worker/param_store.h"

namespace tessera::worker {

/// Most clocks a cached value may age, and a gradient be deferred (--cache_staleness).
inline constexpr int32_t kMaxCacheStaleness = 64;
/// Most rows a cache holds per sparse table (--cache_rows).
inline constexpr uint64_t kMaxCacheRows = uint64_t{1} << 26;

/// Options of a caching store (CreateCachingStore).
struct RowCacheOptions {
  /// Rows held per sparse table: those of its most frequently pulled keys; 1..kMaxCacheRows
  /// (--cache_rows). Default: 65536.
  uint64_t rows = 65536;
  /// S, in clocks (Clock() calls of the caching store): a value a pull serves from the cache
  /// was fetched from the inner store by a pull issued at most S clocks earlier, and a gradient
  /// pushed at clock t reaches the inner store before its clock t + S (pushed in that Clock()
  /// call at the latest); 1..kMaxCacheStaleness (--cache_staleness). Default: 2.
  int32_t staleness = 2;
  /// The job's consistency (ConsistencyOptions::staleness): -1 asynchronous, > 0 bounded.
  /// 0 (bulk-synchronous) is refused: it promises that every pull sees every earlier push.
  /// Default: -1.
  int32_t consistency_staleness = -1;
  /// A key is admitted once it has been pulled this many times in the counting window (the
  /// counts are halved whenever the count table is full); >= 1. Default: 2.
  uint32_t admit_count = 2;
  /// Keys not held whose pulls are counted, per table, at most: over it, every count (held
  /// keys' too) is halved and keys at zero are dropped; 0: 8 * rows + 65536. Default: 0.
  uint64_t counted_keys = 0;
};

/// What a caching store did so far (sums over its sparse tables).
struct RowCacheStats {
  uint64_t hits = 0;           ///< Keys of pulls served from the cache.
  uint64_t misses = 0;         ///< Keys of pulls sent to the inner store.
  uint64_t rows = 0;           ///< Rows held now.
  uint64_t deferred_rows = 0;  ///< Rows holding gradients not yet pushed, now.
  uint64_t passed_keys = 0;    ///< Keys of pushes passed on at once (rows not held).
  uint64_t flushes = 0;        ///< Inner pushes that carried deferred gradients.
  uint64_t flushed_rows = 0;   ///< Rows' gradient sums those pushes carried.
  uint64_t evictions = 0;      ///< Rows given up for more frequent keys.
  uint64_t flush_waits = 0;    ///< Refetches that waited for the row's flush to be acknowledged.
  /// Keys of pulls served by a fetch of their row that an earlier pull had in flight (no inner
  /// key of their own; counted in `hits` too).
  uint64_t joined = 0;
  uint64_t counted_keys = 0;   ///< Keys not held that are counted now (at most counted_keys).
  /// hits / (hits + misses); 0 before any pull.
  double hit_rate() const {
    return hits + misses > 0 ? static_cast<double>(hits) / static_cast<double>(hits + misses) : 0;
  }
};

/// A ParamStore that keeps the rows of frequently pulled keys of sparse tables on the worker
/// and accumulates their gradients locally (dense tables, meta and clocks pass through).
///
/// Staleness is counted in this store's Clock() calls (ticks). A pull serves a held row from
/// the cache while its value is at most S ticks old (fetched by an inner pull issued at most S
/// ticks earlier); other keys go to the inner store, in one inner Pull per call, and `out` is
/// filled in key order either way. A push adds a held row's gradient to the row's local sum;
/// the Clock() call S ticks after the sum's first gradient pushes it (one inner Push per
/// table, before the inner Clock), or, a little early, the last push of its table before that
/// Clock() that passes keys on anyway (the sum rides on it, and that push's result covers it).
/// Evicting a row pushes its sum at once. A row is refetched
/// only once the inner push of its last flushed sum is acknowledged (the pull waits for it),
/// so a refreshed value includes every gradient this store has handed on; its age counts from
/// the refetch's issue. A pull that finds a held row's fetch still in flight (an earlier pull's,
/// issued at most S ticks before this one) does not fetch it again: it waits for that fetch and
/// serves its value (or, should the row be evicted or the fetch fail meanwhile, fetches it on
/// its own), so pulls issued ahead (prefetch) send each hot row once.
/// Deferred gradients are not acknowledged pushes: Push's result covers only the keys passed
/// on, and a worker that dies loses up to S ticks of its held rows' gradients. A deferred
/// gradient is applied with the learning-rate factor in force when it is flushed.
///
/// Thread-safe. `inner` is borrowed and must outlive the store; every Pending a call returns
/// must be waited before the store is destroyed (a pull's until then writes `out`).
class CachingStore : public ParamStore {
 public:
  /// Pushes every deferred gradient and waits until each push of deferred gradients so far is
  /// acknowledged; returns the first error among them. Held values stay (their age bound is
  /// unchanged).
  virtual Status Flush() = 0;
  virtual RowCacheStats stats() const = 0;
};

/// InvalidArgument, saying which, for options out of bounds and for bulk-synchronous
/// consistency; OK otherwise.
Status ValidateRowCacheOptions(const RowCacheOptions& options);

/// A caching store over `inner`. Fails as ValidateRowCacheOptions does.
Result<std::unique_ptr<CachingStore>> CreateCachingStore(ParamStore* inner,
                                                         const RowCacheOptions& options);

}  // namespace tessera::worker
