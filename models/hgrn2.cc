// HGRN2 (fla `hgrn2`): a gated linear RNN with state expansion,
//   q = swish(q_proj x),  g = logsigmoid(f_proj x)  (layer 0), or, with the
//   layer's lower bound lb,  g = log(lb + (1 − lb) · σ(f_proj x)),
//   k = 1 − exp(g),  S_t = diag(exp g_t) S_{t-1} + k_t i_tᵀ,  o_t = K^-0.5 · S_tᵀ q_t,
// then o_proj(RMSNorm(o)). The lower bounds come from the model-level
// `model.lower_bounds` [L, D]: lb = cumsum(softmax over layers) − its first row.
#include <cmath>

#include "models/families.h"

namespace lair::models {
namespace {

using kernels::BinaryOp;
using kernels::UnaryOp;

class Hgrn2Mixer : public Mixer {
 public:
  Hgrn2Mixer(const Hgrn2Config& config, ProjectionTriple qfi, int norm, int o)
      : config_(config), qfi_(qfi), norm_(norm), o_(o) {}

  void DeclareState(const std::string& prefix, int, StateLayout* layout) const override {
    layout->tensors.push_back({prefix + "recurrent",
                               DType::kF32,
                               {config_.num_heads, config_.expand_ratio, config_.head_i_dim}});
    qfi_.DeclareState(prefix, layout);
  }

  absl::StatusOr<Var> Forward(Graph& g, const LinearInput& x,
                              const StepContext& ctx) const override {
    // q = silu(q_proj(x)), in the product.
    LAIR_ASSIGN_OR_RETURN(
        auto qfi, qfi_.Forward(g, x, ctx, 1, {}, {kernels::Activation{UnaryOp::kSilu}, {}, {}}));
    Var gate;
    if (ctx.layer_extra.t.defined()) {
      const Var& lb = ctx.layer_extra;  // [1, forget_dim]
      LAIR_ASSIGN_OR_RETURN(Var forget, g.Unary(UnaryOp::kSigmoid, qfi[1]));
      LAIR_ASSIGN_OR_RETURN(Var open, g.Unary(UnaryOp::kAffine, lb, -1.0f, 1.0f));
      LAIR_ASSIGN_OR_RETURN(Var scaled, g.Mul(forget, open));
      LAIR_ASSIGN_OR_RETURN(Var bounded, g.Add(scaled, lb));
      LAIR_ASSIGN_OR_RETURN(gate, g.Unary(UnaryOp::kLog, bounded));
    } else {
      LAIR_ASSIGN_OR_RETURN(gate, g.Unary(UnaryOp::kLogSigmoid, qfi[1]));
    }
    DecayInputs in;
    in.kind = kernels::DecayKind::kVector;
    in.scale = 1.0f / std::sqrt(static_cast<float>(config_.expand_ratio));
    const Var& q = qfi[0];
    LAIR_ASSIGN_OR_RETURN(Var k, g.Unary(UnaryOp::kExp, gate, -1.0f, 1.0f));
    in.q = SplitHeads(g, q, config_.num_heads);
    in.k = SplitHeads(g, k, config_.num_heads);
    in.v = SplitHeads(g, qfi[2], config_.num_heads);
    in.gk = SplitHeads(g, gate, config_.num_heads);
    LAIR_ASSIGN_OR_RETURN(Var o, g.Decay(ctx.batch, in, ctx.State(0), ctx.form));
    o = g.Reshape(o, {o.dim(0), o.dim(1) * o.dim(2)});
    return g.Linear(LinearInput::Normed(o, norm_, kernels::NormKind::kRms,
                                        static_cast<float>(config_.base.norm_eps)),
                    {o_}, x.x);
  }

  std::vector<int> InputProjections() const override { return qfi_.Weights(); }

 private:
  Hgrn2Config config_;
  ProjectionTriple qfi_;
  int norm_, o_;
};

}  // namespace

absl::StatusOr<DecoderSpec> BuildHgrn2(const Hgrn2Config& config, Params& params) {
  const int hidden = config.base.hidden_size, layers = config.base.num_layers;
  auto declare_mixer = [&](const std::string& p) -> absl::StatusOr<std::unique_ptr<Mixer>> {
    LAIR_ASSIGN_OR_RETURN(ProjectionTriple qfi,
                          ProjectionTriple::Declare(params, p, {"q", "f", "i"}, hidden,
                                                    {config.forget_dim, config.forget_dim, hidden},
                                                    config.conv, false));
    int norm = -1;
    if (config.elementwise_affine) {
      LAIR_ASSIGN_OR_RETURN(norm, params.Add(p + "g_norm.weight", {hidden}, InitSpec::Ones()));
    }
    LAIR_ASSIGN_OR_RETURN(int o, params.AddMatrix(p + "o_proj.weight", {hidden, hidden}));
    return std::make_unique<Hgrn2Mixer>(config, qfi, norm, o);
  };
  LAIR_ASSIGN_OR_RETURN(DecoderSpec spec, BuildFlaDecoder(config.base, params, declare_mixer));
  if (!config.use_lower_bound) return spec;

  LAIR_ASSIGN_OR_RETURN(
      int bounds, params.Add("model.lower_bounds", {layers, config.forget_dim}, InitSpec::Zeros()));
  // softmax over layers = exp(P) / (1ᵀ exp(P)); lbᵀ = softmaxᵀ Mᵀ with
  // M[i][j] = 1 for 1 ≤ j ≤ i (the cumulative sum minus the first row).
  Tensor ones = Tensor::Zeros(DType::kF32, {1, layers});
  Tensor cumsum = Tensor::Zeros(DType::kF32, {layers, layers});
  for (int i = 0; i < layers; ++i) {
    ones.f32()[i] = 1.0f;
    for (int j = 1; j <= i; ++j) cumsum.f32()[i * layers + j] = 1.0f;
  }
  LAIR_ASSIGN_OR_RETURN(Tensor ones_device, params.Constant(ones));
  LAIR_ASSIGN_OR_RETURN(Tensor cumsum_device, params.Constant(cumsum));
  spec.layer_extras = [bounds, layers, ones_device,
                       cumsum_device](Graph& g) -> absl::StatusOr<std::vector<Var>> {
    LAIR_ASSIGN_OR_RETURN(Var e, g.Unary(UnaryOp::kExp, g.Param(bounds)));
    LAIR_ASSIGN_OR_RETURN(Var total, g.MatMul(Graph::Constant(ones_device), e, false, false));
    LAIR_ASSIGN_OR_RETURN(Var p, g.Binary(BinaryOp::kDiv, e, total));
    LAIR_ASSIGN_OR_RETURN(Var lb_t, g.MatMul(p, Graph::Constant(cumsum_device), true, true));
    std::vector<Var> extras(layers);  // layer 0 has no lower bound
    for (int i = 1; i < layers; ++i) {
      LAIR_ASSIGN_OR_RETURN(Var column, g.Columns(lb_t, i, 1));
      extras[i] = g.Reshape(column, {1, column.dim(0)});
    }
    return extras;
  };
  return spec;
}

}  // namespace lair::models
