#include "ps/table_spec.h"

#include <gtest/gtest.h>

#include <cmath>

namespace tessera {
namespace {

TEST(TableSpecTest, Validation) {
  EXPECT_TRUE(ValidateTableSpec(TableSpec::Sparse("emb", 16)).ok());
  EXPECT_TRUE(ValidateTableSpec(TableSpec::Dense("mlp", 1000)).ok());
  EXPECT_FALSE(ValidateTableSpec(TableSpec::Sparse("", 16)).ok());
  EXPECT_FALSE(ValidateTableSpec(TableSpec::Sparse("emb", 0)).ok());
  EXPECT_FALSE(ValidateTableSpec(TableSpec::Sparse("emb", kMaxSparseDim + 1)).ok());
  EXPECT_FALSE(ValidateTableSpec(TableSpec::Dense("d", 0)).ok());
  TableSpec s = TableSpec::Sparse("emb", 4);
  s.optimizer.learning_rate = NAN;
  EXPECT_FALSE(ValidateTableSpec(s).ok());
  s = TableSpec::Sparse("emb", 4);
  s.optimizer.beta1 = 1.0f;
  EXPECT_FALSE(ValidateTableSpec(s).ok());
  TableSpec d = TableSpec::Dense("d", 10);
  d.admission.min_count = 3;
  EXPECT_FALSE(ValidateTableSpec(d).ok());
}

TEST(TableSpecTest, DifferenceNamesTheFields) {
  TableSpec a = TableSpec::Sparse("emb", 16);
  TableSpec b = a;
  EXPECT_EQ(DescribeSpecDifference(a, b), "");
  b.dim = 32;
  b.optimizer.learning_rate = 0.5f;
  const std::string d = DescribeSpecDifference(a, b);
  EXPECT_NE(d.find("dim: 16 vs 32"), std::string::npos) << d;
  EXPECT_NE(d.find("optimizer.learning_rate: 0.01 vs 0.5"), std::string::npos) << d;
}

TEST(TableSpecTest, TableIdIsStableAndNonZero) {
  EXPECT_EQ(TableIdForName("emb"), TableIdForName("emb"));
  EXPECT_NE(TableIdForName("emb"), TableIdForName("emb2"));
  EXPECT_NE(TableIdForName(""), 0u);
}

}  // namespace
}  // namespace tessera
