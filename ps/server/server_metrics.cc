#include "ps/server/server_metrics_internal.h"

#include <algorithm>
#include <sstream>

namespace tessera::internal {
namespace {

using metrics::Registry;
using Samples = std::vector<Registry::Sample>;

// "SparsePush" -> "sparse_push": label values in Prometheus' usual style.
std::string SnakeCase(std::string_view camel) {
  std::string out;
  for (char c : camel) {
    if (c >= 'A' && c <= 'Z') {
      if (!out.empty()) out += '_';
      out += static_cast<char>(c - 'A' + 'a');
    } else {
      out += c;
    }
  }
  return out;
}

// Request latency: 50 us to 26 s, doubling.
std::vector<double> LatencyBuckets() { return metrics::ExponentialBuckets(50e-6, 2, 20); }

}  // namespace

ServerMetrics::ServerMetrics(metrics::Registry& registry, uint32_t rank, uint32_t num_servers,
                             uint32_t lanes)
    : registry_(registry) {
  for (uint8_t i = 1; i <= kMaxOp; ++i) {
    const metrics::Labels op{{"op", SnakeCase(OpName(static_cast<Op>(i)))}};
    ops_[i].requests = &registry.AddCounter(
        "tessera_server_requests_total", "Requests received, by op.", op);
    ops_[i].errors = &registry.AddCounter(
        "tessera_server_request_errors_total", "Requests answered with an error, by op.", op);
    ops_[i].seconds = &registry.AddHistogram(
        "tessera_server_request_duration_seconds",
        "From a request's arrival to its reply being queued, by op (parked time included).",
        op, LatencyBuckets());
  }
  const metrics::Labels invalid{{"op", "invalid"}};
  invalid_requests_ = &registry.AddCounter("tessera_server_requests_total",
                                           "Requests received, by op.", invalid);
  invalid_errors_ = &registry.AddCounter("tessera_server_request_errors_total",
                                         "Requests answered with an error, by op.", invalid);
  received_bytes_ = &registry.AddCounter("tessera_server_received_bytes_total",
                                         "Bytes of requests received (all frames).");
  sent_bytes_ = &registry.AddCounter("tessera_server_sent_bytes_total",
                                     "Bytes of replies sent (all frames).");
  registry
      .AddGauge("tessera_server_info", "Constant 1, labelled with the server's place and build.",
                {{"rank", std::to_string(rank)},
                 {"num_servers", std::to_string(num_servers)},
                 {"version", TESSERA_VERSION_STRING}})
      .Set(1);
  registry
      .AddGauge("tessera_server_start_time_seconds", "Start time of the server, Unix seconds.")
      .Set(std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
               .count());
  for (uint32_t l = 0; l < lanes; ++l) lanes_.push_back(std::make_unique<LaneMirror>());
  AddLaneCollectors();
  AddIoCollectors();
  AddTableCollectors();
}

ServerMetrics::~ServerMetrics() { registry_.RemoveCollectors(this); }

void ServerMetrics::Received(const Op* op, size_t bytes) {
  received_bytes_->Inc(bytes);
  const auto i = op ? static_cast<uint8_t>(*op) : 0;
  if (i == 0 || i > kMaxOp) {
    invalid_requests_->Inc();
  } else {
    ops_[i].requests->Inc();
  }
}

void ServerMetrics::Completed(Op op, bool ok, TimePoint received) {
  const auto i = static_cast<uint8_t>(op);
  if (i == 0 || i > kMaxOp) {
    if (!ok) invalid_errors_->Inc();
    return;
  }
  if (!ok) ops_[i].errors->Inc();
  ops_[i].seconds->Observe(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - received).count());
}

std::string ServerMetrics::StatsLines() const {
  std::ostringstream o;
  o << "version " << TESSERA_VERSION_STRING << "\n"
    << "uptime_s "
    << std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() -
                                                        started_)
           .count()
    << "\n";
  for (uint8_t i = 1; i <= kMaxOp; ++i) {
    const PerOp& op = ops_[i];
    if (op.requests->value() == 0) continue;
    const std::vector<uint64_t> counts = op.seconds->bucket_counts();
    uint64_t total = 0;
    for (uint64_t c : counts) total += c;
    // The upper bound of the bucket holding quantile q (the last bound for the +Inf bucket).
    auto quantile_ms = [&](double q) {
      const auto& bounds = op.seconds->upper_bounds();
      uint64_t seen = 0;
      for (size_t b = 0; b < counts.size(); ++b) {
        seen += counts[b];
        if (total > 0 && static_cast<double>(seen) >= q * static_cast<double>(total)) {
          return 1e3 * bounds[std::min(b, bounds.size() - 1)];
        }
      }
      return 0.0;
    };
    o << "op_" << SnakeCase(OpName(static_cast<Op>(i))) << " requests=" << op.requests->value()
      << " errors=" << op.errors->value() << " p50_ms=" << quantile_ms(0.5)
      << " p99_ms=" << quantile_ms(0.99) << "\n";
  }
  return o.str();
}

