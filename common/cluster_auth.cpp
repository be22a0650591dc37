#include "common/cluster_auth.h"

#include <algorithm>

#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include "common/error.h"
#include "common/secret.h"

namespace charm {
namespace {

// Length-prefixed so that no two different transcripts serialise to the same bytes.
void append_field(std::string& out, const std::string& field) {
  const uint32_t n = static_cast<uint32_t>(field.size());
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>(n >> (8 * i)));
  out += field;
}

}  // namespace

std::string random_nonce() {
  std::string nonce(kAuthNonceBytes, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(nonce.data()), static_cast<int>(nonce.size())) != 1) {
    fail_internal("OpenSSL RAND_bytes failed to produce a handshake nonce");
  }
  return nonce;
}

std::string auth_proof(const std::string& secret, AuthRole role, const AuthTranscript& transcript) {
  std::string message = role == AuthRole::kClient ? "charm-auth-v1 client" : "charm-auth-v1 worker";
  append_field(message, transcript.worker_nonce);
  append_field(message, transcript.client_nonce);
  append_field(message, transcript.client_name);
  append_field(message, transcript.worker_name);
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  if (HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
           reinterpret_cast<const unsigned char*>(message.data()), message.size(), mac, &size) == nullptr ||
      size != kAuthProofBytes) {
    fail_internal("OpenSSL HMAC-SHA256 failed while computing a handshake proof");
  }
  return std::string(reinterpret_cast<const char*>(mac), size);
}

ClientHandshake client_handshake(FrameConnection& conn, HelloMsg hello, const std::string& secret,
                                 std::chrono::milliseconds timeout, const std::string& label) {
  ClientHandshake out;
  // One deadline for the whole exchange (hello out ... helloReply back), so a worker that
  // trickles its frames cannot stretch the handshake to several timeouts.
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  const auto left = [&] {
    return std::max(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()),
                    std::chrono::milliseconds(1));
  };
  hello.client_nonce = random_nonce();
  out.bytes_out += conn.send(encode_hello(hello), left());
  auto receive = [&] {
    FrameBody body = conn.receive(left());
    out.bytes_in += body.bytes + 4;
    return decode_message(body, conn.max_frame_bytes());
  };
  WireMessage first = receive();

  if (auto* reply = std::get_if<HelloReplyMsg>(&first)) {
    // An open worker. Refuse it when this side has a secret: anyone could answer so.
    // A rejection (version or fingerprint) is the more useful error, so it goes first.
    if (!secret.empty() && reply->ok) {
      fail_protocol(label + " did not ask for the cluster's shared secret (it has none configured, "
                            "this side has one); refusing an unauthenticated worker");
    }
    out.reply = std::move(*reply);
    return out;
  }
  auto* challenge = std::get_if<AuthChallengeMsg>(&first);
  if (challenge == nullptr) fail_unexpected_message(first, "helloReply or authChallenge");
  if (secret.empty()) {
    fail_protocol(label + " requires the cluster's shared secret, and none is configured here "
                          "(cluster.secret_file or cluster.secret_env in the topology)");
  }
  const AuthTranscript transcript{challenge->worker_nonce, hello.client_nonce, hello.client_name,
                                  challenge->worker_name};
  out.bytes_out += conn.send(encode_auth_response({auth_proof(secret, AuthRole::kClient, transcript)}), left());

  WireMessage second = receive();
  if (auto* error = std::get_if<ErrorMsg>(&second)) {
    fail_protocol(label + " rejected this side's proof of the cluster's shared secret (the secrets differ): " +
                  error->message);
  }
  auto* reply = std::get_if<HelloReplyMsg>(&second);
  if (reply == nullptr) fail_unexpected_message(second, "helloReply");
  if (!constant_time_equal(reply->worker_proof, auth_proof(secret, AuthRole::kWorker, transcript))) {
    fail_protocol(label + " could not prove it holds the cluster's shared secret (its proof does not "
                          "match): a different secret, or not the worker it claims to be");
  }
  out.authenticated = true;
  out.reply = std::move(*reply);
  return out;
}

}  // namespace charm
