// Where a checkpoint stores its routed experts: the tensor names of one family's hub
// layout (each family's file gives its own, coordinator/models/families.h).
#pragma once

#include <string>

namespace charm {

/// Names of one family's routed-expert tensors. `prefix` has one "{}" for the layer:
/// per-expert layout  "<prefix>.<e>.<gate>.weight"  shape [moe_intermediate, hidden]
///                    "<prefix>.<e>.<up>.weight"    shape [moe_intermediate, hidden]
///                    "<prefix>.<e>.<down>.weight"  shape [hidden, moe_intermediate]
/// fused 3-D layouts  "<prefix>.<gate_up>" [E, 2*I, H] (gate rows first, then up),
///                    "<prefix>.down_proj" [E, H, I]   (transformers >= 5 Qwen3-MoE/OLMoE)
///               or   "<prefix>.<gate>" / "<prefix>.<up>" [E, I, H], "<prefix>.<down>" [E, H, I]
///                    (with or without a ".weight" suffix).
/// The defaults are the names most hub families use.
struct ExpertTensorNames {
  std::string prefix = "model.layers.{}.mlp.experts";
  std::string gate = "gate_proj";
  std::string up = "up_proj";
  std::string down = "down_proj";
  std::string gate_up = "gate_up_proj";  ///< fused gate+up name in the fused 3-D layout
  /// gpt-oss's layout (GptOssExperts) instead of the ones above: "<prefix>.<gate_up>"
  /// [E, H, 2*I] multiplied as x @ W, gate in the even columns and up in the odd ones;
  /// "<prefix>.<down>" [E, I, H], also x @ W; biases "<prefix>.<gate_up>_bias" [E, 2*I]
  /// (interleaved the same way) and "<prefix>.<down>_bias" [E, H].
  bool gpt_oss_layout = false;

  bool operator==(const ExpertTensorNames&) const = default;
};

}  // namespace charm
