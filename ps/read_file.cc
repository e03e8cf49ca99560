#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <memory>
#include <string_view>

#include "ps/read_file_internal.h"

namespace tessera::internal {
namespace {

const char* KindOf(mode_t mode) {
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

}  // namespace

ReadableFile::~ReadableFile() {
  if (fd_ >= 0) ::close(fd_);
}

int ReadableFile::Release() {
  const int fd = fd_;
  fd_ = -1;
  return fd;
}

Result<std::unique_ptr<ReadableFile>> OpenRegularFile(const std::string& path,
                                                      const ReadFileOptions& options) {
  const bool confined = !options.inside.empty();
  const int flags = O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK | (confined ? O_NOFOLLOW : 0);
  const int fd = ::open(path.c_str(), flags);
  if (fd < 0) {
    const int e = errno;
    if (e == ENOENT) return Status::NotFound("no file '" + path + "'");
    if (e == ELOOP && confined) {
      return Status::FailedPrecondition("'" + path + "' is a symbolic link: files under the " +
                                        "admin root must be the files themselves");
    }
    return Status::IOError("cannot open '" + path + "': " + std::strerror(e));
  }
  auto file = std::make_unique<ReadableFile>(fd, 0);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    return Status::IOError("cannot stat '" + path + "': " + std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) {
    return Status::FailedPrecondition("'" + path + "' is " + KindOf(st.st_mode) +
                                      ", not a regular file: refused");
  }
  if (static_cast<uint64_t>(st.st_size) > options.max_bytes) {
    return Status::ResourceExhausted("'" + path + "' has " + std::to_string(st.st_size) +
                                     " bytes, more than the " +
                                     std::to_string(options.max_bytes) + " accepted");
  }
  if (confined) {
    // Where the descriptor really points: a link in a directory component (server-0 -> /x)
    // is resolved here, after the open, so no swap between a check and the open escapes it.
    char real[PATH_MAX + 1];
    const std::string self = "/proc/self/fd/" + std::to_string(fd);
    const ssize_t n = ::readlink(self.c_str(), real, PATH_MAX);
    if (n < 0) return Status::IOError("cannot resolve '" + path + "': " + std::strerror(errno));
    const std::string_view resolved(real, static_cast<size_t>(n));
    std::string root = options.inside;
    if (!root.ends_with('/')) root += '/';
    if (!resolved.starts_with(root)) {
      return Status::FailedPrecondition("'" + path + "' resolves to '" + std::string(resolved) +
                                        "', outside the admin root '" + options.inside + "'");
    }
  }
  const int fl = ::fcntl(fd, F_GETFL);
  if (fl < 0 || ::fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) {
    return Status::IOError("cannot set '" + path + "' blocking: " + std::strerror(errno));
  }
  return std::make_unique<ReadableFile>(file->Release(), static_cast<uint64_t>(st.st_size));
}

Result<std::string> ReadRegularFile(const std::string& path, const ReadFileOptions& options) {
  TESSERA_ASSIGN_OR_RETURN(auto file, OpenRegularFile(path, options));
  std::string data(file->size(), '\0');
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::read(file->fd(), data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::IOError("cannot read '" + path + "': " + std::strerror(errno));
    if (n == 0) break;  // shrank since the open
    done += static_cast<size_t>(n);
  }
  data.resize(done);
  return data;
}

}  // namespace tessera::internal
