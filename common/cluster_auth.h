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
#include <map>
#include <optional>
#include <string>
#include <vector>

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

/// The client side of the handshake without a socket: the frames to send and what the
/// worker's decoded messages mean. client_handshake drives it over a FrameConnection; the
/// fuzz target (tests/fuzz/fuzz_client_handshake.cpp) feeds it bytes. Not thread-safe.
class ClientHandshaker {
 public:
  /// `hello` goes out with `client_nonce` (kAuthNonceBytes; client_handshake draws a
  /// random_nonce()); `secret` empty: no secret configured here; `label` names the worker
  /// in errors.
  ClientHandshaker(HelloMsg hello, std::string client_nonce, std::string secret, std::string label);

  /// The first frame to send: the hello.
  Frame hello_frame() const { return encode_hello(hello_); }

  /// Takes the worker's next message. Returns the frame to send back (an authResponse to
  /// an authChallenge), or nullopt when the exchange is over (done()). Throws
  /// Error(kProtocol) as client_handshake says, and for a message after done().
  std::optional<Frame> on_message(WireMessage message);

  bool done() const { return done_; }
  /// After done(): the worker's helloReply and whether the worker proved the secret.
  const HelloReplyMsg& reply() const { return reply_; }
  bool authenticated() const { return authenticated_; }

 private:
  HelloMsg hello_;
  std::string secret_;
  std::string label_;
  std::optional<AuthTranscript> transcript_;  // after an authChallenge
  HelloReplyMsg reply_;
  bool done_ = false;
  bool authenticated_ = false;
};

/// Runs the client side on a fresh connection: sends `hello` (with a new client nonce)
/// and, when the worker challenges, answers with this side's proof and checks the
/// worker's. `secret` empty: the cluster is open (no secret configured here). The whole
/// exchange (every frame sent and received) within `timeout`; every frame received is
/// capped at `max_frame_bytes` (max_hello_reply_bytes of the model's shape), checked
/// before anything is allocated for it, and the connection keeps that cap after. Throws
/// Error(kProtocol) naming `label` and "shared secret" when the worker demands a secret
/// and none is configured here, when the worker rejects this side's proof, when the
/// worker's proof does not match, and when a secret is configured here but the worker
/// does not ask for it (mutual authentication: an unauthenticated worker could be
/// anyone); Error(kProtocol) for an unexpected message and for a frame over the cap
/// (naming the peer and the cap); what FrameConnection throws for socket errors and
/// timeouts.
ClientHandshake client_handshake(FrameConnection& conn, HelloMsg hello, const std::string& secret,
                                 std::chrono::milliseconds timeout, const std::string& label,
                                 uint64_t max_frame_bytes);

/// What a coordinator requires of a worker's helloReply.
struct HelloExpectations {
  std::string model_fingerprint;  ///< the coordinator's model_fingerprint()
  /// layer -> expert ids (ascending) the placement assigns this worker: it must hold each.
  std::map<uint32_t, std::vector<uint32_t>> experts;
};

/// Checks a worker's helloReply against `expected`. Returns the (layer, expert) pairs the
/// worker holds. Throws Error(kProtocol) naming `label` for: a rejection (reply.ok false,
/// with the worker's error text), another protocol version, another model fingerprint
/// (both values), an assigned expert the worker does not hold (the expert and layer).
/// Pure; thread-safe.
uint64_t accept_hello_reply(const HelloReplyMsg& reply, const HelloExpectations& expected, const std::string& label);

}  // namespace charm
