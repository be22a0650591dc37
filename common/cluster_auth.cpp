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

ClientHandshaker::ClientHandshaker(HelloMsg hello, std::string client_nonce, std::string secret, std::string label)
    : hello_(std::move(hello)), secret_(std::move(secret)), label_(std::move(label)) {
  hello_.client_nonce = std::move(client_nonce);
}

std::optional<Frame> ClientHandshaker::on_message(WireMessage message) {
  if (done_) fail_protocol(label_ + " sent " + message_name(message) + " after its helloReply, unasked");
  if (!transcript_) {
    // The first answer: a helloReply from an open worker, or an authChallenge.
    if (auto* reply = std::get_if<HelloReplyMsg>(&message)) {
      // Refuse an open worker when this side has a secret: anyone could answer so. A
      // rejection (version or fingerprint) is the more useful error, so it goes first.
      if (!secret_.empty() && reply->ok) {
        fail_protocol(label_ + " did not ask for the cluster's shared secret (it has none configured, "
                               "this side has one); refusing an unauthenticated worker");
      }
      reply_ = std::move(*reply);
      done_ = true;
      return std::nullopt;
    }
    auto* challenge = std::get_if<AuthChallengeMsg>(&message);
    if (challenge == nullptr) fail_unexpected_message(message, "helloReply or authChallenge");
    if (secret_.empty()) {
      fail_protocol(label_ + " requires the cluster's shared secret, and none is configured here "
                             "(cluster.secret_file or cluster.secret_env in the topology)");
    }
    transcript_ = AuthTranscript{challenge->worker_nonce, hello_.client_nonce, hello_.client_name,
                                 challenge->worker_name};
    return encode_auth_response({auth_proof(secret_, AuthRole::kClient, *transcript_)});
  }
  // The answer to this side's proof.
  if (auto* error = std::get_if<ErrorMsg>(&message)) {
    fail_protocol(label_ + " rejected this side's proof of the cluster's shared secret (the secrets differ): " +
                  error->message);
  }
  auto* reply = std::get_if<HelloReplyMsg>(&message);
  if (reply == nullptr) fail_unexpected_message(message, "helloReply");
  if (!constant_time_equal(reply->worker_proof, auth_proof(secret_, AuthRole::kWorker, *transcript_))) {
    fail_protocol(label_ + " could not prove it holds the cluster's shared secret (its proof does not "
                           "match): a different secret, or not the worker it claims to be");
  }
  reply_ = std::move(*reply);
  authenticated_ = true;
  done_ = true;
  return std::nullopt;
}

ClientHandshake client_handshake(FrameConnection& conn, HelloMsg hello, const std::string& secret,
                                 std::chrono::milliseconds timeout, const std::string& label,
                                 uint64_t max_frame_bytes) {
  ClientHandshake out;
  // One deadline for the whole exchange (hello out ... helloReply back), so a worker that
  // trickles its frames cannot stretch the handshake to several timeouts.
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  const auto left = [&] {
    return std::max(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()),
                    std::chrono::milliseconds(1));
  };
  // Whatever answers at the worker's address is a stranger until its helloReply is
  // accepted: no frame bigger than a legitimate reply is read (receive checks the length
  // prefix before allocating).
  conn.set_max_frame_bytes(max_frame_bytes);
  ClientHandshaker handshaker(std::move(hello), random_nonce(), secret, label);
  out.bytes_out += conn.send(handshaker.hello_frame(), left());
  while (!handshaker.done()) {
    const FrameBody body = conn.receive(left());
    out.bytes_in += body.bytes + 4;
    if (std::optional<Frame> answer = handshaker.on_message(decode_message(body, max_frame_bytes))) {
      out.bytes_out += conn.send(*answer, left());
    }
  }
  out.reply = handshaker.reply();
  out.authenticated = handshaker.authenticated();
  return out;
}

uint64_t accept_hello_reply(const HelloReplyMsg& reply, const HelloExpectations& expected, const std::string& label) {
  if (!reply.ok) fail_protocol(label + " rejected the handshake: " + reply.error);
  if (reply.protocol_version != kProtocolVersion) {
    fail_protocol(label + " speaks protocol version " + std::to_string(reply.protocol_version) +
                  ", the coordinator " + std::to_string(kProtocolVersion));
  }
  if (reply.model_fingerprint != expected.model_fingerprint) {
    fail_protocol(label + " serves model fingerprint " + reply.model_fingerprint + ", the coordinator has " +
                  expected.model_fingerprint);
  }
  // The worker must hold what the coordinator's placement sends it (same topology file).
  for (const auto& [layer, experts] : expected.experts) {
    const auto it = reply.held.find(layer);
    for (uint32_t e : experts) {
      if (it == reply.held.end() || !std::binary_search(it->second.begin(), it->second.end(), e)) {
        fail_protocol(label + " does not hold expert " + std::to_string(e) + " of layer " + std::to_string(layer) +
                      ", which the placement assigns it");
      }
    }
  }
  uint64_t held = 0;
  for (const auto& [layer, experts] : reply.held) held += experts.size();
  return held;
}

}  // namespace charm
