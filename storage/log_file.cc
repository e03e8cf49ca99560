// The request log as segment files (log_file_internal.h).
#include <fcntl.h>
#include <glog/logging.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <optional>
#include <random>

#include "storage/log_file_internal.h"
#include "storage/log_record_internal.h"

namespace tessera::internal {
namespace {

constexpr char kSuffix[] = ".tlog";
constexpr char kSpareSuffix[] = ".tlog.spare";
// The active segment is closed and deleted by Truncate only from this size on: smaller ones
// are not worth a new file per truncation.
constexpr uint64_t kCloseActiveBytes = uint64_t{4} << 20;

Status Errno(const std::string& what) {
  const int e = errno;
  std::string msg = what + ": " + std::strerror(e);
  return e == ENOSPC ? Status::IOError("no space left: " + msg) : Status::IOError(msg);
}

std::string SegmentName(uint64_t first_seq) {
  std::string digits = std::to_string(first_seq);
  return std::string(20 - digits.size(), '0') + digits + kSuffix;
}

Status SyncDir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Errno("opening '" + dir + "'");
  const int rc = ::fsync(fd);
  ::close(fd);
  return rc == 0 ? Status::OK() : Errno("syncing '" + dir + "'");
}

// A segment mapped read-only: replay reads it without copying (reading it into a fresh buffer
// cost a memset, a copy and a page fault per 4 KiB: 60% of a replay's time in a profile).
class MappedFile {
 public:
  static Result<std::unique_ptr<MappedFile>> Open(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return Errno("opening '" + path + "'");
    struct stat st;
    if (::fstat(fd, &st) != 0) {
      Status s = Errno("stat '" + path + "'");
      ::close(fd);
      return s;
    }
    auto m = std::unique_ptr<MappedFile>(new MappedFile());
    m->size_ = static_cast<size_t>(st.st_size);
    if (m->size_ > 0) {
      void* p = ::mmap(nullptr, m->size_, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
      if (p == MAP_FAILED) {
        Status s = Errno("mapping '" + path + "'");
        ::close(fd);
        return s;
      }
      m->data_ = static_cast<const char*>(p);
    }
    ::close(fd);
    return m;
  }
  ~MappedFile() {
    if (data_ != nullptr) ::munmap(const_cast<char*>(data_), size_);
  }
  std::string_view view() const { return {data_, size_}; }

 private:
  MappedFile() = default;
  const char* data_ = nullptr;
  size_t size_ = 0;
};

// The nonce of the segment open as `fd` (0: version 1).
Result<uint64_t> ReadNonce(int fd, const std::string& path) {
  char h[LogFile::kSegmentHeaderBytes] = {};
  if (::pread(fd, h, sizeof(h), 0) < 0) return Errno("reading '" + path + "'");
  TESSERA_ASSIGN_OR_RETURN(const SegmentFormat f,
                           ReadSegmentFormat(std::string_view(h, sizeof(h)), path));
  return f.nonce;
}

// What a Corruption of the log tells the operator to do.
constexpr char kRepairHint[] =
    "; stop the server, back up the directory and run tessera-server --repair_log with the same "
    "--data_dir and --request_log_dir to keep every record that verifies (docs/operations.md, "
    "\"Recovery\")";

// Replaces `path` whole with `data`: written aside, synced, renamed over it (the caller syncs
// the directory).
Status ReplaceFile(const std::string& path, std::string_view data) {
  const std::string aside = path + ".repair";
  const int fd = ::open(aside.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Errno("creating '" + aside + "'");
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t w = ::write(fd, data.data() + done, data.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      Status s = Errno("writing '" + aside + "'");
      ::close(fd);
      return s;
    }
    done += static_cast<size_t>(w);
  }
  const bool synced = ::fsync(fd) == 0;
  ::close(fd);
  if (!synced) return Errno("syncing '" + aside + "'");
  if (::rename(aside.c_str(), path.c_str()) != 0) return Errno("renaming '" + aside + "'");
  return Status::OK();
}

}  // namespace

Result<std::unique_ptr<LogFile>> LogFile::Open(const LogFileOptions& options) {
  if (options.dir.empty()) return Status::InvalidArgument("the request log needs a directory");
  std::unique_ptr<LogFile> log(new LogFile(options));
  {
    MutexLock l(log->mu_);  // not shared yet: taken for the analysis
    TESSERA_RETURN_IF_ERROR(log->Recover());
  }
  return log;
}

LogFile::~LogFile() {
  MutexLock l(mu_);
  Status s = FlushLocked();
  if (!s.ok()) LOG(ERROR) << "request log: " << s.ToString();
  TrimActive();
  if (fd_ >= 0) ::close(fd_);
}

void LogFile::AdoptSpare(const std::filesystem::directory_entry& e) {
  std::error_code ec;
  if (!e.is_regular_file(ec)) return;
  if (recycles() && spares_.size() < options_.spare_segments) {
    spares_.push_back(e.path().string());
  } else {
    std::filesystem::remove(e.path(), ec);  // not reused by this log
  }
}

Status LogFile::Recover() {
  std::error_code ec;
  std::filesystem::create_directories(options_.dir, ec);
  if (ec) return Status::IOError("creating '" + options_.dir + "': " + ec.message());
  for (const auto& e : std::filesystem::directory_iterator(options_.dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.ends_with(kSpareSuffix)) {
      AdoptSpare(e);
      continue;
    }
    if (name.size() != 20 + sizeof(kSuffix) - 1 || !name.ends_with(kSuffix)) continue;
    uint64_t first = 0;
    auto [p, err] = std::from_chars(name.data(), name.data() + 20, first);
    if (err != std::errc() || p != name.data() + 20) continue;
    // A segment's name on something that is not a file (a directory, a FIFO) is refused: its
    // records cannot be read, and reading or sizing it would throw or block.
    std::error_code fec;
    const bool regular = e.is_regular_file(fec);
    const uint64_t bytes = regular ? static_cast<uint64_t>(e.file_size(fec)) : 0;
    if (!regular || fec) {
      return Status::IOError("request log segment '" + e.path().string() + "' is " +
                             (fec ? "unreadable: " + fec.message() : "not a regular file") +
                             ": move it out of " + options_.dir);
    }
    segments_.push_back(Segment{first, bytes, e.path().string()});
  }
  if (ec) return Status::IOError("listing '" + options_.dir + "': " + ec.message());
  std::sort(segments_.begin(), segments_.end(),
            [](const Segment& a, const Segment& b) { return a.first_seq < b.first_seq; });
  // Segments left empty by a crash right after their creation (no bytes, or only the zeros of
  // their preallocation) hold nothing.
  uint64_t expect = 0, valid = 0;
  std::string torn;
  while (!segments_.empty()) {
    expect = 0;
    valid = 0;
    if (segments_.back().bytes > 0) {
      TESSERA_RETURN_IF_ERROR(ScanSegment(
          segments_.back(), &torn, 0, [](uint64_t, std::string_view) { return Status::OK(); },
          &expect, &valid));
    }
    if (valid > 0 || !torn.empty()) break;
    std::filesystem::remove(segments_.back().path, ec);
    segments_.pop_back();
  }
  if (segments_.empty()) return Status::OK();
  Segment& last = segments_.back();
  if (expect != 0) last_seq_ = expect - 1;  // holes count: the next record follows them
  if (!torn.empty()) {
    // Only a tail that is torn may be cut: a record that verifies after the damage was written
    // (and maybe acknowledged) after it, so the damage is corruption, not a crash's leftover.
    TESSERA_ASSIGN_OR_RETURN(auto file, MappedFile::Open(last.path));
    TESSERA_ASSIGN_OR_RETURN(const SegmentFormat f, ReadSegmentFormat(file->view(), last.path));
    const size_t next = NextVerifiedRecord(file->view(), valid + 1, f.nonce);
    if (next != std::string_view::npos) {
      const uint64_t seq = VerifiedRecordAt(file->view(), next, f.nonce)->seq;
      return Status::Corruption(
          "request log " + last.path + " at byte " + std::to_string(valid) + ": " + torn +
          ", and record " + std::to_string(seq) + " at byte " + std::to_string(next) +
          " after it verifies: the log is corrupt (not a torn tail), nothing was cut" +
          kRepairHint);
    }
  }
  // Written at offsets (pwritev at the end of its records), not O_APPEND: past the records may
  // lie the zeros of a preallocation or a reused file's old bytes.
  fd_ = ::open(last.path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd_ < 0) return Errno("opening '" + last.path + "'");
  TESSERA_ASSIGN_OR_RETURN(last.nonce, ReadNonce(fd_, last.path));
  if (!torn.empty()) {
    LOG(WARNING) << "request log: cutting " << (last.bytes - valid) << " bytes of a torn record "
                 << "off the end of " << last.path << " (it was never acknowledged)";
    if (::ftruncate(fd_, static_cast<off_t>(valid)) != 0) return Errno("cutting " + last.path);
  }
  last.bytes = valid;  // a zero tail (the preallocation) is no records
  if (last_seq_ == 0) last_seq_ = last.first_seq - 1;
  return Status::OK();
}

Status LogFile::ScanSegment(const Segment& s, std::string* torn, uint64_t after,
                            const std::function<Status(uint64_t, std::string_view)>& fn,
                            uint64_t* expect, uint64_t* valid_bytes) {
  TESSERA_ASSIGN_OR_RETURN(auto file, MappedFile::Open(s.path));
  // Past s.bytes lies what this log did not write (zeros, a reused file's old bytes).
  const std::string_view data = file->view().substr(0, s.bytes);
  TESSERA_ASSIGN_OR_RETURN(const SegmentFormat f, ReadSegmentFormat(data, s.path));
  size_t off = f.start;
  *valid_bytes = off;
  std::string what;
  while (off < data.size()) {
    const std::optional<VerifiedRecord> r = VerifiedRecordAt(data, off, f.nonce, &what);
    if (!r && AllZero(data.substr(off))) return Status::OK();  // the preallocation's zeros
    // A reused segment: the old bytes after its records (or a torn record) end them, unless a
    // record of this segment verifies further on.
    if (!r && f.nonce != 0 &&
        NextVerifiedRecord(data, off + 1, f.nonce) == std::string_view::npos) {
      return Status::OK();
    }
    if (!r) {
      if (torn != nullptr) {  // Recover decides whether it is a torn tail
        *torn = what;
        return Status::OK();
      }
      return Status::Corruption("request log " + s.path + " at byte " + std::to_string(off) +
                                ": " + what + kRepairHint);
    }
    if (*expect != 0 && r->seq != *expect) {
      return Status::Corruption("request log " + s.path + ": record " + std::to_string(r->seq) +
                                " follows " + std::to_string(*expect - 1) + kRepairHint);
    }
    *expect = r->seq + 1;
    if (r->seq > after && !r->hole) TESSERA_RETURN_IF_ERROR(fn(r->seq, r->payload));
    off += r->bytes;
    *valid_bytes = off;
  }
  return Status::OK();
}

Result<LogRepairReport> LogFile::Repair(const std::string& dir) {
  std::vector<Segment> segments;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.size() != 20 + sizeof(kSuffix) - 1 || !name.ends_with(kSuffix)) continue;
    uint64_t first = 0;
    auto [p, err] = std::from_chars(name.data(), name.data() + 20, first);
    if (err != std::errc() || p != name.data() + 20) continue;
    if (!e.is_regular_file(ec)) {
      return Status::FailedPrecondition("request log segment '" + e.path().string() +
                                        "' is not a regular file");
    }
    segments.push_back(Segment{first, 0, e.path().string()});
  }
  if (ec) return Status::IOError("listing '" + dir + "': " + ec.message());
  std::sort(segments.begin(), segments.end(),
            [](const Segment& a, const Segment& b) { return a.first_seq < b.first_seq; });
  LogRepairReport report;
  uint64_t expect = segments.empty() ? 0 : segments.front().first_seq;
  for (const Segment& seg : segments) {
    TESSERA_ASSIGN_OR_RETURN(auto file, MappedFile::Open(seg.path));
    const std::string_view data = file->view();
    TESSERA_ASSIGN_OR_RETURN(const SegmentFormat f, ReadSegmentFormat(data, seg.path));
    std::string out(data.substr(0, f.start));
    bool changed = false;
    size_t off = f.start;
    while (off < data.size()) {
      std::string what;
      const std::optional<VerifiedRecord> r = VerifiedRecordAt(data, off, f.nonce, &what);
      if (!r && AllZero(data.substr(off))) break;  // the preallocation's zeros: no damage
      const bool skip = !r || r->seq < expect;
      const size_t next = skip ? NextVerifiedRecord(data, off + 1, f.nonce) : off;
      if (!r && f.nonce != 0 && next == std::string_view::npos) break;  // a reused file's old bytes
      if (skip) {
        const size_t end = next == std::string_view::npos ? data.size() : next;
        if (r) what = "record " + std::to_string(r->seq) + " out of sequence";
        report.lines.push_back(seg.path + " bytes " + std::to_string(off) + ".." +
                               std::to_string(end) + ": dropped (" + what + ")");
        report.dropped_bytes += end - off;
        changed = true;
        off = end;
        continue;
      }
      if (r->seq > expect) {
        report.lines.push_back("records " + std::to_string(expect) + ".." +
                               std::to_string(r->seq - 1) + " could not be read: lost (holes " +
                               "in " + seg.path + ")");
        for (; expect < r->seq; ++expect) {
          char h[kHeaderBytes];
          EncodeHole(expect, f.nonce, h);
          out.append(h, kHeaderBytes);
          ++report.lost_records;
        }
        changed = true;
      }
      out.append(data.substr(off, r->bytes));
      if (!r->hole) ++report.kept;
      expect = r->seq + 1;
      off += r->bytes;
    }
    if (changed) TESSERA_RETURN_IF_ERROR(ReplaceFile(seg.path, out));
  }
  if (!segments.empty()) TESSERA_RETURN_IF_ERROR(SyncDir(dir));
  return report;
}

