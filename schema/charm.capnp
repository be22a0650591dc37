# The coordinator <-> worker protocol.
#
# Transport (common/wire.h): a TCP stream of frames; each frame is a 4-byte
# little-endian byte length followed by one Cap'n Proto flat (unpacked, single
# segment-table) message whose root is `Message`. One connection carries one
# conversation: the client (coordinator or `charm status`) sends `hello` first, then any
# number of requests; the worker answers each request with exactly one reply, in order.
# The one exception is `prefetchHint`: a fire-and-forget message that gets NO reply (not
# even on error), so a client reading replies stays in step by never waiting for one.
#
# Tensors travel as `Data` holding little-endian values, row-major: hidden rows as f32 (a
# row of hidden_size floats is hidden_size * 4 bytes), reply rows as int64 fixed point
# (hidden_size * 8 bytes; common/fixed_point.h). Every count and size below is checked by
# the decoder (common/wire.cpp) before use; bumping a field's meaning bumps
# kProtocolVersion.

@0xae0e9eaac317c58d;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("charm::wire");

# Client -> worker, first message of a connection.
struct Hello {
  protocolVersion @0 :UInt32;   # the client's kProtocolVersion (unitless counter)
  modelFingerprint @1 :Text;    # model_fingerprint() of the client's checkpoint, 16 hex chars
  clientName @2 :Text;          # free-form name of the client for the worker's log, <= 256 B
  clientNonce @3 :Data;         # 32 random bytes (common/cluster_auth.h); the worker's
                                # proof covers them, so a recorded proof cannot be replayed
}

# Worker -> client, answer to `hello` when the worker has a cluster shared secret: the
# client must prove it holds the secret too (common/cluster_auth.h) before anything else.
struct AuthChallenge {
  workerNonce @0 :Data;         # 32 random bytes, fresh for this connection
  workerName @1 :Text;          # the worker's name in the topology (covered by the proofs)
}

# Client -> worker, answer to `authChallenge`.
struct AuthResponse {
  proof @0 :Data;               # HMAC-SHA256(secret, client transcript), 32 bytes
}

# The experts a worker holds on one MoE layer.
struct LayerExperts {
  layer @0 :UInt32;             # decoder layer index (0-based)
  experts @1 :List(UInt32);     # routed expert ids held on this layer, ascending
  identities @2 :Data;          # protocol 3: 16 bytes per entry of `experts`, in its order:
                                # the content identity of the checkpoint bytes the worker
                                # serves for that expert (XXH3-128, canonical big-endian;
                                # common/expert_identity.h); the client compares them with
                                # its own checkpoint's
}

# Worker -> client, answer to `hello`.
struct HelloReply {
  ok @0 :Bool;                  # true when versions and fingerprints match
  error @1 :Text;               # why not ok (names both values); empty when ok
  workerName @2 :Text;          # the worker's name in the topology
  protocolVersion @3 :UInt32;   # the worker's kProtocolVersion
  modelFingerprint @4 :Text;    # model_fingerprint() of the worker's checkpoint
  held @5 :List(LayerExperts);  # experts held, one entry per MoE layer with any
  workerProof @6 :Data;         # after an authChallenge: HMAC-SHA256(secret, worker
                                # transcript), 32 bytes, so the client authenticates the
                                # worker too; empty when the worker has no secret
  lossyForm @7 :Text;           # protocol 3: empty when the worker computes with the
                                # checkpoint's values exactly; else the lossy form its
                                # experts were converted to ("int8 group_size 32"),
                                # printable, <= 256 B; `identities` then name the source
                                # experts they were converted from
}

# One (row, expert) pair of a layer's batch-union.
struct Assignment {
  row @0 :UInt32;               # index into the request's hidden rows, < numRows
  expert @1 :UInt32;            # routed expert id on the request's layer
  weight @2 :Float32;           # protocol 4: the router's combine weight; the worker adds
                                # weight * output to the row's fixed-point sum
}

# Client -> worker: run these assignments on one MoE layer.
struct LayerRequest {
  requestId @0 :UInt64;         # echoed in the response (opaque to the worker)
  layer @1 :UInt32;             # decoder layer index (0-based)
  hiddenSize @2 :UInt32;        # floats per row; > 0
  numRows @3 :UInt32;           # rows in `hidden`
  hidden @4 :Data;              # [numRows, hiddenSize] f32 LE: numRows*hiddenSize*4 bytes
  assignments @5 :List(Assignment);  # any order; at most 256 per row (the sums' headroom)
  prefetch @6 :PrefetchHint;    # protocol 5, optional: the experts of a coming layer (the
                                # next MoE layer) predicted for these rows, this worker's
                                # only. The worker starts reading them once this request's
                                # own reads are queued, while it computes; advice, as a
                                # prefetchHint message is (the same rules and limits)
}

# What a worker measured while serving one layer request.
struct LayerStats {
  expertsComputed @0 :UInt32;   # distinct experts run for the request
  rowsComputed @1 :UInt32;      # assignments computed
  computeNs @2 :UInt64;         # wall time in expert kernels, nanoseconds (I/O wait excluded)
  # The worker's expert tiers for this request (protocol 2, with the auth fields; zero
  # from a service that keeps no tiers). Each distinct expert is a hit or a miss:
  # hits + misses is expertsComputed (or both are 0).
  hits @3 :UInt32;              # distinct experts found resident in RAM (or being prefetched)
  misses @4 :UInt32;            # distinct experts this request read from disk
  bytesRead @5 :UInt64;         # bytes those reads fetched
  ioWaitNs @6 :UInt64;          # time the request blocked on reads or free slots, ns
  diskNs @7 :UInt64;            # time the I/O threads spent on those reads, ns
  prefetchHits @8 :UInt32;      # hits served by an earlier prefetch; <= hits
  saturated @9 :UInt64;         # protocol 4: output values clamped to the fixed-point
                                # range (|weight * output| >= 2^23); the client warns
  vramHits @10 :UInt32;         # hits served from the VRAM tier (computed on the GPU);
                                # <= hits (0 from a worker without one)
}

