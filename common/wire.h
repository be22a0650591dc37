// The coordinator <-> worker wire format (schema/charm.capnp) and its framing over TCP.
//
// Frame = 4-byte little-endian body length N, then N bytes: one Cap'n Proto flat message
// (the format capnp::messageToFlatArray writes) whose root is charm::wire::Message.
// Encoders are pure functions from charm structs to whole frames (length prefix
// included); decoders are pure functions from a frame body to charm structs that validate
// every count and size and throw Error(kProtocol) naming the field at fault. The data
// path (layer requests and replies) reads and writes its rows in place instead:
// common/wire_layer.h, on the same validation.
//
// Deadlines: FrameConnection does its socket I/O as Asio async operations on a private
// io_context and runs that context with run_for() in short slices until the operation
// completes, the deadline passes (the operation is cancelled) or a stop flag is raised.
// SO_RCVTIMEO is not used because Asio's blocking reads re-poll without a timeout.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "common/error.h"
#include "common/expert_identity.h"
#include "common/moe_types.h"

namespace charm {

/// Bumped whenever a field's meaning or a frame rule changes; peers must agree exactly.
/// 2: the shared-secret handshake (authChallenge / authResponse, hello.clientNonce,
/// helloReply.workerProof), the tier statistics (layerResponse.stats, healthReply tier
/// fields) and `prefetchHint` (a message that gets no reply): one bump for all three.
/// 3: helloReply carries each held expert's content identity (held[].identities) and
/// the worker's lossy form (lossyForm), which the client checks.
/// 4: replies at the minimum: assignments carry the router weight, and a layerResponse
/// holds one int64 fixed-point row per request row (the weighted sum of that row's
/// outputs, common/fixed_point.h) instead of one f32 row per assignment; stats.saturated.
/// 5: a layerRequest may carry the next MoE layer's prefetch (layerRequest.prefetch),
/// which the worker starts while it computes the request; a protocol-4 worker would
/// silently ignore it, so the bump makes a mixed cluster an error at hello instead.
/// 6: the VRAM tier's counters and residency (layerResponse.stats.vramHits,
/// TierCounters.vramHits, LayerResidency.vram): additive, but a health reply with the
/// third bitmap can exceed a protocol-5 coordinator's size bound for it.
constexpr uint32_t kProtocolVersion = 6;

/// Upper bound on the experts one prefetchHint may name (no layer has more experts).
constexpr uint32_t kMaxHintExperts = 1u << 16;

/// Default upper bound on one frame's body, in bytes (1 GiB).
constexpr uint64_t kDefaultMaxFrameBytes = uint64_t{1} << 30;

/// Upper bound on hiddenSize accepted from the wire, in floats per row.
constexpr uint32_t kMaxWireHiddenSize = 1u << 20;

/// Upper bound on one frame's body on a connection whose peer is not trusted yet: every
/// FrameConnection starts with it. A worker keeps it until a client's hello succeeded
/// (hello, authResponse, healthRequest are a few hundred bytes); a client raises it to
/// max_hello_reply_bytes / max_health_reply_bytes of its model for the replies it expects
/// (a helloReply lists every expert held), so whatever answers at an address cannot make
/// either side allocate kDefaultMaxFrameBytes.
constexpr uint64_t kHandshakeMaxFrameBytes = 64 * 1024;
/// Frames a FrameConnection reads ahead while it sends (set_read_while_sending), at most.
constexpr size_t kMaxReadAheadFrames = 8;

/// Upper bounds on text fields: names (clientName, workerName), fingerprints, and error
/// or state texts, in bytes. Names reach the logs, so they are also printable ASCII.
constexpr size_t kMaxWireNameBytes = 256;
constexpr size_t kMaxWireFingerprintBytes = 64;
constexpr size_t kMaxWireTextBytes = 64 * 1024;

/// Size of the handshake's nonces and HMAC-SHA256 proofs, in bytes.
constexpr size_t kAuthNonceBytes = 32;
constexpr size_t kAuthProofBytes = 32;

/// The largest frame body a legitimate worker sends in answer to `hello`, in bytes, for a
/// model with `num_moe_layers` MoE layers of `num_experts` routed experts each: a
/// helloReply listing every expert of every layer with its 16-byte content identity,
/// with every text at its cap (so an
/// `error` frame or an authChallenge, both smaller, fits too), plus room for the segment
/// table and far pointers of a multi-segment Cap'n Proto message. The one place that
/// knows how big a helloReply can be: a field added to HelloReply belongs here too.
/// Derived from the struct sizes of schema/charm.capnp; DeepSeek-V3's 58 x 256 experts
/// give about 365 KiB. Pure; never throws.
uint64_t max_hello_reply_bytes(uint32_t num_moe_layers, uint32_t num_experts);

/// The largest frame body a legitimate worker sends in answer to `healthRequest`, in
/// bytes: a healthReply with tier counters and residency bitmaps of `num_experts` experts
/// for `num_moe_layers` layers and every text at its cap, or an `error` frame (whichever
/// is larger), with the same room as max_hello_reply_bytes. Pure; never throws.
uint64_t max_health_reply_bytes(uint32_t num_moe_layers, uint32_t num_experts);

/// A whole encoded frame: 4-byte LE length prefix followed by the body.
using Frame = std::vector<uint8_t>;

/// A received frame body, stored in 8-byte words because Cap'n Proto reads aligned words.
struct FrameBody {
  std::vector<uint64_t> words;  ///< the body, zero-padded to a whole number of words
  uint64_t bytes = 0;           ///< body length in bytes as the prefix gave it
};

/// `hello`: first message of a client.
struct HelloMsg {
  uint32_t protocol_version = kProtocolVersion;
  std::string model_fingerprint;  ///< model_fingerprint() of the client's checkpoint
  std::string client_name;
  std::string client_nonce;       ///< kAuthNonceBytes random bytes, or empty
};

/// `authChallenge`: a worker with a shared secret answers hello with this.
struct AuthChallengeMsg {
  std::string worker_nonce;       ///< kAuthNonceBytes random bytes
  std::string worker_name;
};

/// `authResponse`: the client's proof that it holds the shared secret.
struct AuthResponseMsg {
  std::string proof;              ///< kAuthProofBytes bytes of HMAC-SHA256
};

/// `helloReply`.
struct HelloReplyMsg {
  bool ok = false;
  std::string error;              ///< why not ok; names both mismatching values
  std::string worker_name;
  uint32_t protocol_version = kProtocolVersion;
  std::string model_fingerprint;
  std::map<uint32_t, std::vector<uint32_t>> held;  ///< layer -> expert ids held
  /// The content identity of every held expert (the encoder requires one for each).
  ExpertIdentities identities;
  std::string worker_proof;       ///< kAuthProofBytes after an authChallenge, else empty
  std::string lossy_form;         ///< "" = the checkpoint's values; else e.g. "int8 group_size 32"
};

/// `layerResponse`: a LayerResponse, or an error naming why the request failed.
struct LayerResponseMsg {
  LayerResponse response;  ///< outputs empty when error is set
  std::string error;        ///< non-empty when the worker could not run the request
};

/// `healthRequest` (no fields).
struct HealthRequestMsg {};

/// `healthReply`.
struct HealthReplyMsg {
  std::string worker_name;
  std::string state;             ///< "up"
  uint64_t experts_held = 0;     ///< (layer, expert) pairs
  uint64_t requests_served = 0;  ///< layer requests answered since start
  uint64_t bytes_in = 0;         ///< frame bytes received since start (prefixes included)
  uint64_t bytes_out = 0;        ///< frame bytes sent since start (prefixes included)
  uint64_t uptime_ms = 0;
  uint32_t protocol_version = kProtocolVersion;
  std::string model_fingerprint;  ///< model_fingerprint() of the served checkpoint; empty
                                  ///< from a worker that predates the field
  TierCounters tier;                 ///< expert-tier counters summed over layers
  std::map<uint32_t, TierCounters> tier_layers;  ///< per MoE layer
  uint64_t slot_bytes = 0;        ///< bytes of one RAM expert slot
  uint64_t slots = 0;             ///< RAM expert slots (pinned + LRU)
  /// Per MoE layer: which experts are in RAM as the reply was built (empty from a
  /// worker that predates the field).
  std::map<uint32_t, LayerResidency> residency;
};

/// `error`: the peer's last frame was rejected; the sender closes the connection after.
struct ErrorMsg {
  std::string message;
};

/// Any decoded message; the alternative is the union member the frame carried.
using WireMessage = std::variant<HelloMsg, HelloReplyMsg, LayerRequest, LayerResponseMsg,
                                 HealthRequestMsg, HealthReplyMsg, ErrorMsg, AuthChallengeMsg,
                                 AuthResponseMsg, PrefetchHintMsg>;

/// The schema's name of the message held by `message` ("hello", "layerRequest", ...).
const char* message_name(const WireMessage& message);

// --- encoders: charm struct -> whole frame ------------------------------------------

Frame encode_hello(const HelloMsg& hello);
/// Throws Error(kInvalidInput) naming the expert when a held expert has no identity.
Frame encode_hello_reply(const HelloReplyMsg& reply);
/// Throws Error(kInvalidInput) when hidden.size() != num_rows * hidden_size.
Frame encode_layer_request(const LayerRequest& request);
Frame encode_layer_response(const LayerResponseMsg& response);
Frame encode_health_request();
Frame encode_health_reply(const HealthReplyMsg& reply);
Frame encode_error(const std::string& message);
Frame encode_auth_challenge(const AuthChallengeMsg& challenge);
Frame encode_auth_response(const AuthResponseMsg& response);
/// Throws Error(kInvalidInput) for more than kMaxHintExperts experts.
Frame encode_prefetch_hint(const PrefetchHintMsg& hint);

// --- decoders: frame body -> charm struct ---------------------------------------------

/// The body length a frame's 4-byte little-endian prefix announces, checked before
/// anything is allocated for it. Throws Error(kProtocol) "frame length N bytes[ from
/// <from>] exceeds the cap of M bytes" for a length over `max_frame_bytes`, and for one
/// that is not a whole number of 8-byte Cap'n Proto words. `from` names the peer (empty:
/// not named). The one length check of both split_frame and FrameConnection::receive.
uint64_t frame_length(const uint8_t prefix[4], uint64_t max_frame_bytes, const std::string& from = "");

/// Splits one whole frame held in memory (prefix + body) into its body. Throws
/// Error(kProtocol) for fewer than 4 bytes, a length over `max_frame_bytes`, a body
/// length that is not a multiple of 8 (Cap'n Proto words), or a byte count that
/// disagrees with the prefix (truncated or trailing bytes).
FrameBody split_frame(const uint8_t* data, size_t size,
                      uint64_t max_frame_bytes = kDefaultMaxFrameBytes);

/// Decodes and validates a body. Throws Error(kProtocol) naming the field for: a
/// malformed Cap'n Proto message (bad segment table, out-of-bounds pointers, traversal
/// limit of 2 * body words + 1024 exceeded, nesting over 16, trailing words), an unknown
/// union member; names over kMaxWireNameBytes or not printable ASCII, fingerprints over
/// kMaxWireFingerprintBytes, texts over kMaxWireTextBytes; a nonce or proof of the wrong
/// size; in a helloReply: a layer listed twice or expert ids not strictly ascending,
/// identities other than 16 bytes per expert, a lossyForm over kMaxWireNameBytes or not
/// printable; in
/// a layerRequest: hiddenSize 0 or over kMaxWireHiddenSize, a hidden payload that is not
/// a multiple of 4 bytes or not numRows * hiddenSize * 4 bytes, an assignment row >=
/// numRows, a prefetch naming more than kMaxHintExperts experts; in a layerResponse:
/// outputs not a multiple of 8 bytes (int64), stats.hits + stats.misses other than 0 or
/// expertsComputed, prefetchHits > hits; in a healthReply:
/// tierLayers not ascending / a layer twice, prefetchHits > prefetchIssued; in a
/// prefetchHint: more than kMaxHintExperts experts. What needs the model's shape (layer
/// and expert ids) is checked by check_layer_request and check_prefetch_hint.
WireMessage decode_message(const FrameBody& body,
                           uint64_t max_frame_bytes = kDefaultMaxFrameBytes);

/// What a worker knows of its model, to check a decoded layerRequest against.
struct ModelLimits {
  uint32_t num_layers = 0;   ///< decoder layers (num_hidden_layers)
  uint32_t num_experts = 0;  ///< routed experts per MoE layer (num_experts)
  uint32_t hidden_size = 0;  ///< floats per hidden row
  std::vector<uint32_t> moe_layers;  ///< ascending ids of the MoE layers
};

/// Checks a decoded layerRequest against the served model. Throws Error(kProtocol)
/// naming the field for: layer >= num_layers or not an MoE layer, hiddenSize !=
/// hidden_size, an expert id >= num_experts, more assignments than numRows *
/// num_experts (each (row, expert) pair at most once). A limit of 0 is not checked.
void check_layer_request(const LayerRequest& request, const ModelLimits& limits);

/// Checks a decoded prefetchHint against the served model, as check_layer_request does a
/// layerRequest. Throws Error(kProtocol) naming the field for: layer >= num_layers or not
/// an MoE layer, an expert id >= num_experts, more experts than num_experts (each at
/// most once). A limit of 0 is not checked.
void check_prefetch_hint(const PrefetchHintMsg& hint, const ModelLimits& limits);

/// Throws Error(kProtocol) "expected <expected>, got <name of got>" (with the text of an
/// `error` message when that is what came).
[[noreturn]] void fail_unexpected_message(const WireMessage& got, const char* expected);

/// decode_message, then requires alternative T (throws as fail_unexpected_message).
template <typename T>
T decode_as(const FrameBody& body, uint64_t max_frame_bytes = kDefaultMaxFrameBytes) {
  WireMessage message = decode_message(body, max_frame_bytes);
  if (T* value = std::get_if<T>(&message)) return std::move(*value);
  fail_unexpected_message(message, message_name(WireMessage(T{})));
}

// --- a framed TCP connection with deadlines -------------------------------------------

/// One TCP connection that sends and receives frames. Owns its io_context and socket
/// (RAII: closed on destruction). A new connection, connected or accepted, receives
/// frames of at most kHandshakeMaxFrameBytes until set_max_frame_bytes raises the cap
/// (once the peer is trusted). Thread-safety: one thread at a time per connection, except
/// interrupt() and abort(), which any thread may call at any time.
class FrameConnection {
 public:
  /// Connects to host:port within `timeout`. Throws Error(kUnavailable) naming `peer`
  /// when the address does not resolve, the connection is refused or the time runs out.
  static std::unique_ptr<FrameConnection> connect(const std::string& host, uint16_t port,
                                                  std::chrono::milliseconds timeout,
                                                  const std::string& peer);

