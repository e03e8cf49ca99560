// The request log with fsync reuses the files of truncated segments (spares): a reused segment's
// old records are never read back, damage in it is still told from its end, and what a crash
// leaves opens as the records written.
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <random>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "storage/log_file_internal.h"
#include "storage/log_test_util_internal.h"
#include "storage/test_util_internal.h"

namespace tessera::internal {
namespace {

constexpr uint64_t kSegment = 1024;

std::unique_ptr<LogFile> MustOpen(const std::string& dir) {
  LogFileOptions o;
  o.dir = dir;
  o.fsync = true;
  o.segment_bytes = kSegment;
  auto log = LogFile::Open(o);
  EXPECT_TRUE(log.ok()) << log.status().ToString();
  return log.ok() ? std::move(*log) : nullptr;
}

// Records 1..40 are large (old segments of 3 records, ~1.2 KiB); later ones small, so a reused
// segment closes before its records reach the end of the old ones.
std::string Payload(uint64_t seq) {
  return "entry-" + std::to_string(seq) +
         std::string(seq <= 40 ? 390 : 40 + seq % 7, 'a' + seq % 26);
}

std::vector<std::string> Files(const std::string& dir, const std::string& suffix) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().filename().string().ends_with(suffix)) names.push_back(e.path().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::string Contents(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

void Overwrite(const std::string& path, const std::string& data) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(data.data(), static_cast<std::streamsize>(data.size()));
}

// Whether `path` starts with a reused segment's header.
bool Reused(const std::string& path) { return Contents(path).starts_with("TSLS"); }

// Writes 1..40, truncates to 36 (segments of 1..36 become spares or go), then appends from 41
// until a spare is reused as the active segment and holds `records` records; returns the last
// seq appended.
uint64_t WriteIntoAReusedSegment(LogFile& log, const std::string& dir, int records) {
  for (uint64_t s = 1; s <= 40; ++s) EXPECT_TRUE(log.Append(s, Payload(s)).ok());
  EXPECT_TRUE(log.Truncate(36).ok());
  EXPECT_EQ(Files(dir, ".spare").size(), 2u);
  uint64_t seq = 40;
  int in_reused = 0;
  while (in_reused < records && seq < 200) {
    ++seq;
    EXPECT_TRUE(log.Append(seq, Payload(seq)).ok());
    in_reused = Reused(Files(dir, ".tlog").back()) ? in_reused + 1 : 0;
  }
  EXPECT_EQ(in_reused, records) << "no segment was reused";
  return seq;
}

TEST(LogFileReuseTest, AReusedSegmentsOldRecordsAreNotReadAndItsRecordsReopen) {
  TempDir dir, crashed;
  uint64_t last = 0;
  {
    auto log = MustOpen(dir.path());
    last = WriteIntoAReusedSegment(*log, dir.path(), 2);
    // The active segment is a spare's file: its old records lie after the two new ones.
    const std::string active = Files(dir.path(), ".tlog").back();
    EXPECT_GT(std::filesystem::file_size(active),
              LogFile::kSegmentHeaderBytes + 2 * (LogFile::kHeaderBytes + 47));
    // The files as kill -9 leaves them (nothing cut to size).
    std::filesystem::copy(dir.path(), crashed.path(), std::filesystem::copy_options::recursive);
  }
  for (const std::string* d : {&dir.path(), &crashed.path()}) {
    auto log = MustOpen(*d);
    ASSERT_NE(log, nullptr) << *d;
    EXPECT_EQ(log->last_seq(), last) << *d;
    const auto all = ReadAll(*log, 36);
    ASSERT_EQ(all.size(), last - 36) << *d;
    for (uint64_t s = 37; s <= last; ++s) {
      EXPECT_EQ(all[s - 37].first, s) << *d;
      EXPECT_EQ(all[s - 37].second, Payload(s)) << *d;
    }
    ASSERT_TRUE(log->Append(last + 1, Payload(last + 1)).ok());
  }
  auto report = LogFile::Repair(crashed.path());
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_TRUE(report->lines.empty()) << report->lines.front();
  EXPECT_EQ(report->kept, last + 1 - 36);  // 37 .. last + 1 (segments of 1..36 gone)
  auto log = MustOpen(crashed.path());
  EXPECT_EQ(ReadAll(*log, 36).size(), last + 1 - 36);
}

// A machine crash can keep an earlier reused segment at its old length (its cut to size not on
// disk): its old bytes after its records are no damage for Scan and Repair either.
TEST(LogFileReuseTest, OldBytesAfterAnEarlierReusedSegmentsRecordsAreNoDamage) {
  TempDir dir;
  std::string reused, full;  // the reused segment's path, and its bytes when it was full
  uint64_t last = 0;
  {
    auto log = MustOpen(dir.path());
    last = WriteIntoAReusedSegment(*log, dir.path(), 1);
    reused = Files(dir.path(), ".tlog").back();
    while (Files(dir.path(), ".tlog").back() == reused) {
      full = Contents(reused);
      ++last;
      ASSERT_TRUE(log->Append(last, Payload(last)).ok());
    }
    ASSERT_TRUE(log->Append(last + 1, Payload(last + 1)).ok());
    ++last;
  }
  ASSERT_GT(full.size(), std::filesystem::file_size(reused)) << "no old bytes after its records";
  Overwrite(reused, full);
  {
    auto log = MustOpen(dir.path());
    ASSERT_NE(log, nullptr);
    const auto all = ReadAll(*log, 36);
    ASSERT_EQ(all.size(), last - 36);
    for (uint64_t s = 37; s <= last; ++s) EXPECT_EQ(all[s - 37].second, Payload(s));
  }
  auto report = LogFile::Repair(dir.path());
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_TRUE(report->lines.empty()) << report->lines.front();
  EXPECT_EQ(report->kept, last - 36);
}

// Damage inside a reused segment followed by a record of its own is Corruption (acknowledged
// records follow it: nothing is cut); damage in its last record is a torn tail, cut at that
// record, and the old bytes after it stay unread.
TEST(LogFileReuseTest, DamageInAReusedSegmentIsToldFromItsEnd) {
  for (const bool in_last : {false, true}) {
    TempDir dir;
    uint64_t last = 0;
    std::string active;
    {
      auto log = MustOpen(dir.path());
      last = WriteIntoAReusedSegment(*log, dir.path(), 3);
      active = Files(dir.path(), ".tlog").back();
      std::filesystem::copy_file(active, active + ".copy");  // before the cut at close
    }
    std::string data = Contents(active + ".copy");
    std::filesystem::remove(active + ".copy");
    // Record 1 of 3 starts after the header; the last after two records of this segment.
    uint64_t at = LogFile::kSegmentHeaderBytes;
    if (in_last) {
      at += 2 * LogFile::kHeaderBytes + Payload(last - 2).size() + Payload(last - 1).size();
    }
    data[at + LogFile::kHeaderBytes + 3] ^= 0x5a;  // a payload byte: the checksum fails
    Overwrite(active, data);
    LogFileOptions o;
    o.dir = dir.path();
    o.fsync = true;
    o.segment_bytes = kSegment;
    auto log = LogFile::Open(o);
    if (!in_last) {
      ASSERT_FALSE(log.ok());
      EXPECT_EQ(log.status().code(), StatusCode::kCorruption) << log.status().ToString();
      EXPECT_EQ(std::filesystem::file_size(active), data.size()) << "nothing is cut";
      continue;
    }
    ASSERT_TRUE(log.ok()) << log.status().ToString();
    EXPECT_EQ((*log)->last_seq(), last - 1);
    const auto all = ReadAll(**log, 36);
    ASSERT_EQ(all.size(), last - 1 - 36);
    EXPECT_EQ(all.back().first, last - 1);
    EXPECT_EQ(all.back().second, Payload(last - 1));
    ASSERT_TRUE((*log)->Append(last, "again").ok());
    EXPECT_EQ(ReadAll(**log, last - 1).at(0).second, "again");
  }
}


// kill -9 at random moments of a process that appends with fsync, truncates as it goes (so
// every new segment reuses a spare) and reports each acknowledged record: after each kill the
// log opens with every acknowledged record after the truncation mark, whole and in sequence, and
// nothing else; the next process goes on from there.
TEST(LogFileReuseTest, KillDuringAppendsAndReuseKeepsEveryAcknowledgedRecord) {
  TempDir dir;
  std::mt19937 rng(testing::UnitTest::GetInstance()->random_seed());
  uint64_t acked = 0;
  int reused = 0;
  for (int round = 0; round < 6; ++round) {
    int fds[2];
    ASSERT_EQ(::pipe(fds), 0);
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::close(fds[0]);
      LogFileOptions o;
      o.dir = dir.path();
      o.fsync = true;
      o.segment_bytes = 2048;
      auto log = LogFile::Open(o);
      if (!log.ok()) ::_exit(3);
      for (uint64_t seq = (*log)->last_seq() + 1;; ++seq) {
        if (!(*log)->Append(seq, Payload(seq + 40)).ok()) ::_exit(4);
        if (seq % 10 == 0 && !(*log)->Truncate(seq - 20).ok()) ::_exit(5);
        const std::string line = std::to_string(seq) + "\n";
        if (::write(fds[1], line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
          ::_exit(6);
        }
      }
    }
    ::close(fds[1]);
    // Read acknowledgements for a random while, kill, then read what was sent before the kill.
    const auto until = std::chrono::steady_clock::now() +
                       std::chrono::milliseconds(std::uniform_int_distribution<int>(50, 400)(rng));
    std::string got;
    char buf[4096];
    bool killed = false;
    for (;;) {
      if (!killed && std::chrono::steady_clock::now() >= until) {
        ::kill(pid, SIGKILL);
        killed = true;
      }
      pollfd p{fds[0], POLLIN, 0};
      if (::poll(&p, 1, 10) <= 0) continue;
      const ssize_t n = ::read(fds[0], buf, sizeof(buf));
      if (n <= 0) break;  // the child is gone and the pipe drained
      got.append(buf, static_cast<size_t>(n));
    }
    ::close(fds[0]);
    int wstatus = 0;
    ASSERT_EQ(::waitpid(pid, &wstatus, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(wstatus)) << "the child stopped on its own: " << wstatus;
    for (size_t at = got.find('\n'), from = 0; at != std::string::npos;
         from = at + 1, at = got.find('\n', from)) {
      acked = std::max<uint64_t>(acked, std::stoull(got.substr(from, at - from)));
    }
    for (const std::string& f : Files(dir.path(), ".tlog")) reused += Reused(f) ? 1 : 0;
    auto log = MustOpen(dir.path());
    ASSERT_NE(log, nullptr) << "round " << round;
    // The record being appended at the kill may be there too (written, not yet reported).
    EXPECT_GE(log->last_seq(), acked) << "round " << round;
    EXPECT_LE(log->last_seq(), acked + 1) << "round " << round;
    const uint64_t mark = acked > 20 ? acked - 20 : 0;
    const auto all = ReadAll(*log, mark);
    ASSERT_EQ(all.size(), log->last_seq() - mark) << "round " << round;
    for (size_t i = 0; i < all.size(); ++i) {
      ASSERT_EQ(all[i].first, mark + 1 + i) << "round " << round;
      ASSERT_EQ(all[i].second, Payload(all[i].first + 40)) << "round " << round;
    }
    acked = log->last_seq();
  }
  EXPECT_GT(acked, 60u);
  EXPECT_GT(reused, 0) << "no reused segment was open at any kill";
}

}  // namespace
}  // namespace tessera::internal
