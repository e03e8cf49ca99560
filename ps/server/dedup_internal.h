// Exactly-once pushes: the push sequence numbers each client has had logged on this server.
#pragma once

#include <absl/container/btree_set.h>
#include <absl/container/flat_hash_map.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "ps/status.h"
#include "storage/storage.h"

namespace tessera::internal {

/// Bounds of PushDedup.
struct PushDedupOptions {
  /// Clients whose marks are held in memory. Past it, the least recently seen quarter of the
  /// clients with nothing in flight is spilled to the store (one write) and read back from it
  /// when they come again; a client with a push in flight or a gap open stays. Default: 65,536.
  size_t max_clients = size_t{1} << 16;
  /// A client not seen for this long is forgotten (not spilled, and its spilled mark deleted).
  /// Must exceed the longest time a client keeps resending a push (ClientOptions::retry_for_ms,
  /// 120 s by default). Seconds; default: 3600 (one hour).
  uint64_t retention_s = 3600;
  /// How long a gap left by a push refused for a resend blocks the client's later pushes.
  /// Default: 10 s.
  std::chrono::milliseconds resend_window = std::chrono::seconds(10);
};

/// Remembers, per client id, the last push sequence number this server accepted and the last
/// it logged. A client numbers its pushes to one server 1, 2, ... in send order and resends
/// them in that order after a lost connection, so a push at or below the logged mark is a
/// retry whose original is durable: it is answered OK and not applied again. A push above the
/// logged mark but at or below the accepted one is still on its way (parked behind a
/// checkpoint cut): it is refused as Unavailable, and the client retries it later. The logged
/// marks travel with the request log (RequestLog stores them before it truncates), so they
/// survive a crash. Past options.max_clients the least recently seen clients are spilled to
/// `store` (meta records "server/dedup/<client, 16 hex digits>"), never dropped, until
/// options.retention_s after they were last seen. A client known neither here nor in the store
/// whose push is not its first (kUnknown) may have had its mark forgotten: the caller refuses
/// such a push rather than apply it blind. Not thread-safe: the server's I/O thread owns it.
///
/// A push refused after its number was taken, that the client will send again under the same
/// number (refused Unavailable: Abandon with `resend`; or refused before it was taken:
/// Refused), leaves a gap: until each number so refused comes again, or for at most
/// `resend_window` after the latest refusal, the client's pushes above the lowest of them are
/// kBlocked (refused Unavailable, not taken), since one of them logged would put the mark
/// above a refused one, whose resend would then be taken for a retry and never applied. The
/// client sends its pushes again in their order, so the refused ones come first.
class PushDedup {
 public:
  /// kUnknown: the client is known nowhere and `seq` > 1. kUnreadable: the store failed.
  enum class Verdict { kNew, kApplied, kPending, kBlocked, kUnknown, kUnreadable };
  /// Meta key prefix of the spilled marks.
  static constexpr std::string_view kStorePrefix = "server/dedup/";

  /// `store` (not owned; may be null: nothing is spilled and memory is bounded by retention
  /// only) must outlive this table.
  explicit PushDedup(PushDedupOptions options = {}, StorageEngine* store = nullptr)
      : options_(options), store_(store) {}
  explicit PushDedup(std::chrono::milliseconds resend_window)
      : PushDedup(PushDedupOptions{.resend_window = resend_window}) {}
  /// Sets the bounds and the store (before any push: the server calls it at start-up).
  void Configure(PushDedupOptions options, StorageEngine* store) {
    options_ = options;
    store_ = store;
  }

  /// What to do with push `seq` of `client`. Client 0 (no id) is always kNew.
  Verdict Check(uint64_t client, uint64_t seq) const;
  /// Push `seq` is being served (validated; it may still wait before it is logged).
  void Accept(uint64_t client, uint64_t seq);
  /// Push `seq` is logged (or applied, on a server without a log).
  void Logged(uint64_t client, uint64_t seq);
  /// Push `seq` failed before it was logged: a retry of it may apply. `resend`: the client
  /// was told to send it again as it is (Unavailable), so its later pushes wait for it.
  void Abandon(uint64_t client, uint64_t seq, bool resend);
  /// Push `seq` was refused in a way the client does not send it again under its number (a
  /// stale map: it gets a new one; an error): the gap it left, if any, is closed.
  void ClearGap(uint64_t client, uint64_t seq);
  /// Push `seq` was refused before it was taken, and its client sends it again under the same
  /// number (one counted in another server's sequence, refused for its map version): it
  /// leaves a gap like Abandon with `resend`, also for a client not seen before, so that a
  /// later push of the sequence taken before the resend does not put the mark above it.
  void Refused(uint64_t client, uint64_t seq);

  /// The logged marks held in memory as bytes (u32 count, then u64 client, u64 mark each;
  /// little-endian). The spilled ones are in the store already.
  std::string Encode() const;
  /// Adds stored marks (the larger mark wins). Corruption on malformed bytes.
  Status Merge(std::string_view bytes);
  /// Clients held in memory.
  size_t size() const { return clients_.size(); }
  /// Clients written to the store so far, and spilled marks deleted past the retention.
  uint64_t spilled() const { return spilled_; }
  uint64_t expired() const { return expired_; }

 private:
  struct Entry {
    uint64_t accepted = 0;
    uint64_t logged = 0;
    uint64_t touched = 0;
    uint64_t seen_s = 0;    // wall-clock seconds when last seen (for the retention)
    // The numbers refused for a resend and not seen again yet (the gap is at the lowest), and
    // when the latest was refused: they block later pushes for resend_window from then.
    absl::btree_set<uint64_t> returned;
    std::chrono::steady_clock::time_point returned_at;
  };
  // The spilled mark of `client`: nullopt when none; an error when the store fails.
  Result<std::optional<uint64_t>> Spilled(uint64_t client) const;
  Entry& Touch(uint64_t client);
  // Adds `seq`, which the client sends again, to the gap of `e` (a new gap when the last one
  // is past the window).
  void OpenGap(Entry& e, uint64_t seq);
  // True while the gap of `e` blocks the client's later pushes.
  bool GapOpen(const Entry& e) const;
  // Moves the least recently seen quarter of the clients at rest to the store.
  void Spill();
  // Deletes the spilled marks older than the retention in the next sixteenth of the key space.
  void ExpireSpilled(uint64_t now_s);

  absl::flat_hash_map<uint64_t, Entry> clients_;
  uint64_t tick_ = 0;
  PushDedupOptions options_;
  StorageEngine* store_;
  uint64_t spilled_ = 0;
  uint64_t expired_ = 0;
  uint32_t expire_cursor_ = 0;  // the next sixteenth ExpireSpilled visits
};

}  // namespace tessera::internal
