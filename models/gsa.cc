// GSA (fla `gsa`): gated slot attention over num_slots memory slots,
//   q, k = φ(q_proj x, k_proj x) (φ = swish or relu),  v = swish(v_proj x),
//   g = logsigmoid(f_proj x) / gate_logit_normalizer,  s = 1 − exp(g),
// the two-pass GSA mixer (scale 1 as the layer passes it), then
// o_proj(RMSNorm(swish(o))) with the norm over the whole value width (eps
// 1e-5 whatever norm_eps says; see GsaConfig::output_norm_eps).
#include "models/families.h"

namespace lair::models {
namespace {

using kernels::UnaryOp;

class GsaMixer : public Mixer {
 public:
  GsaMixer(const GsaConfig& config, ProjectionTriple qkv, int f, int norm, int o)
      : config_(config), qkv_(qkv), f_(f), norm_(norm), o_(o) {}

  void DeclareState(const std::string& prefix, int, StateLayout* layout) const override {
    const int h = config_.num_heads, m = config_.num_slots;
    layout->tensors.push_back({prefix + "slots_k", DType::kF32, {h, config_.head_k_dim, m}});
    layout->tensors.push_back({prefix + "slots_v", DType::kF32, {h, m, config_.head_v_dim}});
    qkv_.DeclareState(prefix, layout);
  }

  absl::StatusOr<Var> Forward(Graph& g, const LinearInput& x,
                              const StepContext& ctx) const override {
    const int groups = config_.num_heads / config_.num_kv_heads;
    // q and k through the feature map, v through silu, in the products; the
    // forget gate beside them (Forget).
    LAIR_ASSIGN_OR_RETURN(const kernels::Activation feature, ActivationNamed(config_.feature_map));
    LAIR_ASSIGN_OR_RETURN(std::vector<Var> qkv,
                          qkv_.Forward(g, x, ctx, 2, Forget(),
                                       {feature, feature, kernels::Activation{UnaryOp::kSilu}},
                                       /*to_mixer=*/groups == 1));
    GsaInputs in;
    in.scale = static_cast<float>(config_.scale);
    in.q = SplitHeads(g, qkv[0], config_.num_heads);
    const Var k = SplitHeads(g, qkv[1], config_.num_kv_heads);
    const Var v = SplitHeads(g, qkv[2], config_.num_kv_heads);
    const Var gate = SplitHeads(g, qkv[3], config_.num_kv_heads);
    LAIR_ASSIGN_OR_RETURN(Var s, g.Unary(UnaryOp::kExp, gate, -1.0f, 1.0f));
    LAIR_ASSIGN_OR_RETURN(in.k, RepeatKvHeads(g, k, groups));
    LAIR_ASSIGN_OR_RETURN(in.v, RepeatKvHeads(g, v, groups));
    LAIR_ASSIGN_OR_RETURN(in.g, RepeatKvHeads(g, gate, groups));
    LAIR_ASSIGN_OR_RETURN(in.s, RepeatKvHeads(g, s, groups));
    LAIR_ASSIGN_OR_RETURN(Var o, g.Gsa(ctx.batch, in, ctx.State(0), ctx.State(1), ctx.form));
    o = g.Reshape(o, {o.dim(0), o.dim(1) * o.dim(2)});
    // o_proj(RMSNorm(silu(o))): the norm takes the SiLU as it reads o.
    LinearInput out = LinearInput::Normed(o, norm_, kernels::NormKind::kRms,
                                          static_cast<float>(config_.output_norm_eps));
    out.gate_mode = kernels::NormGate::kSiluInput;
    return g.Linear(out, {o_}, x.x);
  }

  std::vector<int> InputProjections() const override {
    return WithWeights(qkv_.Weights(), Forget());
  }

 private:
  // The forget gate's product of x, beside q, k, v:
  // logsigmoid(f_proj(x)) / gate_logit_normalizer, in the group's epilogue.
  std::array<LinearWeight, 1> Forget() const {
    return {{{f_, -1, {UnaryOp::kLogSigmoid, 1.0f / config_.gate_logit_normalizer}}}};
  }

  GsaConfig config_;
  ProjectionTriple qkv_;
  int f_, norm_, o_;
};

}  // namespace

absl::StatusOr<DecoderSpec> BuildGsa(const GsaConfig& config, Params& params) {
  const int hidden = config.base.hidden_size;
  return BuildFlaDecoder(
      config.base, params, [&](const std::string& p) -> absl::StatusOr<std::unique_ptr<Mixer>> {
        LAIR_ASSIGN_OR_RETURN(ProjectionTriple qkv,
                              ProjectionTriple::DeclareQkv(params, p, config, config.conv, true));
        LAIR_ASSIGN_OR_RETURN(int f,
                              params.AddMatrix(p + "f_proj.weight",
                                               {config.num_kv_heads * config.num_slots, hidden}));
        int norm = -1;
        if (config.elementwise_affine) {
          LAIR_ASSIGN_OR_RETURN(norm, params.Add(p + "g_norm.weight", {hidden}, InitSpec::Ones()));
        }
        LAIR_ASSIGN_OR_RETURN(int o,
                              params.AddMatrix(p + "o_proj.weight", {hidden, config.value_dim}));
        return std::make_unique<GsaMixer>(config, qkv, f, norm, o);
      });
}

}  // namespace lair::models
