// A request in flight on the server, the "answer once when every part has finished" counter,
// and the splits of a request's keys and dense ranges by lane. Used by the I/O thread, the
// lanes and the file writer.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>
#include <zmq.hpp>

#include "ps/codec.h"
#include "ps/mutex.h"
#include "ps/routing.h"
#include "ps/status.h"

namespace tessera::internal {

class ServerMetrics;

/// Seconds since the epoch (row update times, export cut-offs).
uint32_t NowSeconds();

/// Counts the parts of a request that must finish before it is answered, so that it is
/// answered exactly once, by whichever thread finishes the last part. It starts holding one
/// part, the guard, owned by the thread that hands the parts out: parts that finish while
/// others are still being handed out cannot answer early. That thread calls Add() before it
/// hands out each part and Done() for the guard when it has handed out all of them.
/// Thread-safe.
class PartCounter {
 public:
  /// One more part that must finish (called before the part can run).
  void Add(uint32_t n = 1) { remaining_.fetch_add(n, std::memory_order_relaxed); }
  /// Marks one part finished; true for exactly one caller: the one that finished the last.
  [[nodiscard]] bool Done() { return remaining_.fetch_sub(1, std::memory_order_acq_rel) == 1; }

 private:
  std::atomic<uint32_t> remaining_{1};
};

/// A typed view of frame `f`: the frame itself when aligned, else a copy in `*copy`.
template <typename T>
const T* ViewOf(zmq::message_t& f, std::vector<T>* copy) {
  if (reinterpret_cast<uintptr_t>(f.data()) % alignof(T) == 0) {
    return static_cast<const T*>(f.data());
  }
  copy->resize(f.size() / sizeof(T));
  std::memcpy(copy->data(), f.data(), f.size());
  return copy->data();
}

/// A request being served. Shared by the parts it was split into; the part that finishes
/// last sends the reply (FinishPart).
struct Pending {
  zmq::message_t identity;
  Header header;
  std::vector<zmq::message_t> frames;
  // Typed, aligned views of the frames (the frames themselves, or copies if misaligned).
  const uint64_t* keys = nullptr;
  const float* values = nullptr;
  std::vector<uint64_t> key_copy;
  std::vector<float> value_copy;
  // Reply data frame, written in place by the lanes; or, for a DensePull that takes one frame
  // per server chunk (kDensePullChunkFrames), those frames, each set by the lane of its chunk.
  zmq::message_t out;
  std::vector<zmq::message_t> out_frames;
  // A DensePull that takes frames of several chunks (kDensePullRunFrames): per lane, its
  // frames and its part of the index (per frame: chunk count, then the chunks), each slot set
  // by its lane; the reply sends the index of all lanes, then their frames, in lane order.
  std::vector<std::vector<zmq::message_t>> lane_frames;
  std::vector<std::vector<uint64_t>> lane_index;
  bool has_out = false;
  PartCounter parts;
  Mutex mu;
  Status status ABSL_GUARDED_BY(mu);  // first error (Fail, outcome)
  // Per-lane text (Stats): sized by the I/O thread before the parts run, each slot written by
  // its lane under mu, read by the part that finishes last. Guarded by mu while the parts run,
  // but not annotated: its writers (control_ops.cc, backup_fill.cc) still lock mu with
  // std::lock_guard<std::mutex>, which the analysis does not know; annotate it with them.
  std::vector<std::string> text;
  bool silent = false;            // internal work (maintenance): no reply
  // The pull part of a push-pull whose push this server applied already (AnsweredAsRetry): it
  // was admitted at any map version and is not fenced again when it runs after waiting.
  bool admitted_as_retry = false;
  // A client's push counted as parked in PushOrder (NoteParked): the client's
  // later pushes wait behind it.
  bool order_parked = false;
  // Pushes: the client's own id when header.client_id was rewritten to the key of another
  // server's sequence (ServerImpl::KeyByOrigin); what a primary forwards to its backup.
  uint64_t origin_client = 0;
  // The edge (edge_ops.cc): the peer's in-flight slot, given back when the request is
  // dropped; whether SendReply found the peer's send queue full (it does not read replies).
  std::shared_ptr<void> admission;
  std::atomic<bool> reply_dropped{false};
  // Where the reply is counted (null: nowhere), and when the request came in.
  ServerMetrics* metrics = nullptr;
  std::chrono::steady_clock::time_point received;

  /// Records `s` as the request's outcome unless an error is already recorded.
  void Fail(const Status& s) ABSL_LOCKS_EXCLUDED(mu);
  /// The outcome recorded so far.
  Status outcome() ABSL_LOCKS_EXCLUDED(mu);
};

/// Whether no clock orders request `h`: it has no staleness bound, or no job size (the
/// staleness gate, Consistency::AdmitOrPark, lets such a read through at once).
inline bool NoClockOrder(const Header& h) { return h.staleness < 0 || h.num_workers == 0; }

/// A sparse pull that no clock orders: the lanes and the log wait may serve it ahead of pushes
/// of other connections (Task::Pass::kRead, FlushStagedServingReads).
inline bool UnorderedSparsePull(const Header& h) {
  return h.op == Op::kSparsePull && NoClockOrder(h);
}

/// The bytes of `p`'s data frames (what a request waiting somewhere holds).
inline uint64_t FrameBytes(const Pending& p) {
  uint64_t n = 0;
  for (const zmq::message_t& f : p.frames) n += f.size();
  return n;
}

/// Sends the reply of a finished request over `sock` (the ROUTER, or an inproc PUSH to the
/// I/O thread): its status, and its data or text frame when it succeeded.
void SendReply(zmq::socket_t& sock, Pending& p);

/// Marks one part of `p` finished with `s` and, when it was the last, replies over `sock`.
void FinishPart(Pending& p, const Status& s, zmq::socket_t& sock);

/// Index of the first NaN or infinity in v[0..n), or kAllFinite.
inline constexpr uint64_t kAllFinite = ~uint64_t{0};
uint64_t FirstNonFinite(const float* v, uint64_t n);

/// The request's key indices each lane serves: by_lane[l] lists, in request order, the indices
/// of the keys whose slot lane l owns.
using KeySplit = std::vector<std::vector<uint32_t>>;

/// Splits keys[0..n) by lane over `lanes` lanes. With `owner` set, every key's slot must belong
/// to server `rank` under that map: the first key that does not stops the split and its index
/// is returned; kAllOwned otherwise.
inline constexpr uint64_t kAllOwned = ~uint64_t{0};
uint64_t SplitKeysByLane(const uint64_t* keys, uint64_t n, uint32_t lanes, const SlotMap* owner,
                         uint32_t rank, KeySplit* out);

/// One chunk's part of a dense range: elements [begin, end) of chunk `chunk`, which are
/// elements [pos, pos + end - begin) of the request.
struct DenseSegment {
  uint64_t chunk;
  uint32_t begin, end;
  uint64_t pos;
};
using DenseSplit = std::vector<std::vector<DenseSegment>>;

/// Splits elements [offset, offset + count) of dense table `table` into chunk segments, by
/// the lane that owns each chunk.
DenseSplit SplitDenseByLane(uint64_t table, uint64_t offset, uint64_t count, uint32_t lanes);

}  // namespace tessera::internal
