// Moving slots between servers while a job trains (docs/elasticity.md, "Online resharding").
// The controller (tessera-ctl scale) flips a slot to its new primary in the map with the old
// one named as `importing`; the old owner then refuses the slot (fencing) and the new one holds
// requests for it (ParkedByImport). The controller copies the rows: ahead of the flip (SlotExport
// of slots still owned, SlotImport ahead), after it the rows updated since (SlotExport since
// the lane marks, SlotImport rows), marks them in (SlotImport done), and finally SlotDrop on
// the old owner once the map no longer names it.
#include <glog/logging.h>

#include <absl/container/flat_hash_map.h>

#include <algorithm>
#include <cstring>
#include <random>

#include "ps/optimizer.h"
#include "ps/server/server_impl_internal.h"
#include "ps/server/slot_copy_internal.h"
#include "ps/slot_rows.h"

namespace tessera::internal {
namespace {

// SlotImport's `count`: what the request does (0: [slots][rows], the rows of importing slots).
constexpr uint64_t kImportDone = 1;     // [slots]: the copy is in; held requests run
constexpr uint64_t kImportAhead = 2;    // [slots][rows]: rows of slots this server will import
// SlotExport's `count` (0: slots given up; 1: slots still owned, the copy ahead of the flip).
constexpr uint64_t kExportFill = 2;     // slots owned whose backup is being filled (a rebuild)

// The sparse tables a lane visits: id, floats of value and of optimizer state.
struct SparseTable {
  uint64_t id;
  uint32_t dim;
  uint32_t state;
};

// Visits the rows of `slots` in `snapshot` (a lane's TakeSlotSnapshot), table by table.
Status ScanSlots(LaneSnapshot& snapshot, const std::vector<SparseTable>& tables,
                 const std::vector<uint32_t>& slots,
                 const std::function<void(const SparseTable&, uint64_t, const float*,
                                          const float*, const RowMeta&)>& fn) {
  const std::vector<bool> wanted = SlotMask(slots);
  for (const SparseTable& t : tables) {
    TESSERA_RETURN_IF_ERROR(snapshot.Scan(
        t.id, [&](uint64_t key, const float* value, const float* state, const RowMeta& meta) {
          if (wanted[SlotOfKey(key)]) fn(t, key, value, state, meta);
          return true;
        }));
  }
  return Status::OK();
}

// Deletes the rows of `slots` that `lane` holds (SlotDrop: the old owner's copy after a move;
// the new owner's stale rows of an earlier stay, before a move).
Status DeleteSlotRows(Lane& lane, const std::vector<SparseTable>& tables,
                      const std::vector<uint32_t>& slots, std::atomic<uint64_t>* deleted) {
  for (const SparseTable& t : tables) {
    // The store deletes whole slot ranges where it can, without reading them.
    TESSERA_ASSIGN_OR_RETURN(uint64_t n, lane.store().DropSlots(t.id, slots));
    deleted->fetch_add(n, std::memory_order_relaxed);
  }
  return Status::OK();
}

// The sparse tables of `tables`, with their state floats.
std::vector<SparseTable> SparseTables(const std::vector<std::pair<uint64_t, TableSpec>>& tables) {
  std::vector<SparseTable> out;
  for (const auto& [id, spec] : tables) {
    if (spec.kind == TableKind::kSparse) {
      out.push_back({id, spec.dim, Optimizer::Make(spec.optimizer)->StateFloats(spec.dim)});
    }
  }
  return out;
}

// Moved rows by lane, and the tables they bring that the server does not have.
struct ImportPlan {
  std::vector<RowBatch> lanes;
  std::vector<std::pair<uint64_t, TableSpec>> added;
  uint64_t rows = 0;
  // Job metadata records (engine keys under "user/", values).
  std::vector<std::pair<std::string, std::string>> meta;
};

// Checks and sorts SlotImport's rows: each table entry a valid spec under its name's id that
// `known` (SameTableExists) accepts; each row of a sparse table (the server's, `spec_of`, or
// one the rows bring), of the table's floats, and of a slot in `want`.
Status DecodeImport(std::string_view data, const std::vector<bool>& want, uint32_t lanes,
                    const std::function<Result<bool>(uint64_t, const TableSpec&)>& known,
                    const std::function<const TableSpec*(uint64_t)>& spec_of, ImportPlan* plan) {
  auto find = [&](uint64_t id) -> const TableSpec* {
    for (const auto& a : plan->added) {
      if (a.first == id) return &a.second;
    }
    return spec_of(id);
  };
  auto table = [&](uint64_t id, const TableSpec& spec) -> Status {
    TESSERA_RETURN_IF_ERROR(ValidateTableSpec(spec));
    if (TableIdForName(spec.name) != id) {
      return Status::InvalidArgument("slot rows: table '" + spec.name + "' with id " +
                                     std::to_string(id) + ", not its name's id");
    }
    TESSERA_ASSIGN_OR_RETURN(bool exists, known(id, spec));
    if (!exists && find(id) == nullptr) plan->added.emplace_back(id, spec);
    return Status::OK();
  };
  auto row = [&](uint64_t table, uint64_t key, const SlotRowMeta& m, const char* floats,
                 uint32_t n) -> Status {
    const TableSpec* spec = find(table);
    if (spec == nullptr || spec->kind != TableKind::kSparse) {
      return Status::InvalidArgument("slot rows: row of key " + std::to_string(key) +
                                     " of table id " + std::to_string(table) +
                                     ", which is no sparse table here or in the rows");
    }
    const uint32_t expect = spec->dim + Optimizer::Make(spec->optimizer)->StateFloats(spec->dim);
    if (n != expect) {
      return Status::InvalidArgument("slot rows: key " + std::to_string(key) + " of table '" +
                                     spec->name + "' has " + std::to_string(n) +
                                     " floats, its rows have " + std::to_string(expect));
    }
    const uint32_t slot = SlotOfKey(key);
    if (!want[slot]) {
      return Status::InvalidArgument("slot rows: key " + std::to_string(key) + " is of slot " +
                                     std::to_string(slot) + ", not one the request names");
    }
    plan->lanes[LaneOfSlot(slot, lanes)].Add(table, key, m, floats, n);
    ++plan->rows;
    return Status::OK();
  };
  auto meta = [&](std::string_view name, std::string_view value) -> Status {
    if (name.substr(0, 5) != "user/" || name.size() <= 5 || name.size() > 5 + 1024 ||
        value.size() > (size_t{1} << 20)) {
      return Status::InvalidArgument("slot rows: a metadata record '" +
                                     std::string(name.substr(0, 64)) + "' of " +
                                     std::to_string(value.size()) +
                                     " bytes: not a job record (user/NAME, NAME of 1..1024 "
                                     "bytes, at most 1 MiB)");
    }
    plan->meta.emplace_back(name, value);
    return Status::OK();
  };
  return ParseSlotRows(data, {table, row, nullptr, meta});
}

// A SlotExport's lane part (ExportLanes) for the rows of `want`: on the lane, the lane's
// mark (with this process's `instance`) and its rows as they are; off it, the rows of those
// slots written after the mark, only those changed after the lane's step in `since` when the
// controller sent the marks of a first copy (a delta).
ExportFreeze SlotRowsFreeze(std::shared_ptr<const std::vector<uint32_t>> want,
                            std::shared_ptr<std::vector<SparseTable>> tables,
                            std::shared_ptr<std::vector<uint64_t>> since, uint64_t instance) {
  return [want, tables, since, instance](Lane& lane) -> Result<ExportScan> {
    std::string mark;
    AppendSlotMark(&mark, lane.index(), instance, lane.step());
    // Rows keep their step in 32 bits: past that, every row (a complete copy, never less).
    const bool delta = !since->empty() && lane.step() <= UINT32_MAX;
    const uint64_t after = delta ? (*since)[lane.index()] : 0;
    TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<LaneSnapshot> snapshot,
                             lane.store().TakeSlotSnapshot(*want));
    return ExportScan([want, tables, mark = std::move(mark), delta, after, snapshot](
                          std::string* out, uint64_t* n) -> Status {
      *out = mark;
      std::vector<float> row;
      return ScanSlots(*snapshot, *tables, *want,
                       [&](const SparseTable& t, uint64_t key, const float* value,
                           const float* state, const RowMeta& meta) {
                         if (delta && meta.last_step <= after) return;
                         row.assign(value, value + t.dim);
                         row.insert(row.end(), state, state + t.state);
                         AppendSlotRow(
                             out, t.id, key,
                             SlotRowMeta{meta.update_count, meta.last_step, meta.last_update_s},
                             row.data(), static_cast<uint32_t>(row.size()));
                         ++*n;
                       });
    });
  };
}

}  // namespace