void LogFile::Preallocate() {
  if (preallocated_ || fd_ < 0) return;
  preallocated_ = true;
  // The file's size set up front, not only its blocks (FALLOC_FL_KEEP_SIZE): a write that
  // grows the size makes fdatasync commit the inode as well (512 KiB writes + fdatasync on ext4:
  // 55 MB/s that way, 66 MB/s preallocated, docs/storage.md). Failure (a file system without
  // fallocate) only costs that speed.
  (void)::fallocate(fd_, 0, 0, static_cast<off_t>(options_.segment_bytes));
}

void LogFile::TrimActive() {
  if (!preallocated_ || fd_ < 0 || segments_.empty()) return;
  preallocated_ = false;
  // A failure leaves zeros after the records, which every reader takes for their end.
  (void)::ftruncate(fd_, static_cast<off_t>(segments_.back().bytes));
}

Status LogFile::StartSegment(uint64_t first_seq) {
  if (fd_ >= 0) {
    TrimActive();
    ::close(fd_);
  }
  preallocated_ = false;
  fd_ = -1;
  const std::string path = (std::filesystem::path(options_.dir) / SegmentName(first_seq)).string();
  Segment seg{first_seq, 0, path};
  if (recycles() && ReuseSpare(path, &seg.nonce)) {
    seg.bytes = kSegmentHeaderBytes;
  } else {
    fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) return Errno("creating '" + path + "'");
  }
  Preallocate();
  if (options_.fsync) {
    if (Status s = SyncDir(options_.dir); !s.ok()) {
      // No segment without its directory entry durable: the next append starts one again
      // (with fd_ open and no segment listed, it wrote through segments_.back() of an empty
      // list).
      ::close(fd_);
      fd_ = -1;
      return s;
    }
  }
  segments_.push_back(std::move(seg));
  return Status::OK();
}

