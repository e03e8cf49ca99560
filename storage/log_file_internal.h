// The request log of a durable server as plain files: segments of checksummed records, appended
// with one write(2) each (docs/storage.md explains why not a RocksDB column family).
#pragma once

#include <sys/uio.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ps/mutex.h"
#include "ps/status.h"
#include "storage/storage.h"

namespace tessera::internal {

struct LogFileOptions {
  /// Directory of the segments, created if missing.
  std::string dir;
  /// fdatasync each write before Append() / Flush() returns (survives power loss).
  bool fsync = false;
  /// Appends wait in memory until Flush() (or until kMaxBuffer bytes wait): the relaxed mode.
  /// Otherwise Append() has written the record when it returns (survives kill -9).
  bool buffered = false;
  /// A segment is closed and a new one started once it holds this many bytes.
  uint64_t segment_bytes = uint64_t{64} << 20;
  /// With fsync (and not buffered): segments that Truncate drops are kept as spares, at most this
  /// many, and a new segment reuses one instead of a new file. Writes into a reused file's blocks
  /// need no block allocation or extent conversion, which an fdatasync would commit to the
  /// file system's journal. 0: every segment is a new file.
  uint32_t spare_segments = 2;
};

/// What LogFile::Repair kept and dropped.
struct LogRepairReport {
  /// Records that verified and stay in the log.
  uint64_t kept = 0;
  /// Bytes dropped (damaged, or records out of sequence).
  uint64_t dropped_bytes = 0;
  /// Sequence numbers lost between records that verified (holes left in their place).
  uint64_t lost_records = 0;
  /// One line per damaged byte range and per run of lost records, for the operator.
  std::vector<std::string> lines;
};

/// Records of increasing sequence numbers in segment files `<first seq, 20 digits>.tlog`.
/// A segment this log writes is preallocated to segment_bytes (fallocate, zeros past its
/// records), so that a write fills blocks the file already has and fdatasync has no file size to
/// update; a segment is cut to its records when the next one starts and when the log closes. A
/// zero tail (what kill -9 or a machine crash leaves) is the end of a segment's records.
/// With fsync, a segment may reuse the file of one that Truncate dropped (a spare,
/// `<its old name>.spare`; LogFileOptions::spare_segments): such a segment starts with a 16-byte
/// header (u32 magic kSegmentMagic, u32 version 2, u64 random nonce, not 0), and its records'
/// stored checksums are XOR'd with the nonce, so the old records after its own never verify;
/// the bytes after its last record that verifies are its end when no record verifies after them
/// (old bytes, or a torn record: never acknowledged). A segment without that header is version 1.
/// A record is a 24-byte header (u32 magic, u32 length, u64 seq, u64 XXH3 of the payload seeded
/// with seq and length; little-endian) followed by the payload. A hole (magic kHoleMagic,
/// length 0) stands for a record that Repair could not read: it keeps the sequence numbers
/// contiguous and Scan skips it. Thread-safe.
class LogFile {
 public:
  static constexpr uint32_t kMagic = 0x474c5354;         // "TSLG"
  static constexpr uint32_t kHoleMagic = 0x484c5354;     // "TSLH"
  static constexpr uint32_t kSegmentMagic = 0x534c5354;  // "TSLS"
  static constexpr size_t kSegmentHeaderBytes = 16;
  static constexpr size_t kHeaderBytes = 24;
  static constexpr size_t kMaxBuffer = size_t{4} << 20;
  static constexpr uint64_t kMaxRecordBytes = uint64_t{1} << 31;

  /// Opens the log in options.dir. A record torn or damaged at the end of the last segment (what
  /// a crash can leave: it was never acknowledged, and no record that verifies follows it) is
  /// cut off with a warning. Damage followed by a record that verifies is Corruption naming
  /// the file and byte (nothing is cut: acknowledged records follow it); damage in an earlier
  /// segment is found by Scan() and reported as Corruption. Repair() handles both.
  static Result<std::unique_ptr<LogFile>> Open(const LogFileOptions& options);
  /// Rewrites the damaged segments of the (closed) log in `dir`, keeping every record whose
  /// header and checksum verify and putting a hole in place of each sequence number lost
  /// between them; a damaged tail is cut. Segments without damage are left alone. The log
  /// then opens and scans without Corruption. Not to be run while a server has the log open.
  static Result<LogRepairReport> Repair(const std::string& dir);
  ~LogFile();
  LogFile(const LogFile&) = delete;
  LogFile& operator=(const LogFile&) = delete;

