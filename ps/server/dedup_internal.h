// Exactly-once pushes: the push sequence numbers each client has had logged on this server.
#pragma once

#include <absl/container/flat_hash_map.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "ps/status.h"

namespace tessera::internal {

/// Remembers, per client id, the last push sequence number this server accepted and the last
/// it logged. A client numbers its pushes to one server 1, 2, ... in send order and resends
/// them in that order after a lost connection, so a push at or below the logged mark is a
/// retry whose original is durable: it is answered OK and not applied again. A push above the
/// logged mark but at or below the accepted one is still on its way (parked behind a
/// checkpoint cut): it is refused as Unavailable, and the client retries it later. The logged
/// marks travel with the request log (RequestLog stores them before it truncates), so they
/// survive a crash. Holds at most kMaxClients clients; past that the least recently seen
/// quarter is forgotten. Not thread-safe: the server's I/O thread owns it.
///
/// A push refused after its number was taken, that the client will send again under the same
/// number (refused Unavailable: Abandon with `resend`), leaves a gap: until that number comes
/// again, or for at most `resend_window`, the client's pushes above it are kBlocked (refused
/// Unavailable, not taken), since one of them logged would put the mark above the refused
/// one, whose resend would then be taken for a retry and never applied. The client sends its
/// pushes again in their order, so the refused one comes first.
class PushDedup {
 public:
  enum class Verdict { kNew, kApplied, kPending, kBlocked };
  static constexpr size_t kMaxClients = size_t{1} << 16;

  explicit PushDedup(std::chrono::milliseconds resend_window = std::chrono::seconds(10))
      : resend_window_(resend_window) {}

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

  /// The logged marks as bytes (u32 count, then u64 client, u64 mark each; little-endian).
  std::string Encode() const;
  /// Adds stored marks (the larger mark wins). Corruption on malformed bytes.
  Status Merge(std::string_view bytes);
  size_t size() const { return clients_.size(); }

 private:
  struct Entry {
    uint64_t accepted = 0;
    uint64_t logged = 0;
    uint64_t touched = 0;
    uint64_t returned = 0;  // the lowest number refused for a resend not seen yet; 0: none
    std::chrono::steady_clock::time_point returned_at;
  };
  Entry& Touch(uint64_t client);

  absl::flat_hash_map<uint64_t, Entry> clients_;
  uint64_t tick_ = 0;
  const std::chrono::milliseconds resend_window_;
};

}  // namespace tessera::internal
