// The small ops that need no lane split, or the same body on every lane: tables, job
// metadata, stats, clocks and barriers.
#include <atomic>
#include <sstream>

#include "ps/limits.h"
#include "ps/optimizer.h"
#include "ps/server/server_impl_internal.h"

namespace tessera::internal {

Status ServerImpl::CreateTable(const std::shared_ptr<Pending>& p) {
  if (!p->header.spec) return Status::InvalidArgument("CreateTable without a spec");
  const TableSpec& spec = *p->header.spec;
  TESSERA_RETURN_IF_ERROR(ValidateTableSpec(spec));
  const uint64_t id = TableIdForName(spec.name);
  TESSERA_ASSIGN_OR_RETURN(bool known, tables_.SameExists(id, spec, "(existing vs requested)"));
  if (known) {
    Header r;
    r.table_id = id;
    r.spec = spec;
    ReplyOk(std::move(p->identity), p->header, r);
    return Status::OK();
  }
  TESSERA_ASSIGN_OR_RETURN(std::optional<std::string> dropping,
                           engine_->GetMeta(kDroppedTablePrefix + std::to_string(id)));
  if (dropping) {
    return Status::FailedPrecondition("table '" + spec.name +
                                      "' was dropped and its drop did not finish (a lane "
                                      "failed): drop it again, then create it");
  }
  TESSERA_RETURN_IF_ERROR(engine_->PutMeta("table/" + std::to_string(id), EncodeTableSpec(spec)));
  tables_.Add(id, spec);
  p->header.table_id = id;
  RunOnAllLanes(
      p, [id, spec](Lane& lane) { return lane.store().AddTable(id, spec); }, false);
  return Status::OK();
}

// DropTable: the table leaves the registry and its record at once, a marker in the same write
// saying that its rows are still to go; every lane then forgets it (writing back what it had not
// written, so that nothing of the table is in flight), and the lane that finishes last deletes
// its rows and layout on disk (DropTableData) and the marker, before the reply. A crash in
// between: RecoverTables finishes the drop at the next start, before any lane reads a row. A
// drop of a name the server does not know runs the same steps (idempotent: a retried drop, or
// one a failure cut short, finishes). Pushes to the table still in flight fail with NotFound.
Status ServerImpl::DropTable(const std::shared_ptr<Pending>& p) {
  const std::string& name = p->header.name;
  if (name.empty() || name.size() > kMaxTableNameLength) {
    return Status::InvalidArgument("DropTable needs a table name of 1.." +
                                   std::to_string(kMaxTableNameLength) + " bytes");
  }
  const uint64_t id = TableIdForName(name);
  const std::string marker = kDroppedTablePrefix + std::to_string(id);
  const MetaWrite begin[] = {{"table/" + std::to_string(id), std::nullopt}, {marker, ""}};
  TESSERA_RETURN_IF_ERROR(engine_->WriteMeta(begin));
  tables_.Remove(id);
  p->header.table_id = id;
  auto left = std::make_shared<std::atomic<uint32_t>>(static_cast<uint32_t>(lanes_.size()));
  StorageEngine* engine = engine_.get();
  RunOnAllLanes(
      p,
      [id, left, engine, marker](Lane& lane) -> Status {
        TESSERA_RETURN_IF_ERROR(lane.store().DropTable(id));
        if (left->fetch_sub(1) != 1) return Status::OK();
        TESSERA_RETURN_IF_ERROR(engine->DropTableData(id));
        const MetaWrite done[] = {{marker, std::nullopt}};
        return engine->WriteMeta(done);
      },
      true);
  return Status::OK();
}

Status ServerImpl::GetTable(const std::shared_ptr<Pending>& p) {
  const std::optional<uint64_t> id = tables_.IdOf(p->header.name);
  if (!id) return Status::NotFound("no table named '" + p->header.name + "'");
  Header r;
  r.table_id = *id;
  r.spec = tables_.find(*id)->second.spec;
  Header req = p->header;
  req.table_id = *id;
  ReplyOk(std::move(p->identity), req, r);
  return Status::OK();
}

Status ServerImpl::MetaOp(const std::shared_ptr<Pending>& p) {
  const Header& h = p->header;
  if (h.name.empty() || h.name.size() > 1024) {
    return Status::InvalidArgument("meta name must have 1..1024 bytes");
  }
  const std::string key = "user/" + h.name;
  if (h.op == Op::kPutMeta) {
    TESSERA_RETURN_IF_ERROR(ExpectFrames(*p, 1));
    if (p->frames[0].size() > (1 << 20)) {
      return Status::ResourceExhausted("meta records are limited to 1 MiB");
    }
    TESSERA_RETURN_IF_ERROR(engine_->PutMeta(key, p->frames[0].to_string_view()));
    migration_.NoteMetaWritten(key);  // newer than a copy a joining server may get (SlotImport)
    ReplyOk(std::move(p->identity), h);
    return Status::OK();
  }
  TESSERA_ASSIGN_OR_RETURN(std::optional<std::string> v, engine_->GetMeta(key));
  Header r;
  r.elem_type = ElemType::kBytes;
  r.count = v ? 1 : 0;
  ReplyOk(std::move(p->identity), h, r, v ? &*v : nullptr);
  return Status::OK();
}

namespace {
// One "table NAME id=... kind=... dim=|length=... optimizer=... lr=..." line per table (Stats).
void AppendTableLines(const TableRegistry& tables, std::ostream& s) {
  for (auto& [id, t] : tables) {
    s << "table " << t.spec.name << " id=" << id
      << " kind=" << (t.spec.kind == TableKind::kSparse ? "sparse" : "dense")
      << (t.spec.kind == TableKind::kSparse ? " dim=" : " length=")
      << (t.spec.kind == TableKind::kSparse ? t.spec.dim : t.spec.length)
      << " optimizer=" << OptimizerKindName(t.spec.optimizer.kind)
      << " lr=" << t.spec.optimizer.learning_rate << "\n";
  }
}
// Exactly-once pushes: retries answered, pushes of clients known nowhere refused, the marks
// held in memory and those spilled to the store (PushDedup).
void WritePushMarkStats(std::ostream& s, const IoCounts& counts, const PushDedup& dedup) {
  s << "retried_pushes " << counts.retried_pushes << "\n"
    << "reads_during_log_write " << counts.reads_during_log_write << "\n"
    << "unknown_client_pushes " << counts.unknown_client_pushes << "\n"
    << "push_marks_in_memory " << dedup.size() << "\n"
    << "push_marks_spilled " << dedup.spilled() << "\n";
}
}  // namespace

// long function: one line per store counter and lane, in the order operators read them.
Status ServerImpl::StatsOp(const std::shared_ptr<Pending>& p) {
  const uint32_t job_workers = consistency_.job_workers();
  std::ostringstream s;
  s << "rank " << options_.rank << "\n"
    << "num_servers " << options_.num_servers << "\n"
    << "lanes " << lanes_.size() << "\n"
    << "tables " << tables_.size() << "\n"
    << "requests " << counts_.requests << "\n"
    << "errors " << counts_.errors << "\n"
    << "pushes " << counts_.pushes << "\n";
  WritePushMarkStats(s, counts_, dedup_);
  s << "map_version " << fence_.version() << "\n"
    << "stale_map_refusals " << fence_.refusals() << "\n"
    << "slot_rows_exported " << migration_.rows_exported.load() << "\n"
    << "slot_rows_imported " << migration_.rows_imported.load() << "\n"
    << "slot_rows_deleted " << migration_.rows_dropped.load() << "\n"
    << "import_parked_now " << migration_.parked_now() << "\n"
    << "import_parked_total " << migration_.parked_total() << "\n"
    << "held_behind_parked_now " << push_order_.held_now() << "\n"
    << "held_behind_parked_total " << push_order_.held_total() << "\n"
    << "replicated_pushes " << repl_.queue.replicated() << "\n"
    << "replication_waiting " << repl_.queue.waiting() << "\n"
    << "failed_replications " << repl_.queue.failed() << "\n"
    << "fenced_replicas " << counts_.fenced_replicas << "\n"
    << "fill_held_total " << repl_.park.fill_held_total() << "\n"
    << "replica_parked_now " << repl_.park.size() << "\n"
    << "replica_resends_dropped " << repl_.park.resends_dropped() << "\n"
    << "replica_held_expired " << repl_.park.expired() << "\n"
    << "replica_refused_ahead " << repl_.park.refused_ahead() << "\n"
    << "map_wait_now " << map_wait_.size() << "\n"
    << "map_wait_total " << map_wait_.held_total() << "\n"
    << "map_wait_resends_dropped " << map_wait_.resends_dropped() << "\n"
    << "map_wait_expired " << map_wait_.expired() << "\n"
    << "fill_exports_waiting " << migration_.exports_waiting() << "\n"
    << "barrier_waiters " << consistency_.barrier_waiters() << "\n"
    << "log_last_seq " << log_->last_seq() << "\n"
    << "log_truncated_to " << log_->truncated() << "\n"
    << "push_keys " << counts_.push_keys << "\n"
    << "pulls " << counts_.pulls << "\n"
    << "pull_keys " << counts_.pull_keys << "\n"
    << "parked_now " << consistency_.parked_now() << "\n"
    << "parked_total " << consistency_.parked_total() << "\n"
    << "job_workers " << job_workers << "\n"
    << "min_clock " << (job_workers ? consistency_.MinClock(job_workers) : 0) << "\n"
    << "max_clock " << consistency_.MaxClock() << "\n"
    << "max_push_clock " << cut_.max_push_clock() << "\n"
    << "checkpoint_pending " << (cut_.pending() ? 1 : 0) << "\n"
    << "restore_queued_batches_max " << restore_credits_.out_max() << "\n"
    << "restore_back_pressure_waits " << restore_credits_.waits() << "\n"
    << "connections " << edge_.connections.open() << "\n"
    << "refused_connections " << counts_.refused_connections << "\n"
    << "idle_connections_displaced " << edge_.connections.idle_displaced() << "\n"
    << "stalled_peers " << edge_.peers.stalled_count() << "\n"
    << "dropped_replies " << counts_.dropped_replies << "\n"
    << "throttled_requests " << counts_.throttled_requests << "\n";
  for (const auto& [name, value] : engine_->EngineStats()) s << name << " " << value << "\n";
  s << metrics_->StatsLines();
  AppendTableLines(tables_, s);
  p->text.assign(lanes_.size() + 1, std::string());
  p->text[0] = s.str();
  Pending* raw = p.get();
  RunOnAllLanes(
      p,
      [raw](Lane& lane) {
        StoreStats st = lane.store().stats();
        std::ostringstream o;
        const std::string l = "lane" + std::to_string(lane.index()) + "_";
        o << l << "rows_in_memory " << st.rows_in_memory << "\n"
          << l << "bytes_in_memory " << st.bytes_in_memory << "\n"
          << l << "lookups " << st.lookups << "\n"
          << l << "memory_hits " << st.memory_hits << "\n"
          << l << "applies " << st.applies << "\n"
          << l << "evicted_rows " << st.evicted_rows << "\n"
          << l << "disk_reads " << st.disk_reads << "\n"
          << l << "admission_rejects " << st.admission_rejects << "\n"
          << l << "write_backs " << st.commits << "\n"
          << l << "rows_written " << st.rows_written << "\n"
          << l << "dirty_bytes " << lane.store().dirty_bytes() << "\n"
          << l << "back_pressure_waits " << lane.back_pressure_waits() << "\n"
          << l << "reads_passed " << lane.reads_passed() << "\n"
          << l << "write_backs_postponed " << lane.write_backs_postponed() << "\n"
          << l << "durable_log_mark " << lane.committed_seq() << "\n";
        std::lock_guard<std::mutex> g(raw->mu);
        raw->text[lane.index() + 1] = o.str();
        return Status::OK();
      },
      false);
  return Status::OK();
}

// A Clock that came after pushes of its connection that wait for this server's map (MapWait)
// waits behind them: it ends their step, for a checkpoint cut and the staleness bound alike.
Status ServerImpl::ClockOp(const std::shared_ptr<Pending>& p) {
  if (p->header.clock < 0) return Status::InvalidArgument("negative clock");
  if (!map_wait_.empty() && map_wait_.HoldsPeer(p->identity) &&
      map_wait_.AdmitBehindPeer(p) == MapWait::Verdict::kHeld) {
    return Status::OK();
  }
  return ApplyClock(p);
}

Status ServerImpl::ApplyClock(const std::shared_ptr<Pending>& p) {
  const Header& h = p->header;
  consistency_.SetClock(h.worker_id, h.clock, h.num_workers);
  ReplyOk(std::move(p->identity), h);
  Readmit(consistency_.TakeParked());
  TakeSnapshotIfReady();
  return Status::OK();
}

Status ServerImpl::BarrierOp(const std::shared_ptr<Pending>& p) {
  const Header& h = p->header;
  if (h.num_workers == 0) return Status::InvalidArgument("barrier with zero workers");
  if (h.name.empty()) return Status::InvalidArgument("barrier without a name");
  if (consistency_.barrier_waiters() >= kMaxBarrierWaiters) {
    return Status::ResourceExhausted("server " + std::to_string(options_.rank) + " holds " +
                                     std::to_string(kMaxBarrierWaiters) +
                                     " barrier waits, its limit");
  }
  for (auto& w : consistency_.Arrive(std::move(p->identity), h)) {
    ReplyOk(std::move(w.identity), w.header);
  }
  return Status::OK();
}

}  // namespace tessera::internal
