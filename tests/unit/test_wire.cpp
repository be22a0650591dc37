// common/wire.h: encode/decode round trips and every malformed-frame rejection.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <string>

#include <capnp/message.h>
#include <capnp/serialize.h>

#include "common/error.h"
#include "common/fixed_point.h"
#include "common/wire.h"
#include "common/wire_layer.h"
#include "schema/charm.capnp.h"
#include "tests/support/expect_error.h"

using namespace charm;

namespace {

FrameBody body_of(const Frame& frame) { return split_frame(frame.data(), frame.size()); }

// A frame built straight from a capnp builder, so tests can write what encoders refuse.
Frame frame_from(capnp::MessageBuilder& builder) {
  kj::Array<capnp::word> words = capnp::messageToFlatArray(builder);
  auto bytes = words.asBytes();
  Frame frame(4 + bytes.size());
  for (int i = 0; i < 4; ++i) frame[i] = uint8_t(bytes.size() >> (8 * i));
  std::memcpy(frame.data() + 4, bytes.begin(), bytes.size());
  return frame;
}

Frame raw_layer_request(uint32_t hidden_size, uint32_t num_rows, size_t hidden_bytes,
                        std::vector<std::pair<uint32_t, uint32_t>> assignments) {
  capnp::MallocMessageBuilder builder;
  auto r = builder.initRoot<wire::Message>().initLayerRequest();
  r.setRequestId(7);
  r.setLayer(3);
  r.setHiddenSize(hidden_size);
  r.setNumRows(num_rows);
  r.initHidden(hidden_bytes);
  auto list = r.initAssignments(static_cast<unsigned>(assignments.size()));
  for (unsigned i = 0; i < assignments.size(); ++i) {
    list[i].setRow(assignments[i].first);
    list[i].setExpert(assignments[i].second);
  }
  return frame_from(builder);
}

LayerRequest sample_request() {
  LayerRequest req;
  req.request_id = 0x1234567890abcdefull;
  req.layer = 5;
  req.hidden_size = 3;
  req.num_rows = 2;
  req.hidden = {1.5f, -2.25f, 3e-8f, 0.0f, -0.0f, 1e30f};
  req.assignments = {{1, 7, 0.625f}, {0, 2, -1.5e-7f}, {1, 0, 1.0f}};
  return req;
}

}  // namespace

TEST_CASE("layerRequest round trip keeps every field and every bit") {
  const LayerRequest req = sample_request();
  const Frame frame = encode_layer_request(req);
  // Length prefix is little-endian and counts the body only.
  const uint32_t length = frame[0] | frame[1] << 8 | frame[2] << 16 | uint32_t(frame[3]) << 24;
  CHECK(length == frame.size() - 4);
  const LayerRequest got = decode_as<LayerRequest>(body_of(frame));
  CHECK(got.request_id == req.request_id);
  CHECK(got.layer == req.layer);
  CHECK(got.hidden_size == req.hidden_size);
  CHECK(got.num_rows == req.num_rows);
  REQUIRE(got.hidden.size() == req.hidden.size());
  CHECK(std::memcmp(got.hidden.data(), req.hidden.data(), req.hidden.size() * 4) == 0);
  REQUIRE(got.assignments.size() == req.assignments.size());
  for (size_t i = 0; i < req.assignments.size(); ++i) {
    CHECK(got.assignments[i].row == req.assignments[i].row);
    CHECK(got.assignments[i].expert == req.assignments[i].expert);
    CHECK(got.assignments[i].weight == req.assignments[i].weight);
  }
}

