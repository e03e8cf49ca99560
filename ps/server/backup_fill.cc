// Backup rebuild (docs/elasticity.md, "Backup rebuild"): after a fail-over a slot or dense part
// may have a primary and no backup; a controller (tessera-ctl map rebuild, or the promoting
// server in the background) names a new backup with the primary as its importing source. The
// primary forwards the slot's pushes to it from that map on; the backup holds them
// (HeldForFill) until the copy of the rows is in (SlotImport done), then applies them in
// order. The primary's copy (SlotExport for a fill) is taken once every request it sequenced
// by an older map is in its lanes, so it holds every push not forwarded and none forwarded.
#include <absl/container/flat_hash_map.h>

#include <algorithm>
#include <cstring>

#include "ps/optimizer.h"
#include "ps/server/server_impl_internal.h"
#include "ps/server/slot_copy_internal.h"
#include "ps/slot_rows.h"

namespace tessera::internal {
namespace {

// The chunks [first, end) of each dense part asked for, per dense table: (table, first, end).
struct DenseChunkRange {
  uint64_t table;
  uint64_t first, end;
};
std::vector<DenseChunkRange> DensePartChunks(
    const std::vector<std::pair<uint64_t, TableSpec>>& tables, const std::vector<uint32_t>& parts,
    uint32_t dense_servers) {
  std::vector<DenseChunkRange> out;
  for (const auto& [id, spec] : tables) {
    if (spec.kind != TableKind::kDense) continue;
    for (uint32_t part : parts) {
      const DenseRange r = DenseRangeOfServer(id, spec.length, part, dense_servers);
      if (r.begin >= r.end) continue;
      out.push_back({id, r.begin / kDenseChunkFloats,
                     (r.end + kDenseChunkFloats - 1) / kDenseChunkFloats});
    }
  }
  return out;
}
bool InChunks(const std::vector<DenseChunkRange>& ranges, uint64_t table, uint64_t chunk) {
  for (const DenseChunkRange& r : ranges) {
    if (r.table == table && chunk >= r.first && chunk < r.end) return true;
  }
  return false;
}


// Chunks to write in one lane.
// Checks and sorts SlotImport's dense chunks (rows of dense tables keyed by chunk index): each
// table entry accepted by `table`, each chunk of a dense table `spec_of` knows, in `ranges`,
// of the chunk's floats (value and optimizer state); into `lanes` by LaneOfChunk.
Status DecodeDenseChunks(std::string_view data, const std::vector<DenseChunkRange>& ranges,
                         uint32_t nl, const std::function<Status(uint64_t, const TableSpec&)>& table,
                         const std::function<const TableSpec*(uint64_t)>& spec_of,
                         std::vector<RowBatch>* lanes, uint64_t* rows) {
  auto row = [&](uint64_t id, uint64_t chunk, const SlotRowMeta& m, const char* floats,
                 uint32_t n) -> Status {
    const TableSpec* spec = spec_of(id);
    if (spec == nullptr || spec->kind != TableKind::kDense || !InChunks(ranges, id, chunk)) {
      return Status::InvalidArgument("dense chunks: chunk " + std::to_string(chunk) +
                                     " of table id " + std::to_string(id) +
                                     " is in no dense part the request names");
    }
    const uint32_t len = static_cast<uint32_t>(
        std::min<uint64_t>(kDenseChunkFloats, spec->length - chunk * kDenseChunkFloats));
    const uint32_t want = len + Optimizer::Make(spec->optimizer)->StateFloats(len);
    if (n != want) {
      return Status::InvalidArgument("dense chunks: chunk " + std::to_string(chunk) +
                                     " of table '" + spec->name + "' has " + std::to_string(n) +
                                     " floats, not " + std::to_string(want));
    }
    (*lanes)[LaneOfChunk(id, chunk, nl)].Add(id, chunk, m, floats, n);
    ++*rows;
    return Status::OK();
  };
  return ParseSlotRows(data, {table, row, nullptr, nullptr});
}

}  // namespace

// True when forwarded push `p` (keys read) touches a slot this server is the backup being
// filled of and whose copy is not in yet: it waits, in order with every forwarded push after
// it, at the head of the ReplicaPark (ReadmitReplicas, once SlotImport says it is in).
bool ServerImpl::HeldForFill(const Pending& p) {
  const ClusterMapState* map = fence_.Current();
  if (map == nullptr || map->filling.empty() || p.keys == nullptr) return false;
  for (uint64_t i = 0; i < p.header.count; ++i) {
    const uint32_t slot = SlotOfKey(p.keys[i]);
    if (map->filling[slot] && !migration_.slot_filled(slot)) return true;
  }
  return false;
}

// True when forwarded dense push of part `part` waits for that part's fill.
bool ServerImpl::DenseHeldForFill(uint32_t part) {
  const ClusterMapState* map = fence_.Current();
  return map != nullptr && part < map->dense_filling.size() && map->dense_filling[part] &&
         !migration_.dense_filled(part);
}

// The parts frame of a dense SlotExport/SlotImport (u32 each, < the map's dense_servers).
Result<std::vector<uint32_t>> ServerImpl::RequestDenseParts(const Pending& p,
                                                            const ClusterMapState* map) {
  TESSERA_ASSIGN_OR_RETURN(std::vector<uint32_t> parts, RequestSlots(p));
  const uint32_t n = map != nullptr ? map->dense_servers : fence_.DenseServers();
  for (uint32_t part : parts) {
    if (part >= n) {
      return Status::InvalidArgument("dense part " + std::to_string(part) + " is not below " +
                                     std::to_string(n) + " (dense_servers)");
    }
  }
  return parts;
}

// SlotExport count 3: the chunks of dense parts this server is the primary of whose backup
// is being filled, as rows of their tables (key: chunk index), sequenced like a slot fill.
Status ServerImpl::DenseFillExport(const std::shared_ptr<Pending>& p) {
  const Header& h = p->header;
  TESSERA_RETURN_IF_ERROR(ExpectFrames(*p, 1));
  TESSERA_ASSIGN_OR_RETURN(const ClusterMapState* map, MapAtLeast(h));
  if (map == nullptr) {
    return Status::FailedPrecondition("server " + std::to_string(options_.rank) +
                                      " has no cluster map yet: no dense part to copy");
  }
  TESSERA_ASSIGN_OR_RETURN(const std::vector<uint32_t> parts, RequestDenseParts(*p, map));
  const bool move = h.count == kExportDenseMove;
  for (uint32_t part : parts) {
    const std::string at = " at map version " + std::to_string(map->version);
    if (move && (part >= map->dense_moving_from.size() ||
                 map->dense_moving_from[part] != options_.rank)) {
      return Status::FailedPrecondition("dense part " + std::to_string(part) +
                                        " is not moving away from server " +
                                        std::to_string(options_.rank) + at);
    }
    if (!move && (map->DenseOwner(part) != options_.rank ||
                  map->DenseBackup(part) == RoutingMap::kNoBackup)) {
      return Status::FailedPrecondition(
          "dense part " + std::to_string(part) + " is not server " +
          std::to_string(options_.rank) + "'s with a backup" + at +
          ": no backup fill to copy it for");
    }
  }
  // The chunks of those parts, as rows of their dense tables (key: the chunk index): value,
  // then optimizer state.
  const auto list = tables_.List();
  std::string specs;
  for (const auto& [id, spec] : list) AppendSlotTable(&specs, id, spec);
  auto ranges = std::make_shared<const std::vector<DenseChunkRange>>(
      DensePartChunks(list, parts, map->dense_servers));
  auto state = std::make_shared<absl::flat_hash_map<uint64_t, std::shared_ptr<Optimizer>>>();
  for (const auto& [id, spec] : list) {
    if (spec.kind == TableKind::kDense) (*state)[id] = Optimizer::Make(spec.optimizer);
  }
  p->text.assign(lanes_.size() + 1, std::string());
  p->text[0] = std::move(specs);
  auto freeze = [ranges, state](Lane& lane) -> Result<ExportScan> {
    TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<LaneSnapshot> snapshot, lane.store().TakeSnapshot());
    return ExportScan([ranges, state, snapshot](std::string* out, uint64_t* n) -> Status {
      for (const auto& entry : *state) {
        // Not a structured binding: clang 14 (the fuzz build) cannot capture one in a lambda.
        const uint64_t id = entry.first;
        const std::shared_ptr<Optimizer>& opt = entry.second;
        TESSERA_RETURN_IF_ERROR(snapshot->ScanDense(
            id, [&](uint64_t chunk, const float* row, uint32_t len, const RowMeta& meta) {
              if (!InChunks(*ranges, id, chunk)) return true;
              AppendSlotRow(out, id, chunk,
                            SlotRowMeta{meta.update_count, meta.last_step, meta.last_update_s},
                            row, len + opt->StateFloats(len));
              ++*n;
              return true;
            }));
      }
      return Status::OK();
    });
  };
  ExportLanes(p, h.map_version, std::move(freeze));
  return Status::OK();
}

