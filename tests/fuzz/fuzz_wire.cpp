// libFuzzer target: one frame as received from a peer (4-byte length prefix + Cap'n Proto
// body) through split_frame, decode_message and check_layer_request / check_prefetch_hint,
// then re-encoded and decoded again; a layerRequest or layerResponse also through the
// in-place decoders (common/wire_layer.h), which must accept exactly what decode_message
// accepts and read the same values. Any exception other than charm::Error, any sanitizer report, or a
// re-encoded message that decodes differently is a bug.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <cstdlib>
#include <variant>
#include <vector>

#include "common/error.h"
#include "common/wire.h"
#include "common/wire_layer.h"

namespace {

constexpr uint64_t kMaxFrame = 1 << 20;

// Re-encodes what was decoded; the decode of that must succeed and give the same message.
charm::Frame encode(const charm::WireMessage& m) {
  using namespace charm;
  if (auto* v = std::get_if<HelloMsg>(&m)) return encode_hello(*v);
  if (auto* v = std::get_if<HelloReplyMsg>(&m)) return encode_hello_reply(*v);
  if (auto* v = std::get_if<LayerRequest>(&m)) return encode_layer_request(*v);
  if (auto* v = std::get_if<LayerResponseMsg>(&m)) return encode_layer_response(*v);
  if (std::holds_alternative<HealthRequestMsg>(m)) return encode_health_request();
  if (auto* v = std::get_if<HealthReplyMsg>(&m)) return encode_health_reply(*v);
  if (auto* v = std::get_if<ErrorMsg>(&m)) return encode_error(v->message);
  if (auto* v = std::get_if<AuthChallengeMsg>(&m)) return encode_auth_challenge(*v);
  if (auto* v = std::get_if<PrefetchHintMsg>(&m)) return encode_prefetch_hint(*v);
  return encode_auth_response(std::get<AuthResponseMsg>(m));
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// The in-place decoders agree with decode_message on `body` (`message` when it decoded,
// nullptr when it threw).
void check_views(const charm::FrameBody& body, const charm::WireMessage* message) {
  using namespace charm;
  const auto* request = message ? std::get_if<LayerRequest>(message) : nullptr;
  const bool looks_like_request = is_layer_request(body, kMaxFrame);  // the root alone
  if (message && looks_like_request != (request != nullptr)) std::abort();
  if (looks_like_request) {
    try {
      const LayerRequestView view = decode_layer_request_view(body, kMaxFrame);
      if (!request || view.num_rows != request->num_rows || view.assignments.size() != request->assignments.size() ||
          !std::equal(view.hidden.begin(), view.hidden.end(), request->hidden.begin(), request->hidden.end(),
                      same_bits)) {
        std::abort();
      }
    } catch (const Error&) {
      if (request) std::abort();
    }
  }
  const auto* response = message ? std::get_if<LayerResponseMsg>(message) : nullptr;
  try {
    const LayerResponseView view = decode_layer_response_view(body, kMaxFrame);
    const auto& outputs = response ? response->response.outputs : std::vector<int64_t>{};
    if (!response || view.error != response->error ||
        !std::equal(view.outputs.begin(), view.outputs.end(), outputs.begin(), outputs.end())) {
      std::abort();
    }
  } catch (const Error&) {
    if (response) std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  charm::WireMessage message;
  charm::FrameBody body;
  try {
    body = charm::split_frame(data, size, kMaxFrame);
  } catch (const charm::Error&) {
    return 0;
  }
  try {
    message = charm::decode_message(body, kMaxFrame);
  } catch (const charm::Error&) {
    check_views(body, nullptr);
    return 0;
  }
  check_views(body, &message);
  if (auto* request = std::get_if<charm::LayerRequest>(&message)) {
    try {
      charm::check_layer_request(*request, charm::ModelLimits{48, 128, 64, {1, 3, 5}});
    } catch (const charm::Error&) {
    }
  }
  if (auto* hint = std::get_if<charm::PrefetchHintMsg>(&message)) {
    try {
      charm::check_prefetch_hint(*hint, charm::ModelLimits{48, 128, 64, {1, 3, 5}});
    } catch (const charm::Error&) {
    }
  }
  const charm::Frame again = encode(message);
  const charm::WireMessage round = charm::decode_message(charm::split_frame(again.data(), again.size()));
  if (round.index() != message.index() || encode(round) != again) std::abort();
  return 0;
}