uint64_t ServerImpl::RandomInstance() {
  std::random_device rd;
  return (uint64_t{rd()} << 32) ^ rd();
}

// True when client request `p` touches a slot or dense part whose rows are still being
// copied to this server as its (new) primary.
bool ServerImpl::CopyingInRequest(const Pending& p) {
  const Header& h = p.header;
  const ClusterMapState* map = fence_.Current();
  if (map == nullptr) return false;
  if (h.op == Op::kDensePull || h.op == Op::kDensePush) {
    // A client's request for a dense part moving here (a forwarded push for a part whose
    // backup is being filled here waits in the ReplicaPark instead: Dense).
    if (map->dense_filling.empty() || h.replica_from != 0) return false;
    auto t = tables_.find(h.table_id);
    if (t == tables_.end()) return false;
    auto part = DensePartOf(h, t->second.spec.length, t->second.spec.name);
    return part.ok() && DenseHeldForFill(*part);
  }
  if (h.op != Op::kSparsePull && h.op != Op::kSparsePush && h.op != Op::kSparsePushPull) {
    return false;
  }
  if (map->importing.empty() || p.keys == nullptr) return false;
  for (uint64_t i = 0; i < h.count; ++i) {
    const uint32_t slot = SlotOfKey(p.keys[i]);
    if (map->importing[slot] && !migration_.slot_filled(slot)) return true;
  }
  return false;
}