void ServerMetrics::PublishLane(uint32_t l, const StoreStats& st,
                                std::vector<TableMemory> tables, uint64_t dirty_bytes,
                                uint64_t back_pressure_waits, uint64_t durable_log_mark) {
  if (l >= lanes_.size()) return;
  LaneMirror& m = *lanes_[l];
  {
    MutexLock g(m.tables_mu);
    m.tables = std::move(tables);
  }
  constexpr auto r = std::memory_order_relaxed;
  m.rows.store(st.rows_in_memory, r);
  m.bytes.store(st.bytes_in_memory, r);
  m.lookups.store(st.lookups, r);
  m.memory_hits.store(st.memory_hits, r);
  m.applies.store(st.applies, r);
  m.apply_memory_hits.store(st.apply_memory_hits, r);
  m.evicted.store(st.evicted_rows, r);
  m.disk_reads.store(st.disk_reads, r);
  m.budget_evictions.store(st.budget_evictions, r);
  m.admission_rejects.store(st.admission_rejects, r);
  m.write_backs.store(st.commits, r);
  m.rows_written.store(st.rows_written, r);
  m.dirty_bytes.store(dirty_bytes, r);
  m.back_pressure_waits.store(back_pressure_waits, r);
  m.durable_log_mark.store(durable_log_mark, r);
}

void ServerMetrics::PublishIo(IoState s) {
  MutexLock l(io_mu_);
  io_ = std::move(s);
}

void ServerMetrics::AddLaneCollectors() {
  // Per lane, from the mirrors the lanes publish.
  auto lane = [this](const char* name, const char* help, Registry::Type type,
                     std::atomic<uint64_t> LaneMirror::*field) {
    registry_.AddCollector(this, name, help, type, [this, field] {
      Samples out;
      for (size_t l = 0; l < lanes_.size(); ++l) {
        out.push_back({{{"lane", std::to_string(l)}},
                       static_cast<double>(((*lanes_[l]).*field).load(std::memory_order_relaxed))});
      }
      return out;
    });
  };
  const auto G = Registry::Type::kGauge, C = Registry::Type::kCounter;
  lane("tessera_storage_rows_in_memory", "Rows in the memory tier, by lane.", G,
       &LaneMirror::rows);
  lane("tessera_storage_memory_bytes", "Bytes the memory tier uses, by lane.", G,
       &LaneMirror::bytes);
  lane("tessera_storage_lookups_total", "Rows looked up (pulls), by lane.", C,
       &LaneMirror::lookups);
  lane("tessera_storage_memory_hits_total",
       "Lookups answered from the memory tier, by lane (hit rate: over lookups).", C,
       &LaneMirror::memory_hits);
  lane("tessera_storage_applies_total", "Rows updated by pushes, by lane.", C,
       &LaneMirror::applies);
  lane("tessera_storage_apply_memory_hits_total",
       "Row updates whose row was in the memory tier, by lane.", C,
       &LaneMirror::apply_memory_hits);
  lane("tessera_storage_evicted_rows_total", "Rows deleted by tables' eviction policies.", C,
       &LaneMirror::evicted);
  lane("tessera_storage_disk_reads_total", "Rows read back from RocksDB, by lane.", C,
       &LaneMirror::disk_reads);
  lane("tessera_storage_budget_evictions_total",
       "Rows dropped from memory to stay within the budget (still on disk), by lane.", C,
       &LaneMirror::budget_evictions);
  lane("tessera_storage_admission_rejects_total",
       "Rows read from disk but not let into the memory tier (seen less often than the rows "
       "they would replace), by lane.",
       C, &LaneMirror::admission_rejects);
  lane("tessera_storage_write_backs_total", "Write-back batches handed to the writer, by lane.",
       C, &LaneMirror::write_backs);
  lane("tessera_storage_rows_written_total", "Rows (and dense chunks) written back, by lane.",
       C, &LaneMirror::rows_written);
  lane("tessera_storage_dirty_bytes", "Bytes of changed rows not yet written back, by lane.", G,
       &LaneMirror::dirty_bytes);
  lane("tessera_storage_back_pressure_waits_total",
       "Times a lane waited for the writer because of its dirty bytes.", C,
       &LaneMirror::back_pressure_waits);
  lane("tessera_storage_durable_log_mark",
       "Request-log sequence number up to which the lane's rows are on disk.", G,
       &LaneMirror::durable_log_mark);

}

