#include "ps/slot_rows.h"

#include <cstring>

#include "ps/codec.h"

namespace tessera::internal {
namespace {

template <typename T>
void Put(std::string* out, T v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(v));
}

// A cursor over the data that refuses to read past its end.
struct Reader {
  std::string_view d;
  size_t pos = 0;
  template <typename T>
  bool Get(T* v) {
    if (d.size() - pos < sizeof(T)) return false;
    std::memcpy(v, d.data() + pos, sizeof(T));
    pos += sizeof(T);
    return true;
  }
};

constexpr size_t kRowHeaderBytes = 1 + 8 + 8 + 4 * 4;

}  // namespace

void AppendSlotTable(std::string* out, uint64_t id, const TableSpec& spec) {
  const std::string enc = EncodeTableSpec(spec);
  out->push_back('T');
  Put<uint64_t>(out, id);
  Put<uint32_t>(out, static_cast<uint32_t>(enc.size()));
  out->append(enc);
}

void AppendSlotRow(std::string* out, uint64_t table, uint64_t key, const SlotRowMeta& meta,
                   const float* row, uint32_t n) {
  out->push_back('R');
  Put<uint64_t>(out, table);
  Put<uint64_t>(out, key);
  Put<uint32_t>(out, meta.update_count);
  Put<uint32_t>(out, meta.last_step);
  Put<uint32_t>(out, meta.last_update_s);
  Put<uint32_t>(out, n);
  out->append(reinterpret_cast<const char*>(row), size_t{n} * sizeof(float));
}

void AppendSlotMark(std::string* out, uint32_t lane, uint64_t instance, uint64_t step) {
  out->push_back('S');
  Put<uint32_t>(out, lane);
  Put<uint64_t>(out, instance);
  Put<uint64_t>(out, step);
}

void AppendSlotMeta(std::string* out, std::string_view name, std::string_view value) {
  out->push_back('M');
  Put<uint32_t>(out, static_cast<uint32_t>(name.size()));
  out->append(name);
  Put<uint32_t>(out, static_cast<uint32_t>(value.size()));
  out->append(value);
}

Status ParseSlotRows(std::string_view data, const SlotRowsVisitor& visitor) {
  Reader r{data};
  while (r.pos < data.size()) {
    const size_t at = r.pos;
    const auto bad = [&](const std::string& what) {
      return Status::Corruption("slot rows: " + what + " at byte " + std::to_string(at) + " of " +
                                std::to_string(data.size()));
    };
    char tag = 0;
    r.Get(&tag);
    if (tag == 'T') {
      uint64_t id;
      uint32_t len;
      if (!r.Get(&id) || !r.Get(&len) || data.size() - r.pos < len) {
        return bad("a table entry cut short");
      }
      auto spec = DecodeTableSpec(data.substr(r.pos, len));
      if (!spec.ok()) return bad("a table spec that does not decode (" + spec.status().message() + ")");
      r.pos += len;
      if (visitor.table) TESSERA_RETURN_IF_ERROR(visitor.table(id, *spec));
    } else if (tag == 'R') {
      uint64_t table, key;
      SlotRowMeta m;
      uint32_t n;
      if (!r.Get(&table) || !r.Get(&key) || !r.Get(&m.update_count) || !r.Get(&m.last_step) ||
          !r.Get(&m.last_update_s) || !r.Get(&n) ||
          (data.size() - r.pos) / sizeof(float) < n) {
        return bad("a row cut short");
      }
      const char* row = data.data() + r.pos;
      r.pos += size_t{n} * sizeof(float);
      if (visitor.row) TESSERA_RETURN_IF_ERROR(visitor.row(table, key, m, row, n));
    } else if (tag == 'S') {
      uint32_t lane;
      uint64_t instance, step;
      if (!r.Get(&lane) || !r.Get(&instance) || !r.Get(&step)) return bad("a lane mark cut short");
      if (visitor.mark) TESSERA_RETURN_IF_ERROR(visitor.mark(lane, instance, step));
    } else if (tag == 'M') {
      uint32_t name_len, value_len;
      if (!r.Get(&name_len) || data.size() - r.pos < name_len) return bad("a record cut short");
      const std::string_view name = data.substr(r.pos, name_len);
      r.pos += name_len;
      if (!r.Get(&value_len) || data.size() - r.pos < value_len) return bad("a record cut short");
      const std::string_view value = data.substr(r.pos, value_len);
      r.pos += value_len;
      if (visitor.meta) TESSERA_RETURN_IF_ERROR(visitor.meta(name, value));
    } else {
      return bad("an entry of unknown type " + std::to_string(static_cast<int>(tag)));
    }
  }
  return Status::OK();
}

Result<SlotRowsPieces> SplitSlotRows(std::string_view data, size_t max_bytes) {
  std::string tables;
  TESSERA_RETURN_IF_ERROR(ParseSlotRows(
      data, {[&](uint64_t id, const TableSpec& spec) {
               AppendSlotTable(&tables, id, spec);
               return Status::OK();
             },
             nullptr, nullptr,
             [&](std::string_view name, std::string_view value) {
               AppendSlotMeta(&tables, name, value);
               return Status::OK();
             }}));
  SlotRowsPieces out;
  std::string cur = tables;
  bool has_rows = false;
  TESSERA_RETURN_IF_ERROR(ParseSlotRows(
      data, {nullptr,
             [&](uint64_t table, uint64_t key, const SlotRowMeta& m, const char* row,
                 uint32_t n) {
               const size_t bytes = kRowHeaderBytes + size_t{n} * sizeof(float);
               if (has_rows && cur.size() + bytes > max_bytes) {
                 out.pieces.push_back(std::move(cur));
                 cur = tables;
                 has_rows = false;
               }
               // `row` may be unaligned: AppendSlotRow only copies its bytes.
               AppendSlotRow(&cur, table, key, m, reinterpret_cast<const float*>(row), n);
               has_rows = true;
               ++out.rows;
               return Status::OK();
             },
             [&](uint32_t lane, uint64_t instance, uint64_t step) {
               out.marks.push_back({lane, instance, step});
               return Status::OK();
             },
             nullptr}));
  out.pieces.push_back(std::move(cur));
  return out;
}

}  // namespace tessera::internal
