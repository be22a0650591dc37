// Content identity of the routed experts across the handshake (issue 12, item 4): a
// worker, a container or the in-process store whose expert bytes differ from the
// coordinator's checkpoint is caught at the handshake or when the bytes are read, naming
// the worker, layer, expert and both hashes; a lossy container of the same weights is
// accepted as the lossy option it is. Every case starts from a copy of
// tests/fixtures/models/qwen3-moe-tiny with the bytes of one expert changed.
#include <doctest/doctest.h>

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "app/status_report.h"
#include "common/checkpoint.h"
#include "common/error.h"
#include "common/fingerprint.h"
#include "common/model_config.h"
#include "common/topology.h"
#include "common/wire.h"
#include "coordinator/dispatch/dispatcher_factory.h"
#include "coordinator/models/checkpoint_families.h"
#include "tests/support/checkpoint_copy.h"
#include "tests/support/expect_error.h"
#include "tests/support/safetensors_writer.h"
#include "tests/support/temp_dir.h"
#include "worker/experts/expert_container.h"
#include "worker/experts/expert_convert.h"
#include "worker/experts/expert_executor.h"
#include "worker/experts/expert_manifest.h"
#include "worker/experts/store_factory.h"
#include "worker/rpc_server.h"
#include "worker/worker_main.h"

using namespace charm;
using namespace charm::testing;
using namespace std::chrono_literals;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// The expert whose bytes the tests change: on an MoE layer (0, 2, 3 are), owned by "a".
constexpr uint32_t kLayer = 2;
constexpr uint32_t kExpert = 4;

std::string slurp(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

/// An open checkpoint with its parsed config.
struct Model {
  std::unique_ptr<Checkpoint> checkpoint;
  ModelConfig config;
  std::string fingerprint;
  explicit Model(const fs::path& dir) {
    checkpoint = Checkpoint::open(dir);
    config = ModelConfig::parse(checkpoint->config_json(), (dir / "config.json").string(), checkpoint_families());
    fingerprint = model_fingerprint(*checkpoint);
  }
  std::vector<ExpertKey> all() const {
    std::vector<ExpertKey> keys;
    for (int64_t l : config.moe_layer_ids()) {
      for (int64_t e = 0; e < config.num_experts; ++e) keys.emplace_back(l, e);
    }
    return keys;
  }
  void convert(const fs::path& out, const std::string& quant = "none") const {
    ConvertOptions o;
    o.out = out;
    o.quant = quant;
    o.progress = false;
    convert_experts(*checkpoint, config, all(), o);
  }
  /// The content identity of (layer, expert) as this checkpoint holds it now.
  std::string hash(uint32_t layer, uint32_t expert) const {
    return hash_expert_identities(*checkpoint, config.expert_tensors, {{layer, expert}},
                                  config.hidden_size, config.moe_intermediate_size)
        .at({layer, expert})
        .hex();
  }
};

/// Workers "a" (even experts) and "b" (odd experts) of every MoE layer.
Topology two_workers(const fs::path& model) {
  Topology t;
  t.model = model;
  t.workers = {WorkerSpec{"a", "127.0.0.1", 0, {0, 2, 4, 6, 8, 10, 12, 14}, {}, {}},
               WorkerSpec{"b", "127.0.0.1", 0, {1, 3, 5, 7, 9, 11, 13, 15}, {}, {}}};
  t.connect_timeout_ms = 5000;
  t.startup_timeout_ms = 5000;
  t.request_timeout_ms = 30000;
  t.heartbeat_ms = 0;
  t.rejoin_min_ms = 60000;  // no background rejoin during a test
  t.api_host = "127.0.0.1";
  t.api_port = FrameListener::listen("127.0.0.1", 0)->port();  // nothing listens there
  return t;
}

/// One in-process worker serving its share of `topology` from the checkpoint at `dir`, as
/// `charm worker` does (open_store with `store`'s tier settings).
struct Worker {
  Model model;
  std::unique_ptr<ExpertStore> store;
  std::unique_ptr<ExpertExecutor> executor;
  std::unique_ptr<ExecutorService> service;
  std::unique_ptr<WorkerServer> server;

  Worker(const fs::path& dir, Topology& topology, int index, const StoreSpec& spec = {}) : model(dir) {
    WorkerSpec& me = topology.workers[static_cast<size_t>(index)];
    store = open_store(spec, *model.checkpoint, model.config, owned_experts(topology, model.config, index), me.name,
                       model.fingerprint);
    executor = std::make_unique<ExpertExecutor>(*store);
    service = std::make_unique<ExecutorService>(*executor);
    WorkerServerOptions options;
    options.worker_name = me.name;
    options.model_fingerprint = model.fingerprint;
    server = std::make_unique<WorkerServer>(options, *service);
    server->start();
    me.port = server->port();
  }

  /// A raw hello: the helloReply the worker sends a coordinator.
  HelloReplyMsg hello() const {
    auto conn = FrameConnection::connect("127.0.0.1", server->port(), 5s, "test");
    conn->send(encode_hello(HelloMsg{kProtocolVersion, model.fingerprint, "test", ""}), 5s);
    return decode_as<HelloReplyMsg>(conn->receive(5s));
  }
};

/// The coordinator's side: make_dispatcher over the checkpoint, as `charm serve` does.
std::unique_ptr<ExpertDispatcher> coordinator(const Topology& topology, const Model& model, LocalExperts& local) {
  return make_dispatcher(topology, *model.checkpoint, model.config, local);
}

}  // namespace

