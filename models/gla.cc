// GLA (fla `gla`): vector decay from a low-rank key-side gate,
//   gk = logsigmoid(gk_proj.1(gk_proj.0(x))) / gate_logit_normalizer,
//   S_t = diag(exp gk_t) S_{t-1} + k_t v_tᵀ,  o_t = K^-0.5 · S_tᵀ q_t,
// then a per-head RMSNorm gated by swish(g_proj(x)) and o_proj.
#include <cmath>
#include <optional>
#include <string>
#include <utility>

#include "models/families.h"

namespace lair::models {
namespace {

class GlaMixer : public Mixer {
 public:
  GlaMixer(std::string prefix, const GlaConfig& config, ProjectionTriple qkv, int gk0, int gk1,
           int gk1_bias, HeadOutputGate output, int o)
      : prefix_(std::move(prefix)),
        config_(config),
        qkv_(qkv),
        gk0_(gk0),
        gk1_(gk1),
        gk1_bias_(gk1_bias),
        output_(output),
        o_(o) {}

  void DeclareState(const std::string& prefix, int, StateLayout* layout) const override {
    layout->tensors.push_back({prefix + "recurrent",
                               DType::kF32,
                               {config_.num_heads, config_.head_k_dim, config_.head_v_dim}});
    qkv_.DeclareState(prefix, layout);
  }

  absl::StatusOr<Var> Forward(Graph& g, const LinearInput& x,
                              const StepContext& ctx) const override {
    const int groups = config_.num_heads / config_.num_kv_heads;
    // q and k through the feature map (if any), in the products.
    LAIR_ASSIGN_OR_RETURN(const kernels::Activation feature, ActivationNamed(config_.feature_map));
    // gk = logsigmoid(gk_proj.1(gk_proj.0(x))) / gate_logit_normalizer. At a
    // decode step whose backend does not form it from gk_proj.0's output,
    // one product among the input products forms it through the fused
    // weight (FuseLowRankGate) where gk_proj.1 would take a launch between
    // them and the step.
    const bool fused = fused_gate_ >= 0 && groups == 1 &&
                       g.ReadsFusedGate(ctx.batch, gk1_, config_.num_heads, config_.head_k_dim,
                                        config_.head_v_dim, ctx.form);
    LAIR_ASSIGN_OR_RETURN(std::vector<Var> qkv,
                          qkv_.Forward(g, x, ctx, 1, AlsoOfInput(fused), {feature, feature, {}},
                                       /*to_mixer=*/groups == 1));
    DecayInputs in;
    in.kind = kernels::DecayKind::kVector;
    in.scale = 1.0f / std::sqrt(static_cast<float>(config_.head_k_dim));
    in.sixteen_bit_o_ok = true;  // read only by the output norm, in o_proj
    in.q = SplitHeads(g, qkv[0], config_.num_heads);
    LAIR_ASSIGN_OR_RETURN(in.k,
                          RepeatKvHeads(g, SplitHeads(g, qkv[1], config_.num_kv_heads), groups));
    LAIR_ASSIGN_OR_RETURN(in.v,
                          RepeatKvHeads(g, SplitHeads(g, qkv[2], config_.num_kv_heads), groups));
    if (fused) {
      in.gk = SplitHeads(g, qkv[3], config_.num_heads);
    } else {
      // From gk_proj.0's output z: the decay op forms gk (the CUDA decode
      // step reads gk_proj.1's weights itself), or with grouped heads
      // gk_proj.1's product, then repeated.
      const LowRankDecayGate gate{qkv[3], gk1_, gk1_bias_, GateScale()};
      if (groups == 1) {
        in.gk_low_rank = gate;
      } else {
        LAIR_ASSIGN_OR_RETURN(Var gk, g.Linear(gate.z, gate.AsLinear()));
        LAIR_ASSIGN_OR_RETURN(in.gk,
                              RepeatKvHeads(g, SplitHeads(g, gk, config_.num_kv_heads), groups));
      }
    }
    LAIR_ASSIGN_OR_RETURN(Var o, g.Decay(ctx.batch, in, ctx.State(0), ctx.form));
    return g.Linear(output_.Input(g, qkv.size() > 4 ? qkv[4] : Var{}, o), {o_}, x.x);
  }

