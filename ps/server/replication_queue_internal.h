// Primary-backup replication (docs/elasticity.md, "Replication and fail-over"): the ordered
// queue of a primary's requests waiting for their backups, and the forwarded pushes a backup
// holds until its map or a fill catches up. Both without sockets: the server sends the pieces
// and reads the answers (replication.cc).
#pragma once

#include <absl/container/flat_hash_map.h>
#include <absl/container/flat_hash_set.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>
#include <zmq.hpp>

#include "ps/server/map_fence_internal.h"
#include "ps/server/request_internal.h"

namespace tessera::internal {

/// One backup's part of a push: the request sent to it, until it answers.
struct ReplPiece {
  uint16_t backup = 0;
  uint64_t request_id = 0;
  std::vector<zmq::message_t> parts;  // envelope, keys, values (kept to send again)
  std::vector<uint32_t> slots;        // the slots it touches, sorted (sparse)
  int64_t dense_part = -1;            // the dense part it writes (dense; -1: sparse)
  std::chrono::steady_clock::time_point sent_at;
  // When the backup last answered it (any answer), or it was first sent: silent past
  // ReplicationQueue::kSilenceLimit, the entry fails.
  std::chrono::steady_clock::time_point heard;
  bool done = false;
  bool acked = false;  // the backup answered OK (it holds the push)
};

/// A data request waiting, in arrival order, for the backups of the pushes ahead of it and
/// its own; `release` hands it to the log and the lanes.
struct ReplEntry {
  std::shared_ptr<Pending> p;
  std::function<void()> release;
  std::vector<ReplPiece> pieces;
  uint32_t waiting = 0;  // pieces not answered yet
  bool failed = false;   // answered with an error; released without running
  // When a map moved what it writes away from this server while its backup had not answered
  // (it waits for that answer up to kOrphanLimit); zero: not orphaned.
  std::chrono::steady_clock::time_point orphaned{};
  // The map version it was sequenced (and forwarded) by.
  uint64_t version = 0;
};

/// A primary's requests in arrival order while replication is active: each is released (to
/// the log and the lanes) once it is at the head and every backup of its push answered, so
/// an acknowledged push is on two servers and a client reads its own writes. Not
/// thread-safe: the server's I/O thread owns it.
class ReplicationQueue {
 public:
  /// A piece unanswered this long is sent again (the backup restarted or lost it; it applies
  /// a piece once: its dedup knows the numbers).
  static constexpr std::chrono::milliseconds kReplicaResend{500};
  /// An orphaned entry (its slots moved away while its backup had not answered) waits this
  /// long for the answer, then fails.
  static constexpr std::chrono::seconds kOrphanLimit{30};

  /// `stream`: the client id of forwarded pushes that have no client id (this process's own
  /// numbering).
  explicit ReplicationQueue(uint64_t stream) : stream_(stream) {}

  bool empty() const { return queue_.empty(); }
  /// Pieces sent and not answered yet.
  size_t waiting() const { return waiting_.size(); }

  /// Appends request `p`, sequenced by map `version`; its pieces, if any, are added to the
  /// returned entry and then Track()ed.
  ReplEntry& Enqueue(std::shared_ptr<Pending> p, std::function<void()> release, uint64_t version);
  /// Entry `e` waits for each of its pieces (counted as a replicated push when it has any).
  void Track(ReplEntry& e);
  /// The header of a push forwarded to a backup by server `rank` (Header::replica_from),
  /// numbered as the client numbered it (client_origin) or, without a client id, in this
  /// primary's stream; a new request id each call.
  Header ForwardedHeader(const Pending& p, Op op, uint64_t map_version, uint32_t rank);

  /// The entry and piece waiting for the answer to `request_id`; {nullptr, 0} when none does
  /// (an answer to a resend already counted).
  std::pair<ReplEntry*, size_t> Find(uint64_t request_id) const;
  /// Piece `index` of `e` no longer waits (answered, or its backup dropped).
  void PieceDone(ReplEntry& e, size_t index);
  /// Fails `e` and the pushes of the same client queued behind it that no backup took yet:
  /// one of them logged would move the client's logged mark past `e`, whose resend would then
  /// be taken for a retry of something applied nowhere. Returns them latest first (each then
  /// gives its number back in order); none of them is released. Empty when `e` failed
  /// already.
  std::vector<ReplEntry*> Fail(ReplEntry& e);
  /// Releases the entries at the head whose backups all answered (a failed one is dropped).
  void ReleaseReady();
  /// A piece its backup has not answered at all this long (not even Unavailable: a backup
  /// that holds a forwarded push answers it within ReplicaPark::kHoldLimit) fails its entry:
  /// the primary's queue never waits for good behind one answer.
  static constexpr std::chrono::seconds kSilenceLimit{60};
  /// The pieces due to be sent again at `now` (into `due`, in the order they were first
  /// sent, which is the order the backup must take them) and the entries to fail (returned):
  /// orphaned past kOrphanLimit, or with a piece silent past kSilenceLimit.
  std::vector<ReplEntry*> Due(std::chrono::steady_clock::time_point now,
                              std::vector<ReplPiece*>* due);
  /// After a map change: a piece whose backup `map` dropped no longer waits for it; an entry
  /// whose slots server `rank` no longer owns waits for its backup's answer (orphaned).
  void MapChanged(const ClusterMapState& map, uint32_t rank);
  /// Adds the backups that unanswered pieces name to `used`.
  void AddWaitingBackups(absl::flat_hash_set<uint16_t>* used) const;
  /// True while a push of a step up to `cut` waits for its backups (not in the lanes yet).
  bool WaitsForPushUpTo(int64_t cut) const;
  /// True while an entry sequenced by a map older than `version` waits.
  bool HoldsOlderThan(uint64_t version) const;

