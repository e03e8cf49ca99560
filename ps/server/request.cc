#include <chrono>
#include <zmq_addon.hpp>

#include "ps/server/request_internal.h"
#include "ps/server/server_metrics_internal.h"
#include "ps/vector_clones_internal.h"

namespace tessera::internal {

uint32_t NowSeconds() {
  return static_cast<uint32_t>(std::chrono::duration_cast<std::chrono::seconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
}

void Pending::Fail(const Status& s) {
  MutexLock l(mu);
  if (status.ok()) status = s;
}

Status Pending::outcome() {
  MutexLock l(mu);
  return status;
}

void SendReply(zmq::socket_t& sock, Pending& p) {
  const Status status = p.outcome();
  Header h;
  h.request_id = p.header.request_id;
  h.op = p.header.op;
  h.table_id = p.header.table_id;
  h.worker_id = p.header.worker_id;
  h.status = status.code();
  h.message = status.message();
  std::vector<zmq::message_t> parts;
  parts.push_back(std::move(p.identity));
  std::string text;
  if (status.ok() && !p.text.empty()) {
    // Text can outgrow an envelope (a line per table): it travels as a data frame.
    for (auto& t : p.text) text += t;
    h.elem_type = ElemType::kBytes;
    h.count = 1;
  }
  std::string env;
  if (status.ok() && p.has_out) {
    h.elem_type = ElemType::kF32;
    h.count = p.header.count;
    h.dim = p.header.dim;
    h.offset = p.header.offset;
  }
  EncodeHeader(h, &env);
  parts.emplace_back(env.data(), env.size());
  if (status.ok() && p.has_out) {
    if (!p.lane_frames.empty()) {
      std::string index;
      for (const auto& li : p.lane_index) {
        index.append(reinterpret_cast<const char*>(li.data()), li.size() * sizeof(uint64_t));
      }
      parts.emplace_back(index.data(), index.size());
      for (auto& lf : p.lane_frames) {
        for (zmq::message_t& f : lf) parts.push_back(std::move(f));
      }
    } else if (p.out_frames.empty()) {
      parts.push_back(std::move(p.out));
    } else {
      for (zmq::message_t& f : p.out_frames) parts.push_back(std::move(f));
    }
  }
  if (!text.empty()) parts.emplace_back(text.data(), text.size());
  if (p.metrics != nullptr) {
    size_t bytes = 0;
    for (size_t i = 1; i < parts.size(); ++i) bytes += parts[i].size();
    p.metrics->Sent(bytes);
    p.metrics->Completed(p.header.op, status.ok(), p.received);
  }
  try {
    if (!zmq::send_multipart(sock, parts, zmq::send_flags::dontwait)) {
      // The peer's queue is full. The send took nothing (the first frame failed): the
      // identity goes back to `p`, so that the I/O thread can mark the peer stalled.
      p.identity = std::move(parts[0]);
      p.reply_dropped.store(true, std::memory_order_relaxed);
    }
  } catch (const zmq::error_t&) {
    // The peer is gone: nothing else to tell it.
  }
}

void FinishPart(Pending& p, const Status& s, zmq::socket_t& sock) {
  if (!s.ok()) p.Fail(s);
  if (p.parts.Done() && !p.silent) SendReply(sock, p);
}

TESSERA_VECTOR_CLONES
uint64_t FirstNonFinite(const float* v, uint64_t n) {
  // Checks the exponent bits in blocks so that the compiler vectorizes the scan.
  const uint32_t* bits = reinterpret_cast<const uint32_t*>(v);
  constexpr uint64_t kBlock = 1024;
  for (uint64_t b = 0; b < n; b += kBlock) {
    const uint64_t e = std::min(n, b + kBlock);
    uint32_t any = 0;
    for (uint64_t i = b; i < e; ++i) any |= ((bits[i] & 0x7f800000u) == 0x7f800000u);
    if (any) {
      for (uint64_t i = b; i < e; ++i) {
        if ((bits[i] & 0x7f800000u) == 0x7f800000u) return i;
      }
    }
  }
  return kAllFinite;
}

uint64_t SplitKeysByLane(const uint64_t* keys, uint64_t n, uint32_t lanes, const SlotMap* owner,
                         uint32_t rank, KeySplit* out) {
  out->assign(lanes, {});
  for (auto& v : *out) v.reserve(n / lanes + 16);
  for (uint64_t i = 0; i < n; ++i) {
    const uint32_t slot = SlotOfKey(keys[i]);
    if (owner != nullptr && owner->ServerOfSlot(slot) != rank) return i;
    (*out)[LaneOfSlot(slot, lanes)].push_back(static_cast<uint32_t>(i));
  }
  return kAllOwned;
}

DenseSplit SplitDenseByLane(uint64_t table, uint64_t offset, uint64_t count, uint32_t lanes) {
  DenseSplit by_lane(lanes);
  const uint64_t last = offset + count;
  for (uint64_t c = offset / kDenseChunkFloats; c * kDenseChunkFloats < last; ++c) {
    const uint64_t cb = c * kDenseChunkFloats;
    const uint64_t b = std::max(offset, cb), e = std::min(last, cb + kDenseChunkFloats);
    by_lane[LaneOfChunk(table, c, lanes)].push_back(
        DenseSegment{c, static_cast<uint32_t>(b - cb), static_cast<uint32_t>(e - cb), b - offset});
  }
  return by_lane;
}

}  // namespace tessera::internal
