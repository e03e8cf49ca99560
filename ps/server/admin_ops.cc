// Checkpoints at a clock cut, restore onto a cluster of any size, serving exports.
#include <glog/logging.h>

#include <algorithm>
#include <filesystem>

#include "ps/optimizer.h"
#include "ps/record_file_internal.h"
#include "ps/server/server_impl_internal.h"
#include "ps/server/snapshot_internal.h"

namespace tessera::internal {
namespace {

// Rows (and dense chunks) of a checkpoint for one lane, and the credit it holds until applied.
struct RestoreBatch {
  std::vector<uint64_t> tables, keys;
  std::vector<RowMeta> metas;
  std::vector<size_t> starts;  // each row's first float in `floats`
  std::vector<float> floats;
  std::vector<bool> dense;
  RestoreCredit credit;
};

Status ApplyRestoreBatch(Lane& lane, const RestoreBatch& b) {
  for (size_t i = 0; i < b.keys.size(); ++i) {
    const float* row = b.floats.data() + b.starts[i];
    TESSERA_RETURN_IF_ERROR(
        b.dense[i] ? lane.store().PutDenseChunk(b.tables[i], b.keys[i], row, b.metas[i])
                   : lane.store().PutRows(b.tables[i], std::span<const uint64_t>(&b.keys[i], 1),
                                          std::span<const float* const>(&row, 1),
                                          std::span<const RowMeta>(&b.metas[i], 1)));
  }
  return Status::OK();
}

// Rows (or dense chunks) per restore batch: ServerOptions::restore_batch_rows, 0 the default.
size_t RestoreBatchRows(const ServerOptions& o) {
  return o.restore_batch_rows != 0 ? o.restore_batch_rows : 65536;
}

// A checkpoint record must be a whole row (or dense chunk) of its table: value and optimizer
// state, of the table's kind, at a chunk index inside the tensor.
Status CheckRestoredRecord(const TableSpec& spec, const Optimizer& opt, const Record& r,
                           const std::string& path) {
  const auto state = [&](uint64_t n) { return opt.StateFloats(static_cast<uint32_t>(n)); };
  const std::string where =
      "record of table '" + spec.name + "' (key " + std::to_string(r.key) + ") in " + path;
  uint64_t want = 0;
  if (r.kind == Record::kSparseRow) {
    if (spec.kind != TableKind::kSparse)
      return Status::Corruption("sparse " + where + ": dense table");
    want = spec.dim + state(spec.dim);
  } else {
    if (spec.kind != TableKind::kDense)
      return Status::Corruption("dense " + where + ": sparse table");
    const uint64_t chunks = (spec.length + kDenseChunkFloats - 1) / kDenseChunkFloats;
    if (r.key >= chunks) {
      return Status::Corruption(where + ": chunk index beyond the " + std::to_string(chunks) +
                                " chunks of the tensor");
    }
    const uint64_t len =
        std::min<uint64_t>(kDenseChunkFloats, spec.length - r.key * kDenseChunkFloats);
    want = len + state(len);
  }
  if (r.row.size() != want) {
    return Status::Corruption(where + " has " + std::to_string(r.row.size()) +
                              " floats, the table's rows have " + std::to_string(want) +
                              " (value and optimizer state)");
  }
  return Status::OK();
}

// The manifest `m` of old server `id` (in `sdir`) must be that server's files of the
// checkpoint `marker` describes: not those of another attempt that left them there.
Status CheckRestoredManifest(const AdminMarker& marker, const std::vector<std::string>& m,
                             uint32_t id, const std::string& sdir) {
  if (m.size() != 4 && m.size() != 5) return Status::Corruption("bad manifest in '" + sdir + "'");
  auto field = [&](const char* key) {
    auto it = marker.fields.find(key);
    return it == marker.fields.end() ? std::string() : it->second;
  };
  const std::string version = m.size() == 5 ? m[4] : std::string();
  if (m[0] != std::to_string(id) || m[2] != field("cut_clock") || version != field("map_version")) {
    return Status::Corruption("'" + sdir + "' holds server " + m[0] + "'s files of cut clock " +
                              m[2] + (version.empty() ? "" : " at map version " + version) +
                              ", not those of the checkpoint (server " + std::to_string(id) +
                              ", cut clock " + field("cut_clock") +
                              (field("map_version").empty() ? "" : ", map version " +
                                                                       field("map_version")) +
                              "): left by another attempt");
  }
  return Status::OK();
}

}  // namespace

std::string ServerImpl::ServerDir(const std::string& dir, uint32_t rank) const {
  return dir + "/server-" + std::to_string(rank);
}

Status ServerImpl::CheckpointOp(const std::shared_ptr<Pending>& p) {
  const Header& h = p->header;
  if (h.count == 1) {  // abort
    // Only the checkpoint it names: a stray abort cannot end another one.
    if (h.name.empty()) {
      return Status::InvalidArgument("a checkpoint abort names the checkpoint it aborts");
    }
    TESSERA_ASSIGN_OR_RETURN(const std::string dir, AdminPath(h.name));
    const CutState* pending = cut_.state();
    if (pending != nullptr && pending->dir == dir) {
      AbortCut(Status::Cancelled("checkpoint aborted"));
    }
    ReplyOk(std::move(p->identity), h);
    return Status::OK();
  }
  if (h.name.empty()) return Status::InvalidArgument("checkpoint without a directory");
  TESSERA_ASSIGN_OR_RETURN(const std::string ckpt_dir, AdminPath(h.name));
  TESSERA_RETURN_IF_ERROR(cut_.CheckIdle());
  TESSERA_RETURN_IF_ERROR(CheckAdminMap(h, "checkpoint"));
  TESSERA_RETURN_IF_ERROR(cut_.CheckNotPassed(h));
  std::error_code ec;
  std::filesystem::create_directories(ServerDir(ckpt_dir, options_.rank), ec);
  if (ec) {
    return Status::IOError("cannot create '" + ServerDir(ckpt_dir, options_.rank) +
                           "': " + ec.message());
  }
  CutState cut{h.clock, h.num_workers, ckpt_dir, p,
               options_.follow_cluster_map ? h.map_version : 0};
  const uint32_t timeout_ms =
      options_.checkpoint_cut_timeout_ms != 0 ? options_.checkpoint_cut_timeout_ms : 120000;
  cut.deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  cut_.Begin(std::move(cut));
  TakeSnapshotIfReady();
  return Status::OK();
}

// The writing of a checkpoint's tables, meta and manifest files, gathered now.
Result<std::function<Status()>> ServerImpl::CheckpointHeader(const std::string& dir,
                                                              int64_t cut, uint64_t version) {
  std::vector<std::string> specs;
  for (auto& [id, t] : tables_) specs.push_back(EncodeTableSpec(t.spec));
  std::vector<std::string> meta;
  TESSERA_RETURN_IF_ERROR(engine_->ScanMeta("user/", [&](std::string_view k, std::string_view v) {
    meta.emplace_back(k);
    meta.emplace_back(v);
  }));
  std::vector<std::string> manifest = {std::to_string(options_.rank),
                                       std::to_string(ClusterSize()), std::to_string(cut),
                                       std::to_string(lanes_.size())};
  if (options_.follow_cluster_map) manifest.push_back(std::to_string(version));
  return std::function<Status()>([dir, specs = std::move(specs), meta = std::move(meta),
                                  manifest = std::move(manifest)]() -> Status {
    TESSERA_RETURN_IF_ERROR(WriteBlobs(dir + "/tables", specs));
    TESSERA_RETURN_IF_ERROR(WriteBlobs(dir + "/meta", meta));
    return WriteBlobs(dir + "/manifest", manifest);
  });
}

void ServerImpl::TakeSnapshotIfReady() {
  // Taken once every worker has finished the steps up to the cut.
  const CutState* pending = cut_.state();
  if (pending == nullptr) return;
  const uint32_t workers = cut_.Workers(consistency_.job_workers());
  if (pending->num_workers > 0 && consistency_.MinClock(workers) < pending->cut + 1) return;
  // ReleaseReady calls again.
  if (pending->num_workers > 0 && repl_.queue.WaitsForPushUpTo(pending->cut)) return;
  // A push of a step up to the cut that waits for this server's map (MapWait) would reach the
  // lanes after the files: the cut waits, and the map's arrival aborts it (AbortCutOnMapChange),
  // as does the push's expiry (ExpireMapWait). Taken meanwhile, the cut missed that step's
  // pushes (CheckpointMapTest.ACheckpointAfterAFailoverHoldsTheCutOnceAndRestoresWithBackups,
  // about 1 run in 5).
  if (pending->num_workers > 0 &&
      map_wait_.Any([this](const Header& h) { return cut_.Covers(h); })) {
    return;
  }
  CutState cut = std::move(*cut_.Take());
  const std::string dir = ServerDir(cut.dir, options_.rank);
  auto header = CheckpointHeader(dir, cut.cut, cut.map_version);
  if (!header.ok()) {
    ReplyError(std::move(cut.request->identity), cut.request->header, header.status());
  } else {
    // Lanes run tasks in order: each freezes its rows before it sees any released push.
    LOG(INFO) << "checkpoint at clock " << cut.cut << " into " << dir;
    SnapshotOptions so;
    so.filter = PrimaryRowsFilter();
    WriteLaneSnapshots(cut.request, dir, so, std::move(*header));
  }
  Readmit(cut_.TakeParked());
}

// The specs of the checkpoint's server directory `server_dir`, created here.
Result<std::vector<std::pair<uint64_t, TableSpec>>> ServerImpl::RestoreTables(
    const std::string& server_dir) {
  // Every old server holds every spec: read one's.
  TESSERA_ASSIGN_OR_RETURN(auto specs, ReadBlobs(server_dir + "/tables", edge_.admin_root));
  std::vector<std::pair<uint64_t, TableSpec>> restored;
  std::vector<bool> known;
  // Every spec is checked before any table is added: a refused restore adds none (it added
  // the tables before the one refused, to this thread's list but to no lane).
  for (const auto& b : specs) {
    TESSERA_ASSIGN_OR_RETURN(TableSpec spec, DecodeTableSpec(b));
    TESSERA_RETURN_IF_ERROR(ValidateStoredTableSpec(spec));
    const uint64_t id = TableIdForName(spec.name);
    TESSERA_ASSIGN_OR_RETURN(bool exists, tables_.SameExists(id, spec, "than the checkpoint's"));
    known.push_back(exists);
    restored.emplace_back(id, spec);
  }
  for (size_t i = 0; i < restored.size(); ++i) {
    if (known[i]) continue;
    const auto& [id, spec] = restored[i];
    TESSERA_RETURN_IF_ERROR(
        engine_->PutMeta("table/" + std::to_string(id), EncodeTableSpec(spec)));
    tables_.Add(id, spec);
  }
  return restored;
}

Status ServerImpl::RestoreRows(
    const std::string& dir, const AdminMarker& marker,
    const std::function<void(uint32_t, std::function<Status(Lane&)>)>& submit, uint64_t* loaded) {
  // Rows, in batches per lane. A queued batch holds a credit of restore_credits_ until its
  // lane has applied it and its copy of the rows is freed: the reader waits for one before it
  // queues the next, so memory stays bounded whatever the checkpoint's size.
  constexpr size_t kBatchFloats = (size_t{16} << 20) / sizeof(float);
  const size_t batch_rows = RestoreBatchRows(options_);
  const uint32_t nl = static_cast<uint32_t>(lanes_.size());
  std::vector<std::shared_ptr<RestoreBatch>> batches(nl);
  auto flush = [&](uint32_t l) -> Status {
    if (!batches[l] || batches[l]->keys.empty()) return Status::OK();
    // Cancelled when the server stops meanwhile: Shutdown joins this thread, not the restore.
    TESSERA_RETURN_IF_ERROR(restore_credits_.Acquire(io_.stop));
    auto b = std::move(batches[l]);
    batches[l].reset();
    b->credit = RestoreCredit(&restore_credits_);
    submit(l, [b](Lane& lane) {
      Status s = ApplyRestoreBatch(lane, *b);
      // The rows are in the lane's store now: their copy and the credit go at once, not after
      // the lane's other tasks and commit, so the reader reads on meanwhile.
      *b = RestoreBatch();
      return s;
    });
    return Status::OK();
  };
  absl::flat_hash_map<uint64_t, std::unique_ptr<Optimizer>> optimizers;
  const RowFilter held = HeldRows(/*with_backups=*/true);
  auto visit = [&](const std::string& path, const Record& r) -> Status {
    auto t = tables_.find(r.table_id);
    if (t == tables_.end()) return Status::Corruption("row of an unknown table in " + path);
    // Lanes copy exactly a row's floats (value + optimizer state) from these records.
    auto& opt = optimizers[r.table_id];
    if (!opt) opt = Optimizer::Make(t->second.spec.optimizer);
    TESSERA_RETURN_IF_ERROR(CheckRestoredRecord(t->second.spec, *opt, r, path));
    const bool dense = r.kind == Record::kDenseChunk;
    if (dense ? !held.KeepChunk(r.table_id, r.key) : !held.KeepRow(r.key)) return Status::OK();
    const uint32_t lane =
        dense ? LaneOfChunk(r.table_id, r.key, nl) : LaneOfSlot(SlotOfKey(r.key), nl);
    if (!batches[lane]) batches[lane] = std::make_shared<RestoreBatch>();
    RestoreBatch& b = *batches[lane];
    b.tables.push_back(r.table_id);
    b.keys.push_back(r.key);
    b.metas.push_back(RowMeta{r.meta.update_count, r.meta.last_step, r.meta.last_update_s});
    b.starts.push_back(b.floats.size());
    b.floats.insert(b.floats.end(), r.row.begin(), r.row.end());
    b.dense.push_back(dense);
    ++*loaded;
    if (b.keys.size() >= batch_rows || b.floats.size() >= kBatchFloats) {
      TESSERA_RETURN_IF_ERROR(flush(lane));
    }
    return Status::OK();
  };
  for (uint32_t old : marker.server_ids) {
    const std::string sdir = ServerDir(dir, old);
    TESSERA_ASSIGN_OR_RETURN(auto oinfo, ReadBlobs(sdir + "/manifest", edge_.admin_root));
    TESSERA_RETURN_IF_ERROR(CheckRestoredManifest(marker, oinfo, old, sdir));
    TESSERA_ASSIGN_OR_RETURN(uint64_t old_lanes,
                             ParseStoredNumber(oinfo[3], "lanes in the checkpoint", 256));
    for (uint32_t ol = 0; ol < old_lanes; ++ol) {
      const std::string path = sdir + "/lane-" + std::to_string(ol);
      TESSERA_RETURN_IF_ERROR(
          ReadRecordFile(path, [&](const Record& r) -> Status { return visit(path, r); },
                         edge_.admin_root));
    }
  }
  for (uint32_t l = 0; l < nl; ++l) TESSERA_RETURN_IF_ERROR(flush(l));
  return Status::OK();
}

Status ServerImpl::RestoreOp(const std::shared_ptr<Pending>& p) {
  // Loads a checkpoint taken by a cluster of any size: every server reads every old server's
  // files and keeps the rows its slots (and dense ranges) now own, as primary or backup.
  TESSERA_RETURN_IF_ERROR(CheckAdminMap(p->header, "restore"));
  TESSERA_ASSIGN_OR_RETURN(const std::string dir, AdminPath(p->header.name));
  auto marker = ReadAdminMarker(dir + "/CHECKPOINT", "checkpoint", edge_.admin_root);
  if (marker.status().code() == StatusCode::kNotFound) {
    return Status::NotFound("'" + p->header.name + "' holds no complete checkpoint (no " +
                            "CHECKPOINT file)");
  }
  TESSERA_RETURN_IF_ERROR(marker.status());
  const std::string first = ServerDir(dir, marker->server_ids.front());
  TESSERA_ASSIGN_OR_RETURN(auto restored, RestoreTables(first));
  // The request's guard part keeps the reply back until every batch is handed out; on an
  // error below the guard is never dropped and the error is the only reply.
  auto submit = [&](uint32_t lane, std::function<Status(Lane&)> fn) {
    p->parts.Add();
    lanes_[lane]->Submit(Task{p, std::move(fn), true});
  };
  for (uint32_t l = 0; l < lanes_.size(); ++l) {
    submit(l, [restored](Lane& lane) -> Status {
      for (auto& [id, spec] : restored) TESSERA_RETURN_IF_ERROR(lane.store().AddTable(id, spec));
      return Status::OK();
    });
  }
  // The metadata records live on server 0 of a static cluster, on every server under a map.
  if (options_.rank == 0 || options_.follow_cluster_map) {
    TESSERA_ASSIGN_OR_RETURN(auto meta, ReadBlobs(first + "/meta", edge_.admin_root));
    for (size_t i = 0; i + 1 < meta.size(); i += 2) {
      TESSERA_RETURN_IF_ERROR(engine_->PutMeta(meta[i], meta[i + 1]));
    }
  }
  uint64_t loaded = 0;
  LOG(INFO) << "restoring from " << dir << " (batches of " << RestoreBatchRows(options_)
            << " rows, at most " << restore_credits_.limit() << " queued to the lanes)";
  Status rows = RestoreRows(dir, *marker, submit, &loaded);
  if (!rows.ok()) {
    // The rows read so far stay (restoring again overwrites them).
    LOG(WARNING) << "restore from " << dir << " stopped after " << loaded
                 << " rows/chunks: " << rows.ToString();
    return rows;
  }
  LOG(INFO) << "restored " << loaded << " rows/chunks from " << dir << " ("
            << marker->server_ids.size() << " servers; at most " << restore_credits_.out_max()
            << " batches queued, the reader waited " << restore_credits_.waits() << " times)";
  FinishPart(*p, Status::OK(), router_);  // the guard
  NoteDroppedReply(*p);
  return Status::OK();
}

Status ServerImpl::ExportOp(const std::shared_ptr<Pending>& p) {
  // Values only, of every row (full) or of the rows updated since this server's previous
  // export (delta; rows updated in that export's second are included again).
  const Header& h = p->header;
  if (h.name.empty()) return Status::InvalidArgument("export without a directory");
  TESSERA_ASSIGN_OR_RETURN(const std::string export_dir, AdminPath(h.name));
  TESSERA_RETURN_IF_ERROR(CheckAdminMap(h, "export"));
  const bool delta = h.count == 1;
  uint32_t since = 0;
  if (delta) {
    // The base export (version h.offset, a sibling directory): the delta holds the rows
    // updated since it started.
    std::string parent = std::filesystem::path(h.name).parent_path().string();
    TESSERA_ASSIGN_OR_RETURN(const std::string base,
                             AdminPath((parent.empty() ? std::string() : parent + "/") + "v" +
                                       std::to_string(h.offset)));
    TESSERA_ASSIGN_OR_RETURN(since, DeltaSince(base));
  }
  const uint32_t now = NowSeconds();
  const std::string dir = ServerDir(export_dir, options_.rank);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Status::IOError("cannot create '" + dir + "': " + ec.message());
  std::vector<std::string> specs;
  for (auto& [id, spec] : tables_.List()) specs.push_back(EncodeTableSpec(spec));
  std::vector<std::string> manifest = {std::to_string(options_.rank),
                                       std::to_string(ClusterSize()), std::to_string(since),
                                       std::to_string(lanes_.size()), std::to_string(now)};
  SnapshotOptions so;
  so.values_only = true;
  so.min_update_s = since;
  so.filter = PrimaryRowsFilter();
  WriteLaneSnapshots(p, dir, so,
                     [dir, specs = std::move(specs), manifest = std::move(manifest)]() -> Status {
                       TESSERA_RETURN_IF_ERROR(WriteBlobs(dir + "/tables", specs));
                       return WriteBlobs(dir + "/manifest", manifest);
                     });
  return Status::OK();
}

// The start time a delta export over base export `base` takes rows from: the earliest of
// its servers' (a row may have moved from one to another since).
Result<uint32_t> ServerImpl::DeltaSince(const std::string& base) {
  // Each server of the base export recorded when it started; a row that moved to this server
  // since was exported by another one, so the delta starts at the earliest of them (rows
  // updated in that second are included again).
  TESSERA_ASSIGN_OR_RETURN(AdminMarker marker,
                           ReadAdminMarker(base + "/EXPORT", "export", edge_.admin_root));
  uint64_t since = UINT32_MAX;
  for (uint32_t id : marker.server_ids) {
    const std::string sdir = ServerDir(base, id);
    TESSERA_ASSIGN_OR_RETURN(auto info, ReadBlobs(sdir + "/manifest", edge_.admin_root));
    if (info.size() < 5) return Status::Corruption("the manifest of '" + sdir + "' is incomplete");
    TESSERA_ASSIGN_OR_RETURN(uint64_t t, ParseStoredNumber(info[4], "export start time"));
    since = std::min(since, t);
  }
  return static_cast<uint32_t>(since);
}

// Every lane freezes its rows; the file writer writes them to `dir`/lane-<i>, and runs
// `header` (files beside them), all parts of `p`.
void ServerImpl::WriteLaneSnapshots(const std::shared_ptr<Pending>& p, const std::string& dir,
                                    const SnapshotOptions& options,
                                    std::function<Status()> header) {
  // A lane pauses only to take its snapshot (copy-on-write, or a RocksDB snapshot plus the
  // rows not yet written back); the file writer thread writes and fsyncs the files, one more
  // part of the request per lane, and the header files (lane 0 hands them over: an fsync on
  // the I/O thread stalled every request, 10-70 ms while the disk was busy).
  auto tables = tables_.List();
  FileWriter* writer = writer_.get();
  Pending* raw = p.get();
  auto shared_header = std::make_shared<std::function<Status()>>(std::move(header));
  RunOnAllLanes(
      p,
      [raw, p, dir, tables, writer, options, shared_header](Lane& lane) -> Status {
        if (lane.index() == 0 && *shared_header) {
          raw->parts.Add();
          writer->Submit(p, std::move(*shared_header));
        }
        TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<LaneSnapshot> snapshot,
                                 lane.store().TakeSnapshot());
        const std::string path = dir + "/lane-" + std::to_string(lane.index());
        raw->parts.Add();
        // The lane's periodic write-back waits while the writer scans (Lane::
        // SnapshotBeingWritten); the guard goes with the job, run or dropped.
        writer->Submit(p, [snapshot, tables, path, options,
                           writing = lane.SnapshotBeingWritten()] {
          return WriteLaneSnapshot(*snapshot, tables, path, options);
        });
        return Status::OK();
      },
      false);
}

}  // namespace tessera::internal