// True when CopyingInRequest(p): it waits in SlotMigration until SlotImport says the copy
// is in (or the map moves), or is refused when too many wait.
bool ServerImpl::ParkedByImport(const std::shared_ptr<Pending>& p) {
  if (!CopyingInRequest(*p)) return false;
  const Header& h = p->header;
  // The bound applies to new requests: one readmitted (it waited already) parks again, since
  // refusing it would strand the pushes of its client held behind it (HeldBehindClient).
  if (!migration_.Park(p, readmitting_)) {
    GiveBackSeq(h, /*resend=*/true);
    ReplyError(std::move(p->identity), h,
               Status::Unavailable("server " + std::to_string(options_.rank) + " holds " +
                                   std::to_string(SlotMigration::kMaxParked) +
                                   " requests for slots being moved; nothing was applied, "
                                   "retry"));
    return true;
  }
  push_order_.NoteParked(*p);
  return true;
}

// After the I/O thread's map moved: forgets copies of slots no longer importing and sends
// what waited for a copy through the gates again (fenced by the new version).
void ServerImpl::OnMapChanged() {
  (void)fence_.TakeChanged();
  AbortCutOnMapChange();
  ReplicationMapChanged();
  ReadmitReplicas();
  ReadmitMapWait();
  if (migration_.ForgetSettled(fence_.Current())) {
    Status s = PersistFilled();
    if (!s.ok()) LOG(ERROR) << "resharding: cannot store the slots marked in: " << s.ToString();
  }
  // Fenced again by the new version when they run (Resubmit): a request of the old version
  // is refused and its client routes it by the new map.
  Readmit(migration_.TakeParked());
}

