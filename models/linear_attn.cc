// Linear attention (fla `linear_attn`): q, k through a feature map φ
// (elementwise_product: layer1(x) ⊙ layer2(x), elu + 1, relu or identity),
//   S_t = S_{t-1} + k_t v_tᵀ,  o_t = K^-0.5 · S_tᵀ q_t,
// then a per-head RMSNorm and o_proj.
#include <cmath>

#include "models/families.h"

namespace lair::models {
namespace {

using kernels::UnaryOp;

// The trainable Hadamard map: two head_dim × head_dim linear layers with bias.
struct Hadamard {
  int w1 = -1, b1 = -1, w2 = -1, b2 = -1;

  static absl::StatusOr<Hadamard> Declare(Params& params, const std::string& prefix, int dim) {
    Hadamard h;
    LAIR_ASSIGN_OR_RETURN(h.w1, params.AddMatrix(prefix + ".layer1.weight", {dim, dim}));
    LAIR_ASSIGN_OR_RETURN(h.b1, params.Add(prefix + ".layer1.bias", {dim}, InitSpec::Zeros()));
    LAIR_ASSIGN_OR_RETURN(h.w2, params.AddMatrix(prefix + ".layer2.weight", {dim, dim}));
    LAIR_ASSIGN_OR_RETURN(h.b2, params.Add(prefix + ".layer2.bias", {dim}, InitSpec::Zeros()));
    return h;
  }
};

class LinearAttnMixer : public Mixer {
 public:
  LinearAttnMixer(const LinearAttnConfig& config, ProjectionTriple qkv, Hadamard map_q,
                  Hadamard map_k, int norm, int o)
      : config_(config), qkv_(qkv), map_q_(map_q), map_k_(map_k), norm_(norm), o_(o) {}

  void DeclareState(const std::string& prefix, int, StateLayout* layout) const override {
    layout->tensors.push_back({prefix + "recurrent",
                               DType::kF32,
                               {config_.num_heads, config_.head_k_dim, config_.head_v_dim}});
  }

  absl::StatusOr<Var> Forward(Graph& g, const LinearInput& x,
                              const StepContext& ctx) const override {
    const int groups = config_.num_heads / config_.num_kv_heads;
    LAIR_ASSIGN_OR_RETURN(auto qkv, qkv_.Forward(g, x, ctx, 1));
    DecayInputs in;
    in.kind = kernels::DecayKind::kNone;
    in.scale = 1.0f / std::sqrt(static_cast<float>(config_.head_k_dim));
    LAIR_ASSIGN_OR_RETURN(in.q, FeatureMap(g, map_q_, SplitHeads(g, qkv[0], config_.num_heads)));
    LAIR_ASSIGN_OR_RETURN(Var k,
                          FeatureMap(g, map_k_, SplitHeads(g, qkv[1], config_.num_kv_heads)));
    LAIR_ASSIGN_OR_RETURN(in.k, RepeatKvHeads(g, k, groups));
    LAIR_ASSIGN_OR_RETURN(in.v,
                          RepeatKvHeads(g, SplitHeads(g, qkv[2], config_.num_kv_heads), groups));
    LAIR_ASSIGN_OR_RETURN(Var o, g.Decay(ctx.batch, in, ctx.State(0), ctx.form));
    LAIR_ASSIGN_OR_RETURN(
        o, g.Norm(o, norm_, kernels::NormKind::kRms, static_cast<float>(config_.base.norm_eps)));
    return g.Linear(LinearInput{g.Reshape(o, {o.dim(0), o.dim(1) * o.dim(2)})}, {o_}, x.x);
  }

  std::vector<int> InputProjections() const override { return qkv_.Weights(); }

 private:
  absl::StatusOr<Var> FeatureMap(Graph& g, const Hadamard& map, const Var& x) const {
    const std::string& kind = config_.feature_map;
    if (kind == "elementwise_product") {
      const LinearWeight both[] = {{map.w1, map.b1}, {map.w2, map.b2}};
      LAIR_ASSIGN_OR_RETURN(std::vector<Var> ab, g.Linears(x, both));
      return g.Mul(ab[0], ab[1]);
    }
    if (kind == "elu") return g.Unary(UnaryOp::kEluPlusOne, x);
    if (kind == "relu") return g.Unary(UnaryOp::kRelu, x);
    return x;  // identity
  }

  LinearAttnConfig config_;
  ProjectionTriple qkv_;
  Hadamard map_q_, map_k_;
  int norm_, o_;
};

}  // namespace

absl::StatusOr<DecoderSpec> BuildLinearAttn(const LinearAttnConfig& config, Params& params) {
  const int hidden = config.base.hidden_size;
  return BuildFlaDecoder(
      config.base, params, [&](const std::string& p) -> absl::StatusOr<std::unique_ptr<Mixer>> {
        LAIR_ASSIGN_OR_RETURN(
            ProjectionTriple qkv,
            ProjectionTriple::DeclareQkv(params, p, config, ShortConvConfig{}, false));
        Hadamard map_q, map_k;
        if (config.feature_map == "elementwise_product") {
          LAIR_ASSIGN_OR_RETURN(map_q,
                                Hadamard::Declare(params, p + "feature_map_q", config.head_k_dim));
          map_k = map_q;
          if (!config.tie_feature_map_qk) {
            LAIR_ASSIGN_OR_RETURN(
                map_k, Hadamard::Declare(params, p + "feature_map_k", config.head_k_dim));
          }
        }
        int norm = -1;
        if (config.elementwise_affine) {
          LAIR_ASSIGN_OR_RETURN(
              norm, params.Add(p + "norm.weight", {config.head_v_dim}, InitSpec::Ones()));
        }
        LAIR_ASSIGN_OR_RETURN(int o,
                              params.AddMatrix(p + "o_proj.weight", {hidden, config.value_dim}));
        return std::make_unique<LinearAttnMixer>(config, qkv, map_q, map_k, norm, o);
      });
}

}  // namespace lair::models
