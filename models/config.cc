#include "models/config.h"

#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace lair::models {
namespace {

absl::Status Positive(const ConfigReader& r, std::string_view field, double value) {
  if (value > 0) return absl::OkStatus();
  return r.FieldError(field, absl::StrCat("must be positive, got ", value));
}

absl::Status Divides(const ConfigReader& r, std::string_view field, int divisor, int value,
                     std::string_view what) {
  if (divisor > 0 && value % divisor == 0) return absl::OkStatus();
  return r.FieldError(field, absl::StrCat(divisor, " must divide ", std::string(what), " ", value));
}

// Refuses a field whose value is not the one LAIR implements.
template <typename T>
absl::Status Require(const ConfigReader& r, std::string_view field, absl::StatusOr<T> value,
                     T wanted, std::string_view why) {
  if (!value.ok()) return value.status();
  if (*value == wanted) return absl::OkStatus();
  return r.FieldError(field, std::string(why));
}

// hidden · expand as fla computes it (int() truncation), checked integral.
absl::StatusOr<int> Expanded(const ConfigReader& r, std::string_view field, int hidden,
                             double def) {
  LAIR_ASSIGN_OR_RETURN(double expand, r.Float(field, def));
  LAIR_RETURN_IF_ERROR(Positive(r, field, expand));
  double dim = hidden * expand;
  if (std::fabs(dim - std::round(dim)) > 1e-6) {
    return r.FieldError(field, absl::StrCat("hidden_size · ", expand, " is not an integer"));
  }
  return static_cast<int>(std::round(dim));
}

// fla's GatedMLP width: intermediate_size, else hidden·hidden_ratio·2/3
// rounded up to a multiple of 256.
absl::StatusOr<int> FlaMlpWidth(const ConfigReader& r, int hidden, int default_ratio) {
  LAIR_ASSIGN_OR_RETURN(std::optional<int> explicit_size, r.OptionalInt("intermediate_size"));
  if (explicit_size) {
    LAIR_RETURN_IF_ERROR(Positive(r, "intermediate_size", *explicit_size));
    return *explicit_size;
  }
  LAIR_ASSIGN_OR_RETURN(int ratio, r.Int("hidden_ratio", default_ratio));
  LAIR_RETURN_IF_ERROR(Positive(r, "hidden_ratio", ratio));
  int width = static_cast<int>(hidden * ratio * 2.0 / 3.0);
  return 256 * ((width + 255) / 256);
}

// The fields every fla causal LM shares (embedding, norms, MLP, head).
absl::StatusOr<DecoderConfig> ParseFlaBase(const ConfigReader& r, int default_hidden_ratio,
                                           bool has_mlp) {
  DecoderConfig c;
  LAIR_ASSIGN_OR_RETURN(c.model_type, r.String("model_type"));
  LAIR_ASSIGN_OR_RETURN(c.vocab_size, r.Int("vocab_size", 32000));
  LAIR_ASSIGN_OR_RETURN(c.hidden_size, r.Int("hidden_size", 2048));
  LAIR_ASSIGN_OR_RETURN(c.num_layers, r.Int("num_hidden_layers", 24));
  LAIR_ASSIGN_OR_RETURN(c.norm_eps, r.Float("norm_eps", 1e-6));
  LAIR_ASSIGN_OR_RETURN(c.tie_word_embeddings, r.Bool("tie_word_embeddings", false));
  LAIR_ASSIGN_OR_RETURN(c.initializer_range, r.Float("initializer_range", 0.02));
  LAIR_RETURN_IF_ERROR(Positive(r, "vocab_size", c.vocab_size));
  LAIR_RETURN_IF_ERROR(Positive(r, "hidden_size", c.hidden_size));
  LAIR_RETURN_IF_ERROR(Positive(r, "num_hidden_layers", c.num_layers));
  LAIR_RETURN_IF_ERROR(Positive(r, "norm_eps", c.norm_eps));
  if (has_mlp) {
    LAIR_ASSIGN_OR_RETURN(c.intermediate_size, FlaMlpWidth(r, c.hidden_size, default_hidden_ratio));
    LAIR_ASSIGN_OR_RETURN(std::string act, r.String("hidden_act", "swish"));
    if (act != "swish" && act != "silu") {
      return r.FieldError("hidden_act",
                          absl::StrCat("only swish/silu MLPs are supported, got '", act, "'"));
    }
  }
  if (r.Has("attn")) {
    return r.FieldError("attn", "hybrid layers with softmax attention are not supported");
  }
  LAIR_RETURN_IF_ERROR(Require(r, "use_l2warp", r.Bool("use_l2warp", false), false,
                               "l2warp changes the training loss and is not supported"));
  return c;
}

absl::Status ParseShortConv(const ConfigReader& r, ShortConvConfig* conv) {
  LAIR_ASSIGN_OR_RETURN(conv->use, r.Bool("use_short_conv", false));
  LAIR_ASSIGN_OR_RETURN(conv->size, r.Int("conv_size", 4));
  return Positive(r, "conv_size", conv->size);
}

// The head layout the GLA, GSA, linear-attention and RetNet configs share:
// key_dim = hidden·expand_k and value_dim = hidden·expand_v (defaults
// `expand_k`, `expand_v`), num_heads / num_kv_heads, and the per-head
// dimensions.
template <typename Config>
absl::Status ParseHeads(const ConfigReader& r, double expand_k, double expand_v, int default_heads,
                        Config* c) {
  LAIR_ASSIGN_OR_RETURN(c->key_dim, Expanded(r, "expand_k", c->base.hidden_size, expand_k));
  LAIR_ASSIGN_OR_RETURN(c->value_dim, Expanded(r, "expand_v", c->base.hidden_size, expand_v));
  LAIR_ASSIGN_OR_RETURN(c->num_heads, r.Int("num_heads", default_heads));
  LAIR_RETURN_IF_ERROR(Positive(r, "num_heads", c->num_heads));
  LAIR_ASSIGN_OR_RETURN(std::optional<int> kv, r.OptionalInt("num_kv_heads"));
  c->num_kv_heads = kv.value_or(c->num_heads);
  LAIR_RETURN_IF_ERROR(Divides(r, "num_kv_heads", c->num_kv_heads, c->num_heads, "num_heads"));
  LAIR_RETURN_IF_ERROR(Divides(r, "num_heads", c->num_heads, c->key_dim, "the key dimension"));
  LAIR_RETURN_IF_ERROR(Divides(r, "num_heads", c->num_heads, c->value_dim, "the value dimension"));
  c->head_k_dim = c->key_dim / c->num_heads;
  c->head_v_dim = c->value_dim / c->num_heads;
  return absl::OkStatus();
}

absl::StatusOr<std::string> FeatureMap(const ConfigReader& r,
                                       std::initializer_list<std::string_view> choices) {
  LAIR_ASSIGN_OR_RETURN(std::optional<std::string> map, r.OptionalString("feature_map"));
  if (!map) return std::string();
  for (std::string_view choice : choices) {
    if (*map == choice) return *map;
  }
  std::string supported;
  for (std::string_view choice : choices)
    absl::StrAppend(&supported, supported.empty() ? "" : ", ", std::string(choice));
  return r.FieldError("feature_map",
                      absl::StrCat("'", *map, "' is not supported (supported: ", supported, ")"));
}

absl::StatusOr<ModelConfig> ParseGla(const ConfigReader& r) {
  GlaConfig c;
  LAIR_ASSIGN_OR_RETURN(c.base, ParseFlaBase(r, 4, true));
  LAIR_RETURN_IF_ERROR(ParseHeads(r, 0.5, 1.0, 4, &c));
  LAIR_ASSIGN_OR_RETURN(c.feature_map, FeatureMap(r, {"relu", "sigmoid", "silu", "swish"}));
  LAIR_RETURN_IF_ERROR(ParseShortConv(r, &c.conv));
  LAIR_ASSIGN_OR_RETURN(c.use_output_gate, r.Bool("use_output_gate", true));
  LAIR_ASSIGN_OR_RETURN(c.fuse_norm, r.Bool("fuse_norm", true));
  LAIR_ASSIGN_OR_RETURN(c.elementwise_affine, r.Bool("elementwise_affine", true));
  LAIR_ASSIGN_OR_RETURN(c.gate_logit_normalizer, r.Int("gate_logit_normalizer", 16));
  LAIR_ASSIGN_OR_RETURN(c.gate_low_rank_dim, r.Int("gate_low_rank_dim", 16));
  LAIR_ASSIGN_OR_RETURN(c.clamp_min, r.OptionalFloat("clamp_min"));
  LAIR_RETURN_IF_ERROR(Positive(r, "gate_logit_normalizer", c.gate_logit_normalizer));
  LAIR_RETURN_IF_ERROR(Positive(r, "gate_low_rank_dim", c.gate_low_rank_dim));
  if (c.clamp_min) return r.FieldError("clamp_min", "gate clamping is not supported");
  LAIR_RETURN_IF_ERROR(Require(r, "use_gk", r.Bool("use_gk", true), true,
                               "only the key-side gate (use_gk=true) is supported"));
  LAIR_RETURN_IF_ERROR(Require(r, "use_gv", r.Bool("use_gv", false), false,
                               "the value-side gate (use_gv) is not supported"));
  return c;
}

absl::StatusOr<ModelConfig> ParseGsa(const ConfigReader& r) {
  GsaConfig c;
  LAIR_ASSIGN_OR_RETURN(c.base, ParseFlaBase(r, 4, true));
  LAIR_RETURN_IF_ERROR(ParseHeads(r, 1.0, 1.0, 4, &c));
  LAIR_ASSIGN_OR_RETURN(c.num_slots, r.Int("num_slots", 64));
  LAIR_RETURN_IF_ERROR(Positive(r, "num_slots", c.num_slots));
  LAIR_ASSIGN_OR_RETURN(c.feature_map, r.OneOf("feature_map", {"swish", "relu"}, "swish"));
  LAIR_RETURN_IF_ERROR(ParseShortConv(r, &c.conv));
  LAIR_ASSIGN_OR_RETURN(c.elementwise_affine, r.Bool("elementwise_affine", true));
  LAIR_ASSIGN_OR_RETURN(c.gate_logit_normalizer, r.Int("gate_logit_normalizer", 8));
  LAIR_RETURN_IF_ERROR(Positive(r, "gate_logit_normalizer", c.gate_logit_normalizer));
  LAIR_ASSIGN_OR_RETURN(c.scale, r.Float("scale", 1.0));
  if (c.value_dim != c.base.hidden_size) {
    return r.FieldError("expand_v", "the output norm spans hidden_size, so expand_v must be 1");
  }
  LAIR_RETURN_IF_ERROR(Require(r, "use_output_gate", r.Bool("use_output_gate", false), false,
                               "the output gate is not supported (the reference ignores it too)"));
  return c;
}

absl::StatusOr<ModelConfig> ParseLinearAttn(const ConfigReader& r) {
  LinearAttnConfig c;
  LAIR_ASSIGN_OR_RETURN(c.base, ParseFlaBase(r, 4, true));
  LAIR_RETURN_IF_ERROR(ParseHeads(r, 1.0, 1.0, 4, &c));
  LAIR_ASSIGN_OR_RETURN(c.feature_map,
                        r.OneOf("feature_map", {"elementwise_product", "elu", "relu", "identity"},
                                "elementwise_product"));
  LAIR_ASSIGN_OR_RETURN(c.tie_feature_map_qk, r.Bool("tie_feature_map_qk", false));
  LAIR_ASSIGN_OR_RETURN(c.norm_q, r.Bool("norm_q", false));
  LAIR_ASSIGN_OR_RETURN(c.norm_k, r.Bool("norm_k", false));
  LAIR_ASSIGN_OR_RETURN(c.elementwise_affine, r.Bool("elementwise_affine", true));
  if (c.norm_q || c.norm_k) {
    return r.FieldError(c.norm_q ? "norm_q" : "norm_k", "sum-normalized q/k are not supported");
  }
  LAIR_RETURN_IF_ERROR(Require(r, "norm_feature_map", r.Bool("norm_feature_map", false), false,
                               "normalized linear attention output is not supported"));
  LAIR_RETURN_IF_ERROR(Require(r, "output_norm", r.String("output_norm", "rmsnorm"),
                               std::string("rmsnorm"),
                               "only the rmsnorm output norm is supported"));
  return c;
}

absl::StatusOr<ModelConfig> ParseRetNet(const ConfigReader& r) {
  RetNetConfig c;
  LAIR_ASSIGN_OR_RETURN(c.base, ParseFlaBase(r, 2, true));
  LAIR_RETURN_IF_ERROR(ParseHeads(r, 1.0, 2.0, 8, &c));
  LAIR_ASSIGN_OR_RETURN(c.feature_map, FeatureMap(r, {"relu", "sigmoid", "silu", "swish"}));
  LAIR_ASSIGN_OR_RETURN(c.use_output_gate, r.Bool("use_output_gate", true));
  LAIR_ASSIGN_OR_RETURN(c.fuse_norm, r.Bool("fuse_norm", true));
  LAIR_ASSIGN_OR_RETURN(c.elementwise_affine, r.Bool("elementwise_affine", true));
  if (c.head_k_dim % 2 != 0)
    return r.FieldError("expand_k", "the rotary head dimension must be even");
  return c;
}

absl::StatusOr<ModelConfig> ParseHgrn2(const ConfigReader& r) {
  Hgrn2Config c;
  LAIR_ASSIGN_OR_RETURN(c.base, ParseFlaBase(r, 4, true));
  LAIR_ASSIGN_OR_RETURN(std::optional<int> ratio, r.OptionalInt("expand_ratio"));
  if (!r.json().contains("expand_ratio")) ratio = 128;
  int hidden = c.base.hidden_size;
  if (ratio) {
    LAIR_RETURN_IF_ERROR(Positive(r, "expand_ratio", *ratio));
    LAIR_RETURN_IF_ERROR(Divides(r, "expand_ratio", *ratio, hidden, "hidden_size"));
    c.expand_ratio = *ratio;
    c.num_heads = hidden / *ratio;  // the reference ignores num_heads here
  } else {
    LAIR_ASSIGN_OR_RETURN(c.num_heads, r.Int("num_heads"));
    LAIR_RETURN_IF_ERROR(Divides(r, "num_heads", c.num_heads, hidden, "hidden_size"));
    c.expand_ratio = hidden / c.num_heads;
  }
  c.forget_dim = c.num_heads * c.expand_ratio;
  c.head_i_dim = hidden / c.num_heads;
  LAIR_RETURN_IF_ERROR(ParseShortConv(r, &c.conv));
  LAIR_ASSIGN_OR_RETURN(c.use_lower_bound, r.Bool("use_lower_bound", true));
  LAIR_ASSIGN_OR_RETURN(c.elementwise_affine, r.Bool("elementwise_affine", true));
  return c;
}

// True when `value` is +infinity as Python's json writes it: a number too
// large for a double, the string "Infinity", or {"__float__": "Infinity"}.
bool IsInfinity(const nlohmann::json& value) {
  if (value.is_number()) return std::isinf(value.get<double>()) || value.get<double>() > 1e300;
  if (value.is_string())
    return value.get<std::string>() == "Infinity" || value.get<std::string>() == "inf";
  if (value.is_object() && value.contains("__float__")) return IsInfinity(value["__float__"]);
  return false;
}

absl::StatusOr<ModelConfig> ParseMamba2(const ConfigReader& r) {
  Mamba2Config c;
  LAIR_ASSIGN_OR_RETURN(c.base, ParseFlaBase(r, 4, false));
  if (!r.Has("norm_eps")) c.base.norm_eps = 1e-5;
  LAIR_ASSIGN_OR_RETURN(c.num_heads, r.Int("num_heads", 64));
  LAIR_ASSIGN_OR_RETURN(c.head_dim, r.Int("head_dim", 64));
  LAIR_ASSIGN_OR_RETURN(c.state_size, r.Int("state_size", 128));
  LAIR_ASSIGN_OR_RETURN(c.expand, r.Int("expand", 2));
  LAIR_ASSIGN_OR_RETURN(c.n_groups, r.Int("n_groups", 1));
  LAIR_ASSIGN_OR_RETURN(c.conv_kernel, r.Int("conv_kernel", 4));
  LAIR_ASSIGN_OR_RETURN(c.use_conv_bias, r.Bool("use_conv_bias", true));
  LAIR_ASSIGN_OR_RETURN(c.use_bias, r.Bool("use_bias", false));
  for (auto [field, value] : {std::pair<std::string_view, int>{"num_heads", c.num_heads},
                              {"head_dim", c.head_dim},
                              {"state_size", c.state_size},
                              {"expand", c.expand},
                              {"n_groups", c.n_groups},
                              {"conv_kernel", c.conv_kernel}}) {
    LAIR_RETURN_IF_ERROR(Positive(r, field, value));
  }
  c.intermediate_size = c.expand * c.base.hidden_size;
  if (c.num_heads * c.head_dim != c.intermediate_size) {
    return r.FieldError("head_dim",
                        absl::StrCat("num_heads · head_dim must equal expand · hidden_size = ",
                                     c.intermediate_size));
  }
  LAIR_RETURN_IF_ERROR(Divides(r, "n_groups", c.n_groups, c.num_heads, "num_heads"));
  c.conv_dim = c.intermediate_size + 2 * c.n_groups * c.state_size;
  LAIR_RETURN_IF_ERROR(Require(r, "hidden_act", r.String("hidden_act", "silu"), std::string("silu"),
                               "only the silu convolution activation is supported"));
  LAIR_RETURN_IF_ERROR(Require(r, "rmsnorm", r.Bool("rmsnorm", true), true,
                               "the gated RMSNorm cannot be turned off"));
  LAIR_RETURN_IF_ERROR(Require(r, "norm_before_gate", r.Bool("norm_before_gate", false), false,
                               "only norm_before_gate=false (the reference layer's) is supported"));
  LAIR_RETURN_IF_ERROR(Require(r, "D_has_hdim", r.Bool("D_has_hdim", false), false,
                               "a per-channel D is not supported"));
  for (const char* field : {"dt_limit", "time_step_limit"}) {
    if (!r.Has(field)) continue;
    const nlohmann::json& limit = r.json()[field];
    bool default_limit = limit.is_array() && limit.size() == 2 && limit[0].is_number() &&
                         limit[0].get<double>() == 0.0 && IsInfinity(limit[1]);
    if (!default_limit)
      return r.FieldError(field, "only the unclamped time step (0, inf) is supported");
  }
  return c;
}

absl::StatusOr<ModelConfig> ParseXlstm(const ConfigReader& r) {
  XlstmConfig c;
  DecoderConfig& b = c.base;
  LAIR_ASSIGN_OR_RETURN(b.model_type, r.String("model_type"));
  LAIR_ASSIGN_OR_RETURN(b.vocab_size, r.Int("vocab_size", 50304));
  LAIR_ASSIGN_OR_RETURN(b.hidden_size, r.Int("hidden_size", 4096));
  LAIR_ASSIGN_OR_RETURN(int layers, r.Int("num_hidden_layers", 32));
  LAIR_ASSIGN_OR_RETURN(b.num_layers, r.Int("num_blocks", layers));
  LAIR_ASSIGN_OR_RETURN(int embedding_dim, r.Int("embedding_dim", b.hidden_size));
  LAIR_ASSIGN_OR_RETURN(b.norm_eps, r.Float("norm_eps", 1e-6));
  LAIR_ASSIGN_OR_RETURN(b.tie_word_embeddings, r.Bool("tie_word_embeddings", false));
  LAIR_ASSIGN_OR_RETURN(c.num_heads, r.Int("num_heads", 8));
  LAIR_ASSIGN_OR_RETURN(double qk_factor, r.Float("qk_dim_factor", 0.5));
  LAIR_ASSIGN_OR_RETURN(double v_factor, r.Float("v_dim_factor", 1.0));
  LAIR_ASSIGN_OR_RETURN(c.gate_soft_cap, r.Float("gate_soft_cap", 15.0));
  LAIR_ASSIGN_OR_RETURN(std::optional<double> logit_cap, r.OptionalFloat("output_logit_soft_cap"));
  c.output_logit_soft_cap =
      r.json().contains("output_logit_soft_cap") ? logit_cap.value_or(0.0) : 30.0;
  LAIR_ASSIGN_OR_RETURN(c.eps, r.Float("eps", 1e-6));
  LAIR_ASSIGN_OR_RETURN(c.use_bias, r.Bool("use_bias", false));
  LAIR_ASSIGN_OR_RETURN(double ffn_factor, r.Float("ffn_proj_factor", 2.667));
  LAIR_ASSIGN_OR_RETURN(int ffn_multiple, r.Int("ffn_round_up_to_multiple_of", 64));
  for (auto [field, value] : {std::pair<std::string_view, double>{"vocab_size", b.vocab_size},
                              {"hidden_size", b.hidden_size},
                              {"num_blocks", b.num_layers},
                              {"num_heads", c.num_heads},
                              {"norm_eps", b.norm_eps},
                              {"gate_soft_cap", c.gate_soft_cap},
                              {"ffn_proj_factor", ffn_factor},
                              {"ffn_round_up_to_multiple_of", ffn_multiple}}) {
    LAIR_RETURN_IF_ERROR(Positive(r, field, value));
  }
  if (embedding_dim != b.hidden_size) {
    return r.FieldError("embedding_dim", "must equal hidden_size");
  }
  c.qk_dim = static_cast<int>(b.hidden_size * qk_factor);
  c.v_dim = static_cast<int>(b.hidden_size * v_factor);
  LAIR_RETURN_IF_ERROR(Divides(r, "num_heads", c.num_heads, c.qk_dim, "the qk dimension"));
  LAIR_RETURN_IF_ERROR(Divides(r, "num_heads", c.num_heads, c.v_dim, "the v dimension"));
  c.qk_head_dim = c.qk_dim / c.num_heads;
  c.v_head_dim = c.v_dim / c.num_heads;
  double up = b.hidden_size * ffn_factor;
  b.intermediate_size =
      static_cast<int>(std::floor((up + ffn_multiple - 1) / ffn_multiple) * ffn_multiple);
  if (c.use_bias) return r.FieldError("use_bias", "projection biases are not supported");
  LAIR_RETURN_IF_ERROR(Require(r, "weight_mode", r.String("weight_mode", "single"),
                               std::string("single"), "only weight_mode 'single' is supported"));
  LAIR_RETURN_IF_ERROR(Require(r, "add_out_norm", r.Bool("add_out_norm", true), true,
                               "a model without its output norm is not supported"));
  return c;
}

absl::StatusOr<ModelConfig> ParseLlama(const ConfigReader& r) {
  LlamaConfig c;
  DecoderConfig& b = c.base;
  LAIR_ASSIGN_OR_RETURN(b.model_type, r.String("model_type"));
  LAIR_ASSIGN_OR_RETURN(b.vocab_size, r.Int("vocab_size", 32000));
  LAIR_ASSIGN_OR_RETURN(b.hidden_size, r.Int("hidden_size", 4096));
  LAIR_ASSIGN_OR_RETURN(b.num_layers, r.Int("num_hidden_layers", 32));
  LAIR_ASSIGN_OR_RETURN(b.intermediate_size, r.Int("intermediate_size", 11008));
  LAIR_ASSIGN_OR_RETURN(b.norm_eps, r.Float("rms_norm_eps", 1e-6));
  LAIR_ASSIGN_OR_RETURN(b.tie_word_embeddings, r.Bool("tie_word_embeddings", false));
  LAIR_ASSIGN_OR_RETURN(b.initializer_range, r.Float("initializer_range", 0.02));
  LAIR_ASSIGN_OR_RETURN(c.num_heads, r.Int("num_attention_heads", 32));
  LAIR_ASSIGN_OR_RETURN(c.num_kv_heads, r.Int("num_key_value_heads", c.num_heads));
  LAIR_ASSIGN_OR_RETURN(c.max_position_embeddings, r.Int("max_position_embeddings", 2048));
  for (auto [field, value] : {std::pair<std::string_view, double>{"vocab_size", b.vocab_size},
                              {"hidden_size", b.hidden_size},
                              {"num_hidden_layers", b.num_layers},
                              {"intermediate_size", b.intermediate_size},
                              {"rms_norm_eps", b.norm_eps},
                              {"num_attention_heads", c.num_heads}}) {
    LAIR_RETURN_IF_ERROR(Positive(r, field, value));
  }
  LAIR_RETURN_IF_ERROR(
      Divides(r, "num_key_value_heads", c.num_kv_heads, c.num_heads, "num_attention_heads"));
  LAIR_ASSIGN_OR_RETURN(std::optional<int> head_dim, r.OptionalInt("head_dim"));
  if (!head_dim) {
    LAIR_RETURN_IF_ERROR(
        Divides(r, "num_attention_heads", c.num_heads, b.hidden_size, "hidden_size"));
  }
  c.head_dim = head_dim.value_or(b.hidden_size / c.num_heads);
  LAIR_RETURN_IF_ERROR(Positive(r, "head_dim", c.head_dim));
  if (c.head_dim % 2 != 0)
    return r.FieldError("head_dim", "the rotary head dimension must be even");
  // Rotary: transformers 5 writes rope_parameters; older configs rope_theta
  // and rope_scaling. Only the unscaled ("default") rotary is implemented.
  LAIR_ASSIGN_OR_RETURN(c.rope_theta, r.Float("rope_theta", 10000.0));
  LAIR_ASSIGN_OR_RETURN(std::optional<ConfigReader> rope, r.OptionalObject("rope_parameters"));
  if (rope) {
    LAIR_ASSIGN_OR_RETURN(c.rope_theta, rope->Float("rope_theta", c.rope_theta));
    LAIR_RETURN_IF_ERROR(Require(*rope, "rope_type", rope->String("rope_type", "default"),
                                 std::string("default"), "only the default rotary is supported"));
  }
  if (r.Has("rope_scaling")) return r.FieldError("rope_scaling", "rotary scaling is not supported");
  LAIR_RETURN_IF_ERROR(Positive(r, "rope_theta", c.rope_theta));
  LAIR_RETURN_IF_ERROR(Require(r, "hidden_act", r.String("hidden_act", "silu"), std::string("silu"),
                               "only silu MLPs are supported"));
  LAIR_RETURN_IF_ERROR(Require(r, "attention_bias", r.Bool("attention_bias", false), false,
                               "attention projection biases are not supported"));
  LAIR_RETURN_IF_ERROR(
      Require(r, "mlp_bias", r.Bool("mlp_bias", false), false, "MLP biases are not supported"));
  LAIR_RETURN_IF_ERROR(Require(r, "pretraining_tp", r.Int("pretraining_tp", 1), 1,
                               "tensor-parallel slicing (pretraining_tp > 1) is not supported"));
  return c;
}

}  // namespace

absl::StatusOr<ModelConfig> ParseModelConfig(const ConfigReader& reader) {
  LAIR_ASSIGN_OR_RETURN(std::string type, reader.String("model_type"));
  if (type == "gla") return ParseGla(reader);
  if (type == "gsa") return ParseGsa(reader);
  if (type == "linear_attn") return ParseLinearAttn(reader);
  if (type == "retnet") return ParseRetNet(reader);
  if (type == "hgrn2") return ParseHgrn2(reader);
  if (type == "mamba2") return ParseMamba2(reader);
  if (type == "xlstm") return ParseXlstm(reader);
  if (type == "llama") return ParseLlama(reader);
  return reader.FieldError("model_type",
                           absl::StrCat("unknown model_type '", type,
                                        "' (supported: ", absl::StrJoin(kModelTypes, ", "), ")"));
}

const DecoderConfig& BaseConfig(const ModelConfig& config) {
  return std::visit([](const auto& c) -> const DecoderConfig& { return c.base; }, config);
}

}  // namespace lair::models
