// The rule every listening socket charm opens follows (docs/architecture.md, "Security"):
// a socket reachable from other machines needs authentication (the cluster's shared
// secret for a worker, an API key for the HTTP API) unless the topology says
// `insecure: true` for it. Loopback means 127.0.0.0/8 and ::1 (also as ::ffff:127.x.y.z),
// and a name only when every address it resolves to is one; 0.0.0.0, ::, "" and any
// other address or name count as reachable.
#pragma once

#include <cstdint>
#include <string>

namespace charm {

/// True when every address `host` resolves to (getaddrinfo, passive, as the listeners
/// resolve it; numeric addresses are not looked up) is a loopback address. "" (the
/// wildcard) is false. Throws Error(kUnavailable) naming `host` when it does not resolve.
/// Thread-safe.
bool is_loopback_host(const std::string& host);

/// One socket about to listen, and what the topology configures for it.
struct ListenSpec {
  std::string what;           ///< who listens, for messages: "worker 'w0'", "the HTTP API"
  std::string host;           ///< the address it binds
  uint16_t port = 0;
  bool authenticated = false; ///< a shared secret / API key is configured
  bool insecure = false;      ///< the topology's explicit `insecure: true` for it
  std::string insecure_key;   ///< that key's path in the YAML: "cluster.insecure", "api.insecure"
  std::string remedy;         ///< how to configure authentication (names `charm secret new`)
};

/// Applies the rule before `spec` listens: authenticated, or on loopback, passes (the
/// latter with an info line); reachable from other machines without authentication
/// throws Error(kInvalidInput) saying who, where, why, spec.remedy and the insecure key,
/// unless spec.insecure, which passes with a warning. Throws what is_loopback_host throws.
void check_listen(const ListenSpec& spec);

}  // namespace charm
