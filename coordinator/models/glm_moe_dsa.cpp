// DeepSeek Sparse Attention models: GLM-5 (GlmMoeDsaForCausalLM) and DeepSeek-V3.2
// (DeepseekV32ForCausalLM, a second record below), following transformers'
// models/glm_moe_dsa/modeling_glm_moe_dsa.py and models/deepseek_v32/modeling_deepseek_v32.py:
// DeepSeek-V3's layers (coordinator/models/deepseek_v3.cpp: MLA over the compressed cache,
// dense first layers, the group-limited sigmoid router with e_score_correction_bias and
// shared experts) with DeepSeek Sparse Attention: each layer's lightning indexer
// (coordinator/models/dsa_indexer.h) picks the index_topk keys every query attends. MLA's
// RoPE turns interleaved pairs (apply_rotary_pos_emb_interleave); the indexer's does too in
// GLM-5 and turns halves in DeepSeek-V3.2. A layer that GLM-5's indexer_types calls
// "shared" has no indexer and reuses the previous layer's selection
// (GlmMoeDsaAttention.skip_topk). The
// multi-token-prediction layer (num_nextn_predict_layers; model.layers.<num_hidden_layers>.*)
// is not read: plain decoding does not use it.
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/config_fields.h"
#include "common/error.h"
#include "coordinator/models/blocks.h"
#include "coordinator/models/dsa_indexer.h"
#include "coordinator/models/families.h"
#include "coordinator/models/mla_attention.h"
#include "coordinator/models/model.h"
#include "coordinator/models/routers.h"

namespace charm {
namespace {

struct GlmMoeDsaLayer {
  RmsNorm input_layernorm, post_attention_layernorm;
  MlaAttention self_attn;
  std::optional<LightningIndexer> indexer;  // self_attn.indexer; none on a "shared" layer
  MoeBlock sparse_moe;                      // GlmMoeDsaMoE; no router in the dense first layers
  DenseMlp mlp;                             // dense layers only
};

class GlmMoeDsa final : public LayerStack<GlmMoeDsaLayer> {
 public:
  GlmMoeDsa(const Checkpoint& ckpt, const ModelConfig& config, ExpertDispatcher& dispatcher)
      : LayerStack(ckpt, config, dispatcher) {
    const size_t h = config.hidden_size;
    const double eps = config.rms_norm_eps;
    for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l);
      GlmMoeDsaLayer layer;
      layer.input_layernorm = RmsNorm::load(ckpt, p + ".input_layernorm", h, eps);
      layer.post_attention_layernorm = RmsNorm::load(ckpt, p + ".post_attention_layernorm", h, eps);
      layer.self_attn = MlaAttention::load(ckpt, p + ".self_attn", config);
      if (!config.indexer_shared[l]) layer.indexer = LightningIndexer::load(ckpt, p + ".self_attn.indexer", config);
      if (config.is_moe_layer(l)) {
        layer.sparse_moe = load_group_limited_moe(ckpt, p + ".mlp", config);
      } else {
        layer.mlp = DenseMlp::load(ckpt, p + ".mlp", h, config.intermediate_size);
      }
      layers_.push_back(std::move(layer));
    }
  }

  /// The compressed MLA cache with the indexer's key: [kv_lora_rank | qk_rope_head_dim |
  /// index_head_dim] per layer and token (the last part unused on "shared" layers).
  KvLayout kv_layout() const override {
    return KvLayout{static_cast<size_t>(config_.num_hidden_layers), MlaAttention::cache_row_dim(config_), 0};
  }

 protected:
  void begin_step() override { selections_.clear(); }  // a forward that threw may have left some
  void attention(size_t l, const float* x, size_t rows, std::span<const SequenceRows> batch, float* out) override {
    if (batch.empty()) return;
    const GlmMoeDsaLayer& layer = layers_[l];
    const std::vector<float> q_latent = layer.self_attn.query_latent(x, rows);
    // Keyed by the micro-batch (its first sequence's cache): the two halves of a step
    // interleave their layers, and a "shared" layer reuses its own half's selection.
    const KvCache* half = batch.front().cache;
    if (layer.indexer) selections_[half] = layer.indexer->select(x, q_latent, rows, batch, l);
    const auto it = selections_.find(half);  // layer 0 always has an indexer (read_indexer_types)
    layer.self_attn.attend(rope_, x, q_latent, rows, batch, l, &it->second, out);
    if (l + 1 == layers_.size()) selections_.erase(it);
  }

