// Moving slots and dense parts between servers (docs/elasticity.md, "Online resharding" and
// "Backup rebuild"): what a server marked copied in, the requests it holds until a copy is in,
// the exports that wait for older requests, and the counts of rows moved.
#pragma once

#include <absl/container/flat_hash_set.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ps/routing.h"
#include "ps/server/map_fence_internal.h"
#include "ps/server/request_internal.h"
#include "ps/status.h"

namespace tessera::internal {

/// The copy-in side of resharding and backup rebuilds on one server. Not thread-safe: the
/// server's I/O thread owns it, except the row counters, which the lanes add to.
class SlotMigration {
 public:
  /// `instance`: this process among restarts of the server (random), a mark of SlotExport,
  /// since a restart resets the lanes' step counters.
  explicit SlotMigration(uint64_t instance) : instance_(instance) {}
  uint64_t instance() const { return instance_; }

  /// A request held for a copy is answered Unavailable after this long (the controller died).
  static constexpr std::chrono::seconds kHoldLimit{60};
  /// Requests held for copies at most; beyond it a new request for a moving slot is refused
  /// (Unavailable) instead of held.
  static constexpr size_t kMaxParked = 65536;

  /// True when `map` has rows of `slot` copied to this server: as its importing primary (a
  /// move) or as its backup being filled (a rebuild).
  static bool CopyingIn(const ClusterMapState* map, uint32_t slot);

  // ---- Marks: the slots and dense parts whose copy is in at the current map. They are
  // stored (Encode/Decode) so that a restarted server that took pushes for them refuses a
  // repeated copy.
  bool slot_filled(uint32_t slot) const { return slots_filled_[slot]; }
  void MarkSlotsFilled(const std::vector<uint32_t>& slots);
  bool dense_filled(uint32_t part) const {
    return part < dense_filled_.size() && dense_filled_[part];
  }
  /// Makes room for the marks of `parts` dense parts (grown, never shrunk: the marks read back
  /// at start stay).
  void GrowDense(uint32_t parts);
  void MarkDenseFilled(const std::vector<uint32_t>& parts);
  /// Forgets the marks of slots and dense parts `map` no longer copies in; true when any was
  /// forgotten (the caller stores the marks again).
  bool ForgetSettled(const ClusterMapState* map);
  /// The marks as stored: one '0'/'1' a slot, and one a dense part.
  std::string EncodeSlots() const;
  std::string EncodeDense() const;
  /// Reads stored marks back (absent: none); Corruption when malformed.
  Status Decode(const std::optional<std::string>& slots, const std::optional<std::string>& dense);

  // ---- Requests held until a copy is in.
  /// Holds `p`; false when kMaxParked are held already and `p` is a new request (one that
  /// waited already, `readmitting`, is held whatever the count: refusing it would strand the
  /// pushes of its client held behind it).
  bool Park(const std::shared_ptr<Pending>& p, bool readmitting);
  /// Every held request, in arrival order, to be sent through the gates again.
  std::vector<std::shared_ptr<Pending>> TakeParked();
  /// The held requests that arrived kHoldLimit or longer before `now`, in arrival order.
  std::vector<std::shared_ptr<Pending>> TakeExpired(std::chrono::steady_clock::time_point now);
  size_t parked_now() const { return parked_.size(); }
  uint64_t parked_total() const { return parked_total_; }

  // ---- Exports waiting for the requests sequenced by an older map to reach the lanes.
  void WaitExport(uint64_t version, std::function<void()> run);
  /// Runs, in order, the waiting exports for which `older_waits(version)` is false.
  void RunExports(const std::function<bool(uint64_t)>& older_waits);
  size_t exports_waiting() const { return exports_.size(); }

  // ---- Job metadata keys ("user/NAME") clients wrote since the process started: a copy of
  // the records imported when the server joins the map does not replace them.
  void NoteMetaWritten(const std::string& key) { meta_written_.insert(key); }
  bool MetaWritten(const std::string& key) const { return meta_written_.contains(key); }

  // ---- Rows moved, for stats (the lanes add to them).
  std::atomic<uint64_t> rows_exported{0}, rows_imported{0}, rows_dropped{0};

 private:
  struct WaitingExport {
    uint64_t version;
    std::function<void()> run;
  };
  const uint64_t instance_;
  std::vector<bool> slots_filled_ = std::vector<bool>(kNumSlots, false);
  std::vector<bool> dense_filled_;
  std::vector<std::shared_ptr<Pending>> parked_;
  uint64_t parked_total_ = 0;
  std::deque<WaitingExport> exports_;
  absl::flat_hash_set<std::string> meta_written_;
};

}  // namespace tessera::internal
