// The server's request log: every push is appended whole before any lane applies it, and
// replayed per lane after a crash (docs/storage.md, "The request log").
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ps/server/request_internal.h"
#include "storage/storage.h"

namespace tessera::internal {

/// Appends pushes to the storage engine's log and replays them at start-up. Each lane stores
/// the sequence number it has applied atomically with its rows (LaneStore::SetAppliedSeq), so
/// replay applies to each lane exactly the entries it had not committed. Not thread-safe: the
/// I/O thread owns it (Replay runs before any lane thread exists).
class RequestLog {
 public:
  /// `engine` must outlive the log. With a memory-only engine the log keeps nothing.
  explicit RequestLog(StorageEngine* engine) : engine_(engine) {}

  /// Appends the validated push `p` (sparse or dense); returns its sequence number, or 0 when
  /// the engine keeps nothing.
  Result<uint64_t> Append(const Pending& p);

  /// Applies to `stores` (the current lane layout) the logged pushes their lanes had not
  /// committed when the server stopped; the marks were stored under the layout of that run.
  /// Entries of tables `known` says no longer exist are skipped. Commits every store and
  /// truncates the log behind the replayed entries.
  Status Replay(std::vector<std::unique_ptr<LaneStore>>& stores,
                const std::function<bool(uint64_t table_id)>& known);

  /// Drops the entries up to `mark` (every lane has committed them), when it advanced.
  void TruncateTo(uint64_t mark);

  /// The last sequence number assigned.
  uint64_t last_seq() const { return seq_; }

  /// Entry layout (little-endian): u8 kind (1 sparse, 2 dense), 3 bytes zero, u32 dim, u64
  /// table id, u64 count, u64 offset, then keys (sparse, count x u64) and gradients (count x
  /// dim floats; dense: count floats).
  static constexpr size_t kHeaderBytes = 32;
  static std::string Encode(const Pending& p);

 private:
  // The mark of each lane of the layout the marks were written under.
  Result<std::vector<uint64_t>> ReadMarks(const std::vector<std::unique_ptr<LaneStore>>& stores);
  // Applies entry `seq` to the lanes whose mark is below it.
  Status ApplyEntry(uint64_t seq, std::string_view e, const std::vector<uint64_t>& marks,
                    std::vector<std::unique_ptr<LaneStore>>& stores,
                    const std::function<bool(uint64_t)>& known);

  StorageEngine* const engine_;
  uint64_t seq_ = 0;        // last sequence number assigned
  uint64_t truncated_ = 0;  // truncated up to here
};

}  // namespace tessera::internal
