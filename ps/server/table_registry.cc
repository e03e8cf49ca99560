#include "ps/server/table_registry_internal.h"

namespace tessera::internal {

void TableRegistry::Add(uint64_t id, const TableSpec& spec) {
  tables_[id] = TableInfo{id, spec};
  names_[spec.name] = id;
}

void TableRegistry::Remove(uint64_t id) {
  auto it = tables_.find(id);
  if (it == tables_.end()) return;
  names_.erase(it->second.spec.name);
  tables_.erase(it);
}

Result<const TableInfo*> TableRegistry::Find(const Header& h, TableKind kind, uint32_t rank) const {
  auto it = tables_.find(h.table_id);
  if (it == tables_.end()) {
    return Status::NotFound("unknown table id " + std::to_string(h.table_id) + " on server " +
                            std::to_string(rank));
  }
  if (it->second.spec.kind != kind) {
    return Status::InvalidArgument(
        "table '" + it->second.spec.name + "' is " +
        (it->second.spec.kind == TableKind::kSparse ? "sparse" : "dense") + ", op " +
        std::string(OpName(h.op)) + " needs a " +
        (kind == TableKind::kSparse ? "sparse" : "dense") + " table");
  }
  return &it->second;
}

Result<bool> TableRegistry::SameExists(uint64_t id, const TableSpec& spec,
                                       const char* compared) const {
  auto it = tables_.find(id);
  if (it == tables_.end()) return false;
  std::string diff = DescribeSpecDifference(it->second.spec, spec);
  if (!diff.empty()) {
    return Status::AlreadyExists("table '" + spec.name + "' exists with another spec " + compared +
                                 ": " + diff);
  }
  return true;
}

std::optional<uint64_t> TableRegistry::IdOf(const std::string& name) const {
  auto it = names_.find(name);
  if (it == names_.end()) return std::nullopt;
  return it->second;
}

std::vector<std::pair<uint64_t, TableSpec>> TableRegistry::List() const {
  std::vector<std::pair<uint64_t, TableSpec>> tables;
  for (auto& [id, t] : tables_) tables.emplace_back(id, t.spec);
  return tables;
}

std::vector<std::pair<uint64_t, std::string>> TableRegistry::Names() const {
  std::vector<std::pair<uint64_t, std::string>> out;
  out.reserve(tables_.size());
  for (const auto& [id, t] : tables_) out.emplace_back(id, t.spec.name);
  return out;
}

}  // namespace tessera::internal
