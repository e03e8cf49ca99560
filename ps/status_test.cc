#include "ps/status.h"

#include <gtest/gtest.h>

namespace tessera {
namespace {

Result<int> Half(int x) {
  if (x % 2) return Status::InvalidArgument("odd: " + std::to_string(x));
  return x / 2;
}

Status Quarter(int x, int* out) {
  TESSERA_ASSIGN_OR_RETURN(int h, Half(x));
  TESSERA_ASSIGN_OR_RETURN(*out, Half(h));
  return Status::OK();
}

TEST(StatusTest, CodesAndMessages) {
  EXPECT_TRUE(Status::OK().ok());
  Status s = Status::NotFound("table 'x'");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_EQ(s.ToString(), "NotFound: table 'x'");
  EXPECT_EQ(s.WithContext("server 1").message(), "server 1: table 'x'");
}

TEST(StatusTest, ResultAndMacros) {
  int q = 0;
  EXPECT_TRUE(Quarter(8, &q).ok());
  EXPECT_EQ(q, 2);
  Status s = Quarter(6, &q);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "odd: 3");
  Result<int> r = Status::OK();  // an OK status is not a value
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInternal);
}

TEST(StatusTest, ResultValueOnAnErrorDiesWithTheStatus) {
  Result<std::string> r = Status::NotFound("no table named 'x'");
  EXPECT_EQ(r.ValueOr("fallback"), "fallback");
  EXPECT_DEATH((void)r.value(),
               "Result::value\\(\\) called on an error: NotFound: no table named 'x'");
  EXPECT_DEATH((void)*r, "NotFound: no table named 'x'");
  EXPECT_DEATH((void)r->size(), "NotFound");
  EXPECT_DEATH((void)std::move(r).ValueOrDie(), "NotFound");
  Result<std::string> ok = std::string("v");
  EXPECT_EQ(ok.value(), "v");
  EXPECT_EQ(ok.ValueOr("fallback"), "v");
}

}  // namespace
}  // namespace tessera