// The slots frame of a SlotExport/SlotImport/SlotDrop request (u32 each, < kNumSlots).
Result<std::vector<uint32_t>> ServerImpl::RequestSlots(const Pending& p) {
  if (p.frames.empty()) {
    return Status::InvalidArgument(std::string(OpName(p.header.op)) + " without a slots frame");
  }
  const zmq::message_t& f = p.frames[0];
  if (f.size() % sizeof(uint32_t) != 0 || f.size() / sizeof(uint32_t) > kNumSlots) {
    return Status::InvalidArgument("slots frame of " + std::to_string(f.size()) +
                                   " bytes: not at most " + std::to_string(kNumSlots) +
                                   " u32 slot numbers");
  }
  std::vector<uint32_t> slots(f.size() / sizeof(uint32_t));
  if (!slots.empty()) std::memcpy(slots.data(), f.data(), f.size());  // an empty frame: no data()
  for (uint32_t s : slots) {
    if (s >= kNumSlots) {
      return Status::InvalidArgument("slot " + std::to_string(s) + " is not below " +
                                     std::to_string(kNumSlots));
    }
  }
  return slots;
}

// The map the server serves by (null: none yet), once it is at least the request's version
// (Unavailable before: the controller asks again); FailedPrecondition without
// follow_cluster_map.
Result<const ClusterMapState*> ServerImpl::MapAtLeast(const Header& h) {
  if (!options_.follow_cluster_map) {
    return Status::FailedPrecondition("server " + std::to_string(options_.rank) +
                                      " follows no cluster map: slots move only with "
                                      "--coordinator");
  }
  const ClusterMapState* map = fence_.Current();
  const uint64_t mine = map == nullptr ? 0 : map->version;
  if (mine < h.map_version) {
    return Status::Unavailable("server " + std::to_string(options_.rank) +
                               " is at cluster map version " + std::to_string(mine) +
                               ", the move is at " + std::to_string(h.map_version) +
                               "; retry once it has seen that version");
  }
  return map;
}

// MapAtLeast, then FailedPrecondition for a slot this server does not own in that map
// (`must_own`: the copy ahead) or owns (otherwise: slots given up, or not taken yet).
Status ServerImpl::CheckOwnership(const Header& h, const std::vector<uint32_t>& slots,
                                  bool must_own) {
  TESSERA_ASSIGN_OR_RETURN(const ClusterMapState* map, MapAtLeast(h));
  const uint64_t version = map == nullptr ? 0 : map->version;
  for (uint32_t slot : slots) {
    const bool owned = map != nullptr && map->primary.ServerOfSlot(slot) == options_.rank;
    if (owned == must_own) continue;
    if (must_own) {
      return Status::FailedPrecondition("slot " + std::to_string(slot) + " is not server " +
                                        std::to_string(options_.rank) +
                                        "'s to copy ahead at map version " +
                                        std::to_string(version));
    }
    return Status::FailedPrecondition("slot " + std::to_string(slot) + " belongs to server " +
                                      std::to_string(options_.rank) + " at map version " +
                                      std::to_string(version) + ": it has not been given up");
  }
  return Status::OK();
}

