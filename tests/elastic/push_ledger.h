// Identifiable pushes for the randomized fault tests (random_faults_test.cc): every push has
// keys of its own, so the table read back afterwards says how many times each push was applied.
//
// Push p touches kSlotsPerPush slots drawn at random, kKeysPerSlot keys in each; no other push
// touches those keys (a key is the inverse of Mix64 of (slot << 50 | p << 8 | j), so it lies
// in the chosen slot and is unique). Its gradient is 1 on every element, the table is SGD with
// learning rate 1 and a zeros initializer: a key reads minus the number of times the push was
// applied. An acknowledged push must read 1 on every key; one that failed or was given up may
// read 0 or 1 but never more; and since all keys of one slot go to one server in one request,
// the keys of one slot must agree (a request is all or nothing on the server that takes it).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "ps/client/client.h"
#include "ps/routing.h"

namespace tessera::testing {

/// The figures of one fault run.
struct FaultFigures {
  uint64_t rounds = 0;
  uint64_t sent = 0;
  uint64_t acknowledged = 0;
  uint64_t failed = 0;       // final error (not acknowledged): may apply 0 or 1 times
  uint64_t hung = 0;         // no final result by its deadline (+ slack): cancelled
  uint64_t lost = 0;         // acknowledged, some key applied 0 times
  uint64_t doubled = 0;      // some key applied more than once
  uint64_t torn = 0;         // the keys of one slot disagree (not all-or-nothing)
  uint64_t unacked_applied = 0;  // failed or hung pushes found applied (allowed)
  uint64_t contradicted = 0;     // ... whose error said nothing of them was applied
  double max_backup_ms = 0;  // longest time from a fault to a fully backed-up map
  double longest_wait_ms = 0;

  void Print(const char* what, uint64_t seed) const {
    std::printf(
        "fault test %s (seed %llu): %llu rounds, %llu pushes sent, %llu acknowledged, %llu "
        "failed, %llu hung, %llu lost, %llu doubled, %llu torn, %llu unacknowledged found "
        "applied (%llu of them said nothing was); longest push wait %.0f ms",
        what, static_cast<unsigned long long>(seed), static_cast<unsigned long long>(rounds),
        static_cast<unsigned long long>(sent), static_cast<unsigned long long>(acknowledged),
        static_cast<unsigned long long>(failed), static_cast<unsigned long long>(hung),
        static_cast<unsigned long long>(lost), static_cast<unsigned long long>(doubled),
        static_cast<unsigned long long>(torn), static_cast<unsigned long long>(unacked_applied),
        static_cast<unsigned long long>(contradicted), longest_wait_ms);
    if (max_backup_ms > 0) {
      std::printf("; max time from a fault to a fully backed-up map %.1f s", max_backup_ms / 1000);
    }
    std::printf("\n");
  }
};

/// Sends identifiable pushes through one client, kInFlight at a time, and checks them all at
/// the end. Not thread-safe: one thread sends and waits.
class PushLedger {
 public:
  static constexpr uint32_t kDim = 2;
  static constexpr uint32_t kSlotsPerPush = 4;
  static constexpr uint32_t kKeysPerSlot = 4;
  static constexpr size_t kInFlight = 4;

  /// `give_up_ms`: a call with no final result this long after it was sent counts as hung
  /// (the client's retry_for_ms plus a generous slack).
  PushLedger(Client& c, const Table& t, uint64_t seed, int64_t give_up_ms)
      : c_(c), t_(t), rng_(seed), give_up_ms_(give_up_ms) {}

  /// The key `j` of push `p` in slot `slot`.
  static uint64_t KeyOf(uint32_t slot, uint64_t p, uint32_t j) {
    return Unmix64((uint64_t{slot} << 50) | ((p + 1) << 8) | j);
  }

  /// Sends the next push (waiting for the oldest first when kInFlight are on their way).
  void Send() {
    if (in_flight_.size() == kInFlight) CompleteOldest();
    Push p;
    p.id = pushes_.size();
    for (uint32_t s = 0; s < kSlotsPerPush; ++s) {
      uint32_t slot;
      do {
        slot = static_cast<uint32_t>(rng_() % kNumSlots);
      } while (std::find(p.slots.begin(), p.slots.end(), slot) != p.slots.end());
      p.slots.push_back(slot);
      for (uint32_t j = 0; j < kKeysPerSlot; ++j) keys_.push_back(KeyOf(slot, p.id, j));
    }
    p.sent = std::chrono::steady_clock::now();
    const std::span<const uint64_t> keys(keys_.data() + keys_.size() - KeysPerPush(),
                                          KeysPerPush());
    p.handle = c_.Push(t_, keys, ones_);
    pushes_.push_back(p);
    in_flight_.push_back(p.id);
    ++figures.sent;
  }

  /// Waits for every push in flight.
  void Drain() {
    while (!in_flight_.empty()) CompleteOldest();
  }

