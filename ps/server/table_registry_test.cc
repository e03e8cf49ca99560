#include "ps/server/table_registry_internal.h"

#include <gtest/gtest.h>

namespace tessera::internal {
namespace {

TableSpec Sparse(const std::string& name, uint32_t dim) {
  return TableSpec::Sparse(name, dim, OptimizerSpec{.kind = OptimizerKind::kSgd,
                                                    .learning_rate = 0.1f});
}

Header Request(uint64_t table, Op op) {
  Header h;
  h.table_id = table;
  h.op = op;
  return h;
}

TEST(TableRegistry, FindsTablesByIdKindAndName) {
  TableRegistry tables;
  tables.Add(7, Sparse("emb", 8));
  tables.Add(9, TableSpec::Dense("w", 100, OptimizerSpec{.kind = OptimizerKind::kSgd}));
  EXPECT_EQ(tables.size(), 2u);
  EXPECT_TRUE(tables.contains(7));
  auto emb = tables.Find(Request(7, Op::kSparsePull), TableKind::kSparse, /*rank=*/3);
  ASSERT_TRUE(emb.ok()) << emb.status().ToString();
  EXPECT_EQ((*emb)->spec.dim, 8u);
  auto unknown = tables.Find(Request(8, Op::kSparsePull), TableKind::kSparse, 3);
  EXPECT_EQ(unknown.status().code(), StatusCode::kNotFound);
  EXPECT_NE(unknown.status().message().find("unknown table id 8 on server 3"), std::string::npos);
  auto kind = tables.Find(Request(9, Op::kSparsePush), TableKind::kSparse, 3);
  EXPECT_EQ(kind.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(kind.status().message().find("table 'w' is dense"), std::string::npos);
  EXPECT_EQ(tables.IdOf("w"), std::optional<uint64_t>(9));
  EXPECT_EQ(tables.IdOf("nope"), std::nullopt);
  EXPECT_EQ(tables.List().size(), 2u);
  EXPECT_EQ(tables.Names().size(), 2u);
}

TEST(TableRegistry, SameExistsNamesTheDifference) {
  TableRegistry tables;
  EXPECT_EQ(tables.SameExists(7, Sparse("emb", 8), "(x)").value(), false);
  tables.Add(7, Sparse("emb", 8));
  EXPECT_EQ(tables.SameExists(7, Sparse("emb", 8), "(x)").value(), true);
  auto other = tables.SameExists(7, Sparse("emb", 16), "(existing vs requested)");
  EXPECT_EQ(other.status().code(), StatusCode::kAlreadyExists);
  EXPECT_NE(other.status().message().find("(existing vs requested)"), std::string::npos);
}

}  // namespace
}  // namespace tessera::internal
