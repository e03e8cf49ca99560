#include "ps/slot_rows.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

namespace tessera::internal {
namespace {

struct Row {
  uint64_t table, key;
  uint32_t count;
  std::vector<float> floats;
  bool operator==(const Row&) const = default;
};

std::vector<Row> Rows(std::string_view data, std::vector<std::string>* tables = nullptr) {
  std::vector<Row> out;
  Status s = ParseSlotRows(
      data, {[&](uint64_t, const TableSpec& spec) {
               if (tables) tables->push_back(spec.name);
               return Status::OK();
             },
             [&](uint64_t t, uint64_t k, const SlotRowMeta& m, const char* row, uint32_t n) {
               std::vector<float> f(n);
               std::memcpy(f.data(), row, n * sizeof(float));
               out.push_back({t, k, m.update_count, f});
               return Status::OK();
             },
             nullptr, nullptr});
  EXPECT_TRUE(s.ok()) << s.ToString();
  return out;
}

TEST(SlotRows, RoundTripSplitAndDamage) {
  std::string data;
  AppendSlotTable(&data, 7, TableSpec::Sparse("emb", 3));
  std::vector<Row> want;
  for (uint64_t k = 0; k < 100; ++k) {
    std::vector<float> f = {1.0f * k, 2.0f, 3.0f, 0.5f, 0.25f, 0.125f};
    AppendSlotRow(&data, 7, k, SlotRowMeta{static_cast<uint32_t>(k), 1, 2}, f.data(), 6);
    want.push_back({7, k, static_cast<uint32_t>(k), f});
  }
  std::vector<std::string> tables;
  EXPECT_EQ(Rows(data, &tables), want);
  EXPECT_EQ(tables, std::vector<std::string>{"emb"});
  AppendSlotMark(&data, 3, 77, 1234);

  // Pieces of at most ~1 KB, each with the table entry, together the same rows in order; the
  // rows counted and the mark read on the way, and left out of the pieces.
  auto split = SplitSlotRows(data, 1024);
  ASSERT_TRUE(split.ok());
  EXPECT_EQ(split->rows, 100u);
  ASSERT_EQ(split->marks.size(), 1u);
  EXPECT_EQ(split->marks[0].lane, 3u);
  EXPECT_EQ(split->marks[0].instance, 77u);
  EXPECT_EQ(split->marks[0].step, 1234u);
  const std::vector<std::string>& pieces = split->pieces;
  EXPECT_GT(pieces.size(), 3u);
  std::vector<Row> joined;
  for (const std::string& p : pieces) {
    EXPECT_LE(p.size(), 1024u);
    tables.clear();
    for (Row& r : Rows(p, &tables)) joined.push_back(r);
    EXPECT_EQ(tables, std::vector<std::string>{"emb"});
  }
  EXPECT_EQ(joined, want);

  // Cut short, or an unknown entry: Corruption naming where, and nothing crashes.
  const SlotRowsVisitor kNoVisitor{nullptr, nullptr, nullptr, nullptr};
  for (size_t cut : {data.size() - 1, data.size() - 30, size_t{5}}) {
    Status s = ParseSlotRows(std::string_view(data).substr(0, cut), kNoVisitor);
    EXPECT_EQ(s.code(), StatusCode::kCorruption) << cut;
    EXPECT_NE(s.message().find("cut short"), std::string::npos) << s.ToString();
  }
  std::string junk = data + "X";
  EXPECT_NE(ParseSlotRows(junk, kNoVisitor).message().find("unknown type"),
            std::string::npos);
  // A row claiming more floats than there are bytes.
  std::string huge;
  float f = 1;
  AppendSlotRow(&huge, 1, 2, {}, &f, 1);
  huge[huge.size() - 8] = '\xff';  // n's low byte
  EXPECT_EQ(ParseSlotRows(huge, kNoVisitor).code(), StatusCode::kCorruption);
}

// Metadata records travel with the table entries: in every piece, read back byte for byte
// (binary values, an empty one), and a record cut short is Corruption.
TEST(SlotRows, MetaRecordsRoundTripInEveryPiece) {
  std::string data;
  AppendSlotTable(&data, 7, TableSpec::Sparse("emb", 1));
  const std::string binary("a\0b\xff", 4);
  AppendSlotMeta(&data, "worker/0/position", binary);
  AppendSlotMeta(&data, "empty", "");
  for (uint64_t k = 0; k < 50; ++k) {
    std::vector<float> f = {1.0f, 2.0f};
    AppendSlotRow(&data, 7, k, SlotRowMeta{}, f.data(), 2);
  }
  auto records = [](std::string_view d) {
    std::vector<std::pair<std::string, std::string>> out;
    Status s = ParseSlotRows(d, {nullptr, nullptr, nullptr,
                                 [&](std::string_view n, std::string_view v) {
                                   out.emplace_back(std::string(n), std::string(v));
                                   return Status::OK();
                                 }});
    EXPECT_TRUE(s.ok()) << s.ToString();
    return out;
  };
  const std::vector<std::pair<std::string, std::string>> want = {
      {"worker/0/position", binary}, {"empty", ""}};
  EXPECT_EQ(records(data), want);
  EXPECT_EQ(Rows(data).size(), 50u);  // a visitor without `meta` skips the records
  auto split = SplitSlotRows(data, 512);
  ASSERT_TRUE(split.ok()) << split.status().ToString();
  ASSERT_GT(split->pieces.size(), 1u);
  for (const std::string& p : split->pieces) EXPECT_EQ(records(p), want);
  std::string cut;
  AppendSlotMeta(&cut, "name", "value");
  for (size_t n : {size_t{3}, size_t{7}, cut.size() - 1}) {
    Status s = ParseSlotRows(std::string_view(cut).substr(0, n), {});
    EXPECT_EQ(s.code(), StatusCode::kCorruption) << n;
    EXPECT_NE(s.message().find("a record cut short"), std::string::npos) << s.ToString();
  }
}

}  // namespace
}  // namespace tessera::internal
