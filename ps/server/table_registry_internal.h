// The tables a server holds: id, spec and name of each.
#pragma once

#include <absl/container/flat_hash_map.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ps/codec.h"
#include "ps/status.h"
#include "ps/table_spec.h"

namespace tessera::internal {

struct TableInfo {
  uint64_t id;
  TableSpec spec;
};

/// The server's tables by id and by name. Not thread-safe: the server's I/O thread owns it
/// (the lanes hold their own copies of the specs in their stores).
class TableRegistry {
 public:
  using Map = absl::flat_hash_map<uint64_t, TableInfo>;

  /// Adds (or replaces) table `id`.
  void Add(uint64_t id, const TableSpec& spec);
  /// Removes table `id` (DropTable); a no-op for an unknown id.
  void Remove(uint64_t id);
  /// The table data request `h` names, of kind `kind`: NotFound for an unknown id (naming
  /// server `rank`), InvalidArgument for one of the other kind.
  Result<const TableInfo*> Find(const Header& h, TableKind kind, uint32_t rank) const;
  /// True when table `id` exists with `spec`, false when it does not exist; AlreadyExists
  /// naming the difference when it exists with another spec (`compared`: how the message
  /// names the two specs).
  Result<bool> SameExists(uint64_t id, const TableSpec& spec, const char* compared) const;
  /// The id of the table named `name`, if there is one.
  std::optional<uint64_t> IdOf(const std::string& name) const;
  /// Every table's id and spec, and id and name.
  std::vector<std::pair<uint64_t, TableSpec>> List() const;
  std::vector<std::pair<uint64_t, std::string>> Names() const;

  size_t size() const { return tables_.size(); }
  bool contains(uint64_t id) const { return tables_.contains(id); }
  Map::const_iterator find(uint64_t id) const { return tables_.find(id); }
  Map::const_iterator begin() const { return tables_.begin(); }
  Map::const_iterator end() const { return tables_.end(); }

 private:
  Map tables_;
  absl::flat_hash_map<std::string, uint64_t> names_;
};

}  // namespace tessera::internal
