// Mamba2 (fla `mamba2`): in_proj → [z | xBC | dt]; xBC through a causal
// depthwise conv with silu; the SSD recurrence as a scalar decay per head,
//   dt = softplus(dt + dt_bias),  g = −exp(A_log) · dt,
//   S_t = exp(g_t) S_{t-1} + B_t (dt_t x_t)ᵀ,  y_t = S_tᵀ C_t + D · x_t,
// then the gated RMSNorm norm(y · silu(z)) · w and out_proj. The block is
// norm → mixer → residual, with no MLP.
#include "models/families.h"

namespace lair::models {
namespace {

using kernels::BinaryOp;
using kernels::UnaryOp;

class Mamba2Mixer : public Mixer {
 public:
  struct Weights {
    int in_proj = -1, in_bias = -1, out_proj = -1, out_bias = -1;
    int conv = -1, conv_bias = -1, dt_bias = -1, a_log = -1, d = -1, norm = -1;
  };

  Mamba2Mixer(const Mamba2Config& config, Weights w) : config_(config), w_(w) {}

  void DeclareState(const std::string& prefix, int, StateLayout* layout) const override {
    layout->tensors.push_back(
        {prefix + "conv", DType::kF32, {config_.conv_dim, config_.conv_kernel - 1}});
    layout->tensors.push_back(
        {prefix + "ssm", DType::kF32, {config_.num_heads, config_.state_size, config_.head_dim}});
  }

  absl::StatusOr<Var> Forward(Graph& g, const LinearInput& x,
                              const StepContext& ctx) const override {
    const int64_t n = x.x.dim(0), heads = config_.num_heads, inner = config_.intermediate_size;
    const int64_t group_state = static_cast<int64_t>(config_.n_groups) * config_.state_size;
    LAIR_ASSIGN_OR_RETURN(Var proj, g.Linear(x, {w_.in_proj, w_.in_bias}));
    LAIR_ASSIGN_OR_RETURN(Var z, g.Columns(proj, 0, inner));
    LAIR_ASSIGN_OR_RETURN(Var xbc, g.Columns(proj, inner, config_.conv_dim));
    LAIR_ASSIGN_OR_RETURN(Var dt, g.Columns(proj, inner + config_.conv_dim, heads));
    LAIR_ASSIGN_OR_RETURN(xbc, g.Conv1d(ctx.batch, xbc, w_.conv, w_.conv_bias, true, ctx.State(0)));
    LAIR_ASSIGN_OR_RETURN(Var xs, g.Columns(xbc, 0, inner));
    LAIR_ASSIGN_OR_RETURN(Var b, g.Columns(xbc, inner, group_state));
    LAIR_ASSIGN_OR_RETURN(Var c, g.Columns(xbc, inner + group_state, group_state));
    xs = g.Reshape(xs, {n, heads, config_.head_dim});

    LAIR_ASSIGN_OR_RETURN(dt, g.Add(dt, g.Reshape(g.Param(w_.dt_bias), {1, heads})));
    LAIR_ASSIGN_OR_RETURN(dt, g.Unary(UnaryOp::kSoftplus, dt));
    LAIR_ASSIGN_OR_RETURN(Var a,
                          g.Unary(UnaryOp::kExp, g.Reshape(g.Param(w_.a_log), {1, heads}), -1.0f));
    DecayInputs in;
    in.kind = kernels::DecayKind::kScalar;
    in.scale = 1.0f;
    LAIR_ASSIGN_OR_RETURN(in.g, g.Mul(dt, a));
    const int per_group = config_.num_heads / config_.n_groups;
    LAIR_ASSIGN_OR_RETURN(in.q, RepeatKvHeads(g, SplitHeads(g, c, config_.n_groups), per_group));
    LAIR_ASSIGN_OR_RETURN(in.k, RepeatKvHeads(g, SplitHeads(g, b, config_.n_groups), per_group));
    LAIR_ASSIGN_OR_RETURN(in.v, g.Mul(xs, g.Reshape(dt, {n, heads, 1})));
    LAIR_ASSIGN_OR_RETURN(Var y, g.Decay(ctx.batch, in, ctx.State(1), ctx.form));
    LAIR_ASSIGN_OR_RETURN(Var skip, g.Mul(xs, g.Reshape(g.Param(w_.d), {1, heads, 1})));
    LAIR_ASSIGN_OR_RETURN(y, g.Add(y, skip));
    y = g.Reshape(y, {n, inner});
    LinearInput out_in = LinearInput::Normed(y, w_.norm, kernels::NormKind::kRms,
                                             static_cast<float>(config_.base.norm_eps));
    out_in.gate_mode = kernels::NormGate::kBefore;
    out_in.gate = z;
    return g.Linear(out_in, {w_.out_proj, w_.out_bias}, x.x);
  }

  std::vector<int> InputProjections() const override { return {w_.in_proj}; }

 private:
  Mamba2Config config_;
  Weights w_;
};

}  // namespace

absl::StatusOr<DecoderSpec> BuildMamba2(const Mamba2Config& config, Params& params) {
  SkeletonNames names;
  names.embedding = "backbone.embeddings.weight";
  names.layer = "backbone.layers.{i}.";
  names.mixer_norm = "norm.weight";
  names.final_norm = "backbone.norm_f.weight";
  LAIR_ASSIGN_OR_RETURN(DecoderSpec spec, DeclareSkeleton(config.base, names, params));
  const int hidden = config.base.hidden_size, heads = config.num_heads,
            inner = config.intermediate_size;
  const int proj = inner + config.conv_dim + heads;
  for (int i = 0; i < config.base.num_layers; ++i) {
    std::string p = LayerPrefix(names, i) + "mixer.";
    Mamba2Mixer::Weights w;
    LAIR_ASSIGN_OR_RETURN(w.in_proj, params.AddMatrix(p + "in_proj.weight", {proj, hidden}));
    if (config.use_bias) {
      LAIR_ASSIGN_OR_RETURN(w.in_bias, params.Add(p + "in_proj.bias", {proj}, InitSpec::Zeros()));
    }
    LAIR_ASSIGN_OR_RETURN(
        w.conv, params.Add(p + "conv1d.weight", {config.conv_dim, 1, config.conv_kernel}));
    if (config.use_conv_bias) {
      LAIR_ASSIGN_OR_RETURN(w.conv_bias,
                            params.Add(p + "conv1d.bias", {config.conv_dim}, InitSpec::Zeros()));
    }
    LAIR_ASSIGN_OR_RETURN(w.dt_bias,
                          params.Add(p + "dt_bias", {heads}, {InitSpec::kDtBias, 0.001f, 0.1f}));
    LAIR_ASSIGN_OR_RETURN(w.a_log,
                          params.Add(p + "A_log", {heads}, {InitSpec::kLogUniform, 1.0f, 16.0f}));
    LAIR_ASSIGN_OR_RETURN(w.d, params.Add(p + "D", {heads}, InitSpec::Ones()));
    LAIR_ASSIGN_OR_RETURN(w.norm, params.Add(p + "norm.weight", {inner}, InitSpec::Ones()));
    LAIR_ASSIGN_OR_RETURN(w.out_proj, params.AddMatrix(p + "out_proj.weight", {hidden, inner}));
    if (config.use_bias) {
      LAIR_ASSIGN_OR_RETURN(w.out_bias,
                            params.Add(p + "out_proj.bias", {hidden}, InitSpec::Zeros()));
    }
    spec.layers[i].mixer = std::make_unique<Mamba2Mixer>(config, w);
  }
  return spec;
}

}  // namespace lair::models
