// Where a key or a dense chunk lives: slots, the slot map, lanes, dense chunking.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ps/status.h"

namespace tessera {

/// Number of hash slots of the key space. Fixed for the life of a cluster's data: moving slots
/// between servers is how the number of servers changes.
inline constexpr uint32_t kNumSlots = 16384;

/// Floats per dense chunk (64 KiB). Dense tensors are cut into chunks; each chunk lives on one
/// server and one lane.
inline constexpr uint64_t kDenseChunkFloats = 16384;

/// MurmurHash3's 64-bit finalizer (fmix64): a fixed, documented bijection on 64-bit keys.
constexpr uint64_t Mix64(uint64_t k) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdULL;
  k ^= k >> 33;
  k *= 0xc4ceb9fe1a85ec53ULL;
  k ^= k >> 33;
  return k;
}

/// The inverse of Mix64: Mix64(Unmix64(x)) == x. Gives the key whose hash has chosen bits (a
/// key of a given slot, for tests, benchmarks and fuzzers).
constexpr uint64_t Unmix64(uint64_t x) {
  // The inverse of an odd multiplier mod 2^64, by Newton's iteration: a is its own inverse
  // to 3 bits, and each step doubles the correct bits (5 steps reach 96; 6 for margin).
  auto inverse = [](uint64_t a) {
    uint64_t inv = a;
    for (int i = 0; i < 6; ++i) inv *= 2 - a * inv;
    return inv;
  };
  x ^= x >> 33;
  x *= inverse(0xc4ceb9fe1a85ec53ULL);
  x ^= x >> 33;
  x *= inverse(0xff51afd7ed558ccdULL);
  x ^= x >> 33;
  return x;
}

/// The slot of a sparse key: the top 14 bits of Mix64(key).
constexpr uint32_t SlotOfKey(uint64_t key) {
  return static_cast<uint32_t>(Mix64(key) >> 50);  // 64 - log2(kNumSlots)
}
static_assert(kNumSlots == (1u << 14));

/// Lane of a slot on a server with `lanes` lanes.
constexpr uint32_t LaneOfSlot(uint32_t slot, uint32_t lanes) { return slot % lanes; }

/// One flag per slot, set for each of `slots` (numbers at or past kNumSlots are skipped): the
/// filter of a scan over some slots, tested as mask[SlotOfKey(key)].
inline std::vector<bool> SlotMask(std::span<const uint32_t> slots) {
  std::vector<bool> mask(kNumSlots, false);
  for (uint32_t s : slots) {
    if (s < kNumSlots) mask[s] = true;
  }
  return mask;
}

/// Assigns every slot to a server. Immutable once built; thread-safe to read.
class SlotMap {
 public:
  /// The default map for `num_servers` servers: contiguous, balanced slot ranges
  /// (server s owns slots [s*kNumSlots/n, (s+1)*kNumSlots/n)).
  static SlotMap Uniform(uint32_t num_servers);
  /// A map from an explicit owner per slot; fails unless owners.size() == kNumSlots and every
  /// owner is < num_servers.
  static Result<SlotMap> FromOwners(std::vector<uint16_t> owners, uint32_t num_servers);

  uint32_t num_servers() const { return num_servers_; }
  uint32_t ServerOfSlot(uint32_t slot) const { return owners_[slot]; }
  uint32_t ServerOfKey(uint64_t key) const { return owners_[SlotOfKey(key)]; }
  const std::vector<uint16_t>& owners() const { return owners_; }

 private:
  std::vector<uint16_t> owners_;
  uint32_t num_servers_ = 0;
};

/// The part of a dense tensor one server holds: chunks [first_chunk, end_chunk), i.e. elements
/// [begin, end) of the tensor.
struct DenseRange {
  uint64_t begin = 0;
  uint64_t end = 0;
};

/// Dense placement: chunks are split into num_servers contiguous blocks; block b goes to server
/// (b + table_id) % num_servers so that small tensors of different tables land on different
/// servers. Returns the element range of `server` (possibly empty).
DenseRange DenseRangeOfServer(uint64_t table_id, uint64_t length, uint32_t server,
                              uint32_t num_servers);

/// Lane of a dense chunk on a server with `lanes` lanes.
constexpr uint32_t LaneOfChunk(uint64_t table_id, uint64_t chunk, uint32_t lanes) {
  return static_cast<uint32_t>((chunk + table_id) % lanes);
}

/// Parses a decimal unsigned number that must be all of `text` and at most `max`; `what`
/// names it in the error (Corruption: such numbers come from files the server wrote).
Result<uint64_t> ParseStoredNumber(std::string_view text, std::string_view what,
                                   uint64_t max = ~uint64_t{0});

/// Checks a server endpoint "tcp://HOST:PORT": HOST non-empty (a name, an address, [IPv6], or
/// "*" to bind every interface), PORT a decimal number in 1..65535, or "*" (a free port) when
/// `allow_any_port` (a server's bind address). InvalidArgument naming the endpoint otherwise.
Status ValidateEndpoint(std::string_view endpoint, bool allow_any_port = false);

/// The most bytes a cluster file ("@FILE") may hold: 4 MiB (65,535 endpoints of ~30 bytes
/// take 2 MiB). Bounds what /dev/zero or a runaway pipe in its place costs.
inline constexpr size_t kMaxClusterFileBytes = size_t{4} << 20;

/// Parses a cluster list: comma-separated endpoints, or "@FILE" with one endpoint per line
/// (blank lines and lines starting with '#' ignored). Every endpoint must pass
/// ValidateEndpoint (InvalidArgument naming the first that does not). A FILE of more than
/// kMaxClusterFileBytes is InvalidArgument (read no further than that).
Result<std::vector<std::string>> ParseClusterList(const std::string& spec);

}  // namespace tessera