TEST_CASE("layerResponse, hello, helloReply, health and error round trip") {
  LayerResponseMsg resp;
  resp.response.request_id = 99;
  resp.response.outputs = {int64_t{1} << 31, -1, kFixedNaN, -kFixedMaxTerm};
  resp.response.stats = {{}, 3, 4, 123456789012ull, 5};  // {tier counters, experts, rows, ns, saturated}
  resp.error = "";
  auto r = decode_as<LayerResponseMsg>(body_of(encode_layer_response(resp)));
  CHECK(r.response.request_id == 99);
  CHECK(r.response.outputs == resp.response.outputs);
  CHECK(r.response.stats.experts_computed == 3);
  CHECK(r.response.stats.rows_computed == 4);
  CHECK(r.response.stats.compute_ns == 123456789012ull);
  CHECK(r.response.stats.saturated == 5);
  CHECK(r.error.empty());

  resp.error = "expert 9 not held";
  resp.response.outputs.clear();
  CHECK(decode_as<LayerResponseMsg>(body_of(encode_layer_response(resp))).error == resp.error);

  HelloMsg hello{kProtocolVersion, "00112233aabbccdd", "coordinator", std::string(kAuthNonceBytes, 7)};
  auto h = decode_as<HelloMsg>(body_of(encode_hello(hello)));
  CHECK(h.protocol_version == kProtocolVersion);
  CHECK(h.model_fingerprint == "00112233aabbccdd");
  CHECK(h.client_name == "coordinator");
  CHECK(h.client_nonce == hello.client_nonce);

  HelloReplyMsg reply;
  reply.ok = true;
  reply.worker_name = "w1";
  reply.model_fingerprint = "ff";
  reply.held = {{0, {1, 2, 3}}, {2, {}}, {5, {15}}};
  reply.identities = {{{0, 1}, {1, 2}}, {{0, 2}, {0xfedcba9876543210ull, 3}}, {{0, 3}, {4, 0x0123456789abcdefull}},
                      {{5, 15}, {~0ull, ~0ull}}};
  reply.lossy_form = "int8 group_size 32";
  auto hr = decode_as<HelloReplyMsg>(body_of(encode_hello_reply(reply)));
  CHECK(hr.ok);
  CHECK(hr.worker_name == "w1");
  CHECK(hr.protocol_version == kProtocolVersion);
  CHECK(hr.held == reply.held);
  CHECK(hr.identities == reply.identities);
  CHECK(hr.lossy_form == "int8 group_size 32");

  CHECK(std::holds_alternative<HealthRequestMsg>(decode_message(body_of(encode_health_request()))));

  HealthReplyMsg health{"w2", "up", 48, 1000, 1u << 20, 1u << 21, 5000, kProtocolVersion,
                        "0123456789abcdef"};
  auto hh = decode_as<HealthReplyMsg>(body_of(encode_health_reply(health)));
  CHECK(hh.worker_name == "w2");
  CHECK(hh.state == "up");
  CHECK(hh.experts_held == 48);
  CHECK(hh.requests_served == 1000);
  CHECK(hh.bytes_in == (1u << 20));
  CHECK(hh.bytes_out == (1u << 21));
  CHECK(hh.uptime_ms == 5000);
  CHECK(hh.protocol_version == kProtocolVersion);
  CHECK(hh.model_fingerprint == "0123456789abcdef");

  CHECK(decode_as<ErrorMsg>(body_of(encode_error("bad frame"))).message == "bad frame");
}

TEST_CASE("encode_layer_request refuses hidden that does not match num_rows * hidden_size") {
  LayerRequest req = sample_request();
  req.hidden.pop_back();
  CHECK_THROWS_AS(encode_layer_request(req), Error);
}

TEST_CASE("truncated frames are rejected") {
  const Frame frame = encode_health_request();
  test::expect_error([&] { split_frame(frame.data(), 3); }, ErrorCategory::kProtocol, {"truncated"});
  test::expect_error([&] { split_frame(frame.data(), frame.size() - 8); }, ErrorCategory::kProtocol, {"truncated"});
  Frame longer = frame;
  longer.push_back(0);
  test::expect_error([&] { split_frame(longer.data(), longer.size()); }, ErrorCategory::kProtocol, {"trailing"});
}

TEST_CASE("a length over the cap is rejected before anything is read") {
  const Frame frame = encode_layer_request(sample_request());
  test::expect_error([&] { split_frame(frame.data(), frame.size(), 64); }, ErrorCategory::kProtocol, {"exceeds the cap"});
  const uint8_t huge[4] = {0xf8, 0xff, 0xff, 0xff};
  test::expect_error([&] { split_frame(huge, 4); }, ErrorCategory::kProtocol, {"exceeds the cap"});
  // decode_message checks the cap too (bodies that came from elsewhere).
  test::expect_error([&] { decode_message(body_of(frame), 64); }, ErrorCategory::kProtocol, {"exceeds the cap"});
}

TEST_CASE("a length that is not whole Cap'n Proto words is rejected") {
  const uint8_t odd[4 + 12] = {12, 0, 0, 0};
  test::expect_error([&] { split_frame(odd, sizeof odd); }, ErrorCategory::kProtocol, {"8-byte"});
}

TEST_CASE("garbage bytes are rejected as a malformed message") {
  // Segment table claiming 2^31 segments.
  FrameBody body;
  body.words = {0xffffffff7fffffffull, 0x0123456789abcdefull};
  body.bytes = 16;
  test::expect_error([&] { decode_message(body); }, ErrorCategory::kProtocol, {"malformed Cap'n Proto message"});
  // One segment whose root pointer points far outside it.
  body.words = {0x0000000200000000ull, 0x7ffffff0fffffffcull, 0};
  body.bytes = 24;
  test::expect_error([&] { decode_message(body); }, ErrorCategory::kProtocol, {"malformed Cap'n Proto message"});
  // An empty body.
  FrameBody empty;
  test::expect_error([&] { decode_message(empty); }, ErrorCategory::kProtocol, {"malformed Cap'n Proto message"});
}