TEST_CASE("a worker whose expert bytes differ from the coordinator's is refused, naming worker, layer, expert and hashes") {
  CheckpointCopy changed;
  change_expert_bytes(changed.path(), kLayer, kExpert);
  const Model original(kQwen3Tiny);
  const Model edited(changed.path());
  CHECK(edited.fingerprint == original.fingerprint);  // the fingerprint cannot tell them apart
  REQUIRE(edited.hash(kLayer, kExpert) != original.hash(kLayer, kExpert));
  CHECK(edited.hash(kLayer, kExpert + 2) == original.hash(kLayer, kExpert + 2));

  Topology topology = two_workers(kQwen3Tiny);
  Worker a(changed.path(), topology, 0);
  Worker b(kQwen3Tiny, topology, 1);
  LocalExperts local;
  test::expect_error([&] { coordinator(topology, original, local); }, ErrorCategory::kProtocol,
                     {"worker 'a'", "layer 2 expert 4: content hash " + edited.hash(kLayer, kExpert) + " on the worker, " +
                                        original.hash(kLayer, kExpert) + " in the coordinator's checkpoint"});
  // The same worker from the original bytes is accepted.
  Topology same = two_workers(kQwen3Tiny);
  Worker a2(kQwen3Tiny, same, 0);
  Worker b2(kQwen3Tiny, same, 1);
  CHECK_NOTHROW(coordinator(same, original, local));
}

TEST_CASE("an expert file changed under a running worker is refused when read, and the worker then reports it") {
  CheckpointCopy copy;
  const Model original(kQwen3Tiny);
  Topology topology = two_workers(copy.path());
  StoreSpec spec;
  spec.ram_gb = 3 * 12288.0 / double(1ull << 30);  // one slot per MoE layer: every expert is read on use
  spec.pin = "none";
  Worker a(copy.path(), topology, 0, spec);
  Worker b(copy.path(), topology, 1, spec);
  LocalExperts local;
  auto dispatcher = coordinator(topology, original, local);
  const std::vector<float> hidden(64, 0.5f);
  std::vector<int64_t> out(64);
  dispatcher->run_layer(kLayer, hidden.data(), 1, 64, {{0, kExpert + 2}}, out.data());  // fine before

  change_expert_bytes(copy.path(), kLayer, kExpert);
  const std::string read = Model(copy.path()).hash(kLayer, kExpert);
  const std::string manifest = original.hash(kLayer, kExpert);
  test::expect_error([&] { dispatcher->run_layer(kLayer, hidden.data(), 1, 64, {{0, kExpert}}, out.data()); },
                     ErrorCategory::kUnavailable,
                     {"worker 'a'", "layer 2 expert 4: the bytes read have content hash " + read +
                                        ", the expert manifest has " + manifest});
  // Prefetched or not, the changed bytes are never computed with; and the next handshake
  // (a rejoin, a restarted coordinator) is refused naming what the worker read.
  CHECK(a.hello().identities.at({kLayer, kExpert}).hex() == read);
  LocalExperts again;
  test::expect_error([&] { coordinator(topology, original, again); }, ErrorCategory::kProtocol,
                     {"worker 'a'", "layer 2 expert 4: content hash " + read});
}