bool LogFile::ReuseSpare(const std::string& path, uint64_t* nonce) {
  while (!spares_.empty()) {
    const std::string spare = std::move(spares_.back());
    spares_.pop_back();
    if (nonce_state_ == 0) {
      nonce_state_ = (uint64_t{std::random_device()()} << 32) ^ std::random_device()() ^
                     static_cast<uint64_t>(::getpid());
    }
    *nonce = SplitMix64(&nonce_state_);
    if (*nonce == 0) *nonce = 1;
    char h[kSegmentHeaderBytes];
    EncodeSegmentHeader(*nonce, h);
    // The new header is durable before the file has the segment's name: under that name its old
    // records never verify, whatever a crash keeps.
    const int fd = ::open(spare.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd >= 0 && ::pwrite(fd, h, sizeof(h), 0) == static_cast<ssize_t>(sizeof(h)) &&
        ::fdatasync(fd) == 0 && ::rename(spare.c_str(), path.c_str()) == 0) {
      fd_ = fd;
      return true;
    }
    LOG(WARNING) << "request log: not reusing " << spare << ": " << std::strerror(errno);
    if (fd >= 0) ::close(fd);
    ::unlink(spare.c_str());
  }
  return false;
}

Status LogFile::WriteOut(struct iovec* iov, size_t n, size_t total) {
  Segment& seg = segments_.back();
  size_t done = 0;
  while (done < total) {
    const ssize_t w = ::pwritev(fd_, iov, static_cast<int>(std::min<size_t>(n, IOV_MAX)),
                                static_cast<off_t>(seg.bytes + done));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      Status s = Errno("writing the request log " + seg.path);
      // Undo a partial record: what follows must start at a record boundary.
      preallocated_ = false;
      if (::ftruncate(fd_, static_cast<off_t>(seg.bytes)) != 0) broken_ = s;
      return s;
    }
    done += static_cast<size_t>(w);
    size_t left = static_cast<size_t>(w);
    while (n > 0 && left >= iov->iov_len) {
      left -= iov->iov_len;
      ++iov;
      --n;
    }
    if (n > 0) {
      iov->iov_base = static_cast<char*>(iov->iov_base) + left;
      iov->iov_len -= left;
    }
  }
  if (options_.fsync && ::fdatasync(fd_) != 0) {
    Status s = Errno("syncing the request log " + seg.path);
    preallocated_ = false;
    if (::ftruncate(fd_, static_cast<off_t>(seg.bytes)) != 0) broken_ = s;
    return s;
  }
  seg.bytes += total;
  return Status::OK();
}