TEST_CASE("trailing words after a valid message are rejected") {
  FrameBody body = body_of(encode_health_request());
  body.words.push_back(0);
  body.bytes += 8;
  test::expect_error([&] { decode_message(body); }, ErrorCategory::kProtocol, {"trailing"});
}

TEST_CASE("the wrong union member is rejected by decode_as, naming both") {
  const FrameBody hello = body_of(encode_hello(HelloMsg{kProtocolVersion, "ab", "c", ""}));
  test::expect_error([&] { decode_as<LayerRequest>(hello); }, ErrorCategory::kProtocol, {"expected layerRequest, got hello"});
  const FrameBody error = body_of(encode_error("worker exploded"));
  test::expect_error([&] { decode_as<HelloReplyMsg>(error); }, ErrorCategory::kProtocol, {"worker exploded"});
}

TEST_CASE("an unknown union member (a newer peer) is rejected") {
  FrameBody body = body_of(encode_health_request());
  // Flat layout: word 0 segment table, word 1 root pointer, word 2 the root struct's data
  // section, whose low 16 bits are the union discriminant.
  REQUIRE(body.words.size() >= 3);
  body.words[2] = (body.words[2] & ~0xffffull) | 77;
  test::expect_error([&] { decode_message(body); }, ErrorCategory::kProtocol, {"union member 77"});
}

TEST_CASE("layerRequest: hidden payload must be numRows * hiddenSize f32") {
  test::expect_error([&] { decode_message(body_of(raw_layer_request(4, 2, 28, {}))); }, ErrorCategory::kProtocol, {"layerRequest.hidden is 28 bytes but numRows (2) * hiddenSize (4)"});
  test::expect_error([&] { decode_message(body_of(raw_layer_request(4, 2, 33, {}))); }, ErrorCategory::kProtocol, {"layerRequest.hidden is 33 bytes, not a multiple of 4"});
}

TEST_CASE("layerRequest: assignment row out of range") {
  test::expect_error(
      [&] { decode_message(body_of(raw_layer_request(4, 2, 32, {{0, 1}, {2, 0}}))); }, ErrorCategory::kProtocol, {"layerRequest.assignments[1].row = 2 is out of range (numRows = 2)"});
}

TEST_CASE("layerRequest: zero and oversized hiddenSize") {
  test::expect_error([&] { decode_message(body_of(raw_layer_request(0, 0, 0, {}))); }, ErrorCategory::kProtocol, {"layerRequest.hiddenSize is 0"});
  test::expect_error(
      [&] { decode_message(body_of(raw_layer_request(kMaxWireHiddenSize + 1, 0, 0, {}))); }, ErrorCategory::kProtocol, {"layerRequest.hiddenSize"});
}

TEST_CASE("layerResponse: outputs must be whole int64 values (a truncated row)") {
  for (unsigned bytes : {4u, 10u, 8u * 8 - 4}) {
    capnp::MallocMessageBuilder builder;
    builder.initRoot<wire::Message>().initLayerResponse().initOutputs(bytes);
    const Frame frame = frame_from(builder);
    const std::string why = "layerResponse.outputs is " + std::to_string(bytes) + " bytes, not a multiple of 8";
    test::expect_error([&] { decode_message(body_of(frame)); }, ErrorCategory::kProtocol, {why});
    test::expect_error([&] { decode_layer_response_view(body_of(frame)); }, ErrorCategory::kProtocol, {why});
  }
}

TEST_CASE("a layerResponse's size depends on its rows, not on the experts each row used") {
  // One row per position: the worker's executor and the wire agree whatever the experts.
  const uint32_t hidden = 64;
  std::vector<size_t> sizes;
  for (uint32_t experts : {1u, 2u, 8u, 64u}) {
    LayerRequest req;
    req.hidden_size = hidden;
    req.num_rows = 3;
    req.hidden.assign(3 * hidden, 0.5f);
    for (uint32_t r = 0; r < 3; ++r) {
      for (uint32_t e = 0; e < experts; ++e) req.assignments.push_back({r, e, 0.25f});
    }
    LayerResponseMsg m;
    m.response.outputs.assign(size_t{req.num_rows} * hidden, 0);
    m.response.stats.rows_computed = static_cast<uint32_t>(req.assignments.size());
    sizes.push_back(encode_layer_response(m).size());
    CHECK(LayerResponseFrame(1, req.num_rows, hidden).finish(m.response.stats).size() == sizes.back());
  }
  CHECK(std::adjacent_find(sizes.begin(), sizes.end(), std::not_equal_to<>()) == sizes.end());
  CHECK(sizes[0] >= 3 * hidden * 8);
  CHECK(sizes[0] - 3 * hidden * 8 < 160);  // framing: prefix, envelope, stats
}

