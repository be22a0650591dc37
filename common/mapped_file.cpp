#include "common/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "common/error.h"

namespace charm {
namespace {

std::string errno_text() { return std::strerror(errno); }

}  // namespace

MappedFile MappedFile::open(const std::filesystem::path& path) {
  const std::string file = path.string();
  MappedFile self;  // RAII: closes on throw
  self.fd_ = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (self.fd_ < 0) fail_io(file + ": cannot open: " + errno_text());
  struct stat st {};
  if (::fstat(self.fd_, &st) != 0) fail_io(file + ": cannot stat: " + errno_text());
  if (!S_ISREG(st.st_mode)) fail_io(file + ": not a regular file");
  self.size_ = static_cast<uint64_t>(st.st_size);
  if (self.size_ > 0) {
    void* map = ::mmap(nullptr, self.size_, PROT_READ, MAP_PRIVATE, self.fd_, 0);
    if (map == MAP_FAILED) fail_io(file + ": cannot mmap: " + errno_text());
    self.map_ = static_cast<const uint8_t*>(map);
  }
  return self;
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), map_(std::exchange(other.map_, nullptr)), size_(std::exchange(other.size_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    this->~MappedFile();
    fd_ = std::exchange(other.fd_, -1);
    map_ = std::exchange(other.map_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

MappedFile::~MappedFile() {
  if (map_ != nullptr) ::munmap(const_cast<uint8_t*>(map_), size_);
  if (fd_ >= 0) ::close(fd_);
  map_ = nullptr;
  fd_ = -1;
}

const uint8_t* MappedFile::region(uint64_t begin, uint64_t nbytes, const std::string& what) const {
  if (begin > size_ || nbytes > size_ - begin) fail_invalid(what + " is not inside this file");
  return map_ + begin;
}

void MappedFile::read_region(uint64_t begin, uint64_t nbytes, uint64_t offset, uint64_t count, void* dst,
                             const std::string& what) const {
  if (offset > nbytes || count > nbytes - offset) {
    fail_invalid(what + ": read of " + std::to_string(count) + " bytes at offset " + std::to_string(offset) +
                 " is outside its " + std::to_string(nbytes) + " bytes");
  }
  region(begin, nbytes, what);  // the region itself must lie in the file
  pread(begin + offset, count, dst, what);
}

void MappedFile::pread(uint64_t offset, uint64_t count, void* dst, const std::string& what) const {
  auto* out = static_cast<uint8_t*>(dst);
  while (count > 0) {
    const ssize_t got = ::pread(fd_, out, count, static_cast<off_t>(offset));
    if (got < 0) {
      if (errno == EINTR) continue;
      fail_io(what + ": read failed at byte " + std::to_string(offset) + ": " + errno_text());
    }
    if (got == 0) {
      fail_io(what + ": unexpected end of file at byte " + std::to_string(offset) + " (" + std::to_string(count) +
              " bytes still to read)");
    }
    out += got;
    offset += static_cast<uint64_t>(got);
    count -= static_cast<uint64_t>(got);
  }
}

}  // namespace charm