Status ServerImpl::SlotExportOp(const std::shared_ptr<Pending>& p) {
  const Header& h = p->header;
  // count 0: slots given up (the copy at the flip); 1: slots still owned (the copy ahead of
  // it, taken while they are served); 2: slots owned whose backup is being filled (the copy at
  // the flip of a rebuild). An optional second frame: u64 per lane, the rows updated after
  // that lane step only (the marks of an earlier export).
  if (h.count > kExportDenseMove) {
    return Status::InvalidArgument("SlotExport count " + std::to_string(h.count) +
                                   " (0 given up, 1 still owned, 2 for a backup fill, 3 dense "
                                   "parts for a backup fill, 4 dense parts moving away)");
  }
  if (h.count == kExportDenseFill || h.count == kExportDenseMove) return DenseFillExport(p);
  if (p->frames.size() != 2) TESSERA_RETURN_IF_ERROR(ExpectFrames(*p, 1));
  TESSERA_ASSIGN_OR_RETURN(const std::vector<uint32_t> slots, RequestSlots(*p));
  TESSERA_RETURN_IF_ERROR(
      CheckOwnership(h, slots, /*must_own=*/slots.empty() || h.count != 0));
  if (h.count == kExportFill) TESSERA_RETURN_IF_ERROR(CheckFillSlots(slots));
  auto since = std::make_shared<std::vector<uint64_t>>();
  if (p->frames.size() == 2) {
    if (p->frames[1].size() != lanes_.size() * sizeof(uint64_t)) {
      return Status::InvalidArgument("SlotExport: a since frame of " +
                                     std::to_string(p->frames[1].size()) + " bytes; server " +
                                     std::to_string(options_.rank) + " has " +
                                     std::to_string(lanes_.size()) + " lanes (8 bytes each)");
    }
    since->resize(lanes_.size());
    std::memcpy(since->data(), p->frames[1].data(), p->frames[1].size());
  }
  // Every table (a server that joined later learns them here), then the rows by lane. Given-up
  // slots were given up at a version this server serves by, so every push to them it accepted
  // is ahead of this task in its lane (RunParts flushes staged pushes first).
  auto want = std::make_shared<const std::vector<uint32_t>>(slots);
  const auto list = tables_.List();
  auto tables = std::make_shared<std::vector<SparseTable>>(SparseTables(list));
  std::string specs;
  for (const auto& [id, spec] : list) AppendSlotTable(&specs, id, spec);
  p->text.assign(lanes_.size() + 1, std::string());
  p->text[0] = std::move(specs);
  if (slots.empty()) {
    // A server joining the map learns the job's metadata records too (the coordinating server,
    // and checkpoints, read them from the lowest live id, which may be a server that joined).
    TESSERA_RETURN_IF_ERROR(
        engine_->ScanMeta("user/", [&](std::string_view k, std::string_view v) {
          AppendSlotMeta(&p->text[0], k, v);
        }));
    ReplyOk(std::move(p->identity), h, Header(), &p->text[0]);
    return Status::OK();
  }
  ExportFreeze freeze = SlotRowsFreeze(want, tables, since, migration_.instance());
  // Every copy holds the pushes taken under an older map, some of which may still wait for
  // their backups (ExportLanes): the copy at a flip (a move's or a backup fill's) must have
  // them, and once a copy ahead is taken, no push sent under the map before the batch's first
  // flip (which may have dropped the slots' backups) waits for an answer any more.
  ExportLanes(p, h.map_version, std::move(freeze));
  return Status::OK();
}

