#include "models/families.h"

#include <variant>

#include "absl/strings/str_cat.h"

namespace lair::models {

absl::StatusOr<DecoderSpec> BuildDecoderSpec(const ModelConfig& config, Params& params) {
  struct Visitor {
    Params& params;
    absl::StatusOr<DecoderSpec> operator()(const GlaConfig& c) { return BuildGla(c, params); }
    absl::StatusOr<DecoderSpec> operator()(const GsaConfig& c) { return BuildGsa(c, params); }
    absl::StatusOr<DecoderSpec> operator()(const LinearAttnConfig& c) {
      return BuildLinearAttn(c, params);
    }
    absl::StatusOr<DecoderSpec> operator()(const RetNetConfig& c) { return BuildRetNet(c, params); }
    absl::StatusOr<DecoderSpec> operator()(const Hgrn2Config& c) { return BuildHgrn2(c, params); }
    absl::StatusOr<DecoderSpec> operator()(const Mamba2Config& c) { return BuildMamba2(c, params); }
    absl::StatusOr<DecoderSpec> operator()(const XlstmConfig& c) { return BuildXlstm(c, params); }
    absl::StatusOr<DecoderSpec> operator()(const LlamaConfig& c) { return BuildLlama(c, params); }
  };
  return std::visit(Visitor{params}, config);
}

namespace {

SkeletonNames FlaSkeletonNames() {
  SkeletonNames names;
  names.embedding = "model.embeddings.weight";
  names.layer = "model.layers.{i}.";
  names.mixer_norm = "attn_norm.weight";
  names.mlp_norm = "mlp_norm.weight";
  names.mlp_gate = "mlp.gate_proj.weight";
  names.mlp_up = "mlp.up_proj.weight";
  names.mlp_down = "mlp.down_proj.weight";
  names.final_norm = "model.norm.weight";
  return names;
}

}  // namespace

absl::StatusOr<DecoderSpec> BuildFlaDecoder(const DecoderConfig& base, Params& params,
                                            const DeclareMixer& declare_mixer) {
  const SkeletonNames names = FlaSkeletonNames();
  LAIR_ASSIGN_OR_RETURN(DecoderSpec spec, DeclareSkeleton(base, names, params));
  for (int i = 0; i < base.num_layers; ++i) {
    LAIR_ASSIGN_OR_RETURN(spec.layers[i].mixer, declare_mixer(LayerPrefix(names, i) + "attn."));
  }
  return spec;
}

Var SplitHeads(Graph& g, const Var& x, int heads) {
  return g.Reshape(x, {x.dim(0), heads, x.dim(-1) / heads});
}

absl::StatusOr<Var> RepeatKvHeads(Graph& g, const Var& x, int groups) {
  if (groups == 1) return x;
  int64_t n = x.dim(0), kv = x.dim(1), d = x.dim(2);
  LAIR_ASSIGN_OR_RETURN(Var repeated, g.Expand(g.Reshape(x, {n, kv, 1, d}), {n, kv, groups, d}));
  return g.Reshape(repeated, {n, kv * groups, d});
}

absl::StatusOr<ShortConv> ShortConv::Declare(Params& params, const std::string& prefix,
                                             int channels, const ShortConvConfig& config,
                                             bool silu) {
  ShortConv conv;
  conv.channels = channels;
  conv.width = config.size;
  conv.silu = silu;
  LAIR_ASSIGN_OR_RETURN(
      conv.weight, params.Add(prefix + ".weight", {channels, 1, config.size}, InitSpec::Normal()));
  return conv;
}

void ShortConv::DeclareState(const std::string& name, StateLayout* layout) const {
  layout->tensors.push_back({name, DType::kF32, {channels, width - 1}});
}

absl::StatusOr<Var> ShortConv::Forward(Graph& g, const Var& x, const StepContext& ctx,
                                       int state_index) const {
  Var x2 = g.Reshape(x, {x.dim(0), channels});
  LAIR_ASSIGN_OR_RETURN(
      Var y, g.Conv1d(ctx.batch, x2, weight, /*bias_id=*/-1, silu, ctx.State(state_index)));
  return g.Reshape(y, x.shape());
}

absl::StatusOr<ProjectionTriple> ProjectionTriple::Declare(
    Params& params, const std::string& prefix, const std::array<std::string, 3>& names, int hidden,
    const std::array<int, 3>& dims, const ShortConvConfig& config, bool conv_silu) {
  ProjectionTriple t;
  t.use_conv = config.use;
  for (int i = 0; i < 3; ++i) {
    LAIR_ASSIGN_OR_RETURN(t.proj[i],
                          params.AddMatrix(prefix + names[i] + "_proj.weight", {dims[i], hidden}));
    if (t.use_conv) {
      LAIR_ASSIGN_OR_RETURN(t.conv[i], ShortConv::Declare(params, prefix + names[i] + "_conv1d",
                                                          dims[i], config, conv_silu));
    }
  }
  return t;
}

void ProjectionTriple::DeclareState(const std::string& prefix, StateLayout* layout) const {
  if (!use_conv) return;
  for (int i = 0; i < 3; ++i) conv[i].DeclareState(absl::StrCat(prefix, "conv", i), layout);
}

absl::StatusOr<std::vector<Var>> ProjectionTriple::Forward(
    Graph& g, const LinearInput& x, const StepContext& ctx, int first_state,
    std::span<const LinearWeight> also, const std::array<kernels::Activation, 3>& activations,
    bool to_mixer) const {
  // (A decode step's q, k, v stay fp32: the step kernel reads them once.)
  const bool sixteen_bit = to_mixer && !use_conv && ctx.batch.max_seqlen > 1;
  std::vector<LinearWeight> weights;
  weights.reserve(3 + also.size());
  for (int i = 0; i < 3; ++i) {
    weights.push_back(
        {proj[i], -1, use_conv ? kernels::Activation{} : activations[i], sixteen_bit});
  }
  weights.insert(weights.end(), also.begin(), also.end());
  LAIR_ASSIGN_OR_RETURN(std::vector<Var> out, g.Linears(x, weights));
  for (int i = 0; use_conv && i < 3; ++i) {
    LAIR_ASSIGN_OR_RETURN(out[i], conv[i].Forward(g, out[i], ctx, first_state + i));
    const kernels::Activation& act = activations[i];
    if (act.identity()) continue;
    LAIR_ASSIGN_OR_RETURN(out[i], g.Unary(act.op, out[i], act.alpha, act.beta, act.in_scale));
  }
  return out;
}

absl::StatusOr<HeadOutputGate> HeadOutputGate::Declare(Params& params, const std::string& prefix,
                                                       int hidden, int value_dim, int head_v_dim,
                                                       bool use_output_gate, bool fuse_norm,
                                                       bool elementwise_affine, double eps) {
  HeadOutputGate out;
  out.eps = static_cast<float>(eps);
  if (use_output_gate) {
    LAIR_ASSIGN_OR_RETURN(out.gate,
                          params.AddMatrix(prefix + "g_proj.weight", {value_dim, hidden}));
  }
  if (elementwise_affine) {
    std::string name = fuse_norm && use_output_gate ? "g_norm_swish_gate.weight" : "g_norm.weight";
    LAIR_ASSIGN_OR_RETURN(out.norm, params.Add(prefix + name, {head_v_dim}, InitSpec::Ones()));
  }
  return out;
}

LinearInput HeadOutputGate::Input(Graph& g, const Var& gate_proj, const Var& o) const {
  LinearInput in;
  in.x = g.Reshape(o, {o.dim(0), o.dim(1) * o.dim(2)});
  in.kind = LinearInput::Kind::kNorm;
  in.eps = eps;
  in.group_size = static_cast<int>(o.dim(2));
  in.norm_weight = norm;
  if (gate >= 0) {
    in.gate_mode = kernels::NormGate::kAfter;
    in.gate = gate_proj;
  }
  return in;
}

std::vector<int> WithWeights(std::vector<int> first, std::span<const LinearWeight> products) {
  for (const LinearWeight& w : products) first.push_back(w.weight);
  return first;
}

absl::StatusOr<kernels::Activation> ActivationNamed(const std::string& name) {
  if (name.empty()) return kernels::Activation{};
  if (name == "relu") return kernels::Activation{kernels::UnaryOp::kRelu};
  if (name == "sigmoid") return kernels::Activation{kernels::UnaryOp::kSigmoid};
  if (name == "silu" || name == "swish") return kernels::Activation{kernels::UnaryOp::kSilu};
  return absl::InvalidArgumentError(absl::StrCat("unsupported activation '", name, "'"));
}

}  // namespace lair::models