Status LogFile::Append(std::span<const Entry> entries) {
  if (entries.empty()) return Status::OK();
  // Headers (with their checksums) are built outside the lock.
  std::vector<std::array<char, kHeaderBytes>> headers(entries.size());
  uint64_t total = 0;
  for (size_t e = 0; e < entries.size(); ++e) {
    uint64_t len = 0;
    for (std::string_view p : entries[e].parts) len += p.size();
    if (len >= kMaxRecordBytes) {
      return Status::InvalidArgument("request-log record of " + std::to_string(len) + " bytes");
    }
    if (e > 0 && entries[e].seq <= entries[e - 1].seq) {
      return Status::InvalidArgument("request-log records out of order");
    }
    EncodeHeader(entries[e].seq, static_cast<uint32_t>(len),
                 Checksum(entries[e].seq, entries[e].parts, len), headers[e].data());
    total += kHeaderBytes + len;
  }
  MutexLock l(mu_);
  if (!broken_.ok()) return broken_.WithContext("the request log is unusable until a restart");
  if (entries.front().seq <= last_seq_) {
    return Status::InvalidArgument("request-log record " + std::to_string(entries.front().seq) +
                                   " is not above the last one, " + std::to_string(last_seq_));
  }
  if (options_.buffered) {
    if (buffer_.empty()) buffer_first_ = entries.front().seq;
    for (size_t e = 0; e < entries.size(); ++e) {
      buffer_.append(headers[e].data(), kHeaderBytes);
      for (std::string_view p : entries[e].parts) buffer_.append(p);
    }
    last_seq_ = entries.back().seq;
    appended_bytes_ += total;
    return buffer_.size() >= kMaxBuffer ? FlushLocked() : Status::OK();
  }
  if (fd_ < 0 || segments_.back().bytes >= options_.segment_bytes) {
    TESSERA_RETURN_IF_ERROR(StartSegment(entries.front().seq));
  }
  Preallocate();  // a segment this log reopened
  iov_.clear();
  for (size_t e = 0; e < entries.size(); ++e) {
    SealRecords(headers[e].data(), kHeaderBytes, segments_.back().nonce);
    iov_.push_back({headers[e].data(), kHeaderBytes});
    for (std::string_view p : entries[e].parts) {
      if (!p.empty()) iov_.push_back({const_cast<char*>(p.data()), p.size()});
    }
  }
  TESSERA_RETURN_IF_ERROR(WriteOut(iov_.data(), iov_.size(), total));
  last_seq_ = entries.back().seq;
  appended_bytes_ += total;
  return Status::OK();
}