// FailedPrecondition for a slot without a backup in the map served by (SlotExport count 2).
Status ServerImpl::CheckFillSlots(const std::vector<uint32_t>& slots) {
  const ClusterMapState* map = fence_.Current();  // at least the request's version (CheckOwnership)
  for (uint32_t slot : slots) {
    if (map == nullptr || map->backup.empty() || map->backup[slot] == RoutingMap::kNoBackup) {
      return Status::FailedPrecondition(
          "slot " + std::to_string(slot) + " has no backup at map version " +
          std::to_string(map == nullptr ? 0 : map->version) +
          ": there is no backup fill to copy it for");
    }
  }
  return Status::OK();
}

// The lanes' part of SlotExport `p` of map `version`, once no request sequenced by an
// older map waits in the replication queue: `freeze` takes each lane's rows as they are (on
// the lane: a snapshot, copy-on-write), and the scan it returns writes them (after the lane's
// marks, if any) to the lane's output and counts them, on the file writer's thread: read on
// the lane, a rebuild's copy held a promoted server's lanes 210-380 ms at a time, and the
// pushes it took meanwhile ran at 0.1-0.4x. The output goes to p->text[lane + 1] (the caller
// sets p->text, the specs in [0]) and the count to slot_rows_exported.
void ServerImpl::ExportLanes(const std::shared_ptr<Pending>& p, uint64_t version,
                             ExportFreeze freeze) {
  // A rebuild's copy holds every push this server took before it forwarded the slots to their
  // new backup, and none it forwarded there (the backup applies those itself, once the copy is
  // in): it runs once the requests sequenced by an older map have reached the lanes. The ones
  // after them wait for the backup, which holds them until the copy is in. A move's copy at
  // the flip waits the same way: a push of a replicated map taken before the slots were given
  // up may still wait for a backup (of another of its slots), and reaches the lanes only then.
  Pending* raw = p.get();
  std::atomic<uint64_t>* exported = &migration_.rows_exported;
  FileWriter* writer = writer_.get();
  auto lane_part = [raw, p, writer, exported, freeze = std::move(freeze)](Lane& lane) -> Status {
    TESSERA_ASSIGN_OR_RETURN(ExportScan scan, freeze(lane));
    const uint32_t index = lane.index();
    raw->parts.Add();  // before this part ends: the request waits for the scan
    writer->Submit(p, [raw, exported, index, scan = std::move(scan)]() -> Status {
      std::string out;
      uint64_t n = 0;
      TESSERA_RETURN_IF_ERROR(scan(&out, &n));
      exported->fetch_add(n, std::memory_order_relaxed);
      std::lock_guard<std::mutex> l(raw->mu);
      raw->text[index + 1] = std::move(out);
      return Status::OK();
    });
    return Status::OK();
  };
  migration_.WaitExport(version, [this, p, lane_part = std::move(lane_part)]() mutable {
    RunOnAllLanes(p, std::move(lane_part), false);
  });
  RunWaitingExports();
}

