// Encoding and decoding of message envelopes (frame 0 of every message).
// FlatBuffers types stay inside codec.cc; callers see plain structs.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "ps/status.h"
#include "ps/table_spec.h"

namespace tessera {

/// Version of the wire protocol this build speaks. A peer with another version is refused.
inline constexpr uint32_t kProtocolVersion = 1;

/// Largest envelope accepted (bytes). Envelopes are small: bulk data travels in other frames.
inline constexpr size_t kMaxEnvelopeBytes = 64 * 1024;

/// Operations. Values match schema/tessera.fbs.
enum class Op : uint8_t {
  kInvalid = 0,
  kPing = 1,
  kCreateTable = 2,
  kGetTable = 3,
  kSparsePull = 4,
  kSparsePush = 5,
  kSparsePushPull = 6,
  kDensePull = 7,
  kDensePush = 8,
  kClock = 9,
  kBarrier = 10,
  kPutMeta = 11,
  kGetMeta = 12,
  kStats = 13,
  kCheckpoint = 14,
  kRestore = 15,
  kExport = 16,
  kSlotExport = 17,
  kSlotImport = 18,
  kSlotDrop = 19,
  kDropTable = 20,
};
inline constexpr uint8_t kMaxOp = 20;

/// The ops that write rows: sparse push, sparse push-pull, dense push.
inline bool IsPush(Op op) {
  return op == Op::kSparsePush || op == Op::kSparsePushPull || op == Op::kDensePush;
}

std::string_view OpName(Op op);

/// Element type of the array frames.
enum class ElemType : uint8_t { kNone = 0, kF32 = 1, kU64 = 2, kBytes = 3 };

/// `dim` of a DensePull request whose sender takes the values as several data frames: one per
/// server chunk (kDenseChunkFloats) the range touches, in order, which a server sends from its
/// table without copying them. 0 (or a server of an older build): one data frame.
inline constexpr uint32_t kDensePullChunkFrames = 1;
/// `dim` of a DensePull request whose sender takes an index frame then frames of several
/// server chunks each (adjacent chunks of one lane, sent from the table without copying), in
/// any order the index gives (docs/wire-protocol.md). A server of an older build answers one
/// frame.
inline constexpr uint32_t kDensePullRunFrames = 2;

/// The decoded envelope. Requests and replies use the same fields (see docs/wire-protocol.md).
struct Header {
  uint32_t version = kProtocolVersion;
  uint64_t request_id = 0;
  Op op = Op::kInvalid;
  uint64_t table_id = 0;
  ElemType elem_type = ElemType::kNone;
  uint64_t count = 0;
  uint32_t dim = 0;
  uint64_t offset = 0;
  uint32_t worker_id = 0;
  int64_t clock = 0;
  int32_t staleness = -1;
  uint32_t num_workers = 0;
  StatusCode status = StatusCode::kOk;
  std::string message;
  std::optional<TableSpec> spec;
  std::string name;
  /// Pushes: the client's id and this push's per-server sequence number (exactly-once
  /// retries); 0: none.
  uint64_t client_id = 0;
  uint64_t client_seq = 0;
  /// Pushes: the table's learning rate is multiplied by this for this push (a learning-rate
  /// schedule, computed by the sender; FTRL ignores it). Servers accept [0, kMaxLrScale].
  float lr_scale = 1.0f;
  /// Data requests: the version of the cluster map the sender routed by; 0: a static cluster
  /// (no fencing). See docs/elasticity.md.
  uint64_t map_version = 0;
  /// Pushes with a client_id: the server (id + 1) whose push sequence of this client
  /// client_seq counts in; 0: the receiving server's own (docs/elasticity.md, fail-over).
  uint32_t client_origin = 0;
  /// Replication: the primary (server id + 1) that forwards this client push to its backup;
  /// 0: a client's request.
  uint32_t replica_from = 0;
};

/// Serializes `h` into `out` (replacing its contents).
void EncodeHeader(const Header& h, std::string* out);

/// Verifies (bounded flatbuffers::Verifier) and decodes an envelope. On a version mismatch the
/// header's request_id and op are still filled so the caller can answer, and the status names
/// both versions.
Status DecodeHeader(const void* data, size_t size, Header* out);

/// A spec as bytes (for durable metadata) and back.
std::string EncodeTableSpec(const TableSpec& spec);
Result<TableSpec> DecodeTableSpec(std::string_view bytes);

}  // namespace tessera
