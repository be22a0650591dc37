#include "common/secret.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <spdlog/spdlog.h>

#include "common/error.h"

namespace charm {

namespace {

/// Refuses a secret file that is not a regular file, that others may access in any way,
/// or that its group may write (the secret could be read or replaced); warns when its
/// group may read it. `where` names it in messages.
void check_secret_file(const std::filesystem::path& file, const std::string& where) {
  struct stat st {};
  if (::stat(file.c_str(), &st) != 0) {
    fail_invalid(where + " cannot be read: " + (errno == ENOENT ? std::string("it does not exist") : std::strerror(errno)) +
                 " (make one with: charm secret new " + file.string() + ")");
  }
  if (!S_ISREG(st.st_mode)) fail_invalid(where + " is not a regular file");
  if ((st.st_mode & (S_IRWXO | S_IWGRP)) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    const bool others = (st.st_mode & S_IRWXO) != 0;
    fail_invalid(where + " has mode " + mode + ", which lets " + (others ? "other users read or replace" : "its group replace") +
                 " the secret; run: chmod 600 " + file.string());
  }
  if ((st.st_mode & S_IRGRP) != 0) spdlog::warn("{} is readable by its group; chmod 600 it unless that is meant", where);
}

}  // namespace

std::string read_secret(const SecretSource& source) {
  if (!source.configured()) return "";
  std::string secret;
  std::string where;
  if (!source.file.empty()) {
    where = source.key + ": file " + source.file.describe();
    check_secret_file(source.file, where);
    std::ifstream in(source.file, std::ios::binary);
    if (!in) fail_invalid(where + " cannot be read");
    secret.resize(kMaxSecretBytes + 1);
    in.read(secret.data(), static_cast<std::streamsize>(secret.size()));
    secret.resize(static_cast<size_t>(in.gcount()));
    if (secret.size() > kMaxSecretBytes) {
      fail_invalid(where + " is longer than " + std::to_string(kMaxSecretBytes) + " bytes; is it the right file?");
    }
  } else {
    where = source.key + ": environment variable " + source.env;
    const char* value = std::getenv(source.env.c_str());
    if (value == nullptr) fail_invalid(where + " is not set");
    secret = value;
    if (secret.size() > kMaxSecretBytes) fail_invalid(where + " is longer than " + std::to_string(kMaxSecretBytes) + " bytes");
  }
  while (!secret.empty() && (secret.back() == '\n' || secret.back() == '\r' ||
                             secret.back() == ' ' || secret.back() == '\t')) {
    secret.pop_back();
  }
  if (secret.size() < kMinSecretBytes) {
    fail_invalid(where + " holds " + std::to_string(secret.size()) + " bytes; a secret needs at least " +
                 std::to_string(kMinSecretBytes) + " (make one with: charm secret new FILE)");
  }
  return secret;
}

namespace {

/// Removes a temporary file unless released; closes its descriptor.
class TempFile {
 public:
  TempFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  ~TempFile() {
    if (fd_ >= 0) ::close(fd_);
    ::unlink(path_.c_str());
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  int fd() const { return fd_; }
  const std::string& path() const { return path_; }
  /// Closes the descriptor, reporting a failed close (a lost write).
  bool close() {
    const int fd = fd_;
    fd_ = -1;
    return ::close(fd) == 0;
  }

 private:
  std::string path_;
  int fd_;
};

std::string hex(const unsigned char* bytes, size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    out += digits[bytes[i] >> 4];
    out += digits[bytes[i] & 15];
  }
  return out;
}

}  // namespace

void create_secret_file(const std::filesystem::path& file) {
  const std::string name = file.string();
  std::error_code ec;
  if (std::filesystem::symlink_status(file, ec).type() != std::filesystem::file_type::not_found && !ec) {
    fail_invalid(name + " already exists; charm secret new never overwrites a secret (remove it first, then give "
                 "every machine the new one)");
  }
  unsigned char bytes[32];
  if (RAND_bytes(bytes, sizeof bytes) != 1) fail_internal("OpenSSL RAND_bytes failed to make a secret");
  std::string text = hex(bytes, sizeof bytes) + "\n";
  OPENSSL_cleanse(bytes, sizeof bytes);

  const std::filesystem::path folder = file.has_parent_path() ? file.parent_path() : std::filesystem::path(".");
  std::string pattern = (folder / ("." + file.filename().string() + ".tmp-XXXXXX")).string();
  const int fd = ::mkstemp(pattern.data());  // O_EXCL, mode 0600
  if (fd < 0) fail_io(name + ": cannot create a file in " + folder.string() + ": " + std::strerror(errno));
  TempFile temp(pattern, fd);
  bool ok = ::fchmod(fd, 0600) == 0;
  for (size_t done = 0; ok && done < text.size();) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    ok = n > 0;
    if (ok) done += static_cast<size_t>(n);
  }
  ok = ok && ::fsync(fd) == 0;
  ok = temp.close() && ok;
  OPENSSL_cleanse(text.data(), text.size());
  if (!ok) fail_io(name + ": cannot write " + temp.path() + ": " + std::strerror(errno));
  // link() is atomic and fails if the name exists: a secret is never half-written or
  // replaced, even by a concurrent run.
  if (::link(temp.path().c_str(), name.c_str()) != 0) {
    if (errno == EEXIST) fail_invalid(name + " already exists; charm secret new never overwrites a secret");
    fail_io(name + ": cannot create: " + std::strerror(errno));
  }
}

namespace {

std::string sha256(const std::string& bytes) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  if (EVP_Digest(bytes.data(), bytes.size(), digest, &size, EVP_sha256(), nullptr) != 1) {
    fail_internal("SHA-256 failed (OpenSSL EVP_Digest)");
  }
  return std::string(reinterpret_cast<const char*>(digest), size);
}

}  // namespace

bool constant_time_equal(const std::string& a, const std::string& b) {
  // Comparing digests makes the time independent of where, and whether in length, the
  // two differ.
  const std::string da = sha256(a), db = sha256(b);
  return CRYPTO_memcmp(da.data(), db.data(), da.size()) == 0;
}

}  // namespace charm