TEST_CASE("an amplification attack (2^28 zero-size assignments in 0 bytes) hits the traversal limit") {
  capnp::MallocMessageBuilder builder;
  auto req = builder.initRoot<wire::Message>().initLayerRequest();
  req.setHiddenSize(1);
  req.initAssignments(0);
  FrameBody body = body_of(frame_from(builder));
  // Find the assignments list pointer (list, composite element size 7, 0 words) and make
  // its tag claim 2^28 elements of zero data and pointer words: in bounds, no bytes.
  bool patched = false;
  for (size_t p = 1; p < body.words.size() && !patched; ++p) {
    const uint64_t w = body.words[p];
    if ((w & 3) != 1 || ((w >> 32) & 7) != 7 || (w >> 35) != 0) continue;
    const int32_t offset = static_cast<int32_t>(static_cast<uint32_t>(w)) >> 2;
    const size_t tag = p + 1 + offset;
    REQUIRE(tag < body.words.size());
    body.words[tag] = uint64_t{1} << 30;  // struct tag: count 2^28 in the offset field
    patched = true;
  }
  REQUIRE(patched);
  test::expect_error([&] { decode_message(body); }, ErrorCategory::kProtocol, {"malformed Cap'n Proto message"});
}

TEST_CASE("prefetchHint round-trips; an empty list is allowed") {
  const auto hint = decode_as<PrefetchHintMsg>(body_of(encode_prefetch_hint(PrefetchHintMsg{5, {1, 9, 63}})));
  CHECK(hint.layer == 5);
  CHECK(hint.experts == std::vector<uint32_t>{1, 9, 63});
  const WireMessage empty = decode_message(body_of(encode_prefetch_hint(PrefetchHintMsg{0, {}})));
  CHECK(std::string(message_name(empty)) == "prefetchHint");
  CHECK(std::get<PrefetchHintMsg>(empty).experts.empty());
}

TEST_CASE("prefetchHint: more than kMaxHintExperts experts is refused by the encoder and the decoder") {
  PrefetchHintMsg big{1, std::vector<uint32_t>(kMaxHintExperts + 1, 3)};
  CHECK_THROWS_AS(encode_prefetch_hint(big), Error);
  capnp::MallocMessageBuilder builder;
  auto r = builder.initRoot<wire::Message>().initPrefetchHint();
  r.setLayer(1);
  r.initExperts(kMaxHintExperts + 1);
  test::expect_error([&] { decode_message(body_of(frame_from(builder))); }, ErrorCategory::kProtocol, {"prefetchHint.experts"});
}

TEST_CASE("layerRequest.prefetch (protocol 5): carried, read in place alike, absent by default, capped") {
  LayerRequest req{7, 2, 3, 1, {1, 2, 3}, {{0, 5}}, std::nullopt};
  CHECK_FALSE(decode_as<LayerRequest>(body_of(encode_layer_request(req))).prefetch.has_value());
  CHECK_FALSE(decode_layer_request_view(body_of(encode_layer_request(req))).prefetch.has_value());
  req.prefetch = PrefetchHintMsg{3, {0, 4, 15}};
  const Frame frame = encode_layer_request(req);
  const LayerRequest got = decode_as<LayerRequest>(body_of(frame));
  REQUIRE(got.prefetch.has_value());
  CHECK(got.prefetch->layer == 3);
  CHECK(got.prefetch->experts == std::vector<uint32_t>{0, 4, 15});
  const LayerRequestView view = decode_layer_request_view(body_of(frame));
  REQUIRE(view.prefetch.has_value());
  CHECK(view.prefetch->experts == got.prefetch->experts);
  // The gathering encoder carries it the same way, byte for byte.
  const std::vector<float> all = {9, 9, 9, 1, 2, 3};
  const std::vector<uint32_t> rows = {1};
  CHECK(encode_layer_request_rows({7, 2, 3, &*req.prefetch}, all.data(), rows, req.assignments) == frame);
  // An empty prefetch list is still a prefetch (for no experts).
  req.prefetch = PrefetchHintMsg{3, {}};
  CHECK(decode_as<LayerRequest>(body_of(encode_layer_request(req))).prefetch->experts.empty());

  req.prefetch = PrefetchHintMsg{1, std::vector<uint32_t>(kMaxHintExperts + 1, 3)};
  CHECK_THROWS_AS(encode_layer_request(req), Error);
  capnp::MallocMessageBuilder builder;
  auto r = builder.initRoot<wire::Message>().initLayerRequest();
  r.setHiddenSize(1);
  r.initPrefetch().initExperts(kMaxHintExperts + 1);
  const FrameBody big = body_of(frame_from(builder));
  test::expect_error([&] { decode_message(big); }, ErrorCategory::kProtocol, {"layerRequest.prefetch.experts", "over the cap"});
  test::expect_error([&] { decode_layer_request_view(big); }, ErrorCategory::kProtocol, {"layerRequest.prefetch.experts"});
}