  std::optional<VectorDecayDecodeForm> PersistentDecodeForm() const override {
    if (qkv_.use_conv || !config_.feature_map.empty() || config_.num_kv_heads != config_.num_heads)
      return std::nullopt;
    VectorDecayDecodeForm f;
    f.q = qkv_.proj[0], f.k = qkv_.proj[1], f.v = qkv_.proj[2], f.g = output_.gate;
    f.gate_in = gk0_, f.gate_out = gk1_, f.gate_bias = gk1_bias_;
    f.head_norm = output_.norm, f.o = o_;
    f.heads = config_.num_heads, f.dk = config_.head_k_dim, f.dv = config_.head_v_dim;
    f.rank = config_.gate_low_rank_dim;
    f.gate_scale = GateScale();
    f.head_eps = output_.eps;
    return f;
  }

  std::vector<int> InputProjections() const override {
    return WithWeights(qkv_.Weights(), AlsoOfInput(/*fused_gate=*/false));
  }

  // gk_proj.1 · gk_proj.0: 2·R·hidden·key_dim more bytes for the input
  // products to read, but no launch of its own.
  absl::StatusOr<DerivedWeight> FuseLowRankGate(Params& params) override {
    LAIR_ASSIGN_OR_RETURN(fused_gate_, params.AddProduct(prefix_ + "gk_proj.fused", gk1_, gk0_));
    return DerivedWeight{fused_gate_, gk0_};
  }

 private:
  // q, k, v, the gate's low-rank input (or, fused, the gate) and g_proj
  // all read x: one group.
  std::vector<LinearWeight> AlsoOfInput(bool fused_gate) const {
    std::vector<LinearWeight> also = {
        fused_gate ? LowRankDecayGate{{}, fused_gate_, gk1_bias_, GateScale()}.AsLinear()
                   : LinearWeight{gk0_}};
    for (const LinearWeight& w : output_.Projections()) also.push_back(w);
    return also;
  }

  float GateScale() const { return 1.0f / static_cast<float>(config_.gate_logit_normalizer); }

  std::string prefix_;
  GlaConfig config_;
  ProjectionTriple qkv_;
  int gk0_, gk1_, gk1_bias_;
  int fused_gate_ = -1;  // FuseLowRankGate's weight, or -1
  HeadOutputGate output_;
  int o_;
};

}  // namespace

absl::StatusOr<DecoderSpec> BuildGla(const GlaConfig& config, Params& params) {
  const int hidden = config.base.hidden_size, groups = config.num_heads / config.num_kv_heads;
  const int k_dim = config.key_dim / groups;
  return BuildFlaDecoder(
      config.base, params, [&](const std::string& p) -> absl::StatusOr<std::unique_ptr<Mixer>> {
        LAIR_ASSIGN_OR_RETURN(ProjectionTriple qkv,
                              ProjectionTriple::DeclareQkv(params, p, config, config.conv, true));
        LAIR_ASSIGN_OR_RETURN(
            int gk0, params.AddMatrix(p + "gk_proj.0.weight", {config.gate_low_rank_dim, hidden}));
        LAIR_ASSIGN_OR_RETURN(
            int gk1, params.AddMatrix(p + "gk_proj.1.weight", {k_dim, config.gate_low_rank_dim}));
        LAIR_ASSIGN_OR_RETURN(int gk1_bias,
                              params.Add(p + "gk_proj.1.bias", {k_dim}, InitSpec::Zeros()));
        LAIR_ASSIGN_OR_RETURN(int o,
                              params.AddMatrix(p + "o_proj.weight", {hidden, config.value_dim}));
        LAIR_ASSIGN_OR_RETURN(HeadOutputGate output, HeadOutputGate::Declare(params, p, config));
        return std::make_unique<GlaMixer>(p, config, qkv, gk0, gk1, gk1_bias, output, o);
      });
}

}  // namespace lair::models
