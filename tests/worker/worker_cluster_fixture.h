// What the worker tests share around a LocalCluster (tests/cluster_fixture.h): the
// tessera-worker binary, the cluster's server list as --servers takes it, a client that watches
// the job without being one of its workers, and the servers' stats counters.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "ps/client/client.h"
#include "tests/cluster_fixture.h"
#include "tests/worker/worker_process.h"

#ifndef TESSERA_WORKER_BINARY
#error "TESSERA_WORKER_BINARY must name the tessera-worker executable"
#endif

namespace tessera::testing {

/// The cluster's endpoints, comma-separated (tessera-worker --servers).
inline std::string ServerList(const LocalCluster& cluster) {
  std::string servers;
  for (const auto& e : cluster.endpoints()) servers += (servers.empty() ? "" : ",") + e;
  return servers;
}

/// A client of `cluster` that is no worker of the job (worker id 1000: its calls move no
/// clock), for its stats, metadata records and checkpoints (ClientOptions::admin_root).
inline Result<std::unique_ptr<Client>> ConnectObserver(const LocalCluster& cluster) {
  ClientOptions co;
  co.servers = cluster.endpoints();
  co.worker_id = 1000;
  co.admin_root = cluster.admin_root();
  return Client::Create(co);
}

/// Counter `name` of server `rank`'s stats (e.g. "pushes": pushes applied since it started);
/// -1 when the server did not answer within 5 s or has no such line.
inline int64_t ServerStat(Client& client, uint32_t rank, const std::string& name) {
  auto stats = client.ServerStats(rank, DeadlineAfterMs(5000));
  return stats.ok() ? StatValue(*stats, name) : -1;
}

}  // namespace tessera::testing