 private:
  std::unordered_map<const KvCache*, MlaAttention::KeySelection> selections_;
};

using nlohmann::json;
using namespace hf;

/// mlp_layer_types (GlmMoeDsaConfig: "dense" / "sparse" per layer; when absent,
/// first_k_dense_replace dense layers then sparse ones): only that shape is supported, and
/// a list overrides first_k_dense_replace, as in transformers.
void read_mlp_layer_types(const json& j, const std::string& source, ModelConfig& c) {
  const json* types = member(j, "mlp_layer_types");
  if (types == nullptr) return;
  if (!types->is_array() || static_cast<int64_t>(types->size()) != c.num_hidden_layers) {
    fail_invalid(source + ": field 'mlp_layer_types' must be a list of num_hidden_layers (" +
                 std::to_string(c.num_hidden_layers) + ") strings, got " + types->dump());
  }
  int64_t dense = 0;
  while (dense < c.num_hidden_layers && (*types)[dense] == "dense") ++dense;
  for (int64_t i = dense; i < c.num_hidden_layers; ++i) {
    if ((*types)[i] != "sparse") {
      fail_unsupported(source + ": mlp_layer_types[" + std::to_string(i) + "] is " + (*types)[i].dump() +
                       "; supported: \"dense\" layers first, then \"sparse\" ones");
    }
  }
  c.first_k_dense_replace = dense;
}

/// indexer_types ("full" / "shared" per layer), else GlmMoeDsaConfig's defaults:
/// index_topk_pattern ("F"/"S" per layer, or a list), else full where
/// max(i - index_skip_topk_offset + 1, 0) % index_topk_freq == 0 (defaults 2 and 1: all).
void read_indexer_types(const json& j, const std::string& source, ModelConfig& c) {
  const size_t n = static_cast<size_t>(c.num_hidden_layers);
  std::vector<std::string> types;
  const Spelled listed = spelled(j, source, {"indexer_types", "index_topk_pattern"});
  if (listed.value != nullptr && listed.value->is_string()) {
    for (char letter : listed.value->get<std::string>()) {
      types.push_back(letter == 'F' ? "full" : letter == 'S' ? "shared" : std::string(1, letter));
    }
  } else if (listed.value != nullptr && listed.value->is_array()) {
    for (const json& t : *listed.value) types.push_back(t.is_string() ? t.get<std::string>() : t.dump());
  } else if (listed.value != nullptr) {
    fail_invalid(source + ": field '" + listed.key + "' must be a list of strings, got " + listed.value->dump());
  } else {
    const int64_t freq = std::max<int64_t>(get_int(j, source, "index_topk_freq", 1), 1);
    const int64_t offset = get_int(j, source, "index_skip_topk_offset", 2);
    for (size_t i = 0; i < n; ++i) {
      types.push_back(std::max<int64_t>(static_cast<int64_t>(i) - offset + 1, 0) % freq == 0 ? "full" : "shared");
    }
  }
  if (types.size() != n) {
    fail_invalid(source + ": field '" + listed.key + "' names " + std::to_string(types.size()) +
                 " layers, num_hidden_layers is " + std::to_string(n));
  }
  c.indexer_shared.assign(n, false);
  for (size_t i = 0; i < n; ++i) {
    if (types[i] != "full" && types[i] != "shared") {
      fail_invalid(source + ": " + listed.key + "[" + std::to_string(i) + "] is '" + types[i] +
                   "'; expected \"full\" or \"shared\"");
    }
    c.indexer_shared[i] = types[i] == "shared";
  }
  if (n > 0 && c.indexer_shared[0]) {
    fail_invalid(source + ": " + (listed.value ? listed.key + "[0]" : std::string("index_skip_topk_offset")) +
                 ": layer 0 is a \"shared\" indexer layer, but there is no earlier layer to share with");
  }
}

