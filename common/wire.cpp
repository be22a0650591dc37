// Encoders and validating decoders between charm structs and schema/charm.capnp frames.
// The socket side of wire.h is in wire_socket.cpp.
#include "common/wire.h"

#include "common/wire_layer.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <iterator>
#include <span>
#include <string>

#include <capnp/serialize.h>
#include <kj/io.h>

#include "schema/charm.capnp.h"

namespace charm {
namespace {

// f32 and int64 payloads are copied byte for byte; the wire says little-endian.
static_assert(std::endian::native == std::endian::little,
              "charm's wire format copies f32 and int64 rows as-is and needs a little-endian host");

constexpr size_t kPrefixBytes = 4;

// Serialises `builder` into a whole frame (prefix + flat message) with one copy.
Frame finish_frame(capnp::MessageBuilder& builder) {
  const uint64_t body_bytes = capnp::computeSerializedSizeInWords(builder) * sizeof(capnp::word);
  if (body_bytes > UINT32_MAX) {
    fail_invalid("message of " + std::to_string(body_bytes) +
                 " bytes does not fit a 4-byte frame length");
  }
  Frame frame(kPrefixBytes + body_bytes);
  for (size_t i = 0; i < kPrefixBytes; ++i) frame[i] = uint8_t(body_bytes >> (8 * i));
  kj::ArrayOutputStream out(kj::arrayPtr(frame.data() + kPrefixBytes, body_bytes));
  capnp::writeMessage(out, builder);
  return frame;
}

// First segment sized to hold `payload_bytes` of Data plus headers, so big messages are
// one segment (no far pointers, one contiguous copy).
unsigned first_segment_words(uint64_t payload_bytes) {
  return static_cast<unsigned>(payload_bytes / sizeof(capnp::word) + 64);
}

// A prefetchHint's fields (the message, or a layerRequest's prefetch). Throws
// Error(kInvalidInput) for more than kMaxHintExperts experts.
void set_prefetch_hint(wire::PrefetchHint::Builder r, const PrefetchHintMsg& hint) {
  if (hint.experts.size() > kMaxHintExperts) {
    fail_invalid("prefetch hint for layer " + std::to_string(hint.layer) + " names " +
                 std::to_string(hint.experts.size()) + " experts, over the cap " + std::to_string(kMaxHintExperts));
  }
  r.setLayer(hint.layer);
  auto list = r.initExperts(static_cast<unsigned>(hint.experts.size()));
  for (unsigned i = 0; i < hint.experts.size(); ++i) list.set(i, hint.experts[i]);
}

// A layerRequest frame whose rows `fill(dst)` writes straight into the message's hidden
// field (dst: [num_rows, hidden_size] f32), so the rows are copied once into the message.
template <typename Fill>
Frame encode_layer_request_with(const LayerRequestHeader& header, uint32_t num_rows,
                                const std::vector<ExpertAssignment>& assignments, Fill fill) {
  const uint64_t hidden_bytes = uint64_t{num_rows} * header.hidden_size * sizeof(float);
  const uint64_t payload = hidden_bytes + assignments.size() * sizeof(capnp::word);
  capnp::MallocMessageBuilder builder(first_segment_words(payload));
  auto r = builder.initRoot<wire::Message>().initLayerRequest();
  r.setRequestId(header.request_id);
  r.setLayer(header.layer);
  r.setHiddenSize(header.hidden_size);
  r.setNumRows(num_rows);
  capnp::Data::Builder hidden = r.initHidden(hidden_bytes);
  if (hidden_bytes) fill(reinterpret_cast<float*>(hidden.begin()));  // Data is word-aligned
  auto list = r.initAssignments(static_cast<unsigned>(assignments.size()));
  for (unsigned i = 0; i < assignments.size(); ++i) {
    list[i].setRow(assignments[i].row);
    list[i].setExpert(assignments[i].expert);
    list[i].setWeight(assignments[i].weight);
  }
  if (header.prefetch) set_prefetch_hint(r.initPrefetch(), *header.prefetch);
  return finish_frame(builder);
}

void set_layer_stats(wire::LayerStats::Builder stats, const LayerStats& st) {
  stats.setExpertsComputed(st.experts_computed);
  stats.setRowsComputed(st.rows_computed);
  stats.setComputeNs(st.compute_ns);
  // hits, misses and prefetchHits count distinct experts of this request, so they are at
  // most expertsComputed (a u32): the schema's u32 holds them exactly.
  stats.setHits(static_cast<uint32_t>(st.hits));
  stats.setMisses(static_cast<uint32_t>(st.misses));
  stats.setBytesRead(st.bytes_read);
  stats.setIoWaitNs(st.io_wait_ns);
  stats.setDiskNs(st.disk_ns);
  stats.setPrefetchHits(static_cast<uint32_t>(st.prefetch_hits));
  stats.setSaturated(st.saturated);
  stats.setVramHits(static_cast<uint32_t>(st.vram_hits));
}

capnp::Data::Reader as_data(const std::string& bytes) {
  return capnp::Data::Reader(reinterpret_cast<const capnp::byte*>(bytes.data()), bytes.size());
}

template <typename T>
void copy_values(const std::vector<T>& src, capnp::Data::Builder dst) {
  if (!src.empty()) std::memcpy(dst.begin(), src.data(), src.size() * sizeof(T));
}

// The f32 values of a Data field, in place: Cap'n Proto starts every Data on a word
// boundary, so the floats are aligned. Valid while the frame holding `data` is.
std::span<const float> float_view(capnp::Data::Reader data, const char* field) {
  if (data.size() % sizeof(float) != 0) {
    fail_protocol(std::string(field) + " is " + std::to_string(data.size()) +
                  " bytes, not a multiple of 4 (f32)");
  }
  return {reinterpret_cast<const float*>(data.begin()), data.size() / sizeof(float)};
}

// The int64 values of a Data field, in place (word-aligned, as float_view).
std::span<const int64_t> int64_view(capnp::Data::Reader data, const char* field) {
  if (data.size() % sizeof(int64_t) != 0) {
    fail_protocol(std::string(field) + " is " + std::to_string(data.size()) +
                  " bytes, not a multiple of 8 (int64)");
  }
  return {reinterpret_cast<const int64_t*>(data.begin()), data.size() / sizeof(int64_t)};
}

// A text field, capped at `max_bytes`; names (`printable`) must be printable ASCII because
// they go into log lines.
std::string text_of(capnp::Text::Reader text, const char* field, size_t max_bytes,
                    bool printable = false) {
  if (text.size() > max_bytes) {
    fail_protocol(std::string(field) + " is " + std::to_string(text.size()) +
                  " bytes, over the cap of " + std::to_string(max_bytes));
  }
  if (printable) {
    for (char c : text) {
      if (c < 0x20 || c > 0x7e) {
        fail_protocol(std::string(field) + " holds a byte that is not printable ASCII (" +
                      std::to_string(static_cast<unsigned char>(c)) + ")");
      }
    }
  }
  return std::string(text.cStr(), text.size());
}

// A Data field of exactly `size` bytes (or empty when `may_be_empty`).
std::string bytes_of(capnp::Data::Reader data, const char* field, size_t size,
                     bool may_be_empty) {
  if (data.size() != size && !(may_be_empty && data.size() == 0)) {
    fail_protocol(std::string(field) + " is " + std::to_string(data.size()) + " bytes, expected " +
                  std::to_string(size) + (may_be_empty ? " or none" : ""));
  }
  return std::string(reinterpret_cast<const char*>(data.begin()), data.size());
}

// Reads and checks a prefetchHint (the message, or a layerRequest's prefetch).
PrefetchHintMsg decode_prefetch_hint(wire::PrefetchHint::Reader r, const char* field = "prefetchHint") {
  PrefetchHintMsg msg;
  msg.layer = r.getLayer();
  auto experts = r.getExperts();
  if (experts.size() > kMaxHintExperts) {
    fail_protocol(std::string(field) + ".experts has " + std::to_string(experts.size()) + " entries, over the cap " +
                  std::to_string(kMaxHintExperts));
  }
  msg.experts.reserve(experts.size());
  for (uint32_t e : experts) msg.experts.push_back(e);
  return msg;
}

// Reads and checks a layerRequest into `req` (a LayerRequest or a LayerRequestView: all
// but the rows), returning its rows in place. The one place a layerRequest is validated.
template <typename Out>
std::span<const float> read_layer_request(wire::LayerRequest::Reader r, Out& req) {
  req.request_id = r.getRequestId();
  req.layer = r.getLayer();
  req.hidden_size = r.getHiddenSize();
  req.num_rows = r.getNumRows();
  if (req.hidden_size == 0) fail_protocol("layerRequest.hiddenSize is 0");
  if (req.hidden_size > kMaxWireHiddenSize) {
    fail_protocol("layerRequest.hiddenSize " + std::to_string(req.hidden_size) +
                  " exceeds the cap " + std::to_string(kMaxWireHiddenSize));
  }
  capnp::Data::Reader hidden = r.getHidden();
  const uint64_t expected = uint64_t{req.num_rows} * req.hidden_size * sizeof(float);
  if (hidden.size() % sizeof(float) == 0 && hidden.size() != expected) {
    fail_protocol("layerRequest.hidden is " + std::to_string(hidden.size()) +
                  " bytes but numRows (" + std::to_string(req.num_rows) + ") * hiddenSize (" +
                  std::to_string(req.hidden_size) + ") * 4 = " + std::to_string(expected));
  }
  const std::span<const float> rows = float_view(hidden, "layerRequest.hidden");
  auto assignments = r.getAssignments();
  req.assignments.reserve(assignments.size());
  for (uint32_t i = 0; i < assignments.size(); ++i) {
    const uint32_t row = assignments[i].getRow();
    if (row >= req.num_rows) {
      fail_protocol("layerRequest.assignments[" + std::to_string(i) + "].row = " +
                    std::to_string(row) + " is out of range (numRows = " +
                    std::to_string(req.num_rows) + ")");
    }
    req.assignments.push_back({row, assignments[i].getExpert(), assignments[i].getWeight()});
  }
  if (r.hasPrefetch()) req.prefetch = decode_prefetch_hint(r.getPrefetch(), "layerRequest.prefetch");
  return rows;
}

LayerRequest decode_layer_request(wire::LayerRequest::Reader r) {
  LayerRequest req;
  const std::span<const float> rows = read_layer_request(r, req);
  req.hidden.assign(rows.begin(), rows.end());
  return req;
}

// Reads and checks a layerResponse's id, stats and error, returning its outputs in place.
// The one place a layerResponse is validated.
std::span<const int64_t> read_layer_response(wire::LayerResponse::Reader r, uint64_t& request_id, LayerStats& st,
                                             std::string& error) {
  request_id = r.getRequestId();
  const std::span<const int64_t> outputs = int64_view(r.getOutputs(), "layerResponse.outputs");
  auto stats = r.getStats();
  st.experts_computed = stats.getExpertsComputed();
  st.rows_computed = stats.getRowsComputed();
  st.compute_ns = stats.getComputeNs();
  st.hits = stats.getHits();
  st.misses = stats.getMisses();
  st.bytes_read = stats.getBytesRead();
  st.io_wait_ns = stats.getIoWaitNs();
  st.disk_ns = stats.getDiskNs();
  st.prefetch_hits = stats.getPrefetchHits();
  st.saturated = stats.getSaturated();
  st.vram_hits = stats.getVramHits();
  const uint64_t looked_up = st.hits + st.misses;  // each read from a u32: no overflow
  if (looked_up != 0 && looked_up != st.experts_computed) {
    fail_protocol("layerResponse.stats: hits (" + std::to_string(st.hits) + ") + misses (" + std::to_string(st.misses) +
                  ") must equal expertsComputed (" + std::to_string(st.experts_computed) + ")");
  }
  if (st.prefetch_hits > st.hits) {
    fail_protocol("layerResponse.stats.prefetchHits " + std::to_string(st.prefetch_hits) + " exceeds hits " +
                  std::to_string(st.hits));
  }
  if (st.vram_hits > st.hits) {
    fail_protocol("layerResponse.stats.vramHits " + std::to_string(st.vram_hits) + " exceeds hits " +
                  std::to_string(st.hits));
  }
  error = text_of(r.getError(), "layerResponse.error", kMaxWireTextBytes);
  return outputs;
}

LayerResponseMsg decode_layer_response(wire::LayerResponse::Reader r) {
  LayerResponseMsg msg;
  const std::span<const int64_t> outputs =
      read_layer_response(r, msg.response.request_id, msg.response.stats, msg.error);
  msg.response.outputs.assign(outputs.begin(), outputs.end());
  return msg;
}

HelloMsg decode_hello(wire::Hello::Reader h) {
  HelloMsg msg;
  msg.protocol_version = h.getProtocolVersion();
  msg.model_fingerprint = text_of(h.getModelFingerprint(), "hello.modelFingerprint",
                                  kMaxWireFingerprintBytes, true);
  msg.client_name = text_of(h.getClientName(), "hello.clientName", kMaxWireNameBytes, true);
  msg.client_nonce = bytes_of(h.getClientNonce(), "hello.clientNonce", kAuthNonceBytes, true);
  return msg;
}

HelloReplyMsg decode_hello_reply(wire::HelloReply::Reader r) {
  HelloReplyMsg msg;
  msg.ok = r.getOk();
  msg.error = text_of(r.getError(), "helloReply.error", kMaxWireTextBytes);
  msg.worker_name = text_of(r.getWorkerName(), "helloReply.workerName", kMaxWireNameBytes, true);
  msg.protocol_version = r.getProtocolVersion();
  msg.model_fingerprint = text_of(r.getModelFingerprint(), "helloReply.modelFingerprint",
                                  kMaxWireFingerprintBytes, true);
  auto held = r.getHeld();
  for (uint32_t i = 0; i < held.size(); ++i) {
    const std::string at = "helloReply.held[" + std::to_string(i) + "]";
    auto [it, fresh] = msg.held.try_emplace(held[i].getLayer());
    if (!fresh) fail_protocol(at + ".layer " + std::to_string(it->first) + " is listed twice");
    auto experts = held[i].getExperts();
    capnp::Data::Reader identities = held[i].getIdentities();
    if (identities.size() != uint64_t{experts.size()} * kContentHashBytes) {
      fail_protocol(at + ".identities is " + std::to_string(identities.size()) + " bytes, expected " +
                    std::to_string(kContentHashBytes) + " per expert (" + std::to_string(experts.size()) +
                    " experts)");
    }
    it->second.reserve(experts.size());
    for (uint32_t j = 0; j < experts.size(); ++j) {
      // Strictly ascending: the coordinator binary-searches these lists.
      if (j > 0 && experts[j] <= experts[j - 1]) {
        fail_protocol(at + ".experts is not strictly ascending at index " + std::to_string(j));
      }
      it->second.push_back(experts[j]);
      msg.identities.emplace(ExpertKey{it->first, experts[j]},
                             ContentHash::from_bytes(identities.begin() + uint64_t{j} * kContentHashBytes));
    }
  }
  msg.worker_proof = bytes_of(r.getWorkerProof(), "helloReply.workerProof", kAuthProofBytes, true);
  msg.lossy_form = text_of(r.getLossyForm(), "helloReply.lossyForm", kMaxWireNameBytes, true);
  return msg;
}

TierCounters tier_of(wire::TierCounters::Reader r, const std::string& field) {
  TierCounters t{r.getHits(), r.getMisses(), r.getBytesRead(), r.getIoWaitNs(), r.getDiskNs(), r.getPrefetchIssued(),
              r.getPrefetchHits(), r.getVramHits()};
  if (t.prefetch_hits > t.prefetch_issued) {
    fail_protocol(field + ".prefetchHits " + std::to_string(t.prefetch_hits) + " exceeds prefetchIssued " +
                  std::to_string(t.prefetch_issued));
  }
  if (t.vram_hits > t.hits) {
    fail_protocol(field + ".vramHits " + std::to_string(t.vram_hits) + " exceeds hits " + std::to_string(t.hits));
  }
  return t;
}

void set_tier(wire::TierCounters::Builder b, const TierCounters& t) {
  b.setHits(t.hits);
  b.setMisses(t.misses);
  b.setBytesRead(t.bytes_read);
  b.setIoWaitNs(t.io_wait_ns);
  b.setDiskNs(t.disk_ns);
  b.setPrefetchIssued(t.prefetch_issued);
  b.setPrefetchHits(t.prefetch_hits);
  b.setVramHits(t.vram_hits);
}

/// The bitmap of `ids` (LayerResidency: bit e of byte e / 8, least significant first),
/// up to the byte of the largest id.
std::vector<capnp::byte> bitmap_of(const std::vector<uint32_t>& ids) {
  std::vector<capnp::byte> bits;
  for (uint32_t e : ids) {
    if (e / 8 >= bits.size()) bits.resize(e / 8 + 1, 0);
    bits[e / 8] = static_cast<capnp::byte>(bits[e / 8] | (1u << (e % 8)));
  }
  return bits;
}

/// The ids of a bitmap's set bits, ascending (bitmap_of's inverse).
std::vector<uint32_t> ids_of(capnp::Data::Reader bits) {
  std::vector<uint32_t> ids;
  for (uint32_t i = 0; i < bits.size(); ++i) {
    for (uint32_t b = 0; b < 8; ++b)
      if (bits[i] & (1u << b)) ids.push_back(i * 8 + b);
  }
  return ids;
}

/// healthReply.residency: layers ascending, each once, pinned and cached disjoint (vram may
/// overlap either).
std::map<uint32_t, LayerResidency> residency_of(capnp::List<wire::LayerResidency>::Reader list) {
  std::map<uint32_t, LayerResidency> out;
  for (uint32_t i = 0; i < list.size(); ++i) {
    const std::string field = "healthReply.residency[" + std::to_string(i) + "]";
    const uint32_t layer = list[i].getLayer();
    if (!out.empty() && layer <= out.rbegin()->first) {
      fail_protocol(field + ".layer " + std::to_string(layer) + " is not above the previous layer (ascending, once each)");
    }
    LayerResidency r{ids_of(list[i].getPinned()), ids_of(list[i].getCached()), ids_of(list[i].getVram())};
    std::vector<uint32_t> both;
    std::set_intersection(r.pinned.begin(), r.pinned.end(), r.cached.begin(), r.cached.end(), std::back_inserter(both));
    if (!both.empty()) {
      fail_protocol(field + ": expert " + std::to_string(both.front()) + " is both pinned and cached (disjoint sets)");
    }
    out[layer] = std::move(r);
  }
  return out;
}

HealthReplyMsg decode_health_reply(wire::HealthReply::Reader r) {
  HealthReplyMsg msg;
  msg.worker_name = text_of(r.getWorkerName(), "healthReply.workerName", kMaxWireNameBytes, true);
  msg.state = text_of(r.getState(), "healthReply.state", kMaxWireNameBytes, true);
  msg.experts_held = r.getExpertsHeld();
  msg.requests_served = r.getRequestsServed();
  msg.bytes_in = r.getBytesIn();
  msg.bytes_out = r.getBytesOut();
  msg.uptime_ms = r.getUptimeMs();
  msg.protocol_version = r.getProtocolVersion();
  msg.model_fingerprint = text_of(r.getModelFingerprint(), "healthReply.modelFingerprint",
                                  kMaxWireFingerprintBytes, true);
  msg.tier = tier_of(r.getTierTotal(), "healthReply.tierTotal");
  auto layers = r.getTierLayers();
  for (uint32_t i = 0; i < layers.size(); ++i) {
    const std::string field = "healthReply.tierLayers[" + std::to_string(i) + "]";
    const uint32_t layer = layers[i].getLayer();
    if (!msg.tier_layers.empty() && layer <= msg.tier_layers.rbegin()->first) {
      fail_protocol(field + ".layer " + std::to_string(layer) + " is not above the previous layer (ascending, once each)");
    }
    msg.tier_layers[layer] = tier_of(layers[i].getCounters(), field);
  }
  msg.slot_bytes = r.getSlotBytes();
  msg.slots = r.getSlots();
  msg.residency = residency_of(r.getResidency());
  return msg;
}

WireMessage decode_root(wire::Message::Reader m) {
  switch (m.which()) {
    case wire::Message::HELLO: return decode_hello(m.getHello());
    case wire::Message::HELLO_REPLY: return decode_hello_reply(m.getHelloReply());
    case wire::Message::LAYER_REQUEST: return decode_layer_request(m.getLayerRequest());
    case wire::Message::LAYER_RESPONSE: return decode_layer_response(m.getLayerResponse());
    case wire::Message::HEALTH_REQUEST: return HealthRequestMsg{};
    case wire::Message::HEALTH_REPLY: return decode_health_reply(m.getHealthReply());
    case wire::Message::ERROR:
      return ErrorMsg{text_of(m.getError().getMessage(), "error.message", kMaxWireTextBytes)};
    case wire::Message::AUTH_CHALLENGE: {
      auto c = m.getAuthChallenge();
      return AuthChallengeMsg{
          bytes_of(c.getWorkerNonce(), "authChallenge.workerNonce", kAuthNonceBytes, false),
          text_of(c.getWorkerName(), "authChallenge.workerName", kMaxWireNameBytes, true)};
    }
    case wire::Message::AUTH_RESPONSE:
      return AuthResponseMsg{
          bytes_of(m.getAuthResponse().getProof(), "authResponse.proof", kAuthProofBytes, false)};
    case wire::Message::PREFETCH_HINT: return decode_prefetch_hint(m.getPrefetchHint());
  }
  fail_protocol("Message union member " + std::to_string(static_cast<unsigned>(m.which())) +
                " is unknown to protocol version " + std::to_string(kProtocolVersion));
}

}  // namespace

// --- the largest legitimate replies ---------------------------------------------------

namespace {

constexpr uint64_t kWordBytes = sizeof(capnp::word);

// Words of a struct's own sections (data + pointers), from the generated schema.
template <typename T>
constexpr uint64_t struct_words() {
  return uint64_t{T::_capnpPrivate::dataWordSize} + T::_capnpPrivate::pointerCount;
}
// Words of a Text of at most `bytes` bytes (its NUL included), of Data, of a List(UInt32).
constexpr uint64_t text_words(uint64_t bytes) { return (bytes + 1 + kWordBytes - 1) / kWordBytes; }
constexpr uint64_t data_words(uint64_t bytes) { return (bytes + kWordBytes - 1) / kWordBytes; }
constexpr uint64_t u32_list_words(uint64_t count) { return (count * 4 + kWordBytes - 1) / kWordBytes; }

// Room for what a multi-segment message adds (encode_* use MallocMessageBuilder's growing
// segments: each new one at least doubles the total, so a frame under 4 GiB has fewer than
// 32): a segment-table entry and a double-far landing pad (2 words) per segment.
constexpr uint64_t kSegmentSlackWords = 1 + 32 * 3;
// Segment table of one segment, root pointer, the Message struct.
constexpr uint64_t kMessageWords = 1 + 1 + struct_words<wire::Message>();

constexpr uint64_t error_frame_words() {
  return kMessageWords + struct_words<wire::ErrorMessage>() + text_words(kMaxWireTextBytes);
}

}  // namespace

uint64_t max_hello_reply_bytes(uint32_t num_moe_layers, uint32_t num_experts) {
  // held: a composite list (a tag word, then per layer a LayerExperts) and per layer the
  // expert ids and their content identities; the texts at their caps (the lossy form is
  // a name); the proof.
  const uint64_t held = 1 + uint64_t{num_moe_layers} * (struct_words<wire::LayerExperts>() + u32_list_words(num_experts) +
                                                        data_words(uint64_t{kContentHashBytes} * num_experts));
  const uint64_t reply = kMessageWords + struct_words<wire::HelloReply>() + text_words(kMaxWireTextBytes) +
                         2 * text_words(kMaxWireNameBytes) + text_words(kMaxWireFingerprintBytes) + held +
                         data_words(kAuthProofBytes);
  const uint64_t challenge = kMessageWords + struct_words<wire::AuthChallenge>() + data_words(kAuthNonceBytes) +
                             text_words(kMaxWireNameBytes);
  return (std::max({reply, challenge, error_frame_words()}) + kSegmentSlackWords) * kWordBytes;
}

uint64_t max_health_reply_bytes(uint32_t num_moe_layers, uint32_t num_experts) {
  const uint64_t layers =
      1 + uint64_t{num_moe_layers} * (struct_words<wire::LayerTierCounters>() + struct_words<wire::TierCounters>());
  // residency: a composite list of LayerResidency, each with three bitmaps of num_experts bits.
  const uint64_t residency =
      1 + uint64_t{num_moe_layers} * (struct_words<wire::LayerResidency>() + 3 * data_words((uint64_t{num_experts} + 7) / 8));
  const uint64_t reply = kMessageWords + struct_words<wire::HealthReply>() + 2 * text_words(kMaxWireNameBytes) +
                         text_words(kMaxWireFingerprintBytes) + struct_words<wire::TierCounters>() + layers + residency;
  return (std::max(reply, error_frame_words()) + kSegmentSlackWords) * kWordBytes;
}

const char* message_name(const WireMessage& message) {
  static const char* const kNames[] = {"hello",         "helloReply",    "layerRequest",
                                       "layerResponse", "healthRequest", "healthReply",
                                       "error",         "authChallenge", "authResponse",
                                       "prefetchHint"};
  static_assert(std::size(kNames) == std::variant_size_v<WireMessage>);
  return kNames[message.index()];
}

Frame encode_hello(const HelloMsg& hello) {
  capnp::MallocMessageBuilder builder;
  auto h = builder.initRoot<wire::Message>().initHello();
  h.setProtocolVersion(hello.protocol_version);
  h.setModelFingerprint(hello.model_fingerprint);
  h.setClientName(hello.client_name);
  h.setClientNonce(as_data(hello.client_nonce));
  return finish_frame(builder);
}

Frame encode_auth_challenge(const AuthChallengeMsg& challenge) {
  capnp::MallocMessageBuilder builder;
  auto c = builder.initRoot<wire::Message>().initAuthChallenge();
  c.setWorkerNonce(as_data(challenge.worker_nonce));
  c.setWorkerName(challenge.worker_name);
  return finish_frame(builder);
}

Frame encode_auth_response(const AuthResponseMsg& response) {
  capnp::MallocMessageBuilder builder;
  builder.initRoot<wire::Message>().initAuthResponse().setProof(as_data(response.proof));
  return finish_frame(builder);
}

Frame encode_hello_reply(const HelloReplyMsg& reply) {
  uint64_t held_experts = 0;
  for (const auto& [layer, experts] : reply.held) held_experts += experts.size();
  // One segment: room for every field, generously.
  const uint64_t payload = 1024 + reply.error.size() + reply.worker_name.size() + reply.model_fingerprint.size() +
                           reply.worker_proof.size() + reply.lossy_form.size() + 32 * reply.held.size() +
                           24 * held_experts;
  capnp::MallocMessageBuilder builder(first_segment_words(payload));
  auto r = builder.initRoot<wire::Message>().initHelloReply();
  r.setOk(reply.ok);
  r.setError(reply.error);
  r.setWorkerName(reply.worker_name);
  r.setProtocolVersion(reply.protocol_version);
  r.setModelFingerprint(reply.model_fingerprint);
  auto held = r.initHeld(static_cast<unsigned>(reply.held.size()));
  unsigned i = 0;
  for (const auto& [layer, experts] : reply.held) {
    held[i].setLayer(layer);
    auto list = held[i].initExperts(static_cast<unsigned>(experts.size()));
    auto identities = held[i].initIdentities(static_cast<unsigned>(experts.size() * kContentHashBytes));
    for (unsigned j = 0; j < experts.size(); ++j) {
      list.set(j, experts[j]);
      const auto identity = reply.identities.find({layer, experts[j]});
      if (identity == reply.identities.end()) {
        fail_invalid("helloReply: no content identity for layer " + std::to_string(layer) + " expert " +
                     std::to_string(experts[j]));
      }
      const std::string bytes = identity->second.bytes();
      std::memcpy(identities.begin() + uint64_t{j} * kContentHashBytes, bytes.data(), kContentHashBytes);
    }
    ++i;
  }
  r.setWorkerProof(as_data(reply.worker_proof));
  r.setLossyForm(reply.lossy_form);
  return finish_frame(builder);
}

Frame encode_layer_request(const LayerRequest& request) {
  if (request.hidden.size() != uint64_t{request.num_rows} * request.hidden_size) {
    fail_invalid("layer request " + std::to_string(request.request_id) + ": hidden has " +
                 std::to_string(request.hidden.size()) + " floats, expected num_rows (" +
                 std::to_string(request.num_rows) + ") * hidden_size (" +
                 std::to_string(request.hidden_size) + ")");
  }
  const PrefetchHintMsg* prefetch = request.prefetch ? &*request.prefetch : nullptr;
  return encode_layer_request_with({request.request_id, request.layer, request.hidden_size, prefetch}, request.num_rows,
                                   request.assignments, [&](float* dst) {
                                     std::copy(request.hidden.begin(), request.hidden.end(), dst);
                                   });
}

Frame encode_layer_request_rows(const LayerRequestHeader& header, const float* hidden,
                                std::span<const uint32_t> rows, const std::vector<ExpertAssignment>& assignments) {
  const size_t h = header.hidden_size;
  return encode_layer_request_with(header, static_cast<uint32_t>(rows.size()), assignments, [&](float* dst) {
    for (size_t r = 0; r < rows.size(); ++r) std::copy_n(hidden + size_t{rows[r]} * h, h, dst + r * h);
  });
}

Frame encode_layer_response(const LayerResponseMsg& response) {
  const auto& out = response.response.outputs;
  capnp::MallocMessageBuilder builder(first_segment_words(out.size() * sizeof(int64_t)));
  auto r = builder.initRoot<wire::Message>().initLayerResponse();
  r.setRequestId(response.response.request_id);
  copy_values(out, r.initOutputs(out.size() * sizeof(int64_t)));
  set_layer_stats(r.initStats(), response.response.stats);
  r.setError(response.error);
  return finish_frame(builder);
}

Frame encode_health_request() {
  capnp::MallocMessageBuilder builder;
  builder.initRoot<wire::Message>().initHealthRequest();
  return finish_frame(builder);
}

Frame encode_health_reply(const HealthReplyMsg& reply) {
  capnp::MallocMessageBuilder builder;
  auto r = builder.initRoot<wire::Message>().initHealthReply();
  r.setWorkerName(reply.worker_name);
  r.setState(reply.state);
  r.setExpertsHeld(reply.experts_held);
  r.setRequestsServed(reply.requests_served);
  r.setBytesIn(reply.bytes_in);
  r.setBytesOut(reply.bytes_out);
  r.setUptimeMs(reply.uptime_ms);
  r.setProtocolVersion(reply.protocol_version);
  r.setModelFingerprint(reply.model_fingerprint);
  set_tier(r.initTierTotal(), reply.tier);
  auto layers = r.initTierLayers(static_cast<unsigned>(reply.tier_layers.size()));
  unsigned i = 0;
  for (const auto& [layer, t] : reply.tier_layers) {
    layers[i].setLayer(layer);
    set_tier(layers[i].initCounters(), t);
    ++i;
  }
  r.setSlotBytes(reply.slot_bytes);
  r.setSlots(reply.slots);
  auto residency = r.initResidency(static_cast<unsigned>(reply.residency.size()));
  i = 0;
  for (const auto& [layer, res] : reply.residency) {
    residency[i].setLayer(layer);
    const std::vector<capnp::byte> pinned = bitmap_of(res.pinned), cached = bitmap_of(res.cached),
                                   vram = bitmap_of(res.vram);
    residency[i].setPinned(capnp::Data::Reader(pinned.data(), pinned.size()));
    residency[i].setCached(capnp::Data::Reader(cached.data(), cached.size()));
    residency[i].setVram(capnp::Data::Reader(vram.data(), vram.size()));
    ++i;
  }
  return finish_frame(builder);
}

Frame encode_error(const std::string& message) {
  capnp::MallocMessageBuilder builder;
  builder.initRoot<wire::Message>().initError().setMessage(message);
  return finish_frame(builder);
}

Frame encode_prefetch_hint(const PrefetchHintMsg& hint) {
  capnp::MallocMessageBuilder builder;
  set_prefetch_hint(builder.initRoot<wire::Message>().initPrefetchHint(), hint);
  return finish_frame(builder);
}

uint64_t frame_length(const uint8_t prefix[4], uint64_t max_frame_bytes, const std::string& from) {
  uint64_t length = 0;
  for (size_t i = 0; i < kPrefixBytes; ++i) length |= uint64_t{prefix[i]} << (8 * i);
  const std::string what = "frame length " + std::to_string(length) + " bytes" + (from.empty() ? "" : " from " + from);
  if (length > max_frame_bytes) {
    fail_protocol(what + " exceeds the cap of " + std::to_string(max_frame_bytes) + " bytes");
  }
  if (length % sizeof(capnp::word) != 0) fail_protocol(what + " is not a whole number of 8-byte Cap'n Proto words");
  return length;
}

FrameBody split_frame(const uint8_t* data, size_t size, uint64_t max_frame_bytes) {
  if (size < kPrefixBytes) {
    fail_protocol("truncated frame: " + std::to_string(size) +
                  " bytes, shorter than the 4-byte length prefix");
  }
  const uint64_t length = frame_length(data, max_frame_bytes);
  if (size - kPrefixBytes != length) {
    fail_protocol(std::string(size - kPrefixBytes < length ? "truncated frame" : "trailing bytes") +
                  ": the length prefix says " + std::to_string(length) + " bytes, got " +
                  std::to_string(size - kPrefixBytes));
  }
  FrameBody body;
  body.bytes = length;
  body.words.resize(length / sizeof(uint64_t));
  if (length) std::memcpy(body.words.data(), data + kPrefixBytes, length);
  return body;
}

namespace {

// Opens `body` as a Message with every reader limit, checks that nothing trails it, and
// returns read(root). Cap'n Proto's errors become Error(kProtocol) "malformed ...".
template <typename Read>
auto with_root(const FrameBody& body, uint64_t max_frame_bytes, Read read) {
  if (body.bytes > max_frame_bytes) {
    fail_protocol("frame length " + std::to_string(body.bytes) + " bytes exceeds the cap of " +
                  std::to_string(max_frame_bytes) + " bytes");
  }
  kj::ArrayPtr<const capnp::word> words(
      reinterpret_cast<const capnp::word*>(body.words.data()), body.words.size());
  capnp::ReaderOptions options;
  // Every field is read once, so a well-formed message traverses at most its own size;
  // the factor 2 leaves room, and bounds amplification by aliased pointers.
  options.traversalLimitInWords = 2 * words.size() + 1024;
  options.nestingLimit = 16;
  try {
    capnp::FlatArrayMessageReader reader(words, options);
    if (reader.getEnd() != words.end()) {
      fail_protocol("frame has " + std::to_string((words.end() - reader.getEnd()) * 8) +
                    " trailing bytes after the Cap'n Proto message");
    }
    return read(reader.getRoot<wire::Message>());
  } catch (const kj::Exception& e) {
    fail_protocol(std::string("malformed Cap'n Proto message: ") + e.getDescription().cStr());
  }
}

}  // namespace

WireMessage decode_message(const FrameBody& body, uint64_t max_frame_bytes) {
  return with_root(body, max_frame_bytes, decode_root);
}

bool is_layer_request(const FrameBody& body, uint64_t max_frame_bytes) {
  try {
    return with_root(body, max_frame_bytes,
                     [](wire::Message::Reader m) { return m.which() == wire::Message::LAYER_REQUEST; });
  } catch (const Error&) {
    return false;
  }
}

LayerRequestView decode_layer_request_view(FrameBody body, uint64_t max_frame_bytes) {
  LayerRequestView view;
  view.hidden = with_root(body, max_frame_bytes, [&](wire::Message::Reader m) {
    if (m.which() != wire::Message::LAYER_REQUEST) fail_unexpected_message(decode_root(m), "layerRequest");
    return read_layer_request(m.getLayerRequest(), view);
  });
  view.body = std::move(body);  // the words' buffer moves, so `hidden` stays valid
  return view;
}

LayerResponseView decode_layer_response_view(FrameBody body, uint64_t max_frame_bytes) {
  LayerResponseView view;
  view.outputs = with_root(body, max_frame_bytes, [&](wire::Message::Reader m) {
    if (m.which() != wire::Message::LAYER_RESPONSE) fail_unexpected_message(decode_root(m), "layerResponse");
    return read_layer_response(m.getLayerResponse(), view.request_id, view.stats, view.error);
  });
  view.body = std::move(body);
  return view;
}

namespace {

// check_layer_request for a LayerRequest or a LayerRequestView (the same fields).
template <typename Request>
void check_layer_request_fields(const Request& request, const ModelLimits& limits) {
  const std::string at = "layerRequest (layer " + std::to_string(request.layer) + ")";
  if (limits.num_layers && request.layer >= limits.num_layers) {
    fail_protocol("layerRequest.layer " + std::to_string(request.layer) +
                  " is out of range (the model has " + std::to_string(limits.num_layers) +
                  " layers)");
  }
  if (!limits.moe_layers.empty() &&
      !std::binary_search(limits.moe_layers.begin(), limits.moe_layers.end(), request.layer)) {
    fail_protocol("layerRequest.layer " + std::to_string(request.layer) +
                  " is not an MoE layer of the model");
  }
  if (limits.hidden_size && request.hidden_size != limits.hidden_size) {
    fail_protocol(at + ": hiddenSize " + std::to_string(request.hidden_size) +
                  " differs from the model's hidden_size " + std::to_string(limits.hidden_size));
  }
  if (limits.num_experts) {
    const uint64_t cap = uint64_t{request.num_rows} * limits.num_experts;
    if (request.assignments.size() > cap) {
      fail_protocol(at + ": " + std::to_string(request.assignments.size()) +
                    " assignments, more than numRows * num_experts = " + std::to_string(cap));
    }
    for (size_t i = 0; i < request.assignments.size(); ++i) {
      const uint32_t expert = request.assignments[i].expert;
      if (expert >= limits.num_experts) {
        fail_protocol(at + ": assignments[" + std::to_string(i) + "].expert = " +
                      std::to_string(expert) + " is out of range (num_experts = " +
                      std::to_string(limits.num_experts) + ")");
      }
    }
  }
}

}  // namespace

void check_layer_request(const LayerRequest& request, const ModelLimits& limits) {
  check_layer_request_fields(request, limits);
}

void check_layer_request(const LayerRequestView& request, const ModelLimits& limits) {
  check_layer_request_fields(request, limits);
}

struct LayerResponseFrame::Impl {
  capnp::MallocMessageBuilder builder;
  wire::LayerResponse::Builder response;
  capnp::Data::Builder outputs;
  explicit Impl(uint64_t payload_bytes)
      : builder(first_segment_words(payload_bytes)),
        response(builder.initRoot<wire::Message>().initLayerResponse()),
        outputs(nullptr, 0) {}
};

LayerResponseFrame::LayerResponseFrame(uint64_t request_id, uint32_t num_rows, uint32_t hidden_size)
    : impl_(std::make_unique<Impl>(uint64_t{num_rows} * hidden_size * sizeof(int64_t))) {
  impl_->response.setRequestId(request_id);
  impl_->outputs = impl_->response.initOutputs(uint64_t{num_rows} * hidden_size * sizeof(int64_t));
}

LayerResponseFrame::~LayerResponseFrame() = default;

int64_t* LayerResponseFrame::outputs() { return reinterpret_cast<int64_t*>(impl_->outputs.begin()); }

Frame LayerResponseFrame::finish(const LayerStats& stats) {
  set_layer_stats(impl_->response.initStats(), stats);
  impl_->response.setError("");  // as encode_layer_response writes it: the same frame, byte for byte
  return finish_frame(impl_->builder);
}

void check_prefetch_hint(const PrefetchHintMsg& hint, const ModelLimits& limits) {
  const std::string layer = std::to_string(hint.layer);
  if (limits.num_layers && hint.layer >= limits.num_layers) {
    fail_protocol("prefetchHint.layer " + layer + " is out of range (the model has " +
                  std::to_string(limits.num_layers) + " layers)");
  }
  if (!limits.moe_layers.empty() &&
      !std::binary_search(limits.moe_layers.begin(), limits.moe_layers.end(), hint.layer)) {
    fail_protocol("prefetchHint.layer " + layer + " is not an MoE layer of the model");
  }
  if (!limits.num_experts) return;
  if (hint.experts.size() > limits.num_experts) {
    fail_protocol("prefetchHint (layer " + layer + "): " + std::to_string(hint.experts.size()) +
                  " experts, more than num_experts = " + std::to_string(limits.num_experts));
  }
  for (size_t i = 0; i < hint.experts.size(); ++i) {
    if (hint.experts[i] >= limits.num_experts) {
      fail_protocol("prefetchHint (layer " + layer + "): experts[" + std::to_string(i) + "] = " +
                    std::to_string(hint.experts[i]) + " is out of range (num_experts = " +
                    std::to_string(limits.num_experts) + ")");
    }
  }
}

void fail_unexpected_message(const WireMessage& got, const char* expected) {
  std::string text = std::string("expected ") + expected + ", got " + message_name(got);
  if (const auto* error = std::get_if<ErrorMsg>(&got)) text += ": " + error->message;
  fail_protocol(text);
}

}  // namespace charm
