// Secrets named by the topology (the cluster's shared secret, the HTTP API key): where
// one comes from, and reading it. A secret never appears inline in the YAML, so the file
// can be shared or committed; it comes from a file (mode 0600 recommended) or an
// environment variable.
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

/// Shortest secret accepted, in bytes (`openssl rand -hex 32` gives 64).
constexpr size_t kMinSecretBytes = 16;

/// Reads the secret `source` names; "" when none is configured. Throws
/// Error(kInvalidInput) naming source.key and the file (UserPath::describe: resolved, and
/// what a relative path was resolved against) or variable when the file cannot be read, the variable is unset, or the secret is shorter than kMinSecretBytes. Warns
/// (spdlog) when the file is readable by group or others.
std::string read_secret(const SecretSource& source);

/// Compares two secrets or proofs in time that does not depend on where they differ
/// (CRYPTO_memcmp of their SHA-256 digests), so a remote caller cannot learn a prefix or
/// the length by timing. Throws Error(kInternal) if OpenSSL fails.
bool constant_time_equal(const std::string& a, const std::string& b);

}  // namespace charm