Status ServerImpl::SlotImportOp(const std::shared_ptr<Pending>& p) {
  const Header& h = p->header;
  if (h.count > kImportDenseDone) {
    return Status::InvalidArgument("SlotImport count " + std::to_string(h.count) +
                                   " (0 rows, 1 done, 2 rows ahead, 3 dense chunks, 4 dense "
                                   "done)");
  }
  if (h.count == kImportDenseRows || h.count == kImportDenseDone) return DenseFillImport(p);
  TESSERA_RETURN_IF_ERROR(ExpectFrames(*p, h.count == kImportDone ? 1 : 2));
  TESSERA_ASSIGN_OR_RETURN(const std::vector<uint32_t> slots, RequestSlots(*p));
  if (h.count == kImportAhead) {
    // Ahead of the flip: slots this server does not own yet (nothing writes them here), whose
    // copy the flip's delta completes.
    TESSERA_RETURN_IF_ERROR(CheckOwnership(h, slots, /*must_own=*/false));
    return ImportSlotRows(p, slots);
  }
  // Only slots this server is the importing primary or the backup being filled of, at a
  // version it has seen; no slots: the tables only (a server that joins learns them before it
  // owns anything).
  TESSERA_ASSIGN_OR_RETURN(const ClusterMapState* map, MapAtLeast(h));
  for (uint32_t slot : slots) {
    if (!SlotMigration::CopyingIn(map, slot)) {
      return Status::FailedPrecondition(
          "slot " + std::to_string(slot) + " is not being copied to server " +
          std::to_string(options_.rank) + " at map version " +
          std::to_string(map == nullptr ? 0 : map->version));
    }
  }
  if (h.count == kImportDone) {
    migration_.MarkSlotsFilled(slots);
    // Kept across a restart: the server takes pushes for these slots from now on, and a
    // controller that runs the move again must not copy the old owner's rows over them.
    TESSERA_RETURN_IF_ERROR(PersistFilled());
    ReplyOk(std::move(p->identity), h);
    Readmit(migration_.TakeParked());  // those still waiting for another slot park again
    ReadmitReplicas();  // a filled backup applies the forwarded pushes it held, in order
    return Status::OK();
  }
  for (uint32_t slot : slots) {
    if (migration_.slot_filled(slot)) {
      return Status::AlreadyExists("slot " + std::to_string(slot) + " was marked in on server " +
                                   std::to_string(options_.rank) +
                                   " already (it takes pushes): its rows are not replaced");
    }
  }
  return ImportSlotRows(p, slots);
}

// The slots and dense parts marked in (SlotMigration), stored in the
// engine's metadata and read back at start: a restarted server that took pushes for them
// refuses a repeated copy.
Status ServerImpl::PersistFilled() {
  TESSERA_RETURN_IF_ERROR(engine_->PutMeta("reshard/filled", migration_.EncodeSlots()));
  return engine_->PutMeta("reshard/dense_filled", migration_.EncodeDense());
}

Status ServerImpl::LoadFilled() {
  TESSERA_ASSIGN_OR_RETURN(auto bits, engine_->GetMeta("reshard/filled"));
  TESSERA_ASSIGN_OR_RETURN(auto dense, engine_->GetMeta("reshard/dense_filled"));
  return migration_.Decode(bits, dense);
}

// Answers the requests held longer than SlotMigration::kHoldLimit for a copy (Maintain).
void ServerImpl::ExpireImportParked() {
  // A request held for a copy that does not come (the controller died) is answered
  // Unavailable after SlotMigration::kHoldLimit instead of waiting without bound; a push gives
  // its sequence number back (nothing of it was applied) so the client's retry is taken anew.
  for (auto& p : migration_.TakeExpired(std::chrono::steady_clock::now())) {
    const Header& h = p->header;
    const Status why = Status::Unavailable(
        "server " + std::to_string(options_.rank) +
        " holds this request's slots for a move whose copy has not arrived in " +
        std::to_string(SlotMigration::kHoldLimit.count()) +
        " s (is tessera-ctl scale running?); nothing was applied");
    // Its later pushes go back first.
    if (push_order_.Unpark(*p)) ReleaseHeld(h.client_id, &why);
    GiveBackSeq(h, /*resend=*/true);
    ReplyError(std::move(p->identity), h, why);
  }
}

