// One builder per family (models/<family>.cc): each declares its mixer's
// weights under the reference checkpoint names, wraps them in a Mixer per
// layer and fills in the skeleton (models/decoder.h). Errors name the config
// field or the tensor.
//
// Helpers shared by the fla families (heads, grouped kv heads, the short
// convolution) are here too, so each family file holds only its mixer.
#pragma once

#include <array>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "models/config.h"
#include "models/decoder.h"

namespace lair::models {

absl::StatusOr<DecoderSpec> BuildGla(const GlaConfig& config, Params& params);
absl::StatusOr<DecoderSpec> BuildGsa(const GsaConfig& config, Params& params);
absl::StatusOr<DecoderSpec> BuildLinearAttn(const LinearAttnConfig& config, Params& params);
absl::StatusOr<DecoderSpec> BuildRetNet(const RetNetConfig& config, Params& params);
absl::StatusOr<DecoderSpec> BuildHgrn2(const Hgrn2Config& config, Params& params);
absl::StatusOr<DecoderSpec> BuildMamba2(const Mamba2Config& config, Params& params);
absl::StatusOr<DecoderSpec> BuildXlstm(const XlstmConfig& config, Params& params);
absl::StatusOr<DecoderSpec> BuildLlama(const LlamaConfig& config, Params& params);

// The skeleton of an fla causal LM under fla's names (model.embeddings,
// attn_norm, mlp_norm, gate/up/down_proj, model.norm, lm_head), with layer
// i's mixer from declare_mixer("model.layers.<i>.attn.").
using DeclareMixer =
    std::function<absl::StatusOr<std::unique_ptr<Mixer>>(const std::string& prefix)>;
absl::StatusOr<DecoderSpec> BuildFlaDecoder(const DecoderConfig& base, Params& params,
                                            const DeclareMixer& declare_mixer);

// [N, H·D] -> [N, H, D].
Var SplitHeads(Graph& g, const Var& x, int heads);

// [N, kv_heads, D] -> [N, kv_heads·groups, D], each kv head repeated
// `groups` times in a row (einops '(h g) d'), for grouped query heads.
absl::StatusOr<Var> RepeatKvHeads(Graph& g, const Var& x, int groups);

// fla's ShortConvolution on one projection: a depthwise causal conv
// (`<prefix>.weight` [C,1,W], no bias) with its window in the pool.
struct ShortConv {
  int weight = -1;
  int channels = 0, width = 0;
  bool silu = false;

  static absl::StatusOr<ShortConv> Declare(Params& params, const std::string& prefix, int channels,
                                           const ShortConvConfig& config, bool silu);
  void DeclareState(const std::string& name, StateLayout* layout) const;
  // `state_index` is the index (relative to the layer) of its window.
  absl::StatusOr<Var> Forward(Graph& g, const Var& x, const StepContext& ctx,
                              int state_index) const;
};

// Three input projections `<prefix><name>_proj.weight` (no bias), each
// followed, when config.use, by its short convolution `<prefix><name>_conv1d`
// whose windows are layer states first_state, first_state+1, first_state+2.
struct ProjectionTriple {
  std::array<int, 3> proj = {-1, -1, -1};
  std::array<ShortConv, 3> conv;
  bool use_conv = false;

  static absl::StatusOr<ProjectionTriple> Declare(Params& params, const std::string& prefix,
                                                  const std::array<std::string, 3>& names,
                                                  int hidden, const std::array<int, 3>& dims,
                                                  const ShortConvConfig& config, bool conv_silu);
  // q, k, v of an fla attention layer: q is key_dim wide; k and v belong to
  // the num_kv_heads heads that groups of query heads share.
  template <typename Config>
  static absl::StatusOr<ProjectionTriple> DeclareQkv(Params& params, const std::string& prefix,
                                                     const Config& config,
                                                     const ShortConvConfig& conv, bool conv_silu) {
    const int groups = config.num_heads / config.num_kv_heads;
    return Declare(params, prefix, {"q", "k", "v"}, config.base.hidden_size,
                   {config.key_dim, config.key_dim / groups, config.value_dim / groups}, conv,
                   conv_silu);
  }
  // Appends the conv windows (none without convolutions).
  void DeclareState(const std::string& prefix, StateLayout* layout) const;
  // The three projections' weights (Mixer::InputProjections).
  std::vector<int> Weights() const { return {proj.begin(), proj.end()}; }
  // The three projections of x (each convolved when use_conv, then put
  // through its activation: in the products' epilogue without convolutions),
  // followed by the projections `also` of x (not convolved), all from one
  // Graph::Linears. `to_mixer`: the caller hands q, k, v to its mixer as
  // they are, which takes them in 16 bits (LinearWeight::sixteen_bit_ok)
  // when they come from a prefill's products without convolutions.
  absl::StatusOr<std::vector<Var>> Forward(
      Graph& g, const LinearInput& x, const StepContext& ctx, int first_state,
      std::span<const LinearWeight> also = {},
      const std::array<kernels::Activation, 3>& activations = {}, bool to_mixer = false) const;
};

// fla's per-head output stage of GLA and RetNet: RMSNorm over each head's
// value vector (weight shared by the heads), times swish(g_proj(x)) when the
// layer has an output gate. The fused and unfused reference paths compute
// the same function; fuse_norm only picks the weight's name
// (g_norm_swish_gate or g_norm).
struct HeadOutputGate {
  int norm = -1;  // -1: elementwise_affine is false
  int gate = -1;  // g_proj; -1: no output gate
  float eps = 1e-6f;

  static absl::StatusOr<HeadOutputGate> Declare(Params& params, const std::string& prefix,
                                                int hidden, int value_dim, int head_v_dim,
                                                bool use_output_gate, bool fuse_norm,
                                                bool elementwise_affine, double eps);
  // Declare with the fields of a GLA or RetNet config.
  template <typename Config>
  static absl::StatusOr<HeadOutputGate> Declare(Params& params, const std::string& prefix,
                                                const Config& config) {
    return Declare(params, prefix, config.base.hidden_size, config.value_dim, config.head_v_dim,
                   config.use_output_gate, config.fuse_norm, config.elementwise_affine,
                   config.base.norm_eps);
  }
  // The projections of the layer input Forward needs: g_proj, when gated.
  // Only the norm's gate reads it, so it may come in 16 bits (half the
  // bytes for the product to write and the norm to read).
  std::vector<LinearWeight> Projections() const {
    if (gate < 0) return {};
    return {{gate, -1, {}, /*sixteen_bit_ok=*/true}};
  }
  // The input of o_proj: o [N, H, head_v_dim] as [N, H·head_v_dim] under the
  // per-head norm, gated by gate_proj = g_proj(x) [N, H·head_v_dim] when
  // gated (else unused); o_proj's product forms it.
  LinearInput Input(Graph& g, const Var& gate_proj, const Var& o) const;
};

// The weights of `products` after `first` (Mixer::InputProjections from the
// products a Forward takes of its input).
std::vector<int> WithWeights(std::vector<int> first, std::span<const LinearWeight> products);

// An activation by its fla/transformers ACT2FN name (relu, sigmoid,
// silu/swish; "" is the identity), for a projection's epilogue.
absl::StatusOr<kernels::Activation> ActivationNamed(const std::string& name);

}  // namespace lair::models