TEST_CASE("prefetchHint: a truncated experts list is a malformed message") {
  Frame frame = encode_prefetch_hint(PrefetchHintMsg{2, {1, 2, 3, 4, 5, 6}});
  // Claim one more segment word than the frame carries: the list pointer runs out of bounds.
  FrameBody body = body_of(frame);
  body.words.pop_back();
  body.bytes -= 8;
  test::expect_error([&] { decode_message(body); }, ErrorCategory::kProtocol, {"malformed"});
}

TEST_CASE("tier stats round trip in layerResponse and healthReply") {
  LayerResponseMsg resp;
  resp.response.request_id = 5;
  resp.response.stats.experts_computed = 5;
  resp.response.stats.rows_computed = 9;
  resp.response.stats.hits = 3;
  resp.response.stats.misses = 2;
  resp.response.stats.bytes_read = 24576;
  resp.response.stats.io_wait_ns = 777;
  resp.response.stats.disk_ns = 888;
  resp.response.stats.prefetch_hits = 1;
  resp.response.stats.vram_hits = 2;
  const LayerStats s = decode_as<LayerResponseMsg>(body_of(encode_layer_response(resp))).response.stats;
  CHECK(s.hits == 3);
  CHECK(s.misses == 2);
  CHECK(s.bytes_read == 24576);
  CHECK(s.io_wait_ns == 777);
  CHECK(s.disk_ns == 888);
  CHECK(s.prefetch_hits == 1);
  CHECK(s.vram_hits == 2);

  HealthReplyMsg health;
  health.worker_name = "w";
  health.tier = {10, 4, 1 << 20, 5, 6, 3, 2, 7};
  health.tier_layers = {{0, {6, 1, 4096, 1, 2, 1, 1, 5}}, {7, {4, 3, 8192, 4, 4, 2, 1, 2}}};
  health.slot_bytes = 12288;
  health.slots = 6;
  const auto h = decode_as<HealthReplyMsg>(body_of(encode_health_reply(health)));
  CHECK(h.tier == health.tier);
  CHECK(h.tier_layers == health.tier_layers);
  CHECK(h.slot_bytes == 12288);
  CHECK(h.slots == 6);
}

TEST_CASE("healthReply residency: bitmaps round trip; misordered layers and overlaps are refused") {
  HealthReplyMsg health;
  health.worker_name = "w";
  // VRAM experts may be in RAM too (pinned or cached).
  health.residency = {{0, {{0, 7, 8}, {3, 200}, {7, 9, 200}}}, {5, {{}, {1}, {}}}, {9, {{}, {}, {4}}}};
  const auto h = decode_as<HealthReplyMsg>(body_of(encode_health_reply(health)));
  CHECK(h.residency == health.residency);

  auto frame = [](std::vector<uint32_t> layers, std::vector<uint8_t> pinned, std::vector<uint8_t> cached) {
    capnp::MallocMessageBuilder builder;
    auto list = builder.initRoot<wire::Message>().initHealthReply().initResidency(static_cast<unsigned>(layers.size()));
    for (unsigned i = 0; i < layers.size(); ++i) {
      list[i].setLayer(layers[i]);
      list[i].setPinned(capnp::Data::Reader(pinned.data(), pinned.size()));
      list[i].setCached(capnp::Data::Reader(cached.data(), cached.size()));
    }
    return body_of(frame_from(builder));
  };
  CHECK(decode_as<HealthReplyMsg>(frame({2}, {0x01}, {0x02, 0x80})).residency.at(2) == LayerResidency{{0}, {1, 15}, {}});
  test::expect_error([&] { decode_message(frame({3, 3}, {}, {})); }, ErrorCategory::kProtocol,
                     {"healthReply.residency[1].layer 3 is not above the previous layer"});
  test::expect_error([&] { decode_message(frame({1}, {0x05}, {0x04})); }, ErrorCategory::kProtocol,
                     {"healthReply.residency[0]: expert 2 is both pinned and cached"});
}

TEST_CASE("a reply from a worker without tier stats decodes with zeros") {
  capnp::MallocMessageBuilder builder;
  auto r = builder.initRoot<wire::Message>().initLayerResponse();
  r.initStats().setExpertsComputed(4);
  const auto s = decode_as<LayerResponseMsg>(body_of(frame_from(builder))).response.stats;
  CHECK(s.hits == 0);
  CHECK(s.misses == 0);
}