  /// Reads every key of every push through `reader` and counts lost, doubled and torn pushes
  /// into `figures` (a test failure for each of the first few, with the push's story).
  Status Verify(Client& reader) {
    Drain();
    std::vector<float> values(keys_.size() * kDim, 1.0f);
    constexpr size_t kChunk = 16384;
    for (size_t at = 0; at < keys_.size(); at += kChunk) {
      const size_t n = std::min(kChunk, keys_.size() - at);
      TESSERA_RETURN_IF_ERROR(reader.Wait(
          reader.Pull(t_, std::span<const uint64_t>(keys_.data() + at, n),
                      values.data() + at * kDim),
          DeadlineAfterMs(120000)));
    }
    for (const Push& p : pushes_) {
      bool lost = false, doubled = false, torn = false, applied = false;
      for (uint32_t s = 0; s < kSlotsPerPush; ++s) {
        float first = 0;
        for (uint32_t j = 0; j < kKeysPerSlot; ++j) {
          const size_t k = p.id * KeysPerPush() + s * kKeysPerSlot + j;
          for (uint32_t d = 0; d < kDim; ++d) {
            const float times = -values[k * kDim + d];
            if (j == 0 && d == 0) first = times;
            if (times != first) torn = true;
            if (times != 0.0f && times != 1.0f) doubled = true;
            if (times == 0.0f && p.outcome == Outcome::kAcknowledged) lost = true;
            if (times != 0.0f) applied = true;
          }
        }
      }
      figures.lost += lost;
      figures.doubled += doubled;
      figures.torn += torn;
      if (p.outcome != Outcome::kAcknowledged && applied) {
        ++figures.unacked_applied;
        // Allowed (a failed push may have been applied), but its error must not say otherwise.
        const bool contradicted = p.status.find("nothing of it was applied") != std::string::npos;
        figures.contradicted += contradicted;
        if (contradicted) {
          ADD_FAILURE() << "push " << p.id << " failed with \"" << p.status
                        << "\" and was applied";
        } else if (figures.unacked_applied <= 5) {
          std::printf("push %llu (%s: %s) was applied\n",
                      static_cast<unsigned long long>(p.id), OutcomeName(p.outcome),
                      p.status.c_str());
        }
      }
      if ((lost || doubled || torn) && ++reported_ <= 10) {
        std::string keys;
        for (uint32_t s = 0; s < kSlotsPerPush; ++s) {
          keys += " slot " + std::to_string(p.slots[s]) + ":";
          for (uint32_t j = 0; j < kKeysPerSlot; ++j) {
            keys += " " + std::to_string(-values[(p.id * KeysPerPush() + s * kKeysPerSlot + j) *
                                                 kDim]);
          }
        }
        ADD_FAILURE() << "push " << p.id << " (" << OutcomeName(p.outcome) << ": "
                      << p.status << ", sent " << p.sent_at_ms << " ms into the run, its result at "
                      << p.done_at_ms << " ms)"
                      << (lost ? " lost" : "") << (doubled ? " applied twice" : "")
                      << (torn ? " not all-or-nothing" : "") << "; times applied per key:"
                      << keys;
      }
    }
    return Status::OK();
  }

  FaultFigures figures;

 private:
  enum class Outcome { kInFlight, kAcknowledged, kFailed, kHung };
  static const char* OutcomeName(Outcome o) {
    switch (o) {
      case Outcome::kAcknowledged: return "acknowledged";
      case Outcome::kFailed: return "failed";
      case Outcome::kHung: return "hung";
      default: return "in flight";
    }
  }
  struct Push {
    uint64_t id = 0;
    std::vector<uint32_t> slots;
    Handle handle;
    std::chrono::steady_clock::time_point sent;
    double sent_at_ms = 0;
    double done_at_ms = 0;  // when the ledger took its final result (ms into the run)
    Outcome outcome = Outcome::kInFlight;
    std::string status;
  };
  static constexpr size_t KeysPerPush() { return kSlotsPerPush * kKeysPerSlot; }

  void CompleteOldest() {
    Push& p = pushes_[in_flight_.front()];
    in_flight_.pop_front();
    p.sent_at_ms = std::chrono::duration<double, std::milli>(p.sent - start_).count();
    const Status s =
        c_.Wait(p.handle, p.sent + std::chrono::milliseconds(give_up_ms_));
    const double waited =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - p.sent)
            .count();
    figures.longest_wait_ms = std::max(figures.longest_wait_ms, waited);
    p.done_at_ms = p.sent_at_ms + waited;
    p.status = s.ToString();
    if (s.ok()) {
      p.outcome = Outcome::kAcknowledged;
      ++figures.acknowledged;
    } else if (s.code() == StatusCode::kDeadlineExceeded) {
      p.outcome = Outcome::kHung;
      ++figures.hung;
      c_.Cancel(p.handle);
      if (figures.hung <= 5) {
        ADD_FAILURE() << "push " << p.id << " had no final result " << give_up_ms_
                      << " ms after it was sent";
      }
    } else {
      p.outcome = Outcome::kFailed;
      ++figures.failed;
    }
  }

  Client& c_;
  const Table t_;
  std::mt19937_64 rng_;
  const int64_t give_up_ms_;
  const std::vector<float> ones_ = std::vector<float>(kSlotsPerPush * kKeysPerSlot * kDim, 1.0f);
  const std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::vector<Push> pushes_;
  std::vector<uint64_t> keys_;  // KeysPerPush() per push, in push order
  std::deque<uint64_t> in_flight_;
  int reported_ = 0;
};

}  // namespace tessera::testing