# A worker's expert-tier counters since start, for one layer or all.
struct TierCounters {
  hits @0 :UInt64;              # experts requests found resident
  misses @1 :UInt64;            # experts requests read from disk
  bytesRead @2 :UInt64;         # bytes read from disk (misses and prefetches)
  ioWaitNs @3 :UInt64;          # time requests blocked on the disk tier, ns
  diskNs @4 :UInt64;            # time the I/O threads spent in reads, ns
  prefetchIssued @5 :UInt64;    # reads started by prefetch hints
  prefetchHits @6 :UInt64;      # prefetched experts then used; <= prefetchIssued
  vramHits @7 :UInt64;          # hits served from the VRAM tier; <= hits
}

# One layer's counters.
struct LayerTierCounters {
  layer @0 :UInt32;             # decoder layer index
  counters @1 :TierCounters;
}

# Which of one layer's experts are in VRAM and RAM now, as bitmaps over expert ids: bit e
# (byte e / 8, bit e % 8, least significant first) stands for expert e; bytes past the
# last set bit may be left out. An expert in no map is read from disk when asked for.
struct LayerResidency {
  layer @0 :UInt32;             # decoder layer index
  pinned @1 :Data;              # loaded at start, never evicted
  cached @2 :Data;              # in an LRU slot now (may be evicted); disjoint from pinned
  vram @3 :Data;                # in the VRAM tier now (served from there first; an expert
                                # may be in RAM as well); empty without one
}

# Worker -> client, answer to `layerRequest`.
struct LayerResponse {
  requestId @0 :UInt64;         # the request's requestId
  outputs @1 :Data;             # protocol 4: [numRows, hiddenSize] int64 LE: per request
                                # row, the sum over its assignments of round(weight *
                                # output * 2^32) (each product one f32 multiply), or
                                # INT64_MIN when any product was NaN or Inf; the value of
                                # a row with n assignments is within +-n * (2^55 - 1).
                                # One row per position however many experts it used
                                # (docs/architecture.md, "Combining expert outputs").
                                # Empty on error
  stats @2 :LayerStats;         # zero on error
  error @3 :Text;               # non-empty when the request failed (connection stays up)
}

# Client -> worker: how are you?
struct HealthRequest {
  unused @0 :Void;
}

# Worker -> client, answer to `healthRequest`.
struct HealthReply {
  workerName @0 :Text;          # the worker's name in the topology
  state @1 :Text;               # "up" (serving); other values reserved for later tiers
  expertsHeld @2 :UInt64;       # (layer, expert) pairs held
  requestsServed @3 :UInt64;    # layer requests answered since start (all connections)
  bytesIn @4 :UInt64;           # frame bytes received since start, length prefixes included
  bytesOut @5 :UInt64;          # frame bytes sent since start, length prefixes included
  uptimeMs @6 :UInt64;          # milliseconds since the worker started serving
  protocolVersion @7 :UInt32;   # the worker's kProtocolVersion
  modelFingerprint @8 :Text;    # model_fingerprint() of the checkpoint it serves (empty
                                # from workers built before this field existed)
  tierTotal @9 :TierCounters;   # expert-tier counters summed over layers (zero from older workers)
  tierLayers @10 :List(LayerTierCounters);  # per MoE layer, ascending, each layer once
  slotBytes @11 :UInt64;        # bytes of one RAM expert slot
  slots @12 :UInt64;            # RAM expert slots, pinned + LRU, over all layers
  residency @13 :List(LayerResidency);  # per MoE layer, ascending, each layer once, as
                                # the reply was built (empty from older workers)
}

# Client -> worker, fire-and-forget (no reply): the experts the client predicts a coming
# layerRequest will use, so the worker can start reading them from disk early. A hint
# never changes any result; the worker may ignore it (unknown layer, experts it does not
# hold, ids outside the model's range, before a successful hello, or prefetch
# unsupported). With a cluster shared secret, a hint before authentication is refused
# like any other message (an `error` frame, then the connection is closed).
struct PrefetchHint {
  layer @0 :UInt32;             # decoder layer index (0-based) of the predicted request
  experts @1 :List(UInt32);     # predicted routed expert ids on that layer, this worker's only
}

# Either side: the peer's last frame could not be handled; the sender closes after it.
struct ErrorMessage {
  message @0 :Text;             # what was wrong, naming the field
}

# The root of every frame.
struct Message {
  union {
    hello @0 :Hello;
    helloReply @1 :HelloReply;
    layerRequest @2 :LayerRequest;
    layerResponse @3 :LayerResponse;
    healthRequest @4 :HealthRequest;
    healthReply @5 :HealthReply;
    error @6 :ErrorMessage;
    authChallenge @7 :AuthChallenge;
    authResponse @8 :AuthResponse;
    prefetchHint @9 :PrefetchHint;  # no reply
  }
}