TEST_CASE("layerResponse: hits + misses must be expertsComputed; prefetchHits <= hits") {
  auto frame = [](uint32_t computed, uint32_t hits, uint32_t misses, uint32_t prefetch_hits) {
    capnp::MallocMessageBuilder builder;
    auto st = builder.initRoot<wire::Message>().initLayerResponse().initStats();
    st.setExpertsComputed(computed);
    st.setHits(hits);
    st.setMisses(misses);
    st.setPrefetchHits(prefetch_hits);
    return frame_from(builder);
  };
  test::expect_error([&] { decode_message(body_of(frame(4, 3, 2, 0))); }, ErrorCategory::kProtocol, {"hits (3) + misses (2) must equal expertsComputed (4)"});
  test::expect_error([&] { decode_message(body_of(frame(1, 0xffffffffu, 2, 0))); }, ErrorCategory::kProtocol, {"expertsComputed"});
  test::expect_error([&] { decode_message(body_of(frame(4, 2, 2, 3))); }, ErrorCategory::kProtocol, {"prefetchHits 3 exceeds hits 2"});
  capnp::MallocMessageBuilder builder;
  auto st = builder.initRoot<wire::Message>().initLayerResponse().initStats();
  st.setExpertsComputed(2);
  st.setHits(1);
  st.setMisses(1);
  st.setVramHits(2);
  test::expect_error([&] { decode_message(body_of(frame_from(builder))); }, ErrorCategory::kProtocol,
                     {"layerResponse.stats.vramHits 2 exceeds hits 1"});
}

TEST_CASE("healthReply: tier layers ascending and once each; prefetchHits <= prefetchIssued") {
  {
    capnp::MallocMessageBuilder builder;
    auto layers = builder.initRoot<wire::Message>().initHealthReply().initTierLayers(2);
    layers[0].setLayer(3);
    layers[1].setLayer(3);
    test::expect_error([&] { decode_message(body_of(frame_from(builder))); }, ErrorCategory::kProtocol, {"healthReply.tierLayers[1].layer 3"});
  }
  {
    capnp::MallocMessageBuilder builder;
    auto t = builder.initRoot<wire::Message>().initHealthReply().initTierTotal();
    t.setPrefetchIssued(1);
    t.setPrefetchHits(2);
    test::expect_error([&] { decode_message(body_of(frame_from(builder))); }, ErrorCategory::kProtocol, {"healthReply.tierTotal.prefetchHits 2 exceeds prefetchIssued 1"});
  }
  {
    capnp::MallocMessageBuilder builder;
    auto layers = builder.initRoot<wire::Message>().initHealthReply().initTierLayers(1);
    layers[0].initCounters().setPrefetchHits(1);
    test::expect_error([&] { decode_message(body_of(frame_from(builder))); }, ErrorCategory::kProtocol, {"tierLayers[0].prefetchHits"});
  }
  {
    capnp::MallocMessageBuilder builder;
    auto t = builder.initRoot<wire::Message>().initHealthReply().initTierTotal();
    t.setHits(1);
    t.setVramHits(3);
    test::expect_error([&] { decode_message(body_of(frame_from(builder))); }, ErrorCategory::kProtocol,
                       {"healthReply.tierTotal.vramHits 3 exceeds hits 1"});
  }
}

TEST_CASE("helloReply: every held expert needs a 16-byte identity; lossyForm is a printable name") {
  HelloReplyMsg reply;
  reply.held = {{2, {4, 7}}};
  reply.identities = {{{2, 4}, {1, 2}}};
  test::expect_error([&] { encode_hello_reply(reply); }, ErrorCategory::kInvalidInput,
                     {"no content identity for layer 2 expert 7"});
  reply.identities[{2, 7}] = {3, 4};
  CHECK(decode_as<HelloReplyMsg>(body_of(encode_hello_reply(reply))).identities == reply.identities);
  // A peer whose identities do not cover its list: 16 bytes for two experts.
  capnp::MallocMessageBuilder builder;
  auto r = builder.initRoot<wire::Message>().initHelloReply();
  auto held = r.initHeld(1);
  held[0].setLayer(2);
  auto list = held[0].initExperts(2);
  list.set(0, 4);
  list.set(1, 7);
  held[0].initIdentities(16);
  test::expect_error([&] { decode_message(body_of(frame_from(builder))); }, ErrorCategory::kProtocol, {"helloReply.held[0].identities is 16 bytes, expected 16 per expert (2 experts)"});
  HelloReplyMsg short_reply = reply;
  short_reply.lossy_form = std::string("int8\x01");
  test::expect_error([&] { decode_message(body_of(encode_hello_reply(short_reply))); }, ErrorCategory::kProtocol, {"helloReply.lossyForm holds a byte that is not printable ASCII"});
  short_reply.lossy_form = std::string(kMaxWireNameBytes + 1, 'q');
  test::expect_error([&] { decode_message(body_of(encode_hello_reply(short_reply))); }, ErrorCategory::kProtocol, {"helloReply.lossyForm is 257 bytes, over the cap of 256"});
}