Status LogFile::Flush() {
  MutexLock l(mu_);
  return FlushLocked();
}

Status LogFile::FlushLocked() {
  if (buffer_.empty()) return Status::OK();
  if (!broken_.ok()) return broken_.WithContext("the request log is unusable until a restart");
  if (fd_ < 0 || segments_.back().bytes >= options_.segment_bytes) {
    TESSERA_RETURN_IF_ERROR(StartSegment(buffer_first_));
  }
  Preallocate();
  SealRecords(buffer_.data(), buffer_.size(), segments_.back().nonce);
  struct iovec iov = {buffer_.data(), buffer_.size()};
  Status s = WriteOut(&iov, 1, buffer_.size());
  // Failed: these records were acknowledged in the relaxed mode; they are lost with the
  // window, and what follows must not depend on them.
  if (!s.ok()) broken_ = s;
  buffer_.clear();
  return s;
}

Status LogFile::Scan(uint64_t after,
                     const std::function<Status(uint64_t, std::string_view)>& fn) {
  std::vector<Segment> segments;
  {
    // The files are read without the lock: replay scans from several threads at once.
    MutexLock l(mu_);
    TESSERA_RETURN_IF_ERROR(FlushLocked());
    segments = segments_;
  }
  uint64_t expect = 0;
  for (size_t i = 0; i < segments.size(); ++i) {
    // Every record of segment i is below the next segment's first.
    if (i + 1 < segments.size() && segments[i + 1].first_seq <= after + 1) continue;
    uint64_t valid = 0;
    TESSERA_RETURN_IF_ERROR(ScanSegment(segments[i], /*torn=*/nullptr, after, fn, &expect, &valid));
  }
  return Status::OK();
}

