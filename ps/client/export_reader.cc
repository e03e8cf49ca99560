#include "ps/client/export_reader.h"

#include <absl/container/flat_hash_map.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "ps/admin_marker.h"
#include "ps/codec.h"
#include "ps/initializer.h"
#include "ps/record_file_internal.h"
#include "ps/routing.h"

namespace tessera {
namespace internal {

struct ExportTable {
  TableSpec spec;
  uint64_t id = 0;
  absl::flat_hash_map<uint64_t, uint32_t> index;  // key -> row number
  std::vector<float> rows;                        // dim floats per row
  std::vector<float> dense;                       // whole tensor
};

}  // namespace internal

namespace {

struct ExportInfo {
  std::string kind;
  uint64_t base = 0;
  std::vector<uint32_t> server_ids;
};

Result<ExportInfo> ReadInfo(const std::string& dir) {
  auto marker = ReadAdminMarker(dir + "/EXPORT", "export");
  if (marker.status().code() == StatusCode::kNotFound) {
    return Status::NotFound("no complete export in '" + dir + "'");
  }
  TESSERA_RETURN_IF_ERROR(marker.status());
  ExportInfo info;
  auto kind = marker->fields.find("kind");
  if (kind != marker->fields.end()) info.kind = kind->second;
  if (info.kind != "full" && info.kind != "delta") {
    return Status::Corruption("'" + dir + "/EXPORT' is incomplete: no kind full or delta");
  }
  if (info.kind == "delta") {
    TESSERA_ASSIGN_OR_RETURN(info.base, marker->Number("base"));
  }
  info.server_ids = std::move(marker->server_ids);
  return info;
}

// Applies one record of the lane file `path` to its table in `by_id`.
Status ApplyExportRecord(const absl::flat_hash_map<uint64_t, internal::ExportTable*>& by_id,
                         const std::string& path, const internal::Record& rec) {
  auto f = by_id.find(rec.table_id);
  if (f == by_id.end()) return Status::Corruption("unknown table in " + path);
  internal::ExportTable& t = *f->second;
  if (rec.kind == internal::Record::kSparseRow) {
    if (t.spec.kind != TableKind::kSparse || rec.row.size() != t.spec.dim) {
      return Status::Corruption("row of the wrong width in " + path);
    }
    auto [pos, inserted] = t.index.try_emplace(rec.key, static_cast<uint32_t>(t.index.size()));
    if (inserted) t.rows.resize(t.rows.size() + t.spec.dim);
    std::memcpy(t.rows.data() + size_t{pos->second} * t.spec.dim, rec.row.data(),
                sizeof(float) * t.spec.dim);
  } else {
    // The chunk index is checked before it is scaled (no wrap-around).
    if (t.spec.kind != TableKind::kDense ||
        rec.key >= (t.spec.length + kDenseChunkFloats - 1) / kDenseChunkFloats) {
      return Status::Corruption("dense chunk out of range in " + path);
    }
    const uint64_t first = rec.key * kDenseChunkFloats;
    if (first >= t.spec.length ||
        rec.row.size() != std::min<uint64_t>(kDenseChunkFloats, t.spec.length - first)) {
      return Status::Corruption("dense chunk out of range in " + path);
    }
    std::memcpy(t.dense.data() + first, rec.row.data(), sizeof(float) * rec.row.size());
  }
  return Status::OK();
}

}  // namespace

Result<uint64_t> LatestExportVersion(const std::string& root) {
  std::ifstream in(root + "/LATEST");
  if (!in) return uint64_t{0};
  uint64_t v = 0;
  if (!(in >> v)) return Status::Corruption("'" + root + "/LATEST' is not a version number");
  return v;
}

ExportReader::~ExportReader() = default;

Result<std::unique_ptr<ExportReader>> ExportReader::Open(const std::string& root,
                                                         uint64_t version) {
  if (version == 0) {
    TESSERA_ASSIGN_OR_RETURN(version, LatestExportVersion(root));
    if (version == 0) return Status::NotFound("no export under '" + root + "'");
  }
  // The chain: back from `version` through deltas to a full export.
  std::vector<std::pair<std::string, ExportInfo>> chain;
  for (uint64_t v = version;;) {
    const std::string dir = root + "/v" + std::to_string(v);
    TESSERA_ASSIGN_OR_RETURN(ExportInfo info, ReadInfo(dir));
    chain.emplace_back(dir, info);
    if (info.kind == "full") break;
    if (info.base == 0 || info.base >= v) {
      return Status::Corruption("delta export '" + dir + "' has no valid base");
    }
    v = info.base;
  }
  std::unique_ptr<ExportReader> r(new ExportReader());
  r->version_ = version;
  absl::flat_hash_map<uint64_t, internal::ExportTable*> by_id;
  // Oldest first, so later versions overwrite rows.
  for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
    const auto& [dir, info] = *it;
    for (uint32_t s : info.server_ids) {
      const std::string sdir = dir + "/server-" + std::to_string(s);
      TESSERA_ASSIGN_OR_RETURN(auto specs, internal::ReadBlobs(sdir + "/tables"));
      for (const auto& b : specs) {
        TESSERA_ASSIGN_OR_RETURN(TableSpec spec, DecodeTableSpec(b));
        // A spec off the disk is checked before its sizes are used (a dense length of 2^62
        // made the resize below throw length_error out of Open).
        if (Status valid = ValidateTableSpec(spec); !valid.ok()) {
          return Status::Corruption("bad table spec in '" + sdir + "/tables': " + valid.message());
        }
        const uint64_t id = TableIdForName(spec.name);
        if (by_id.contains(id)) continue;
        auto t = std::make_unique<internal::ExportTable>();
        t->spec = spec;
        t->id = id;
        if (spec.kind == TableKind::kDense) {
          t->dense.resize(spec.length);
          InitializeValues(spec.initializer, 0, 0, spec.length, t->dense.data());
        }
        by_id[id] = t.get();
        r->tables_.push_back(std::move(t));
      }
      TESSERA_ASSIGN_OR_RETURN(auto manifest, internal::ReadBlobs(sdir + "/manifest"));
      if (manifest.size() < 4) return Status::Corruption("bad manifest in '" + sdir + "'");
      TESSERA_ASSIGN_OR_RETURN(uint64_t lanes,
                               ParseStoredNumber(manifest[3], "lanes in " + sdir, 256));
      for (uint32_t l = 0; l < lanes; ++l) {
        const std::string path = sdir + "/lane-" + std::to_string(l);
        TESSERA_RETURN_IF_ERROR(internal::ReadRecordFile(path, [&](const internal::Record& rec) {
          return ApplyExportRecord(by_id, path, rec);
        }));
      }
    }
  }
  return r;
}