// SlotImport's rows step: checks them (DecodeImport), creates the tables they bring, and
// writes them in their lanes, durably, before the reply.
Status ServerImpl::ImportSlotRows(const std::shared_ptr<Pending>& p,
                                  const std::vector<uint32_t>& slots) {
  // Checked here, written by their lanes. New tables are created first (a server that joined
  // after they were made); a known table must have the same spec.
  const std::vector<bool> want = SlotMask(slots);  // checked below kNumSlots (RequestSlots)
  const uint32_t nl = static_cast<uint32_t>(lanes_.size());
  auto plan = std::make_shared<ImportPlan>();
  plan->lanes.resize(nl);
  const auto& frame = p->frames[1];
  TESSERA_RETURN_IF_ERROR(DecodeImport(
      std::string_view(static_cast<const char*>(frame.data()), frame.size()), want, nl,
      [&](uint64_t id, const TableSpec& spec) -> Result<bool> {
        return tables_.SameExists(id, spec, "than the moved rows'");
      },
      [&](uint64_t id) -> const TableSpec* {
        auto t = tables_.find(id);
        return t == tables_.end() ? nullptr : &t->second.spec;
      },
      plan.get()));
  for (const auto& [id, spec] : plan->added) {
    TESSERA_RETURN_IF_ERROR(
        engine_->PutMeta("table/" + std::to_string(id), EncodeTableSpec(spec)));
  }
  for (const auto& [id, spec] : plan->added) {
    tables_.Add(id, spec);
    LOG(INFO) << "table '" << spec.name << "' created by moved slot rows";
  }
  // Job records replace what this server holds (a data dir from an earlier stay in the map)
  // unless a client wrote the record here since this process started: that write is at least
  // as new as the export (the server was in the map before the export was taken).
  for (const auto& [key, value] : plan->meta) {
    if (migration_.MetaWritten(key)) continue;
    TESSERA_RETURN_IF_ERROR(engine_->PutMeta(key, value));
  }
  migration_.rows_imported.fetch_add(plan->rows, std::memory_order_relaxed);
  std::vector<LanePart> parts;
  for (uint32_t l = 0; l < nl; ++l) {
    parts.push_back(LanePart{l, [plan, l](Lane& lane) -> Status {
                               for (const auto& [id, spec] : plan->added) {
                                 TESSERA_RETURN_IF_ERROR(lane.store().AddTable(id, spec));
                               }
                               RowBatch& b = plan->lanes[l];
                               for (size_t i = 0; i < b.keys.size(); ++i) {
                                 const float* row = b.floats.data() + b.offsets[i];
                                 // Touched now by this lane's count (idle-step eviction, and a
                                 // later move's delta), not by the old owner's.
                                 b.metas[i].last_step = static_cast<uint32_t>(lane.step());
                                 TESSERA_RETURN_IF_ERROR(lane.store().PutRows(
                                     b.tables[i], std::span<const uint64_t>(&b.keys[i], 1),
                                     std::span<const float* const>(&row, 1),
                                     std::span<const RowMeta>(&b.metas[i], 1)));
                               }
                               // Durable before the reply: the request log does not hold them.
                               return b.keys.empty() ? Status::OK() : lane.store().Commit();
                             }});
  }
  RunParts(p, std::move(parts), /*writes=*/false, /*seq=*/0, /*may_inline=*/false);
  return Status::OK();
}

Status ServerImpl::SlotDropOp(const std::shared_ptr<Pending>& p) {
  TESSERA_RETURN_IF_ERROR(ExpectFrames(*p, 1));
  TESSERA_ASSIGN_OR_RETURN(const std::vector<uint32_t> slots, RequestSlots(*p));
  TESSERA_RETURN_IF_ERROR(CheckOwnership(p->header, slots, /*must_own=*/false));
  // A backup's rows are the slot's other copy: never dropped while the map names it.
  const ClusterMapState* map = fence_.Current();  // at least the request's version
  for (uint32_t slot : slots) {
    if (map != nullptr && !map->backup.empty() && map->backup[slot] == options_.rank) {
      return Status::FailedPrecondition(
          "slot " + std::to_string(slot) + " is backed up by server " +
          std::to_string(options_.rank) + " at map version " + std::to_string(map->version) +
          ": its rows are not dropped");
    }
  }
  auto want = std::make_shared<const std::vector<uint32_t>>(slots);
  auto tables = std::make_shared<std::vector<SparseTable>>(SparseTables(tables_.List()));
  std::atomic<uint64_t>* dropped = &migration_.rows_dropped;
  RunOnAllLanes(
      p, [want, tables, dropped](Lane& lane) { return DeleteSlotRows(lane, *tables, *want, dropped); },
      false);
  return Status::OK();
}

}  // namespace tessera::internal