  ~FrameConnection();
  FrameConnection(const FrameConnection&) = delete;
  FrameConnection& operator=(const FrameConnection&) = delete;

  /// Writes `frame` whole before `timeout`. Returns the bytes written (frame.size()).
  /// Throws Error(kUnavailable) naming the peer on a socket error or timeout, after
  /// closing the connection.
  uint64_t send(const Frame& frame, std::chrono::milliseconds timeout);

  /// Reads one frame before `timeout`; returns its body. Throws Error(kProtocol) naming
  /// the peer for a length over max_frame_bytes or not a multiple of 8 and for a stream
  /// that ends inside a frame ("truncated frame"); Error(kUnavailable) for a socket
  /// error, a timeout, or a stream that ends between frames ("closed the connection").
  /// After Error(kUnavailable) the connection is closed. After a length-prefix
  /// Error(kProtocol) it is left open (the stream is unusable) so the caller can send an
  /// `error` frame before closing.
  /// When `stop` is given and becomes true the read is abandoned with Error(kUnavailable).
  /// After interrupt() it is abandoned at once with Error(kUnavailable) "interrupted",
  /// and the connection is left open (see interrupt()).
  FrameBody receive(std::chrono::milliseconds timeout, const std::atomic<bool>* stop = nullptr);

  /// Thread-safe: makes the receive() in progress on the owning thread, and every later
  /// one, fail at once with Error(kUnavailable) "... interrupted", without closing the
  /// socket, so the owner can still send one last frame (an `error` saying why) before
  /// closing; a send() in progress fails as a send error (the connection closed). The
  /// stream may be out of step after it: send nothing but that last frame. Used by the
  /// worker to evict a connection whose thread is blocked reading or writing.
  void interrupt();
  bool interrupted() const;

