// The server's request log: every push is appended whole before any lane applies it, and
// replayed per lane after a crash (docs/storage.md, "The request log").
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "ps/mutex.h"
#include "ps/server/dedup_internal.h"
#include "ps/server/request_internal.h"
#include "storage/storage.h"

namespace tessera::internal {

/// Appends pushes to the storage engine's log and replays them at start-up. Each lane stores
/// the sequence number it has applied atomically with its rows (LaneStore::SetAppliedSeq), so
/// replay applies to each lane exactly the entries it had not committed. Not thread-safe: the
/// I/O thread owns it (Replay runs before any lane thread exists). Truncation runs on a thread
/// of its own: storing the marks and deleting segments took 10-160 ms, a stall of every
/// request when the I/O thread did it.
class RequestLog {
 public:
  /// `engine` and `dedup` must outlive the log. With a memory-only engine the log keeps
  /// nothing. The clients' logged push marks in `dedup` are stored before the log is
  /// truncated and rebuilt by Replay.
  RequestLog(StorageEngine* engine, PushDedup* dedup) : engine_(engine), dedup_(dedup) {}
  /// Finishes a truncation under way.
  ~RequestLog();
  RequestLog(const RequestLog&) = delete;
  RequestLog& operator=(const RequestLog&) = delete;

  /// Whether the log keeps anything (a durable engine).
  bool durable() const { return engine_->durable(); }

  /// Group commit, part 1: gives the validated push `p` (sparse or dense, with its client id
  /// and sequence number) the next log sequence number and keeps its entry, which points into
  /// `p`'s frames (`p` must stay alive until WriteStaged). Durable engines only.
  uint64_t Stage(std::shared_ptr<Pending> p);
  /// Part 2: writes every staged entry in one write (one fdatasync with --fsync). On an error
  /// none of them is in the log and their sequence numbers are given out again.
  Status WriteStaged();

  /// Applies to `stores` (the current lane layout) the logged pushes their lanes had not
  /// committed when the server stopped; the marks were stored under the layout of that run.
  /// Entries of tables `known` says no longer exist are skipped. Restores the clients' push
  /// marks into the dedup table. The replayed rows stay dirty (the lanes write them back; the
  /// log keeps them until then), unless the lane count changed: then every store commits first.
  Status Replay(std::vector<std::unique_ptr<LaneStore>>& stores,
                const std::function<bool(uint64_t table_id)>& known);

  /// Drops the entries up to `mark` (every lane has committed them), when it advanced: stores
  /// the clients' marks as of now, then deletes the segments, in the background.
  void TruncateTo(uint64_t mark);

  /// The last sequence number assigned.
  uint64_t last_seq() const { return seq_; }
  /// Entries up to this one are gone from the log.
  uint64_t truncated() const { return truncated_.load(std::memory_order_acquire); }

  /// Entry layout (little-endian): u8 kind (5 sparse, 6 dense), 3 bytes zero, u32 dim, u64
  /// table id, u64 count, u64 offset, u64 client id, u64 client sequence number, f32 learning-
  /// rate scale, 4 bytes zero, then keys (sparse, count x u64) and gradients (count x dim
  /// floats; dense: count floats). Entries of older versions are still replayed: kinds 3
  /// (sparse) and 4 (dense) have a 48-byte header without the scale (1), kinds 1 and 2 a
  /// 32-byte header without the client fields either.
  static constexpr size_t kHeaderBytes = 56;
  static constexpr size_t kClientHeaderBytes = 48;
  static constexpr size_t kOldHeaderBytes = 32;
  /// The entry's header; the entry is the header, the keys (sparse) and the gradients.
  static std::array<char, kHeaderBytes> EncodeHeader(const Pending& p);

 private:
  // Stores `marks` (the dedup table's logged marks, encoded), then drops log entries up to
  // `mark`.
  Status StoreMarksAndTruncate(uint64_t mark, const std::string& marks);
  void TruncateLoop() ABSL_LOCKS_EXCLUDED(truncate_mu_);
  // The mark of each lane of the layout the marks were written under; also fills
  // other_layouts_.
  Result<std::vector<uint64_t>> ReadMarks(const std::vector<std::unique_ptr<LaneStore>>& stores);
  // Whether lane `lane_of(n)` of any other stored layout of n lanes has applied entry `seq`.
  template <typename LaneOf>
  bool OtherLayoutHas(uint64_t seq, LaneOf lane_of) const {
    for (const auto& [n, marks] : other_layouts_) {
      if (seq <= marks[lane_of(n)]) return true;
    }
    return false;
  }
  // One thread of a parallel replay: the lanes it applies to, whether it notes the clients'
  // marks (one thread does), and buffers reused from entry to entry (allocated per entry, the
  // fresh pages, zero-filling and copies were a fifth of a replay's CPU in `perf`).
  struct ReplayThread {
    std::vector<bool> mine;
    bool note_client = false;
    std::vector<uint64_t> keys;
    std::vector<float> grads;  // only when the entry's floats are not aligned in place
    KeySplit split;
    std::vector<uint64_t> k;
    std::vector<const float*> g;
  };
  // Applies entry `seq` to the lanes of `thread` whose mark is below it.
  Status ApplyEntry(uint64_t seq, std::string_view e, const std::vector<uint64_t>& marks,
                    std::vector<std::unique_ptr<LaneStore>>& stores,
                    const std::function<bool(uint64_t)>& known, ReplayThread& thread);

  StorageEngine* const engine_;
  PushDedup* const dedup_;
  // Replay: the marks of stored lane layouts other than "server/lanes"'s (lanes, mark per
  // lane). A replay into a new layout commits the new lanes' rows and marks, then records the
  // layout; a crash between the two leaves rows that hold entries "server/lanes"'s marks do
  // not cover, and only the new layout's marks tell. Rows only move forward, so a layout's
  // marks never claim an entry its rows lack.
  std::vector<std::pair<uint32_t, std::vector<uint64_t>>> other_layouts_;
  struct Staged {
    std::shared_ptr<Pending> p;
    std::array<char, kHeaderBytes> header;
    std::array<std::string_view, 3> parts;
  };
  // other_layouts_, staged_ and seq_: I/O thread only (not annotated).
  std::vector<Staged> staged_;
  uint64_t seq_ = 0;  // last sequence number assigned
  std::atomic<uint64_t> truncated_{0};  // truncated up to here
  // The truncation thread, started by the first TruncateTo (the I/O thread starts and joins
  // it), and what it is asked to do.
  std::thread truncator_;
  Mutex truncate_mu_;
  std::condition_variable truncate_cv_;
  bool truncate_stop_ ABSL_GUARDED_BY(truncate_mu_) = false;
  bool truncate_busy_ ABSL_GUARDED_BY(truncate_mu_) = false;     // asked and not yet done
  bool truncate_pending_ ABSL_GUARDED_BY(truncate_mu_) = false;  // not yet taken by the thread
  uint64_t truncate_mark_ ABSL_GUARDED_BY(truncate_mu_) = 0;
  std::string truncate_marks_ ABSL_GUARDED_BY(truncate_mu_);
};

}  // namespace tessera::internal