std::vector<std::string> ExportReader::tables() const {
  std::vector<std::string> out;
  for (auto& t : tables_) out.push_back(t->spec.name);
  return out;
}

Result<const internal::ExportTable*> ExportReader::Find(const std::string& table) const {
  for (auto& t : tables_) {
    if (t->spec.name == table) return t.get();
  }
  return Status::NotFound("table '" + table + "' is not in export v" + std::to_string(version_));
}

Result<TableSpec> ExportReader::spec(const std::string& table) const {
  TESSERA_ASSIGN_OR_RETURN(const internal::ExportTable* t, Find(table));
  return t->spec;
}

Status ExportReader::Lookup(const std::string& table, std::span<const uint64_t> keys,
                            float* out) const {
  TESSERA_ASSIGN_OR_RETURN(const internal::ExportTable* t, Find(table));
  if (t->spec.kind != TableKind::kSparse) {
    return Status::InvalidArgument("table '" + table + "' is dense");
  }
  const uint32_t dim = t->spec.dim;
  for (size_t i = 0; i < keys.size(); ++i) {
    auto it = t->index.find(keys[i]);
    if (it == t->index.end()) {
      InitializeValues(t->spec.initializer, keys[i], 0, dim, out + i * dim);
    } else {
      std::memcpy(out + i * dim, t->rows.data() + size_t{it->second} * dim, sizeof(float) * dim);
    }
  }
  return Status::OK();
}

Status ExportReader::DenseRead(const std::string& table, uint64_t offset, uint64_t length,
                               float* out) const {
  TESSERA_ASSIGN_OR_RETURN(const internal::ExportTable* t, Find(table));
  if (t->spec.kind != TableKind::kDense) {
    return Status::InvalidArgument("table '" + table + "' is sparse");
  }
  if (offset > t->spec.length || length > t->spec.length - offset) {
    return Status::InvalidArgument("dense range outside table '" + table + "'");
  }
  std::memcpy(out, t->dense.data() + offset, sizeof(float) * length);
  return Status::OK();
}

Result<uint64_t> ExportReader::RowCount(const std::string& table) const {
  TESSERA_ASSIGN_OR_RETURN(const internal::ExportTable* t, Find(table));
  return uint64_t{t->index.size()};
}

}  // namespace tessera