  /// Closes the socket (idempotent).
  void close();
  bool is_open() const;

  /// Makes the send or receive another thread is blocked in, and every later one, fail at
  /// once with Error(kUnavailable) "... was aborted" (the socket is shut down; its
  /// descriptor stays the owner's to close). For a peer that went silent: nothing else
  /// wakes a read from it before its deadline. Thread-safe, like interrupt(); unlike it,
  /// nothing can be sent afterwards. Idempotent.
  void abort();
  /// True after abort().
  bool aborted() const;

  const std::string& peer() const { return peer_; }
  /// The remote IP address alone ("127.0.0.1", "::1"): what the worker counts connections
  /// per source by. Empty when the socket could not tell.
  const std::string& remote_address() const { return remote_address_; }
  void set_max_frame_bytes(uint64_t bytes) { max_frame_bytes_ = bytes; }

  /// Whether send() keeps reading while it writes (off by default): frames that arrive
  /// meanwhile, up to kMaxReadAheadFrames of them under max_frame_bytes, are kept and
  /// returned by the next receive() calls in order (wait_readable counts them); an error
  /// such a read meets is raised by the receive() after them. A client that pipelines
  /// requests needs this: its send of request B must not wait for a peer that is itself
  /// blocked sending the reply to A, which only a read unblocks. Owner thread only.
  void set_read_while_sending(bool on);
  uint64_t max_frame_bytes() const { return max_frame_bytes_; }

