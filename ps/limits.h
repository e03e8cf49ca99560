// Bounds on the consistency and naming fields of a request envelope, shared by the server
// (which refuses a request outside them) and the client (which refuses such options early).
#pragma once

#include <cstdint>

#include "ps/codec.h"
#include "ps/status.h"

namespace tessera {

/// Most workers a job may declare (`num_workers`); worker ids that send clocks are below it.
inline constexpr uint32_t kMaxWorkers = 65536;
/// Largest clock (steps) a request may carry: far beyond any job, small enough that
/// `clock - staleness` and `cut + 1` cannot overflow.
inline constexpr int64_t kMaxClock = int64_t{1} << 48;
/// Largest staleness bound; -1 means asynchronous.
inline constexpr int32_t kMaxStaleness = int32_t{1} << 30;
/// Longest `name` a request may carry (tables, metadata records, admin directories), bytes.
inline constexpr size_t kMaxRequestNameBytes = 1024;
/// Longest barrier name, bytes.
inline constexpr size_t kMaxBarrierNameBytes = 256;
/// Most workers a server holds waiting at barriers (all names together).
inline constexpr size_t kMaxBarrierWaiters = 65536;

/// Checks the fields every server op trusts: `num_workers` <= kMaxWorkers and, when it is
/// set, `worker_id` below it (Checkpoint excepted: there it is the cut's worker count);
/// a Clock's `worker_id` below kMaxWorkers; `clock` in [0, kMaxClock] (a Checkpoint's cut may
/// be -1: before any step); `staleness` in [-1, kMaxStaleness]; `name` at most
/// kMaxRequestNameBytes (Barrier: 1..kMaxBarrierNameBytes). InvalidArgument naming the field
/// and its bounds otherwise.
Status ValidateRequestLimits(const Header& h);

}  // namespace tessera