/// The fields GlmMoeDsaConfig and DeepseekV32Config share: the experts' width, the
/// DeepSeek-V3 MoE and MLA fields, the dense layers, and the lightning indexer's
/// (index_topk default 2048, index_head_dim 128, index_n_heads `default_heads`).
void read_dsa_fields(const json& j, const std::string& source, int64_t default_heads, ModelConfig& c) {
  read_moe_intermediate_size(j, source, c);
  read_group_limited_moe(j, source, c);
  read_mlp_layer_types(j, source, c);
  read_mla_fields(j, source, c);
  if (c.q_lora_rank == 0) {
    fail_unsupported(source + ": q_lora_rank is null, but GlmMoeDsaAttention always projects the query latent "
                     "(the lightning indexer reads it)");
  }
  c.rope_interleave = true;  // apply_rotary_pos_emb_interleave, whatever rope_interleave says
  // Fields GlmMoeDsaConfig does not read but a config written for DeepSeek's code may.
  require_value(j, source, "scoring_func", "sigmoid");
  require_value(j, source, "topk_method", "noaux_tc");
  c.index_topk = get_int(j, source, "index_topk", 2048);
  c.index_head_dim = get_int(j, source, "index_head_dim", 128);
  c.index_n_heads = get_int(j, source, "index_n_heads", default_heads);
  for (auto [key, value] : {std::pair{"index_topk", c.index_topk}, {"index_head_dim", c.index_head_dim},
                            {"index_n_heads", c.index_n_heads}}) {
    require_positive(source, key, value);
  }
  if (c.index_head_dim < c.qk_rope_head_dim) {
    fail_invalid(source + ": index_head_dim " + std::to_string(c.index_head_dim) + " is below qk_rope_head_dim " +
                 std::to_string(c.qk_rope_head_dim) + " (the indexer rotates its first qk_rope_head_dim dims)");
  }
}

/// GlmMoeDsaConfig: the DSA fields (32 indexer heads by default), the per-layer indexer
/// types; the indexer's RoPE turns interleaved pairs, as MLA's.
void read_glm_moe_dsa_config(const json& j, const std::string& source, ModelConfig& c) {
  read_dsa_fields(j, source, 32, c);
  read_indexer_types(j, source, c);
  c.index_rope_interleave = true;
}

/// DeepseekV32Config: the DSA fields (64 indexer heads by default), an indexer on every
/// layer, whose RoPE turns halves (DeepseekV32Indexer's apply_rotary_pos_emb).
void read_deepseek_v32_config(const json& j, const std::string& source, ModelConfig& c) {
  read_dsa_fields(j, source, 64, c);
  c.indexer_shared.assign(static_cast<size_t>(c.num_hidden_layers), false);
  c.index_rope_interleave = false;
}

}  // namespace

const ModelFamily& glm_moe_dsa_family() {
  static const ModelFamily family{
      .checkpoint = {.architectures = {"GlmMoeDsaForCausalLM"},
                     .num_experts_keys = {"n_routed_experts", "num_local_experts"},  // field, attribute_map alias
                     .default_rms_norm_eps = 1e-5,                                 // GlmMoeDsaConfig's
                     .yarn_rope = true,
                     .full_layer_type = "indexed_attention",  // GlmMoeDsaConfig's layer_types
                     .read_fields = read_glm_moe_dsa_config,
                     .expert_tensors = ExpertTensorNames{}},  // the hub default names
      .build = build_model<GlmMoeDsa>,
  };
  return family;
}

/// DeepSeek-V3.2 (DeepseekV32ForCausalLM, transformers' models/deepseek_v32/
/// modeling_deepseek_v32.py): the same layers with an indexer on each (no shared ones) and
/// DeepseekV32Config's defaults.
const ModelFamily& deepseek_v32_family() {
  static const ModelFamily family{
      .checkpoint = {.architectures = {"DeepseekV32ForCausalLM"},
                     .num_experts_keys = {"n_routed_experts", "num_local_experts"},
                     .yarn_rope = true,
                     .full_layer_type = "indexed_attention",  // DeepseekV32Config's layer_types
                     .read_fields = read_deepseek_v32_config,
                     .expert_tensors = ExpertTensorNames{}},
      .build = build_model<GlmMoeDsa>,
  };
  return family;
}

}  // namespace charm
