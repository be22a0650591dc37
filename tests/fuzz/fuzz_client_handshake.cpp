// libFuzzer target: what the coordinator accepts from whatever answers at a worker's
// address (issue 12). The input is one flags byte, then the bytes that peer sends: frames
// cut exactly as FrameConnection::receive cuts them (frame_length's cap before anything
// is allocated, at max_hello_reply_bytes of the model's shape), decoded, fed to the
// client side of the handshake (ClientHandshaker, common/cluster_auth.h) until it is
// done, then accept_hello_reply against a placement, then the health reply that
// ClusterDispatcher::connect reads next (capped at max_health_reply_bytes).
//
// Flags: bit 0, this side has the cluster's shared secret; bit 1, the harness plays a
// worker that knows it (it puts the right proof into a helloReply that follows an
// authChallenge, so the fuzzer can reach the authenticated paths, which it could never
// reach by guessing an HMAC).
//
// A bug is: any exception other than charm::Error, a sanitizer report, or a broken
// invariant: with a secret, an ok helloReply accepted from a worker that did not prove
// it; a reply accepted that lacks an assigned expert or has another fingerprint.
//
// The seed corpus (tests/fuzz/corpus/client_handshake/) is written by this program:
//   CHARM_FUZZ_WRITE_SEEDS=tests/fuzz/corpus/client_handshake build-fuzz/tests/fuzz/fuzz_client_handshake
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "common/cluster_auth.h"
#include "common/error.h"
#include "common/wire.h"