// --- the caps a client reads a stranger's replies with (issue 12, item 6) --------------

namespace {

// The largest helloReply a worker of this shape sends: every expert held, texts at caps.
HelloReplyMsg largest_hello_reply(uint32_t layers, uint32_t experts) {
  HelloReplyMsg reply;
  reply.error = std::string(kMaxWireTextBytes, 'e');
  reply.worker_name = std::string(kMaxWireNameBytes, 'w');
  reply.model_fingerprint = std::string(kMaxWireFingerprintBytes, 'f');
  reply.worker_proof = std::string(kAuthProofBytes, 'p');
  reply.lossy_form = std::string(kMaxWireNameBytes, 'l');
  for (uint32_t l = 0; l < layers; ++l) {
    for (uint32_t e = 0; e < experts; ++e) {
      reply.held[l].push_back(e);
      reply.identities[{l, e}] = ContentHash{l, e};
    }
  }
  return reply;
}

}  // namespace

TEST_CASE("max_hello_reply_bytes: the largest legitimate helloReply fits, and the bound is its size") {
  // DeepSeek-V3 (58 MoE layers x 256 experts) needs more than the 64 KiB handshake cap.
  const struct { uint32_t layers, experts; } shapes[] = {{1, 1}, {2, 4}, {16, 64}, {48, 128}, {58, 256}, {61, 384}};
  for (const auto& shape : shapes) {
    CAPTURE(shape.layers);
    CAPTURE(shape.experts);
    const Frame frame = encode_hello_reply(largest_hello_reply(shape.layers, shape.experts));
    const uint64_t body = frame.size() - 4;
    const uint64_t bound = max_hello_reply_bytes(shape.layers, shape.experts);
    MESSAGE(shape.layers << " x " << shape.experts << ": largest helloReply " << body << " bytes, cap " << bound);
    CHECK(body <= bound);
    CHECK(bound - body <= 1024);  // the slack for segment tables and far pointers only
    const WireMessage decoded = decode_message(split_frame(frame.data(), frame.size(), bound), bound);
    REQUIRE(std::holds_alternative<HelloReplyMsg>(decoded));
    CHECK(std::get<HelloReplyMsg>(decoded).identities.size() == uint64_t{shape.layers} * shape.experts);
  }
  CHECK(max_hello_reply_bytes(58, 256) > kHandshakeMaxFrameBytes);
  // Every other frame a worker may answer hello with fits too.
  CHECK(encode_error(std::string(kMaxWireTextBytes, 'x')).size() - 4 <= max_hello_reply_bytes(0, 0));
  CHECK(encode_auth_challenge({std::string(kAuthNonceBytes, 'n'), std::string(kMaxWireNameBytes, 'w')}).size() - 4 <=
        max_hello_reply_bytes(0, 0));
}

TEST_CASE("max_health_reply_bytes: the largest legitimate healthReply or error fits") {
  for (uint32_t layers : {0u, 1u, 3u, 58u, 200u}) {
    CAPTURE(layers);
    HealthReplyMsg h;
    h.worker_name = std::string(kMaxWireNameBytes, 'w');
    h.state = std::string(kMaxWireNameBytes, 's');
    h.model_fingerprint = std::string(kMaxWireFingerprintBytes, 'f');
    h.experts_held = h.requests_served = h.bytes_in = h.bytes_out = h.uptime_ms = h.slot_bytes = h.slots = ~0ull;
    for (uint32_t l = 0; l < layers; ++l) h.tier_layers[l] = TierCounters{1, 2, 3, 4, 5, 6, 6, 1};
    // Every expert of every layer pinned or cached and in VRAM, the largest id last (the
    // longest bitmaps).
    constexpr uint32_t kExperts = 256;
    for (uint32_t l = 0; l < layers; ++l) {
      for (uint32_t e = 0; e < kExperts; ++e) (e % 2 ? h.residency[l].cached : h.residency[l].pinned).push_back(e);
      for (uint32_t e = 0; e < kExperts; ++e) h.residency[l].vram.push_back(e);
    }
    const uint64_t bound = max_health_reply_bytes(layers, kExperts);
    CHECK(encode_health_reply(h).size() - 4 <= bound);
    CHECK(encode_error(std::string(kMaxWireTextBytes, 'x')).size() - 4 <= bound);
  }
}