TEST_CASE("bytes that changed without their file's stat changing (bit rot) are refused when read into RAM") {
  CheckpointCopy copy;
  Topology topology = two_workers(copy.path());
  const Model model(copy.path());
  const auto owned = owned_experts(topology, model.config, 0);
  open_store({}, *model.checkpoint, model.config, owned, "a", model.fingerprint);  // manifest cached
  // Rot: what the cached manifest says no longer matches the bytes; the stat is unchanged.
  const fs::path cache = manifest_cache_file(*model.checkpoint, model.fingerprint);
  REQUIRE(fs::exists(cache));
  std::string text = slurp(cache);
  const std::string real = model.hash(kLayer, kExpert);
  const std::string rotten = std::string(32, '0');
  REQUIRE(text.find(real) != std::string::npos);
  text.replace(text.find(real), real.size(), rotten);
  write_bytes(cache, text);

  // Pinned set (every owned expert resident): refused at start, naming the expert.
  test::expect_error([&] { open_store({}, *model.checkpoint, model.config, owned, "a", model.fingerprint); },
                     ErrorCategory::kIo,
                     {"model-0000", "layer 2 expert 4: the bytes read have content hash " + real +
                                        ", the expert manifest has " + rotten});
  // LRU slots: the start succeeds; a fill of that expert fails, the others serve.
  StoreSpec lru;
  lru.ram_gb = 3 * 12288.0 / double(1ull << 30);
  lru.pin = "none";
  auto store = open_store(lru, *model.checkpoint, model.config, owned, "a", model.fingerprint);
  ExpertExecutor executor(*store);
  std::vector<int64_t> out(64);
  const std::vector<float> hidden(64, 0.25f);
  CHECK_NOTHROW(executor.run_into(kLayer, hidden.data(), 1, {{0, kExpert + 2}}, out.data()));
  test::expect_error([&] { executor.run_into(kLayer, hidden.data(), 1, {{0, kExpert}}, out.data()); },
                     ErrorCategory::kIo, {"layer 2 expert 4", real, rotten});
  CHECK(store->identities().at({kLayer, kExpert}).hex() == real);  // what the handshake will report
}

TEST_CASE("a lossless container converted from other weights is refused at the handshake") {
  CheckpointCopy changed;
  change_expert_bytes(changed.path(), kLayer, kExpert);
  test::TempDir container("charm-identity-container");
  Model(changed.path()).convert(container.path());
  const Model original(kQwen3Tiny);
  Topology topology = two_workers(kQwen3Tiny);
  StoreSpec spec;
  spec.container = container.path();
  Worker a(kQwen3Tiny, topology, 0, spec);  // the worker's own checkpoint is the original one
  Worker b(kQwen3Tiny, topology, 1);
  CHECK(a.hello().lossy_form.empty());
  LocalExperts local;
  test::expect_error([&] { coordinator(topology, original, local); }, ErrorCategory::kProtocol,
                     {"worker 'a'", "layer 2 expert 4: content hash " + Model(changed.path()).hash(kLayer, kExpert) +
                                        " on the worker, " + original.hash(kLayer, kExpert)});
}

TEST_CASE("a lossy container of other weights is refused; of these weights it is accepted as the lossy option") {
  CheckpointCopy changed;
  change_expert_bytes(changed.path(), kLayer, kExpert);
  const Model original(kQwen3Tiny);
  {
    test::TempDir other("charm-identity-int8-other");
    Model(changed.path()).convert(other.path(), "int8");
    Topology topology = two_workers(kQwen3Tiny);
    StoreSpec spec;
    spec.container = other.path();
    Worker a(kQwen3Tiny, topology, 0, spec);
    Worker b(kQwen3Tiny, topology, 1);
    LocalExperts local;
    test::expect_error([&] { coordinator(topology, original, local); }, ErrorCategory::kProtocol,
                       {"worker 'a'", "layer 2 expert 4: content hash"});
  }
  test::TempDir same("charm-identity-int8");
  original.convert(same.path(), "int8");
  Topology topology = two_workers(kQwen3Tiny);
  StoreSpec spec;
  spec.container = same.path();
  Worker a(kQwen3Tiny, topology, 0, spec);
  Worker b(kQwen3Tiny, topology, 1);
  const HelloReplyMsg hello = a.hello();
  CHECK(hello.lossy_form == "int8 group_size 32");  // said, not passed off as the checkpoint's bytes
  CHECK(hello.identities.at({kLayer, kExpert}).hex() == original.hash(kLayer, kExpert));  // what it was made from
  CHECK(b.hello().lossy_form.empty());
  LocalExperts local;
  CHECK_NOTHROW(coordinator(topology, original, local));
  // charm status says so too.
  load_expert_manifest(*original.checkpoint, original.config, original.all(),
                       ManifestOptions{manifest_cache_file(*original.checkpoint, original.fingerprint)});
  const std::string table = format_status(collect_status(topology, 5000));
  INFO(table);
  CHECK(table.find("a serves LOSSY experts (int8 group_size 32)") != std::string::npos);
  CHECK(table.find("b serves LOSSY") == std::string::npos);
}

