// The cluster's shared-secret handshake (mutual challenge-response, HMAC-SHA256 from
// OpenSSL's libcrypto), used by every client of a worker (coordinator, `charm status`)
// and by the worker's server. What it does and does not protect: docs/architecture.md,
// "Security".
//
//   client -> worker   hello          {..., clientName, clientNonce Nc}
//   worker -> client   authChallenge  {workerNonce Nw, workerName}
//   client -> worker   authResponse   {proof = HMAC(secret, "client" transcript)}
//   worker -> client   helloReply     {..., workerProof = HMAC(secret, "worker" transcript)}
//
// transcript = role label, Nw, Nc, clientName, workerName (each length-prefixed). The
// worker's fresh Nw makes a recorded client proof useless on a new connection; the
// client's Nc does the same for a recorded worker proof; the role label stops a proof
// from being reflected back as the other side's. The secret itself never crosses the
// wire. A worker without a secret answers hello with helloReply at once (open cluster).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "common/wire.h"

namespace charm {

/// Which side a proof speaks for.
enum class AuthRole { kClient, kWorker };

/// What both proofs cover.
struct AuthTranscript {
  std::string worker_nonce;  ///< kAuthNonceBytes
  std::string client_nonce;  ///< kAuthNonceBytes, or empty from a client without a secret
  std::string client_name;
  std::string worker_name;
};

/// kAuthNonceBytes from OpenSSL's RAND_bytes. Throws Error(kInternal) if it fails.
std::string random_nonce();

/// HMAC-SHA256(secret, role label || transcript): kAuthProofBytes bytes. Throws
/// Error(kInternal) if OpenSSL fails.
std::string auth_proof(const std::string& secret, AuthRole role, const AuthTranscript& transcript);

/// What a client's handshake got: the worker's helloReply (ok or not: the caller decides
/// what a rejection means) and the frame bytes sent and received, prefixes included.
struct ClientHandshake {
  HelloReplyMsg reply;
  bool authenticated = false;  ///< the worker proved it holds `secret`
  uint64_t bytes_out = 0;
  uint64_t bytes_in = 0;
};

/// Runs the client side on a fresh connection: sends `hello` (with a new client nonce)
/// and, when the worker challenges, answers with this side's proof and checks the
/// worker's. `secret` empty: the cluster is open (no secret configured here). The whole
/// exchange (every frame sent and received) within `timeout`. Throws Error(kProtocol) naming `label` and "shared secret" when the
/// worker demands a secret and none is configured here, when the worker rejects this
/// side's proof, when the worker's proof does not match, and when a secret is
/// configured here but the worker does not ask for it (mutual authentication: an
/// unauthenticated worker could be anyone); Error(kProtocol) for an unexpected message;
/// what FrameConnection throws for socket errors and timeouts.
ClientHandshake client_handshake(FrameConnection& conn, HelloMsg hello, const std::string& secret,
                                 std::chrono::milliseconds timeout, const std::string& label);

}  // namespace charm
