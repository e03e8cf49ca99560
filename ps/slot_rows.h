// The rows of moving slots (online resharding, docs/elasticity.md): what a server gives up
// exports in this format, and the slot's new owner imports it. Self-contained: the table specs
// travel with the rows, so a server that joined after a table was created learns it here.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "ps/status.h"
#include "ps/table_spec.h"

namespace tessera::internal {

/// Metadata of a moved row (storage's RowMeta, field for field).
struct SlotRowMeta {
  uint32_t update_count = 0;
  uint32_t last_step = 0;
  uint32_t last_update_s = 0;
};

/// Appends table `id`'s spec: 'T', u64 id, u32 length, the encoded spec (EncodeTableSpec).
void AppendSlotTable(std::string* out, uint64_t id, const TableSpec& spec);
/// Appends one sparse row: 'R', u64 table, u64 key, u32 update_count, u32 last_step,
/// u32 last_update_s, u32 n, then n floats (value then optimizer state). Little-endian.
void AppendSlotRow(std::string* out, uint64_t table, uint64_t key, const SlotRowMeta& meta,
                   const float* row, uint32_t n);

/// Appends a lane mark: 'S', u32 lane, u64 server instance, u64 step: the exporting lane's
/// step counter when it read the rows that follow (a later export asks for the rows updated
/// after it), and the instance of the server process (a restart resets the counters).
void AppendSlotMark(std::string* out, uint32_t lane, uint64_t instance, uint64_t step);

/// Appends a job metadata record (Client::PutMeta): 'M', u32 name length, the name, u32 value
/// length, the value. A specs-only export carries them, so that a server joining the map
/// learns the records written before it joined.
void AppendSlotMeta(std::string* out, std::string_view name, std::string_view value);

struct SlotRowsVisitor {
  std::function<Status(uint64_t id, const TableSpec& spec)> table;
  /// `row` points into the data: valid during the call only, maybe unaligned (copy it).
  std::function<Status(uint64_t table, uint64_t key, const SlotRowMeta& meta, const char* row,
                       uint32_t n)>
      row;
  std::function<Status(uint32_t lane, uint64_t instance, uint64_t step)> mark;
  /// Views into the data, valid during the call only.
  std::function<Status(std::string_view name, std::string_view value)> meta;
};
/// Reads data written by the Append functions; Corruption naming the offset of the first entry
/// that is cut short or unknown. Stops at the first error a visitor returns.
Status ParseSlotRows(std::string_view data, const SlotRowsVisitor& visitor);

/// A lane mark (AppendSlotMark).
struct SlotMark {
  uint32_t lane;
  uint64_t instance;
  uint64_t step;
};
/// `data` cut into pieces of at most about `max_bytes` at entry boundaries, each piece
/// starting with every table and metadata entry of `data` (so each imports on its own),
/// without the marks;
/// and what the cut read on its way: the number of rows and the marks.
struct SlotRowsPieces {
  std::vector<std::string> pieces;
  uint64_t rows = 0;
  std::vector<SlotMark> marks;
};
/// Corruption as ParseSlotRows.
Result<SlotRowsPieces> SplitSlotRows(std::string_view data, size_t max_bytes);

}  // namespace tessera::internal
