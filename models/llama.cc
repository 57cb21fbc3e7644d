// Llama (transformers `llama`): softmax attention with grouped-query heads,
// rotary positions and a per-slot KV cache of max_context tokens.
#include <cmath>

#include "models/families.h"

namespace lair::models {
namespace {

class LlamaAttention : public Mixer {
 public:
  LlamaAttention(const LlamaConfig& config, int q, int k, int v, int o)
      : config_(config), q_(q), k_(k), v_(v), o_(o) {}

  void DeclareState(const std::string& prefix, int max_context,
                    StateLayout* layout) const override {
    Shape shape = {max_context, config_.num_kv_heads, config_.head_dim};
    layout->tensors.push_back({prefix + "k_cache", DType::kF32, shape});
    layout->tensors.push_back({prefix + "v_cache", DType::kF32, shape});
  }

  absl::StatusOr<Var> Forward(Graph& g, const LinearInput& x,
                              const StepContext& ctx) const override {
    const float theta = static_cast<float>(config_.rope_theta);
    const LinearWeight projections[] = {{q_}, {k_}, {v_}};
    LAIR_ASSIGN_OR_RETURN(std::vector<Var> qkv, g.Linears(x, projections));
    LAIR_ASSIGN_OR_RETURN(Var q, g.Rotary(SplitHeads(g, qkv[0], config_.num_heads), ctx.positions,
                                          config_.head_dim, theta));
    LAIR_ASSIGN_OR_RETURN(Var k, g.Rotary(SplitHeads(g, qkv[1], config_.num_kv_heads),
                                          ctx.positions, config_.head_dim, theta));
    Var v = SplitHeads(g, qkv[2], config_.num_kv_heads);
    LAIR_ASSIGN_OR_RETURN(
        Var o,
        g.Attention(ctx.batch, q, k, v, 1.0f / std::sqrt(static_cast<float>(config_.head_dim)),
                    ctx.State(0), ctx.State(1), ctx.start_positions, ctx.start_positions_device));
    return g.Linear(LinearInput{g.Reshape(o, {o.dim(0), o.dim(1) * o.dim(2)})}, {o_}, x.x);
  }

  std::vector<int> InputProjections() const override { return {q_, k_, v_}; }

 private:
  LlamaConfig config_;
  int q_, k_, v_, o_;
};

}  // namespace

absl::StatusOr<DecoderSpec> BuildLlama(const LlamaConfig& config, Params& params) {
  SkeletonNames names;
  names.embedding = "model.embed_tokens.weight";
  names.layer = "model.layers.{i}.";
  names.mixer_norm = "input_layernorm.weight";
  names.mlp_norm = "post_attention_layernorm.weight";
  names.mlp_gate = "mlp.gate_proj.weight";
  names.mlp_up = "mlp.up_proj.weight";
  names.mlp_down = "mlp.down_proj.weight";
  names.final_norm = "model.norm.weight";
  LAIR_ASSIGN_OR_RETURN(DecoderSpec spec, DeclareSkeleton(config.base, names, params));
  const int64_t d = config.base.hidden_size, q_dim = config.num_heads * config.head_dim,
                kv_dim = config.num_kv_heads * config.head_dim;
  for (int i = 0; i < config.base.num_layers; ++i) {
    std::string p = LayerPrefix(names, i) + "self_attn.";
    LAIR_ASSIGN_OR_RETURN(int q, params.AddMatrix(p + "q_proj.weight", {q_dim, d}));
    LAIR_ASSIGN_OR_RETURN(int k, params.AddMatrix(p + "k_proj.weight", {kv_dim, d}));
    LAIR_ASSIGN_OR_RETURN(int v, params.AddMatrix(p + "v_proj.weight", {kv_dim, d}));
    LAIR_ASSIGN_OR_RETURN(int o, params.AddMatrix(p + "o_proj.weight", {d, q_dim}));
    spec.layers[i].mixer = std::make_unique<LlamaAttention>(config, q, k, v, o);
  }
  return spec;
}

}  // namespace lair::models