TEST_CASE("single node: a container converted from other weights is refused at start") {
  CheckpointCopy changed;
  change_expert_bytes(changed.path(), kLayer, kExpert);
  test::TempDir container("charm-identity-local");
  Model(changed.path()).convert(container.path());
  const Model original(kQwen3Tiny);
  Topology topology;
  topology.model = kQwen3Tiny;
  topology.single_node = true;
  topology.store.container = container.path();
  LocalExperts local;
  test::expect_error([&] { coordinator(topology, original, local); }, ErrorCategory::kInvalidInput,
                     {container.path().string(), "layer 2 expert 4: content hash " +
                                                     Model(changed.path()).hash(kLayer, kExpert) + " in the container, " +
                                                     original.hash(kLayer, kExpert) + " in the checkpoint"});
  // The container of these weights serves.
  test::TempDir good("charm-identity-local-good");
  original.convert(good.path());
  topology.store.container = good.path();
  LocalExperts ok;
  CHECK_NOTHROW(coordinator(topology, original, ok));
}

TEST_CASE("convert: a resumed or finished conversion from other weights is not kept") {
  CheckpointCopy changed;
  change_expert_bytes(changed.path(), kLayer, kExpert);
  const Model original(kQwen3Tiny);
  test::TempDir want("charm-identity-want");
  original.convert(want.path());

  // A conversion of the changed copy interrupted after every record was written: the
  // journal and experts.bin hold the changed expert. Resuming from the original must
  // convert that expert (and the ones after it) again.
  test::TempDir crash("charm-identity-crash");
  Model(changed.path()).convert(crash.path());
  json index = json::parse(slurp(crash / "index.json"));
  json header = index;
  header.erase("experts");
  header.erase("data_bytes");
  std::string journal = header.dump() + "\n";
  for (const auto& record : index["experts"]) journal += record.dump() + "\n";
  fs::remove(crash / "index.json");
  write_bytes(crash / "convert.journal", journal);
  ConvertOptions o;
  o.out = crash.path();
  o.progress = false;
  const ConvertResult r = convert_experts(*original.checkpoint, original.config, original.all(), o);
  CHECK(r.experts_resumed == 16 + 4);  // layer 0's 16 experts and layer 2's experts 0-3
  CHECK(slurp(crash / "experts.bin") == slurp(want / "experts.bin"));
  CHECK(slurp(crash / "index.json") == slurp(want / "index.json"));

  // A finished container of the changed copy is not "already complete" for the original.
  test::TempDir done("charm-identity-done");
  Model(changed.path()).convert(done.path());
  test::expect_error([&] { original.convert(done.path()); }, ErrorCategory::kInvalidInput,
                     {"converted from other weights", "layer 2 expert 4: content hash"});
}

TEST_CASE("a lossless container's records hash to the source identity they record") {
  const Model original(kQwen3Tiny);
  test::TempDir dir("charm-identity-record");
  original.convert(dir.path());
  const auto c = ExpertContainer::open(dir.path(), original.fingerprint, original.config.hidden_size,
                                       original.config.moe_intermediate_size);
  const ExpertIdentities want =
      hash_expert_identities(*original.checkpoint, original.config.expert_tensors, original.all(),
                             original.config.hidden_size, original.config.moe_intermediate_size);
  for (const auto& [key, record] : c->records()) {
    AlignedBuffer blob(record.layout.bytes);
    c->read(key, blob.data());
    CHECK(record.source_hash == want.at(key));
    CHECK(blob_identity(record.layout, blob.data()) == want.at(key));  // bf16 kept as stored
  }
}

TEST_CASE("charm status: a worker holding other weights is wrong-weights, naming layer, expert and hashes") {
  const ScopedCacheRoot cache;  // nothing cached yet
  CheckpointCopy changed;
  change_expert_bytes(changed.path(), kLayer, kExpert);
  const Model original(kQwen3Tiny);
  Topology topology = two_workers(kQwen3Tiny);
  Worker a(changed.path(), topology, 0);
  Worker b(kQwen3Tiny, topology, 1);  // caches the manifest of its own (odd) experts only
  // Without a cached manifest of the topology's model status cannot judge weights, and says so.
  const ClusterStatus unknown = collect_status(topology, 5000);
  CHECK(unknown.workers[0].state == "up");
  CHECK(format_status(unknown).find("are not checked: no valid manifest") != std::string::npos);
  // The coordinator's start caches it (here: the same call charm serve makes).
  load_expert_manifest(*original.checkpoint, original.config, original.all(),
                       ManifestOptions{manifest_cache_file(*original.checkpoint, original.fingerprint)});
  const ClusterStatus status = collect_status(topology, 5000);
  const std::string table = format_status(status);
  INFO(table);
  REQUIRE(status.workers.size() == 2);
  CHECK(status.workers[0].state == "wrong-weights");
  CHECK(status.workers[1].state == "up");
  CHECK_FALSE(status.all_up);
  CHECK(table.find("a is wrong-weights: holds other weights than the topology's model: layer 2 expert 4: content hash " +
                   Model(changed.path()).hash(kLayer, kExpert) + " on the worker, " + original.hash(kLayer, kExpert)) !=
        std::string::npos);
}
