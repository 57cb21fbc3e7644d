// RetNet (fla `retnet`, MultiScaleRetention): a constant per-head decay
// γ_h = 1 − 2^(−5−h), rotary positions on q and k,
//   S_t = γ_h S_{t-1} + k_t v_tᵀ,  o_t = K^-0.5 · S_tᵀ q_t,
// then a per-head RMSNorm gated by swish(g_proj(x)) and o_proj.
#include <cmath>

#include "models/families.h"

namespace lair::models {
namespace {

class RetentionMixer : public Mixer {
 public:
  RetentionMixer(const RetNetConfig& config, ProjectionTriple qkv, Tensor log_gamma,
                 HeadOutputGate output, int o)
      : config_(config), qkv_(qkv), log_gamma_(std::move(log_gamma)), output_(output), o_(o) {}

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
    LAIR_ASSIGN_OR_RETURN(std::vector<Var> qkv, qkv_.Forward(g, x, ctx, 1, output_.Projections(),
                                                             {feature, feature, {}}));
    const Var q = SplitHeads(g, qkv[0], config_.num_heads);
    Var k = SplitHeads(g, qkv[1], config_.num_kv_heads);
    DecayInputs in;
    in.kind = kernels::DecayKind::kConstant;
    in.scale = 1.0f / std::sqrt(static_cast<float>(config_.head_k_dim));
    in.log_gamma = log_gamma_;
    in.sixteen_bit_o_ok = true;  // read only by the output norm, in o_proj
    LAIR_ASSIGN_OR_RETURN(in.q, g.Rotary(q, ctx.positions, config_.head_k_dim, 10000.0f));
    LAIR_ASSIGN_OR_RETURN(k, g.Rotary(k, ctx.positions, config_.head_k_dim, 10000.0f));
    LAIR_ASSIGN_OR_RETURN(in.k, RepeatKvHeads(g, k, groups));
    LAIR_ASSIGN_OR_RETURN(in.v,
                          RepeatKvHeads(g, SplitHeads(g, qkv[2], config_.num_kv_heads), groups));
    LAIR_ASSIGN_OR_RETURN(Var o, g.Decay(ctx.batch, in, ctx.State(0), ctx.form));
    return g.Linear(output_.Input(g, qkv.size() > 3 ? qkv[3] : Var{}, o), {o_}, x.x);
  }

  std::vector<int> InputProjections() const override {
    return WithWeights(qkv_.Weights(), output_.Projections());
  }

 private:
  RetNetConfig config_;
  ProjectionTriple qkv_;
  Tensor log_gamma_;  // [H] device
  HeadOutputGate output_;
  int o_;
};

}  // namespace

absl::StatusOr<DecoderSpec> BuildRetNet(const RetNetConfig& config, Params& params) {
  const int hidden = config.base.hidden_size;
  // fla computes the decays in fp32: log(1 − 2^(−5 − h)).
  Tensor gamma = Tensor::Zeros(DType::kF32, {config.num_heads});
  for (int h = 0; h < config.num_heads; ++h) {
    gamma.f32()[h] = std::log(1.0f - std::pow(2.0f, -5.0f - static_cast<float>(h)));
  }
  LAIR_ASSIGN_OR_RETURN(Tensor log_gamma, params.Constant(gamma));
  return BuildFlaDecoder(
      config.base, params, [&](const std::string& p) -> absl::StatusOr<std::unique_ptr<Mixer>> {
        LAIR_ASSIGN_OR_RETURN(
            ProjectionTriple qkv,
            ProjectionTriple::DeclareQkv(params, p, config, ShortConvConfig{}, false));
        LAIR_ASSIGN_OR_RETURN(int o,
                              params.AddMatrix(p + "o_proj.weight", {hidden, config.value_dim}));
        LAIR_ASSIGN_OR_RETURN(HeadOutputGate output, HeadOutputGate::Declare(params, p, config));
        return std::make_unique<RetentionMixer>(config, qkv, log_gamma, output, o);
      });
}

}  // namespace lair::models
