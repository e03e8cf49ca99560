// ServerImpl's I/O thread (io_loop.cc): the thread and its stop flags, what it counts for stats
// and metrics, and the request it is answering inline.
#pragma once

#include <atomic>
#include <cstdint>
#include <thread>

#include "ps/server/server_metrics_internal.h"

namespace tessera::internal {

struct IoThread {
  std::thread thread;
  std::atomic<bool> stop{false}, stopped{false};
};

// What the I/O thread counted, for stats and metrics.
struct IoCounts {
  uint64_t requests = 0, errors = 0, pushes = 0, push_keys = 0, pulls = 0, pull_keys = 0,
           retried_pushes = 0, unknown_client_pushes = 0;
  // Reads served while a group of pushes was being written to the request log.
  uint64_t reads_during_log_write = 0;
  // Admission (edge_ops.cc), and forwarded pushes a backup refused by its map.
  uint64_t refused_connections = 0, dropped_replies = 0, throttled_requests = 0,
           fenced_replicas = 0;
};

// The request HandleMessage is dispatching, for replies sent on the I/O thread (ReplyOk,
// ReplyError): whether one answered it, whether its header decoded, when it arrived. I/O
// thread only.
struct InlineAnswer {
  bool active = false, answered = false, decoded = false;
  uint64_t request_id = 0;
  ServerMetrics::TimePoint received{};
};

}  // namespace tessera::internal
