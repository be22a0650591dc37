// The layer request and reply without copies of their rows: the coordinator gathers its
// hidden rows straight into the frame it sends, and each side reads the rows of a
// received frame in place (views into the frame, which the decoded value owns). The
// validation is decode_message's (common/wire.h): the owning decoders there are these
// views plus one copy, so a frame is checked by the same code whichever form reads it.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/moe_types.h"
#include "common/wire.h"

namespace charm {

/// A `layerRequest` read in place. `hidden` points into `body` (moving the view keeps it
/// valid: the words' buffer moves with it); assignments are copied out (8 bytes each).
struct LayerRequestView {
  FrameBody body;                            ///< owns the bytes `hidden` points into
  uint64_t request_id = 0;
  uint32_t layer = 0;
  uint32_t hidden_size = 0;
  uint32_t num_rows = 0;
  std::span<const float> hidden;             ///< [num_rows, hidden_size] f32, in `body`
  std::vector<ExpertAssignment> assignments;
  std::optional<PrefetchHintMsg> prefetch;   ///< as LayerRequest::prefetch
};

/// A `layerResponse` read in place; `outputs` points into `body` as LayerRequestView's
/// `hidden` does.
struct LayerResponseView {
  FrameBody body;                   ///< owns the bytes `outputs` points into
  uint64_t request_id = 0;
  std::span<const int64_t> outputs; ///< [request num_rows, hidden_size] int64 fixed point
                                    ///< (common/fixed_point.h), in `body`; empty on error
  LayerStats stats;
  std::string error;                ///< non-empty when the worker could not run the request
};

/// True when `body` holds a well-formed message whose root is a layerRequest (anything
/// malformed reads as false: decode_message then names what is wrong). Never throws.
bool is_layer_request(const FrameBody& body, uint64_t max_frame_bytes = kDefaultMaxFrameBytes);

/// Decodes a layerRequest in place, with decode_message's checks. Throws Error(kProtocol)
/// as decode_message does, and as fail_unexpected_message for any other message.
LayerRequestView decode_layer_request_view(FrameBody body, uint64_t max_frame_bytes = kDefaultMaxFrameBytes);

/// Decodes a layerResponse in place, with decode_message's checks. Throws Error(kProtocol)
/// as decode_message does, and as fail_unexpected_message for any other message (an
/// `error` frame's text included).
LayerResponseView decode_layer_response_view(FrameBody body, uint64_t max_frame_bytes = kDefaultMaxFrameBytes);

/// A layerRequest's fields other than its rows.
struct LayerRequestHeader {
  uint64_t request_id = 0;
  uint32_t layer = 0;
  uint32_t hidden_size = 0;
  const PrefetchHintMsg* prefetch = nullptr;  ///< layerRequest.prefetch; null: none
};

/// Encodes a layerRequest whose row r is hidden[rows[r] * hidden_size ..], gathering each
/// row straight into the frame. `hidden`: [> max(rows), hidden_size] f32.
Frame encode_layer_request_rows(const LayerRequestHeader& header, const float* hidden,
                                std::span<const uint32_t> rows, const std::vector<ExpertAssignment>& assignments);

/// Checks a LayerRequestView against the served model, exactly as check_layer_request
/// (common/wire.h) checks a decoded LayerRequest; throws the same errors.
void check_layer_request(const LayerRequestView& request, const ModelLimits& limits);

/// A layerResponse built in place: the worker's executor adds its sums straight into
/// the message (outputs()), then finish() serialises it. Not copyable; one use.
class LayerResponseFrame {
 public:
  /// Room for `num_rows` rows of `hidden_size` int64 for request `request_id`: one row
  /// per request row, whatever number of assignments each has.
  LayerResponseFrame(uint64_t request_id, uint32_t num_rows, uint32_t hidden_size);
  ~LayerResponseFrame();
  LayerResponseFrame(const LayerResponseFrame&) = delete;
  LayerResponseFrame& operator=(const LayerResponseFrame&) = delete;

  /// [num_rows, hidden_size] int64 inside the message, zero-initialised, word-aligned.
  int64_t* outputs();

  /// The whole frame with `stats`; the builder is spent afterwards. Throws
  /// Error(kInvalidInput) for a message too big for a 4-byte frame length.
  Frame finish(const LayerStats& stats);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace charm