  uint64_t replicated() const { return replicated_; }
  uint64_t failed() const { return failed_; }

 private:
  std::deque<ReplEntry> queue_;
  absl::flat_hash_map<uint64_t, std::pair<ReplEntry*, size_t>> waiting_;
  const uint64_t stream_;
  uint64_t stream_seq_ = 0, request_ids_ = 0;
  uint64_t replicated_ = 0, failed_ = 0;
};

/// The pushes a backup holds, in arrival order: those forwarded under a newer map than its
/// own (until its map catches up), and those for slots it is being filled with (until the
/// copy is in). A resend of one held already (the primary sends unanswered pieces again each
/// ReplicationQueue::kReplicaResend) is dropped: the held one's answer answers it. Bounded in
/// count and bytes, and each push is held at most kHoldLimit (Expire), so nothing waits
/// behind one that never leaves. Not thread-safe: the server's I/O thread owns it.
class ReplicaPark {
 public:
  using Clock = std::chrono::steady_clock;
  /// Held pushes at most, and their frames' bytes at most; beyond either a new one is served
  /// (and refused by its checks) or sent again by its primary.
  static constexpr size_t kMaxHeld = 65536;
  static constexpr uint64_t kMaxHeldBytes = uint64_t{1} << 30;
  /// A push held this long is answered Unavailable (Expire): its primary sends it again.
  static constexpr std::chrono::seconds kHoldLimit{30};

  explicit ReplicaPark(size_t max_held = kMaxHeld, uint64_t max_held_bytes = kMaxHeldBytes)
      : max_held_(max_held), max_held_bytes_(max_held_bytes) {}

  enum class Verdict {
    kServe,    // nothing waits and it is not ahead of this server's map
    kHeld,     // it waits behind the others
    kDropped,  // a resend of one held already
  };
  /// Where forwarded push `p` goes while this server's map is at `mine`, at `now`. `ticket`:
  /// the map re-read (MapRecheck) that a push ahead of `mine` waits for (0: none).
  Verdict Admit(const std::shared_ptr<Pending>& p, uint64_t mine, uint64_t ticket = 0,
                Clock::time_point now = Clock::now());
  /// Holds forwarded push `p` for a fill: at the head, where it came from (the one being
  /// readmitted, which keeps its time) or where nothing waits; Unavailable (the primary sends
  /// it again) for a new one while others wait, never ahead of older ones.
  Status HoldForFill(const std::shared_ptr<Pending>& p, uint32_t rank,
                     Clock::time_point now = Clock::now());
  /// Sends the held pushes whose map is here (at most `mine`) to `serve`, in order, until one
  /// is held again for a fill (it and everything after it wait on).
  void Readmit(uint64_t mine, const std::function<void(const std::shared_ptr<Pending>&)>& serve);

  /// A held push to answer with `status` instead of serving it.
  struct Refusal {
    std::shared_ptr<Pending> p;
    Status status;
  };
  /// The store's newest map version as a re-read after `ticket` found it; nullopt until one
  /// did.
  using Newest = std::function<std::optional<uint64_t>(uint64_t ticket)>;
  /// Takes out, in arrival order, the held pushes to refuse at `now` (this server is `rank`):
  /// one ahead of the newest map the store had at the re-read it waited for
  /// (FailedPrecondition: no primary forwards under a map that was never stored), and one held
  /// past kHoldLimit together with every push held behind it from the same primary
  /// (Unavailable: the primary sends them again in its order, none taken before it).
  std::vector<Refusal> Expire(Clock::time_point now, const Newest& newest, uint32_t rank);

  size_t size() const { return held_.size(); }
  bool empty() const { return held_.empty(); }
  uint64_t bytes() const { return bytes_; }
  uint64_t resends_dropped() const { return resends_dropped_; }
  uint64_t fill_held_total() const { return fill_held_total_; }
  uint64_t expired() const { return expired_; }
  uint64_t refused_ahead() const { return refused_ahead_; }

 private:
  using Key = std::tuple<uint64_t, uint64_t, uint64_t, uint64_t>;
  struct Held {
    std::shared_ptr<Pending> p;
    Clock::time_point since;  // when it came (the deadline counts from here)
    uint64_t ticket = 0;      // the map re-read it waits for (0: none)
  };
  static Key KeyOf(const Header& h);
  void Push(Held held, bool front);
  void Erase(size_t index);

  const size_t max_held_;
  const uint64_t max_held_bytes_;
  std::deque<Held> held_;
  absl::flat_hash_set<Key> keys_;
  uint64_t bytes_ = 0;
  const Pending* readmitting_ = nullptr;  // the one Readmit is serving
  Held readmitting_held_;                 // and how it was held
  uint64_t resends_dropped_ = 0, fill_held_total_ = 0, expired_ = 0, refused_ahead_ = 0;
};

}  // namespace tessera::internal
