// Opening files that came from an operator or a peer (checkpoints, exports, their markers)
// without ever blocking: a FIFO, a device or a symbolic link out of the admin root in their
// place is refused with a Status instead of hanging the reader or reading without end.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "ps/status.h"

namespace tessera::internal {

struct ReadFileOptions {
  /// A canonical directory (CanonicalAdminRoot) the file must resolve inside; a symbolic link
  /// as the file's own last component is refused as well (O_NOFOLLOW). Empty: anywhere, links
  /// followed. Default: empty.
  std::string inside;
  /// The largest file accepted, bytes. Default: unbounded.
  uint64_t max_bytes = UINT64_MAX;
};

/// A file opened by OpenRegularFile: closed on destruction. Not thread-safe.
class ReadableFile {
 public:
  ReadableFile(int fd, uint64_t size) : fd_(fd), size_(size) {}
  ~ReadableFile();
  ReadableFile(const ReadableFile&) = delete;
  ReadableFile& operator=(const ReadableFile&) = delete;
  int fd() const { return fd_; }
  /// The size fstat gave at open.
  uint64_t size() const { return size_; }
  /// Hands the descriptor over (to fdopen); the object no longer closes it.
  int Release();

 private:
  int fd_;
  uint64_t size_;
};

/// Opens `path` read-only with O_NONBLOCK (an open that cannot wait for a FIFO's writer),
/// checks with fstat that it is a regular file of at most `options.max_bytes` and, with
/// `options.inside`, that it resolves inside that directory, then clears O_NONBLOCK. NotFound
/// when it does not exist; FailedPrecondition naming the path for a FIFO, device, directory,
/// a symbolic link (with `inside`) or a file outside `inside`; ResourceExhausted when too
/// large; IOError otherwise.
Result<std::unique_ptr<ReadableFile>> OpenRegularFile(const std::string& path,
                                                      const ReadFileOptions& options);

/// The whole of `path`, opened with OpenRegularFile and read up to its size at open.
Result<std::string> ReadRegularFile(const std::string& path, const ReadFileOptions& options);

}  // namespace tessera::internal
