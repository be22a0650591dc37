// Secrets named by the topology (the cluster's shared secret, the HTTP API key): where
// one comes from, making one, and reading it. A secret never appears inline in the YAML,
// so the file can be shared or committed; it comes from a file (mode 0600: others may
// not have any access, docs/configuration.md) or an environment variable.
#pragma once

#include <filesystem>
#include <string>

#include "common/user_path.h"

namespace charm {

/// Where a secret comes from; at most one of file / env is set. Neither set: no secret.
struct SecretSource {
  UserPath file;               ///< read whole; trailing whitespace (a final newline) dropped
  std::string env;             ///< name of an environment variable holding it
  std::string key;             ///< the YAML key path it was configured under, for messages

  bool configured() const { return !file.empty() || !env.empty(); }
};

/// Shortest secret accepted, in bytes (`charm secret new` writes 64).
constexpr size_t kMinSecretBytes = 16;
/// Longest secret file read, in bytes (a secret_file naming a large file by mistake is
/// refused rather than read whole).
constexpr size_t kMaxSecretBytes = 4096;

/// Reads the secret `source` names; "" when none is configured. Throws
/// Error(kInvalidInput) naming source.key and the file (UserPath::describe: resolved, and
/// what a relative path was resolved against) or variable when the file cannot
/// be read, others have any permission on it or its group may write it (chmod 600, as ssh
/// asks of a private key), the variable is unset, or the secret is shorter than
/// kMinSecretBytes or longer than kMaxSecretBytes. Warns (spdlog) when the file's group
/// may read it (0640, e.g. root:charm, is accepted). Trailing whitespace is dropped.
std::string read_secret(const SecretSource& source);

/// `charm secret new FILE`: writes a fresh secret to `file`: 32 bytes from OpenSSL's
/// RAND_bytes, hex-encoded (64 characters) and a newline, mode 0600. Never overwrites
/// and never leaves a partial file: the text goes to a temporary file (mkstemp, 0600) in
/// the same folder, is fsynced, then hard-linked to `file`, which fails if `file` exists.
/// Throws Error(kInvalidInput) naming `file` when it exists (a symlink included);
/// Error(kIo) naming it when the folder is missing or not writable or a write fails;
/// Error(kInternal) when RAND_bytes fails.
void create_secret_file(const std::filesystem::path& file);

/// Compares two secrets or proofs in time that does not depend on where they differ
/// (CRYPTO_memcmp of their SHA-256 digests), so a remote caller cannot learn a prefix or
/// the length by timing. Throws Error(kInternal) if OpenSSL fails.
bool constant_time_equal(const std::string& a, const std::string& b);

}  // namespace charm
