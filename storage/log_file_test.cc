// The request log's segment files: what a crash leaves is cut, damage elsewhere is reported,
// truncation deletes whole segments, the relaxed mode writes on Flush().
#include "storage/log_file_internal.h"

#include <glog/logging.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "storage/log_test_util_internal.h"
#include "storage/test_util_internal.h"

namespace tessera::internal {
namespace {

std::unique_ptr<LogFile> MustOpen(const std::string& dir, uint64_t segment_bytes = 1 << 20,
                                  bool buffered = false) {
  LogFileOptions o;
  o.dir = dir;
  o.segment_bytes = segment_bytes;
  o.buffered = buffered;
  auto log = LogFile::Open(o);
  EXPECT_TRUE(log.ok()) << log.status().ToString();
  return log.ok() ? std::move(*log) : nullptr;
}

std::string Payload(uint64_t seq) { return "entry-" + std::to_string(seq) + std::string(seq % 7, 'x'); }

std::vector<std::string> Segments(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    names.push_back(e.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

TEST(LogFileTest, RecordsReadBackInOrderAcrossSegmentsAndReopen) {
  TempDir dir;
  {
    auto log = MustOpen(dir.path(), /*segment_bytes=*/256);
    for (uint64_t s = 1; s <= 40; ++s) ASSERT_TRUE(log->Append(s, Payload(s)).ok());
    // Parts are one record: the same as their concatenation.
    const std::string_view parts[] = {"entry-", "41", "xxxxxx"};
    ASSERT_TRUE(log->Append(41, parts).ok());
    EXPECT_EQ(log->last_seq(), 41u);
    EXPECT_EQ(log->Append(41, "again").code(), StatusCode::kInvalidArgument);
  }
  EXPECT_GT(Segments(dir.path()).size(), 3u);
  auto log = MustOpen(dir.path(), 256);
  EXPECT_EQ(log->last_seq(), 41u);
  auto all = ReadAll(*log);
  ASSERT_EQ(all.size(), 41u);
  for (uint64_t s = 1; s <= 41; ++s) {
    EXPECT_EQ(all[s - 1].first, s);
    EXPECT_EQ(all[s - 1].second, Payload(s));
  }
  auto tail = ReadAll(*log, 30);
  ASSERT_EQ(tail.size(), 11u);
  EXPECT_EQ(tail.front().first, 31u);
  ASSERT_TRUE(log->Append(42, Payload(42)).ok());
  EXPECT_EQ(ReadAll(*log, 41).size(), 1u);
}

TEST(LogFileTest, TornLastRecordIsCutAndAppendsContinueAfterIt) {
  TempDir dir;
  std::string last_segment;
  {
    auto log = MustOpen(dir.path());
    for (uint64_t s = 1; s <= 5; ++s) ASSERT_TRUE(log->Append(s, Payload(s)).ok());
  }
  last_segment = dir.path() + "/" + Segments(dir.path()).back();
  const auto size = std::filesystem::file_size(last_segment);
  std::filesystem::resize_file(last_segment, size - 3);  // record 5 torn
  {
    auto log = MustOpen(dir.path());
    EXPECT_EQ(log->last_seq(), 4u);
    ASSERT_TRUE(log->Append(5, "five again").ok());
  }
  auto log = MustOpen(dir.path());
  auto all = ReadAll(*log);
  ASSERT_EQ(all.size(), 5u);
  EXPECT_EQ(all.back().second, "five again");
}

TEST(LogFileTest, DamageBeforeTheLastSegmentIsCorruptionNotACut) {
  TempDir dir;
  {
    auto log = MustOpen(dir.path(), /*segment_bytes=*/128);
    for (uint64_t s = 1; s <= 20; ++s) ASSERT_TRUE(log->Append(s, Payload(s)).ok());
  }
  const auto names = Segments(dir.path());
  ASSERT_GT(names.size(), 2u);
  {
    std::fstream f(dir.path() + "/" + names[0], std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(LogFile::kHeaderBytes + 2);
    f.put('#');  // a payload byte of the first record
  }
  auto log = MustOpen(dir.path(), 128);
  Status s;
  ReadAll(*log, 0, &s);
  EXPECT_EQ(s.code(), StatusCode::kCorruption) << s.ToString();
  EXPECT_NE(s.message().find("checksum"), std::string::npos) << s.ToString();
}

// Overwrites `n` bytes at `offset` of `path` with 0xA5.
void Flip(const std::string& path, uint64_t offset, size_t n) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(static_cast<std::streamoff>(offset));
  for (size_t i = 0; i < n; ++i) f.put(static_cast<char>(0xA5));
}

// The offset of record `seq` in a single-segment log of Payload(1..) records.
uint64_t OffsetOf(uint64_t seq) {
  uint64_t off = 0;
  for (uint64_t s = 1; s < seq; ++s) off += LogFile::kHeaderBytes + Payload(s).size();
  return off;
}

TEST(LogFileTest, DamageFollowedByRecordsThatVerifyIsCorruptionNotATornTail) {
  TempDir dir;
  {
    auto log = MustOpen(dir.path());
    for (uint64_t s = 1; s <= 50; ++s) ASSERT_TRUE(log->Append(s, Payload(s)).ok());
  }
  const std::string segment = dir.path() + "/" + Segments(dir.path()).back();
  const auto size = std::filesystem::file_size(segment);
  const uint64_t at = OffsetOf(10);
  Flip(segment, at + LogFile::kHeaderBytes + 2, 8);  // record 10's payload
  LogFileOptions o;
  o.dir = dir.path();
  auto log = LogFile::Open(o);
  ASSERT_FALSE(log.ok());
  EXPECT_EQ(log.status().code(), StatusCode::kCorruption) << log.status().ToString();
  EXPECT_NE(log.status().message().find(segment + " at byte " + std::to_string(at)),
            std::string::npos)
      << log.status().ToString();
  EXPECT_NE(log.status().message().find("--repair_log"), std::string::npos)
      << log.status().ToString();
  // Nothing was cut: records 11..50 were acknowledged.
  EXPECT_EQ(std::filesystem::file_size(segment), size);
}

TEST(LogFileTest, DamagedHeaderFollowedByRecordsIsCorruptionToo) {
  TempDir dir;
  {
    auto log = MustOpen(dir.path());
    for (uint64_t s = 1; s <= 50; ++s) ASSERT_TRUE(log->Append(s, Payload(s)).ok());
  }
  const std::string segment = dir.path() + "/" + Segments(dir.path()).back();
  Flip(segment, OffsetOf(30) + 2, 8);  // magic and length of record 30
  LogFileOptions o;
  o.dir = dir.path();
  auto log = LogFile::Open(o);
  EXPECT_EQ(log.status().code(), StatusCode::kCorruption) << log.status().ToString();
}

TEST(LogFileTest, DamageInTheLastRecordIsStillATornTail) {
  TempDir dir;
  {
    auto log = MustOpen(dir.path());
    for (uint64_t s = 1; s <= 5; ++s) ASSERT_TRUE(log->Append(s, Payload(s)).ok());
  }
  const std::string segment = dir.path() + "/" + Segments(dir.path()).back();
  Flip(segment, OffsetOf(5) + LogFile::kHeaderBytes + 1, 4);
  auto log = MustOpen(dir.path());
  ASSERT_NE(log, nullptr);
  EXPECT_EQ(log->last_seq(), 4u);
  EXPECT_EQ(std::filesystem::file_size(segment), OffsetOf(5));
}

TEST(LogFileTest, RepairKeepsEveryRecordThatVerifiesAndTheLogGoesOn) {
  TempDir dir;
  {
    auto log = MustOpen(dir.path(), /*segment_bytes=*/512);
    for (uint64_t s = 1; s <= 60; ++s) ASSERT_TRUE(log->Append(s, Payload(s)).ok());
  }
  const auto names = Segments(dir.path());
  ASSERT_GT(names.size(), 3u);
  // Damage in an earlier segment (records lost) and in the middle of the last one.
  const std::string first = dir.path() + "/" + names[1];
  const std::string last = dir.path() + "/" + names.back();
  Flip(first, LogFile::kHeaderBytes + 3, 4);  // within the record: payloads are 8+ bytes
  Flip(last, LogFile::kHeaderBytes + 1, 2);
  {
    LogFileOptions o;
    o.dir = dir.path();
    ASSERT_EQ(LogFile::Open(o).status().code(), StatusCode::kCorruption);
  }
  auto report = LogFile::Repair(dir.path());
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_EQ(report->lost_records, 2u);
  EXPECT_EQ(report->kept, 58u);
  EXPECT_EQ(report->lines.size(), 4u);  // two damaged ranges, two runs of lost records
  for (const std::string& line : report->lines) LOG(INFO) << line;
  const uint64_t lost_a = std::stoull(names[1].substr(0, 20));
  const uint64_t lost_b = std::stoull(names.back().substr(0, 20));
  auto log = MustOpen(dir.path(), 512);
  ASSERT_NE(log, nullptr);
  EXPECT_EQ(log->last_seq(), 60u);
  auto all = ReadAll(*log);
  ASSERT_EQ(all.size(), 58u);
  for (const auto& [seq, payload] : all) {
    EXPECT_NE(seq, lost_a);
    EXPECT_NE(seq, lost_b);
    EXPECT_EQ(payload, Payload(seq));
  }
  ASSERT_TRUE(log->Append(61, Payload(61)).ok());
  EXPECT_EQ(ReadAll(*log, 60).size(), 1u);
  // A second repair finds nothing to do.
  log.reset();
  auto again = LogFile::Repair(dir.path());
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->lost_records, 0u);
  EXPECT_TRUE(again->lines.empty());
  EXPECT_EQ(again->kept, 59u);
}

TEST(LogFileTest, AMissingSegmentIsAGap) {
  TempDir dir;
  {
    auto log = MustOpen(dir.path(), /*segment_bytes=*/128);
    for (uint64_t s = 1; s <= 20; ++s) ASSERT_TRUE(log->Append(s, Payload(s)).ok());
  }
  const auto names = Segments(dir.path());
  ASSERT_GT(names.size(), 3u);
  std::filesystem::remove(dir.path() + "/" + names[1]);
  auto log = MustOpen(dir.path(), 128);
  Status s;
  ReadAll(*log, 0, &s);
  EXPECT_EQ(s.code(), StatusCode::kCorruption) << s.ToString();
}

TEST(LogFileTest, TruncateDeletesWholeSegmentsOnly) {
  TempDir dir;
  auto log = MustOpen(dir.path(), /*segment_bytes=*/128);
  for (uint64_t s = 1; s <= 30; ++s) ASSERT_TRUE(log->Append(s, Payload(s)).ok());
  const size_t before = Segments(dir.path()).size();
  const uint64_t bytes = log->bytes();
  ASSERT_TRUE(log->Truncate(15).ok());
  EXPECT_LT(Segments(dir.path()).size(), before);
  EXPECT_LT(log->bytes(), bytes);
  // Records after the mark are all there (and perhaps a few at or below it).
  auto all = ReadAll(*log);
  ASSERT_FALSE(all.empty());
  EXPECT_LE(all.front().first, 16u);
  EXPECT_EQ(all.back().first, 30u);
  ASSERT_TRUE(log->Truncate(30).ok());  // the active segment is small: kept
  ASSERT_TRUE(log->Append(31, Payload(31)).ok());
  auto reopened = MustOpen(dir.path(), 128);
  auto tail = ReadAll(*reopened, 30);
  ASSERT_EQ(tail.size(), 1u);
  EXPECT_EQ(tail[0].first, 31u);
}

TEST(LogFileTest, AGroupIsOneWriteOfWholeRecords) {
  TempDir dir;
  {
    auto log = MustOpen(dir.path());
    std::vector<std::string> payloads;
    for (uint64_t s = 1; s <= 300; ++s) payloads.push_back(Payload(s));  // > IOV_MAX / 3
    std::vector<std::array<std::string_view, 2>> parts(payloads.size());
    std::vector<LogEntry> entries;
    for (size_t i = 0; i < payloads.size(); ++i) {
      parts[i] = {std::string_view(payloads[i]).substr(0, 3),
                  std::string_view(payloads[i]).substr(3)};
      entries.push_back(LogEntry{i + 1, parts[i]});
    }
    ASSERT_TRUE(log->Append(entries).ok());
    EXPECT_EQ(log->last_seq(), 300u);
    // Out of order inside a group: refused whole.
    const std::string_view x = "x";
    const LogEntry bad[] = {{302, {&x, 1}}, {301, {&x, 1}}};
    EXPECT_EQ(log->Append(bad).code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(log->last_seq(), 300u);
  }
  auto log = MustOpen(dir.path());
  auto all = ReadAll(*log);
  ASSERT_EQ(all.size(), 300u);
  for (uint64_t s = 1; s <= 300; ++s) EXPECT_EQ(all[s - 1].second, Payload(s));
}

TEST(LogFileTest, BufferedModeWritesOnFlush) {
  TempDir dir;
  {
    auto log = MustOpen(dir.path(), 1 << 20, /*buffered=*/true);
    ASSERT_TRUE(log->Append(1, "one").ok());
    ASSERT_TRUE(log->Append(2, "two").ok());
    // Nothing written yet: a process killed now loses these (the relaxed window).
    auto other = MustOpen(dir.path());
    EXPECT_EQ(other->last_seq(), 0u);
    other.reset();
    ASSERT_TRUE(log->Flush().ok());
    auto third = MustOpen(dir.path());
    EXPECT_EQ(third->last_seq(), 2u);
  }
  auto log = MustOpen(dir.path());
  EXPECT_EQ(ReadAll(*log).size(), 2u);
}

}  // namespace
}  // namespace tessera::internal

namespace tessera::internal {
namespace {

// A segment is preallocated while it is written (its size is segment_bytes, zeros after the
// records) and cut to its records when the log closes or moves to the next segment. What kill -9
// leaves (the zeros still there) opens as the records before them, and appends go right after
// the records, not after the zeros.
TEST(LogFilePreallocationTest, ZerosAfterTheRecordsAreTheirEndAndAppendsFollowTheRecords) {
  TempDir dir, crashed;
  constexpr uint64_t kSegment = 1 << 20;
  {
    auto log = MustOpen(dir.path(), kSegment);
    for (uint64_t s = 1; s <= 10; ++s) ASSERT_TRUE(log->Append(s, Payload(s)).ok());
    const std::string segment = dir.path() + "/" + Segments(dir.path()).back();
    EXPECT_EQ(std::filesystem::file_size(segment), kSegment);
    // The files as a process killed now leaves them.
    std::filesystem::copy(dir.path(), crashed.path(),
                          std::filesystem::copy_options::recursive);
  }
  const std::string closed = dir.path() + "/" + Segments(dir.path()).back();
  EXPECT_EQ(std::filesystem::file_size(closed), OffsetOf(11));
  {
    auto log = MustOpen(crashed.path(), kSegment);
    ASSERT_NE(log, nullptr);
    EXPECT_EQ(log->last_seq(), 10u);
    EXPECT_EQ(log->bytes(), OffsetOf(11));
    EXPECT_EQ(log->appended_bytes(), 0u);  // since this Open
    ASSERT_TRUE(log->Append(11, Payload(11)).ok());
    EXPECT_EQ(log->appended_bytes(), OffsetOf(12) - OffsetOf(11));
  }
  const std::string segment = crashed.path() + "/" + Segments(crashed.path()).back();
  EXPECT_EQ(std::filesystem::file_size(segment), OffsetOf(12));
  auto log = MustOpen(crashed.path(), kSegment);
  auto all = ReadAll(*log);
  ASSERT_EQ(all.size(), 11u);
  for (uint64_t s = 1; s <= 11; ++s) EXPECT_EQ(all[s - 1].second, Payload(s));
}

// A machine crash can leave an earlier segment with the zeros of its preallocation (its cut
// to size not yet on disk): Scan and Repair take them for the end of its records.
TEST(LogFilePreallocationTest, ZerosAfterAnEarlierSegmentsRecordsAreNoDamage) {
  TempDir dir;
  {
    auto log = MustOpen(dir.path(), /*segment_bytes=*/256);
    for (uint64_t s = 1; s <= 30; ++s) ASSERT_TRUE(log->Append(s, Payload(s)).ok());
  }
  const auto names = Segments(dir.path());
  ASSERT_GT(names.size(), 3u);
  const std::string first = dir.path() + "/" + names[0];
  std::filesystem::resize_file(first, std::filesystem::file_size(first) + 4096);
  {
    auto log = MustOpen(dir.path(), 256);
    auto all = ReadAll(*log);
    ASSERT_EQ(all.size(), 30u);
    for (uint64_t s = 1; s <= 30; ++s) EXPECT_EQ(all[s - 1].first, s);
  }
  auto report = LogFile::Repair(dir.path());
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_EQ(report->kept, 30u);
  EXPECT_TRUE(report->lines.empty());
}

// A segment created and preallocated right before a crash, with no record in it, is dropped
// at the next open; the records of the segment before it stay the log's end.
TEST(LogFilePreallocationTest, ASegmentOfOnlyZerosIsDropped) {
  TempDir dir;
  {
    auto log = MustOpen(dir.path(), /*segment_bytes=*/256);
    for (uint64_t s = 1; s <= 12; ++s) ASSERT_TRUE(log->Append(s, Payload(s)).ok());
  }
  const std::string empty = dir.path() + "/" + std::string(18, '0') + "13.tlog";
  {
    std::ofstream f(empty, std::ios::binary);
  }
  std::filesystem::resize_file(empty, 256);
  auto log = MustOpen(dir.path(), 256);
  ASSERT_NE(log, nullptr);
  EXPECT_EQ(log->last_seq(), 12u);
  EXPECT_FALSE(std::filesystem::exists(empty));
  ASSERT_TRUE(log->Append(13, Payload(13)).ok());
  EXPECT_EQ(ReadAll(*log).size(), 13u);
}

}  // namespace
}  // namespace tessera::internal