namespace {

using namespace charm;

const std::string kSecret = "the fuzzer's cluster secret, 32B";
const std::string kFingerprint = "00000000c0ffee00";
const std::string kLabel = "worker 'a' (127.0.0.1:5001)";
const std::string kClientNonce(kAuthNonceBytes, 'c');  // fixed: runs must be repeatable
// The model's shape (2 MoE layers of 4 experts) and what the placement assigns worker 'a'.
constexpr uint32_t kMoeLayers = 2, kExperts = 4;
const HelloExpectations kExpected{kFingerprint, {{0, {0, 1}}, {2, {0, 1}}}};

enum Flags : uint8_t { kHasSecret = 1, kWorkerKnowsSecret = 2 };

HelloMsg coordinator_hello() {
  HelloMsg hello;
  hello.model_fingerprint = kFingerprint;
  hello.client_name = "coordinator";
  return hello;
}

// The peer's bytes, cut into frames as FrameConnection::receive cuts a stream.
class Stream {
 public:
  Stream(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  // The next frame's body, or nullopt when the bytes end first (on a socket: a timeout
  // or a closed connection, both Error(kUnavailable)). Throws what receive throws.
  std::optional<FrameBody> next(uint64_t max_frame_bytes) {
    if (size_ - pos_ < 4) return std::nullopt;
    const uint64_t length = frame_length(data_ + pos_, max_frame_bytes, kLabel);
    if (size_ - pos_ - 4 < length) return std::nullopt;
    FrameBody body;
    body.bytes = length;
    body.words.resize(length / 8);
    if (length) std::memcpy(body.words.data(), data_ + pos_ + 4, length);
    pos_ += 4 + length;
    return body;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

void run(const uint8_t* data, size_t size) {
  if (size < 1) return;
  const uint8_t flags = data[0];
  const std::string secret = flags & kHasSecret ? kSecret : "";
  Stream stream(data + 1, size - 1);
  const uint64_t hello_cap = max_hello_reply_bytes(kMoeLayers, kExperts);

  ClientHandshaker handshaker(coordinator_hello(), kClientNonce, secret, kLabel);
  (void)handshaker.hello_frame();
  std::optional<AuthChallengeMsg> challenge;
  while (!handshaker.done()) {
    std::optional<FrameBody> body = stream.next(hello_cap);
    if (!body) return;
    WireMessage message = decode_message(*body, hello_cap);
    if (auto* c = std::get_if<AuthChallengeMsg>(&message)) challenge = *c;
    auto* reply = std::get_if<HelloReplyMsg>(&message);
    if (reply && challenge && (flags & kWorkerKnowsSecret)) {
      const AuthTranscript transcript{challenge->worker_nonce, kClientNonce, "coordinator", challenge->worker_name};
      reply->worker_proof = auth_proof(kSecret, AuthRole::kWorker, transcript);
    }
    if (std::optional<Frame> answer = handshaker.on_message(std::move(message))) {
      // The authResponse this side would send: a whole, decodable frame.
      decode_as<AuthResponseMsg>(split_frame(answer->data(), answer->size()));
    }
  }
  const HelloReplyMsg& reply = handshaker.reply();
  if (!secret.empty() && reply.ok && !handshaker.authenticated()) std::abort();  // mutual authentication
  accept_hello_reply(reply, kExpected, kLabel);
  // Accepted: it must really be what the coordinator asked for.
  if (!reply.ok || reply.model_fingerprint != kFingerprint || reply.protocol_version != kProtocolVersion) std::abort();
  for (const auto& [layer, experts] : kExpected.experts) {
    const auto it = reply.held.find(layer);
    if (it == reply.held.end()) std::abort();
    for (uint32_t e : experts) {
      if (std::find(it->second.begin(), it->second.end(), e) == it->second.end()) std::abort();
    }
  }
  // The health reply ClusterDispatcher::connect reads before marking the worker up.
  const uint64_t health_cap = max_health_reply_bytes(kMoeLayers, kExperts);
  if (std::optional<FrameBody> body = stream.next(health_cap)) decode_as<HealthReplyMsg>(*body, health_cap);
}

// --- the seed corpus -------------------------------------------------------------------

void append(std::vector<uint8_t>& out, const Frame& frame) { out.insert(out.end(), frame.begin(), frame.end()); }

HelloReplyMsg good_reply() {
  HelloReplyMsg reply;
  reply.ok = true;
  reply.worker_name = "a";
  reply.model_fingerprint = kFingerprint;
  reply.held = {{0, {0, 1}}, {2, {0, 1}}};
  return reply;
}

Frame good_health() {
  HealthReplyMsg h;
  h.worker_name = "a";
  h.state = "up";
  h.experts_held = 4;
  h.model_fingerprint = kFingerprint;
  h.tier_layers = {{0, TierCounters{3, 1, 4096, 10, 20, 2, 1}}, {2, TierCounters{}}};
  h.slots = 4;
  return encode_health_reply(h);
}

void write_seeds(const std::string& dir) {
  std::vector<std::pair<std::string, std::vector<uint8_t>>> seeds;
  auto seed = [&](const std::string& name, uint8_t flags, const std::vector<Frame>& frames) {
    std::vector<uint8_t> bytes{flags};
    for (const Frame& f : frames) append(bytes, f);
    seeds.emplace_back(name, std::move(bytes));
  };
  const Frame challenge = encode_auth_challenge({std::string(kAuthNonceBytes, 'w'), "a"});
  HelloReplyMsg rejected = good_reply();
  rejected.ok = false;
  rejected.error = "model fingerprint mismatch: client 'coordinator' has x, worker 'a' has y";
  HelloReplyMsg missing = good_reply();
  missing.held = {{0, {0}}, {2, {0, 1}}};
  HelloReplyMsg other_model = good_reply();
  other_model.model_fingerprint = "ffffffffffffffff";
  HelloReplyMsg other_version = good_reply();
  other_version.protocol_version = kProtocolVersion + 1;
  HelloReplyMsg unproven = good_reply();
  unproven.worker_proof = std::string(kAuthProofBytes, 'x');
  seed("open-ok", 0, {encode_hello_reply(good_reply()), good_health()});
  seed("open-rejected", 0, {encode_hello_reply(rejected)});
  seed("open-error", 0, {encode_error("worker 'a' is serving its maximum of 256 connections")});
  seed("open-missing-expert", 0, {encode_hello_reply(missing)});
  seed("open-other-model", 0, {encode_hello_reply(other_model)});
  seed("open-other-version", 0, {encode_hello_reply(other_version)});
  seed("open-challenge-without-secret", 0, {challenge});
  seed("secret-ok", kHasSecret | kWorkerKnowsSecret, {challenge, encode_hello_reply(good_reply()), good_health()});
  seed("secret-wrong-proof", kHasSecret, {challenge, encode_hello_reply(unproven)});
  seed("secret-proof-rejected", kHasSecret, {challenge, encode_error("authentication failed")});
  seed("secret-worker-did-not-ask", kHasSecret, {encode_hello_reply(good_reply())});
  seed("gigabyte-prefix", 0, {Frame{0, 0, 0, 0x40}});
  Frame truncated = encode_hello_reply(good_reply());
  truncated.resize(truncated.size() - 8);
  seed("truncated", 0, {truncated});
  for (const auto& [name, bytes] : seeds) {
    std::ofstream out(dir + "/" + name + ".bin", std::ios::binary);
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    if (!out) std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  if (const char* dir = std::getenv("CHARM_FUZZ_WRITE_SEEDS")) {
    write_seeds(dir);
    std::exit(0);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    run(data, size);
  } catch (const charm::Error&) {
  }
  return 0;
}