// SlotImport count 3 (chunks) and 4 (done) on the backup being filled of dense parts.
Status ServerImpl::DenseFillImport(const std::shared_ptr<Pending>& p) {
  const Header& h = p->header;
  TESSERA_RETURN_IF_ERROR(ExpectFrames(*p, h.count == kImportDenseDone ? 1 : 2));
  TESSERA_ASSIGN_OR_RETURN(const ClusterMapState* map, MapAtLeast(h));
  if (map == nullptr) {
    return Status::FailedPrecondition("server " + std::to_string(options_.rank) +
                                      " has no cluster map yet: no dense part is copied to it");
  }
  TESSERA_ASSIGN_OR_RETURN(const std::vector<uint32_t> parts, RequestDenseParts(*p, map));
  for (uint32_t part : parts) {
    if (map->dense_filling.empty() || !map->dense_filling[part]) {
      return Status::FailedPrecondition("dense part " + std::to_string(part) +
                                        " is not being copied to server " +
                                        std::to_string(options_.rank) + " at map version " +
                                        std::to_string(map->version));
    }
  }
  // Grown, never shrunk: the marks read back at start stay (the map's dense_servers is fixed).
  migration_.GrowDense(map->dense_servers);
  if (h.count == kImportDenseDone) {
    migration_.MarkDenseFilled(parts);
    // Kept across a restart, as for slots: a moved part's new primary takes pushes from now on.
    TESSERA_RETURN_IF_ERROR(PersistFilled());
    ReplyOk(std::move(p->identity), h);
    Readmit(migration_.TakeParked());  // a moved part's requests (those of other copies park again)
    ReadmitReplicas();  // the forwarded pushes held for the parts, in order
    return Status::OK();
  }
  for (uint32_t part : parts) {
    if (migration_.dense_filled(part)) {
      return Status::AlreadyExists("dense part " + std::to_string(part) +
                                   " was marked in on server " + std::to_string(options_.rank) +
                                   " already (it applies pushes): its chunks are not replaced");
    }
  }
  const auto ranges = DensePartChunks(tables_.List(), parts, map->dense_servers);
  const uint32_t nl = static_cast<uint32_t>(lanes_.size());
  auto plan = std::make_shared<std::vector<RowBatch>>(nl);
  uint64_t rows = 0;
  const auto& frame = p->frames[1];
  TESSERA_RETURN_IF_ERROR(DecodeDenseChunks(
      std::string_view(static_cast<const char*>(frame.data()), frame.size()), ranges, nl,
      [&](uint64_t id, const TableSpec& spec) -> Status {
        TESSERA_ASSIGN_OR_RETURN(bool exists,
                                 tables_.SameExists(id, spec, "than the copied chunks'"));
        if (!exists && spec.kind == TableKind::kDense) {
          return Status::FailedPrecondition("dense table '" + spec.name +
                                            "' of the copied chunks is not on server " +
                                            std::to_string(options_.rank));
        }
        return Status::OK();
      },
      [&](uint64_t id) -> const TableSpec* {
        auto t = tables_.find(id);
        return t == tables_.end() ? nullptr : &t->second.spec;
      },
      plan.get(), &rows));
  migration_.rows_imported.fetch_add(rows, std::memory_order_relaxed);
  std::vector<LanePart> lane_parts;
  for (uint32_t l = 0; l < nl; ++l) {
    lane_parts.push_back(LanePart{l, [plan, l](Lane& lane) -> Status {
                                    RowBatch& b = (*plan)[l];
                                    for (size_t i = 0; i < b.keys.size(); ++i) {
                                      b.metas[i].last_step = static_cast<uint32_t>(lane.step());
                                      TESSERA_RETURN_IF_ERROR(lane.store().PutDenseChunk(
                                          b.tables[i], b.keys[i], b.floats.data() + b.offsets[i],
                                          b.metas[i]));
                                    }
                                    return b.keys.empty() ? Status::OK() : lane.store().Commit();
                                  }});
  }
  RunParts(p, std::move(lane_parts), /*writes=*/false, /*seq=*/0, /*may_inline=*/false);
  return Status::OK();
}

// Runs the exports no older request waits ahead of (after the queue moved).
void ServerImpl::RunWaitingExports() {
  migration_.RunExports([this](uint64_t version) { return repl_.queue.HoldsOlderThan(version); });
}

}  // namespace tessera::internal
