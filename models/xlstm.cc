// xLSTM (transformers `xlstm`, mLSTM blocks): q, k, v projections, input and
// forget gate pre-activations soft-capped at gate_soft_cap, the mLSTM cell
// with exponential input gate (kernels::MlstmKind::kExp), a per-head
// LayerNorm, the sigmoid output gate and out_proj; logits soft-capped at
// output_logit_soft_cap.
#include "models/families.h"

namespace lair::models {
namespace {

using kernels::UnaryOp;

class MlstmMixer : public Mixer {
 public:
  struct Weights {
    int q = -1, k = -1, v = -1, o_gate = -1, i_gate = -1, i_bias = -1, f_gate = -1, f_bias = -1;
    int norm = -1, out = -1;
  };

  MlstmMixer(const XlstmConfig& config, Weights w) : config_(config), w_(w) {}

  void DeclareState(const std::string& prefix, int, StateLayout* layout) const override {
    const int h = config_.num_heads;
    layout->tensors.push_back(
        {prefix + "c", DType::kF32, {h, config_.qk_head_dim, config_.v_head_dim}});
    layout->tensors.push_back({prefix + "n", DType::kF32, {h, config_.qk_head_dim}});
    layout->tensors.push_back({prefix + "m", DType::kF32, {h}});
  }

  absl::StatusOr<Var> Forward(Graph& g, const LinearInput& x,
                              const StepContext& ctx) const override {
    const int h = config_.num_heads;
    MlstmInputs in;
    in.kind = kernels::MlstmKind::kExp;
    in.eps = static_cast<float>(config_.eps);
    LAIR_ASSIGN_OR_RETURN(std::vector<Var> p, g.Linears(x, Projections()));
    in.q = SplitHeads(g, p[0], h);
    in.k = SplitHeads(g, p[1], h);
    in.v = SplitHeads(g, p[2], h);
    in.i = p[3];
    in.f = p[4];
    LAIR_ASSIGN_OR_RETURN(
        Var cell, g.Mlstm(ctx.batch, in, ctx.State(0), ctx.State(1), ctx.State(2), ctx.form));
    cell = g.Reshape(cell, {cell.dim(0), config_.v_dim});
    LAIR_ASSIGN_OR_RETURN(Var normed,
                          g.Norm(cell, w_.norm, kernels::NormKind::kLayer,
                                 static_cast<float>(config_.base.norm_eps), config_.v_head_dim));
    LAIR_ASSIGN_OR_RETURN(Var gated, g.Mul(p[5], normed));
    return g.Linear(LinearInput{gated}, {w_.out}, x.x);
  }

  std::vector<int> InputProjections() const override { return WithWeights({}, Projections()); }

 private:
  // Every projection of x in one group: q, k, v, the input and forget gates
  // (soft-capped: cap·tanh(·/cap)) and the output gate (sigmoid), the
  // gates' functions in the group's epilogue.
  std::array<LinearWeight, 6> Projections() const {
    const float cap = static_cast<float>(config_.gate_soft_cap);
    const kernels::Activation soft_cap{UnaryOp::kTanh, cap, 0.0f, 1.0f / cap};
    return {{{w_.q},
             {w_.k},
             {w_.v},
             {w_.i_gate, w_.i_bias, soft_cap},
             {w_.f_gate, w_.f_bias, soft_cap},
             {w_.o_gate, -1, {UnaryOp::kSigmoid}}}};
  }

  XlstmConfig config_;
  Weights w_;
};

}  // namespace

absl::StatusOr<DecoderSpec> BuildXlstm(const XlstmConfig& config, Params& params) {
  SkeletonNames names;
  names.embedding = "backbone.embeddings.weight";
  names.layer = "backbone.blocks.{i}.";
  names.mixer_norm = "norm_mlstm.weight";
  names.mlp_norm = "norm_ffn.weight";
  names.mlp_gate = "ffn.proj_up_gate.weight";
  names.mlp_up = "ffn.proj_up.weight";
  names.mlp_down = "ffn.proj_down.weight";
  names.final_norm = "backbone.out_norm.weight";
  LAIR_ASSIGN_OR_RETURN(DecoderSpec spec, DeclareSkeleton(config.base, names, params));
  spec.logit_soft_cap = static_cast<float>(config.output_logit_soft_cap);
  const int hidden = config.base.hidden_size, h = config.num_heads;
  for (int i = 0; i < config.base.num_layers; ++i) {
    std::string p = LayerPrefix(names, i) + "mlstm_layer.";
    MlstmMixer::Weights w;
    LAIR_ASSIGN_OR_RETURN(w.q, params.AddMatrix(p + "q.weight", {config.qk_dim, hidden}));
    LAIR_ASSIGN_OR_RETURN(w.k, params.AddMatrix(p + "k.weight", {config.qk_dim, hidden}));
    LAIR_ASSIGN_OR_RETURN(w.v, params.AddMatrix(p + "v.weight", {config.v_dim, hidden}));
    LAIR_ASSIGN_OR_RETURN(w.o_gate,
                          params.AddMatrix(p + "ogate_preact.weight", {config.v_dim, hidden}));
    LAIR_ASSIGN_OR_RETURN(
        w.i_gate, params.AddMatrix(p + "igate_preact.weight", {h, hidden}, InitSpec::Zeros()));
    LAIR_ASSIGN_OR_RETURN(w.i_bias,
                          params.Add(p + "igate_preact.bias", {h}, InitSpec::Constant(-10.0f)));
    LAIR_ASSIGN_OR_RETURN(
        w.f_gate, params.AddMatrix(p + "fgate_preact.weight", {h, hidden}, InitSpec::Zeros()));
    LAIR_ASSIGN_OR_RETURN(
        w.f_bias, params.Add(p + "fgate_preact.bias", {h}, {InitSpec::kLinspace, 3.0f, 6.0f}));
    LAIR_ASSIGN_OR_RETURN(
        w.norm, params.Add(p + "multihead_norm.weight", {config.v_dim}, InitSpec::Ones()));
    LAIR_ASSIGN_OR_RETURN(w.out, params.AddMatrix(p + "out_proj.weight", {hidden, config.v_dim}));
    spec.layers[i].mixer = std::make_unique<MlstmMixer>(config, w);
  }
  return spec;
}

}  // namespace lair::models