  struct Impl;  ///< the Asio socket and its io_context (common/wire_socket.cpp)
  /// Internal: wraps an open socket (FrameListener::accept, connect).
  FrameConnection(std::unique_ptr<Impl> impl, std::string peer, std::string remote_address = "");

 private:
  friend std::vector<size_t> wait_readable(const std::vector<FrameConnection*>& connections,
                                           std::chrono::milliseconds timeout);

  // send()'s write loop with reads alongside (set_read_while_sending); false when the
  // deadline passed first (everything pending is then cancelled and drained).
  bool send_while_reading(const bool& written, std::chrono::steady_clock::time_point deadline);

  std::unique_ptr<Impl> impl_;
  std::string peer_;
  std::string remote_address_;
  uint64_t max_frame_bytes_ = kHandshakeMaxFrameBytes;
};

/// Waits up to `timeout` until at least one of `connections` has bytes to read, was closed
/// or reset by its peer, is closed or was aborted (a receive from it then returns or fails
/// without waiting), and returns the indices of those, ascending; empty when the time ran
/// out first. Reads nothing, so a frame is still whole for receive(). Throws
/// Error(kUnavailable) when poll(2) itself fails. Thread-safety: the owner thread of every
/// connection (others may abort() them meanwhile, which wakes the wait).
std::vector<size_t> wait_readable(const std::vector<FrameConnection*>& connections,
                                  std::chrono::milliseconds timeout);

/// A listening TCP socket that yields FrameConnections. RAII: closed on destruction.
/// Thread-safety: one thread at a time.
class FrameListener {
 public:
  /// Binds exactly host:port (port 0 picks an ephemeral port) with SO_REUSEADDR and
  /// listens. Throws Error(kUnavailable) naming the address when it cannot bind.
  static std::unique_ptr<FrameListener> listen(const std::string& host, uint16_t port);

  ~FrameListener();
  FrameListener(const FrameListener&) = delete;
  FrameListener& operator=(const FrameListener&) = delete;

  /// The bound port (useful after binding port 0).
  uint16_t port() const;

  /// Waits up to `timeout` for a client; nullptr when none came in time. Throws
  /// Error(kUnavailable) when the listening socket fails.
  std::unique_ptr<FrameConnection> accept(std::chrono::milliseconds timeout);

  struct Impl;

 private:
  explicit FrameListener(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace charm
