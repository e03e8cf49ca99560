#include "ps/codec.h"

#include <flatbuffers/flatbuffers.h>
#include <gtest/gtest.h>

#include <random>

#include "schema/tessera_generated.h"

namespace tessera {
namespace {

TEST(CodecTest, RoundTrip) {
  Header h;
  h.request_id = 123456789012345ULL;
  h.op = Op::kSparsePush;
  h.table_id = 0xdeadbeefcafeULL;
  h.elem_type = ElemType::kF32;
  h.count = 1000;
  h.dim = 16;
  h.offset = 7;
  h.worker_id = 3;
  h.clock = 42;
  h.staleness = 2;
  h.num_workers = 4;
  h.status = StatusCode::kNotFound;
  h.message = "no such table";
  h.name = "barrier-1";
  h.client_id = 0x0123456789abcdefULL;
  h.client_seq = 77;
  h.map_version = 0xfedcba9876543210ULL;
  h.client_origin = 3;
  h.replica_from = 2;
  TableSpec spec = TableSpec::Sparse("emb", 16);
  spec.optimizer.kind = OptimizerKind::kAdam;
  spec.optimizer.learning_rate = 0.003f;
  spec.initializer = {InitializerKind::kNormal, 0, 0.01f, 99};
  spec.admission = {3, 0.5f};
  spec.eviction = {100, 3600};
  h.spec = spec;
  std::string bytes;
  EncodeHeader(h, &bytes);
  Header d;
  ASSERT_TRUE(DecodeHeader(bytes.data(), bytes.size(), &d).ok());
  EXPECT_EQ(d.request_id, h.request_id);
  EXPECT_EQ(d.op, h.op);
  EXPECT_EQ(d.table_id, h.table_id);
  EXPECT_EQ(d.elem_type, h.elem_type);
  EXPECT_EQ(d.count, h.count);
  EXPECT_EQ(d.dim, h.dim);
  EXPECT_EQ(d.offset, h.offset);
  EXPECT_EQ(d.worker_id, h.worker_id);
  EXPECT_EQ(d.clock, h.clock);
  EXPECT_EQ(d.staleness, h.staleness);
  EXPECT_EQ(d.num_workers, h.num_workers);
  EXPECT_EQ(d.status, h.status);
  EXPECT_EQ(d.message, h.message);
  EXPECT_EQ(d.name, h.name);
  EXPECT_EQ(d.client_id, h.client_id);
  EXPECT_EQ(d.client_seq, h.client_seq);
  EXPECT_EQ(d.map_version, h.map_version);
  EXPECT_EQ(d.client_origin, 3u);
  EXPECT_EQ(d.replica_from, 2u);
  ASSERT_TRUE(d.spec.has_value());
  EXPECT_EQ(DescribeSpecDifference(*d.spec, spec), "");
}

TEST(CodecTest, DefaultsRoundTrip) {
  Header h;
  h.op = Op::kPing;
  std::string bytes;
  EncodeHeader(h, &bytes);
  Header d;
  ASSERT_TRUE(DecodeHeader(bytes.data(), bytes.size(), &d).ok());
  EXPECT_EQ(d.staleness, -1);
  EXPECT_EQ(d.map_version, 0u);
  EXPECT_EQ(d.client_origin, 0u);
  EXPECT_EQ(d.replica_from, 0u);
  EXPECT_FALSE(d.spec.has_value());
}

// The map version is an optional field at the end of the table: a static-cluster envelope (0)
// does not carry it, so it is byte-identical to one of a build without the field, and such an
// envelope decodes as version 0.
TEST(CodecTest, MapVersionIsAbsentWhenZero) {
  Header h;
  h.op = Op::kSparsePush;
  h.count = 3;
  std::string without, with;
  EncodeHeader(h, &without);
  h.map_version = 7;
  EncodeHeader(h, &with);
  EXPECT_GT(with.size(), without.size());
  Header d;
  ASSERT_TRUE(DecodeHeader(without.data(), without.size(), &d).ok());
  EXPECT_EQ(d.map_version, 0u);
  ASSERT_TRUE(DecodeHeader(with.data(), with.size(), &d).ok());
  EXPECT_EQ(d.map_version, 7u);
}

TEST(CodecTest, RejectsGarbageAndTruncation) {
  Header d;
  EXPECT_FALSE(DecodeHeader("", 0, &d).ok());
  std::string garbage = "this is not a flatbuffer at all, no sir";
  EXPECT_EQ(DecodeHeader(garbage.data(), garbage.size(), &d).code(), StatusCode::kInvalidArgument);
  Header h;
  h.op = Op::kSparsePull;
  h.message = "some text to make it longer";
  std::string bytes;
  EncodeHeader(h, &bytes);
  for (size_t cut = 1; cut < bytes.size(); ++cut) {
    EXPECT_FALSE(DecodeHeader(bytes.data(), cut, &d).ok()) << "cut at " << cut;
  }
  std::string huge(kMaxEnvelopeBytes + 1, '\0');
  EXPECT_FALSE(DecodeHeader(huge.data(), huge.size(), &d).ok());
}

TEST(CodecTest, RandomBytesNeverCrash) {
  std::mt19937_64 rng(7);
  Header h;
  h.op = Op::kSparsePush;
  h.spec = TableSpec::Sparse("x", 4);
  std::string bytes;
  EncodeHeader(h, &bytes);
  for (int i = 0; i < 20000; ++i) {
    std::string m = bytes;
    const int flips = 1 + rng() % 4;
    for (int f = 0; f < flips; ++f) m[rng() % m.size()] = static_cast<char>(rng());
    Header d;
    (void)DecodeHeader(m.data(), m.size(), &d).ok();
  }
}

TEST(CodecTest, VersionMismatchNamesBoth) {
  Header h;
  h.op = Op::kPing;
  h.version = kProtocolVersion + 6;
  h.request_id = 77;
  std::string bytes;
  EncodeHeader(h, &bytes);
  Header d;
  Status s = DecodeHeader(bytes.data(), bytes.size(), &d);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find(std::to_string(kProtocolVersion + 6)), std::string::npos);
  EXPECT_NE(s.message().find(std::to_string(kProtocolVersion)), std::string::npos);
  EXPECT_EQ(d.request_id, 77u);
}

TEST(CodecTest, UnknownOpRejected) {
  Header h;
  h.op = static_cast<Op>(200);
  std::string bytes;
  EncodeHeader(h, &bytes);
  Header d;
  EXPECT_EQ(DecodeHeader(bytes.data(), bytes.size(), &d).code(), StatusCode::kInvalidArgument);
}

TEST(CodecTest, SpecBytesRoundTrip) {
  TableSpec s = TableSpec::Dense("mlp/w1", 12345);
  s.optimizer.kind = OptimizerKind::kFtrl;
  auto r = DecodeTableSpec(EncodeTableSpec(s));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(DescribeSpecDifference(*r, s), "");
  EXPECT_EQ(DecodeTableSpec("garbage").status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tessera
