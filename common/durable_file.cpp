#include "common/durable_file.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/error.h"

namespace charm {
namespace {

std::string why() { return std::strerror(errno); }

void fsync_or_fail(int fd, const std::filesystem::path& path) {
  if (::fsync(fd) != 0) fail_io(path.string() + ": fsync failed: " + why());
}

}  // namespace

void write_file_atomically(const std::filesystem::path& path, const std::string& text) {
  const std::filesystem::path tmp = path.string() + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail_io(tmp.string() + ": cannot create: " + why());
  try {
    size_t done = 0;
    while (done < text.size()) {
      const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) fail_io(tmp.string() + ": write failed: " + why());
      done += static_cast<size_t>(n);
    }
    fsync_or_fail(fd, tmp);
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string reason = why();
    ::unlink(tmp.c_str());
    fail_io(path.string() + ": cannot replace it: " + reason);
  }
  const std::filesystem::path dir = path.has_parent_path() ? path.parent_path() : ".";
  const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0) fail_io(dir.string() + ": cannot open: " + why());
  const int synced = ::fsync(dir_fd);
  const std::string reason = why();
  ::close(dir_fd);
  if (synced != 0) fail_io(dir.string() + ": fsync failed: " + reason);
}

FileLock::FileLock(const std::filesystem::path& path) : fd_(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644)) {
  if (fd_ < 0) fail_io(path.string() + ": cannot open the lock file: " + why());
  while (::flock(fd_, LOCK_EX) != 0) {
    if (errno != EINTR) {
      const std::string reason = why();
      ::close(fd_);
      fail_io(path.string() + ": cannot lock: " + reason);
    }
  }
}

FileLock::~FileLock() { ::close(fd_); }

}  // namespace charm