Status LogFile::Truncate(uint64_t upto) {
  std::vector<std::string> gone;
  size_t spare = 0;  // how many of them to keep as spares
  {
    MutexLock l(mu_);
    size_t drop = 0;
    while (drop + 1 < segments_.size() && segments_[drop + 1].first_seq <= upto + 1) ++drop;
    const bool drop_active = drop + 1 == segments_.size() && buffer_.empty() &&
                             last_seq_ <= upto && segments_.back().bytes >= kCloseActiveBytes;
    if (drop_active) {
      ::close(fd_);
      fd_ = -1;
      preallocated_ = false;
      ++drop;
    }
    for (size_t i = 0; i < drop; ++i) gone.push_back(std::move(segments_[i].path));
    segments_.erase(segments_.begin(), segments_.begin() + static_cast<ptrdiff_t>(drop));
    const size_t room = options_.spare_segments - std::min<size_t>(spares_.size(),
                                                                   options_.spare_segments);
    spare = recycles() ? std::min(gone.size(), room) : 0;
  }
  // Unlinked (or renamed to spares) without the lock: freeing a 64 MiB file takes milliseconds,
  // and appends go on. The newest are kept: the most of their blocks written.
  Status result;
  std::vector<std::string> spares;
  for (size_t i = 0; i < gone.size(); ++i) {
    const std::string& path = gone[i];
    if (i + spare >= gone.size() && ::rename(path.c_str(), (path + ".spare").c_str()) == 0) {
      spares.push_back(path + ".spare");
      continue;
    }
    if (::unlink(path.c_str()) != 0 && errno != ENOENT && result.ok()) {
      result = Errno("deleting '" + path + "'");
    }
  }
  if (!spares.empty()) {
    MutexLock l(mu_);
    for (std::string& p : spares) spares_.push_back(std::move(p));
  }
  return result;
}

uint64_t LogFile::last_seq() const {
  MutexLock l(mu_);
  return last_seq_;
}

uint64_t LogFile::appended_bytes() const {
  MutexLock l(mu_);
  return appended_bytes_;
}

uint64_t LogFile::bytes() const {
  MutexLock l(mu_);
  uint64_t b = buffer_.size();
  for (const Segment& s : segments_) b += s.bytes;
  return b;
}

}  // namespace tessera::internal