TEST_CASE("frame_length: the one length check, naming the peer and the cap") {
  const uint8_t gib[4] = {0, 0, 0, 0x40};
  test::expect_error([&] { frame_length(gib, 4096, "worker 'a'"); }, ErrorCategory::kProtocol, {"frame length 1073741824 bytes from worker 'a' exceeds the cap of 4096 bytes"});
  const uint8_t odd[4] = {12, 0, 0, 0};
  test::expect_error([&] { frame_length(odd, 4096); }, ErrorCategory::kProtocol, {"frame length 12 bytes is not a whole number of 8-byte"});
  const uint8_t ok[4] = {0, 16, 0, 0};
  CHECK(frame_length(ok, 4096) == 4096);
}

TEST_CASE("layerRequest and layerResponse read in place: the same values, the same frames, the same errors") {
  LayerRequest req{7, 2, 3, 2, {1, 2, 3, 4, 5, 6}, {{0, 5}, {1, 9}, {0, 9}}, std::nullopt};
  const Frame frame = encode_layer_request(req);
  // Gathering rows straight into the frame gives the owning encoder's bytes.
  const std::vector<float> all = {9, 9, 9, 1, 2, 3, 4, 5, 6};
  const std::vector<uint32_t> rows = {1, 2};
  CHECK(encode_layer_request_rows({7, 2, 3}, all.data(), rows, req.assignments) == frame);

  CHECK(is_layer_request(body_of(frame)));
  CHECK_FALSE(is_layer_request(body_of(encode_health_request())));
  const LayerRequestView view = decode_layer_request_view(body_of(frame));
  const auto* begin = reinterpret_cast<const uint8_t*>(view.body.words.data());
  const auto* at = reinterpret_cast<const uint8_t*>(view.hidden.data());
  CHECK((at > begin && at + view.hidden.size_bytes() <= begin + view.body.bytes));  // in the frame, not a copy
  CHECK(std::vector<float>(view.hidden.begin(), view.hidden.end()) == req.hidden);
  CHECK(view.request_id == 7);
  CHECK(view.layer == 2);
  CHECK(view.num_rows == 2);
  REQUIRE(view.assignments.size() == 3);
  CHECK(view.assignments[2].expert == 9);
  check_layer_request(view, ModelLimits{4, 16, 3, {2}});
  test::expect_error([&] { check_layer_request(view, ModelLimits{4, 8, 3, {2}}); }, ErrorCategory::kProtocol, {"assignments[1].expert = 9"});
  test::expect_error([&] { decode_layer_request_view(body_of(encode_health_request())); }, ErrorCategory::kProtocol, {"expected layerRequest"});
  {  // rows that do not match the payload: decode_message's error
    capnp::MallocMessageBuilder builder;
    auto r = builder.initRoot<wire::Message>().initLayerRequest();
    r.setHiddenSize(4);
    r.setNumRows(2);
    r.initHidden(28);
    const auto words = capnp::messageToFlatArray(builder);
    FrameBody b;
    b.words.assign(reinterpret_cast<const uint64_t*>(words.begin()), reinterpret_cast<const uint64_t*>(words.end()));
    b.bytes = b.words.size() * 8;
    for (const auto& decode : {std::function<void()>([&] { decode_layer_request_view(b); }),
                               std::function<void()>([&] { decode_message(b); })}) {
      test::expect_error(decode, ErrorCategory::kProtocol, {"layerRequest.hidden is 28 bytes but numRows (2) * hiddenSize (4)"});
    }
  }

  // A reply built in place is the owning encoder's frame and reads back in place.
  LayerStats stats;
  stats.experts_computed = 2;
  stats.rows_computed = 3;
  stats.hits = 1;
  stats.misses = 1;
  LayerResponseFrame built(7, 3, 3);
  for (int i = 0; i < 9; ++i) built.outputs()[i] = (int64_t{i} - 4) << 30;
  const Frame reply = built.finish(stats);
  LayerResponseMsg owned;
  owned.response.request_id = 7;
  for (int i = 0; i < 9; ++i) owned.response.outputs.push_back((int64_t{i} - 4) << 30);
  owned.response.stats = stats;
  CHECK(encode_layer_response(owned) == reply);
  const LayerResponseView got = decode_layer_response_view(body_of(reply));
  CHECK(got.request_id == 7);
  CHECK(std::vector<int64_t>(got.outputs.begin(), got.outputs.end()) == owned.response.outputs);
  CHECK(got.stats.hits == 1);
  CHECK(got.error.empty());
  test::expect_error([&] { decode_layer_response_view(body_of(encode_error("worker says no"))); }, ErrorCategory::kProtocol, {"worker says no"});
}