void ServerMetrics::AddIoCollectors() {
  const auto G = Registry::Type::kGauge, C = Registry::Type::kCounter;
  auto io = [this]<typename T>(const char* name, const char* help, Registry::Type type,
                               T IoState::*field) {
    registry_.AddCollector(this, name, help, type, [this, field] {
      MutexLock l(io_mu_);
      return Samples{{{}, static_cast<double>(io_.*field)}};
    });
  };
  io("tessera_server_tables", "Tables on the server.", G, &IoState::tables);
  io("tessera_server_connections", "Client connections open.", G, &IoState::connections);
  io("tessera_server_parked_requests", "Requests waiting for the staleness bound or a cut.", G,
     &IoState::parked);
  io("tessera_server_stalled_peers", "Clients whose reply queue is full.", G,
     &IoState::stalled_peers);
  io("tessera_server_min_clock", "Slowest worker's clock (bounded staleness).", G,
     &IoState::min_clock);
  io("tessera_server_max_clock", "Fastest worker's clock.", G, &IoState::max_clock);
  io("tessera_server_max_push_clock", "Highest clock a push carried (-1: none).", G,
     &IoState::max_push_clock);
  io("tessera_server_log_last_seq", "Last request-log sequence number.", G,
     &IoState::log_last_seq);
  io("tessera_server_log_truncated_to", "Request log truncated up to this sequence number.", G,
     &IoState::log_truncated_to);
  io("tessera_server_checkpoint_pending", "1 while a checkpoint waits for its cut.", G,
     &IoState::checkpoint_pending);
  io("tessera_server_restore_queued_batches_max",
     "Most restore batches queued to the lanes at once (--restore_max_queued_batches bounds "
     "it).",
     G, &IoState::restore_queued_batches_max);
  io("tessera_server_restore_back_pressure_waits_total",
     "Times a restore's checkpoint reader waited for a lane to apply a batch.", C,
     &IoState::restore_back_pressure_waits);
  io("tessera_server_refused_connections_total", "Connections over --max_connections.", C,
     &IoState::refused_connections);
  io("tessera_server_dropped_replies_total", "Replies dropped: the client's queue was full.", C,
     &IoState::dropped_replies);
  io("tessera_server_throttled_requests_total",
     "Requests refused or dropped by the in-flight and stalled-client limits.", C,
     &IoState::throttled_requests);
  io("tessera_server_retried_pushes_total", "Pushes answered as retries (exactly once).", C,
     &IoState::retried_pushes);
  io("tessera_server_unknown_client_pushes_total",
     "Pushes refused Aborted: their client is known neither in memory nor in the store and "
     "the push is not its first (the client renumbers).",
     C, &IoState::unknown_client_pushes);
  io("tessera_server_push_marks_in_memory", "Clients whose push marks are held in memory.", G,
     &IoState::push_marks_in_memory);
  io("tessera_server_push_marks_spilled_total",
     "Push marks written to the store past --push_dedup_max_clients (kept, not forgotten).", C,
     &IoState::push_marks_spilled);
  io("tessera_server_idle_connections_displaced_total",
     "Idle connections that gave their place to one that needed it.", C,
     &IoState::idle_connections_displaced);
  io("tessera_server_replica_held_expired_total",
     "Forwarded pushes answered Unavailable after waiting their hold limit on the backup.", C,
     &IoState::replica_held_expired);
  io("tessera_server_replica_refused_ahead_total",
     "Forwarded pushes refused: their map version is ahead of the newest stored in etcd.", C,
     &IoState::replica_refused_ahead);
  io("tessera_server_push_keys_total", "Keys in sparse pushes (caller keys).", C,
     &IoState::push_keys);
  io("tessera_server_pull_keys_total", "Keys in sparse pulls (caller keys).", C,
     &IoState::pull_keys);
  registry_.AddCollector(
      this, "tessera_storage_engine_bytes",
      "Storage engine memory and files by kind (RocksDB block cache, memtables, table readers, "
      "request log).",
      G, [this] {
        MutexLock l(io_mu_);
        Samples out;
        for (const auto& [name, v] : io_.engine) {
          out.push_back({{{"kind", name}}, static_cast<double>(v)});
        }
        return out;
      });
}

void ServerMetrics::AddTableCollectors() {
  // Per table, summed over the lanes: each lane's figures as of its last maintenance pass, the
  // table's name as of the I/O thread's. A table a lane has not reported yet counts 0 there.
  auto table = [this](const char* name, const char* help, uint64_t TableMemory::*field) {
    registry_.AddCollector(this, name, help, Registry::Type::kGauge, [this, field] {
      std::vector<std::pair<uint64_t, std::string>> names;
      {
        MutexLock l(io_mu_);
        names = io_.table_names;
      }
      std::sort(names.begin(), names.end(),
                [](const auto& a, const auto& b) { return a.second < b.second; });
      std::vector<double> sums(names.size(), 0);
      for (const auto& lane : lanes_) {
        MutexLock g(lane->tables_mu);
        for (const TableMemory& t : lane->tables) {
          for (size_t i = 0; i < names.size(); ++i) {
            if (names[i].first == t.table_id) sums[i] += static_cast<double>(t.*field);
          }
        }
      }
      Samples out;
      for (size_t i = 0; i < names.size(); ++i) {
        out.push_back({{{"table", names[i].second}}, sums[i]});
      }
      return out;
    });
  };
  table("tessera_table_rows_in_memory", "Rows of a table in the memory tier of this server.",
        &TableMemory::rows_in_memory);
  table("tessera_table_memory_bytes", "Bytes of a table in the memory tier of this server.",
        &TableMemory::bytes_in_memory);
}

}  // namespace tessera::internal