  /// Appends record `seq`, which must be above last_seq(). Unbuffered: written (and fdatasync'd
  /// with fsync) when this returns OK. On an error nothing of the record stays in the log.
  Status Append(uint64_t seq, std::string_view payload) { return Append(seq, {&payload, 1}); }
  /// Appends record `seq` whose payload is the concatenation of `parts` (written with one
  /// writev, without copying them together).
  Status Append(uint64_t seq, std::span<const std::string_view> parts) {
    const Entry e{seq, parts};
    return Append({&e, 1});
  }
  using Entry = LogEntry;
  /// Appends records of increasing seq in one write (group commit: one fdatasync for all).
  /// On an error none of them stays in the log.
  Status Append(std::span<const Entry> entries);
  /// Writes what waits in the buffer (buffered mode); fdatasync with fsync.
  Status Flush();
  /// Visits the records with seq > `after`, in order. Corruption for a damaged record or a gap
  /// in the sequence numbers. Scans may run at once (replay reads the log per lane), but not
  /// beside appends.
  Status Scan(uint64_t after, const std::function<Status(uint64_t, std::string_view)>& fn);
  /// Deletes the segments whose records all have seq <= `upto` (the active segment too when it
  /// is large enough to be worth closing).
  Status Truncate(uint64_t upto);

  /// The highest sequence number appended (0: none).
  uint64_t last_seq() const;
  /// Bytes in the segment files.
  uint64_t bytes() const;
  /// Bytes of records (headers and payloads) appended since Open: written to the segments, or
  /// waiting in the buffer (buffered mode). Truncate does not lower it.
  uint64_t appended_bytes() const;

 private:
  struct Segment {
    uint64_t first_seq;  // the seq its name gives (its first record, when it has one)
    uint64_t bytes;      // its header (a reused segment) and records
    std::string path;
    uint64_t nonce = 0;  // a reused segment's (set for the active one only)
  };
  explicit LogFile(const LogFileOptions& o) : options_(o) {}
  Status Recover() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Keeps a spare found at Open for reuse, or deletes it (no reuse, or enough kept).
  void AdoptSpare(const std::filesystem::directory_entry& e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Status StartSegment(uint64_t first_seq) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Opens a spare as the segment at `path` with a new nonce (header synced before the rename);
  // false when none could be (then a new file is made).
  bool ReuseSpare(const std::string& path, uint64_t* nonce) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool recycles() const { return options_.fsync && !options_.buffered; }
  // Preallocates the active segment (once per segment and open); cuts it back to its records.
  void Preallocate() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void TrimActive() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Status WriteOut(struct iovec* iov, size_t n, size_t total) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Status FlushLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Visits segment `s`'s records after `after`. Damage is Corruption, unless `torn` is given
  // (the last segment at Open): then the scan stops there, says what it found in `*torn` and
  // returns OK with `*valid_bytes` at the damage.
  Status ScanSegment(const Segment& s, std::string* torn, uint64_t after,
                     const std::function<Status(uint64_t, std::string_view)>& fn,
                     uint64_t* expect, uint64_t* valid_bytes);

  const LogFileOptions options_;
  mutable Mutex mu_;
  std::vector<Segment> segments_ ABSL_GUARDED_BY(mu_);  // by first_seq; the last is active
  int fd_ ABSL_GUARDED_BY(mu_) = -1;                    // the active segment
  bool preallocated_ ABSL_GUARDED_BY(mu_) = false;      // fd_'s file extended by this log
  uint64_t last_seq_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t appended_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::string buffer_ ABSL_GUARDED_BY(mu_);             // buffered mode: records not yet written
  uint64_t buffer_first_ ABSL_GUARDED_BY(mu_) = 0;      // the lowest seq in buffer_
  Status broken_ ABSL_GUARDED_BY(mu_);                  // a failed write that could not be undone
  std::vector<struct iovec> iov_ ABSL_GUARDED_BY(mu_);  // Append's scratch
  std::vector<std::string> spares_ ABSL_GUARDED_BY(mu_);  // files to reuse as segments
  uint64_t nonce_state_ ABSL_GUARDED_BY(mu_) = 0;         // SplitMix64 of the nonces
};

}  // namespace tessera::internal
