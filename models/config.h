// Typed model configurations, one struct per family, parsed from a Hugging
// Face config.json through ConfigReader (checkpoint/config_reader.h).
//
// Each struct holds every field its family's reference implementation reads
// (fla for gla, gsa, linear_attn, retnet, hgrn2 and mamba2; transformers for
// xlstm and llama), with the reference defaults for absent or null fields,
// and the derived sizes (head dimensions, MLP width) computed the way the
// reference computes them. An option the reference supports but LAIR does
// not (hybrid attention layers, use_gv, a non-default rope_scaling, ...) is
// an InvalidArgument naming the file and the field; so is an unknown
// model_type. Fields that only affect training kernels or the Python side
// (fuse_cross_entropy, attn_mode, use_cache, ...) are ignored.
#pragma once

#include <optional>
#include <string>
#include <variant>

#include "checkpoint/config_reader.h"
#include "core/status.h"

namespace lair::models {

// The fields of the shared decoder skeleton.
struct DecoderConfig {
  std::string model_type;
  int vocab_size = 32000;
  int hidden_size = 2048;
  int num_layers = 24;
  double norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  int intermediate_size = 0;  // SwiGLU MLP width; 0 for families without an MLP (mamba2)
  double initializer_range = 0.02;
};

// fla's ShortConvolution in front of q, k, v (or q, f, i for hgrn2). It
// never has a bias: fla's gla, gsa and hgrn2 blocks do not hand conv_bias
// to their layers, so a config's conv_bias is ignored, as fla ignores it.
struct ShortConvConfig {
  bool use = false;  // use_short_conv
  int size = 4;      // conv_size
};

struct GlaConfig {
  DecoderConfig base;
  int num_heads = 4, num_kv_heads = 4;
  int key_dim = 0, value_dim = 0;  // hidden·expand_k, hidden·expand_v
  int head_k_dim = 0, head_v_dim = 0;
  std::string feature_map;  // empty: none; else an activation name
  ShortConvConfig conv;
  bool use_output_gate = true;
  bool fuse_norm = true;  // norm weight named g_norm_swish_gate (true) or g_norm
  bool elementwise_affine = true;
  int gate_logit_normalizer = 16;
  int gate_low_rank_dim = 16;
  std::optional<double> clamp_min;
};

struct GsaConfig {
  DecoderConfig base;
  int num_heads = 4, num_kv_heads = 4;
  int key_dim = 0, value_dim = 0, head_k_dim = 0, head_v_dim = 0;
  int num_slots = 64;
  std::string feature_map = "swish";  // swish or relu
  ShortConvConfig conv;
  bool elementwise_affine = true;
  int gate_logit_normalizer = 8;
  double scale = 1.0;  // the layer passes 1, not K^-0.5
  // The output RMSNorm keeps the layer's own default eps: fla's block does
  // not hand norm_eps to the layer (the gsa-tiny goldens match 1e-5, not
  // the config's 1e-6).
  double output_norm_eps = 1e-5;
};

struct LinearAttnConfig {
  DecoderConfig base;
  int num_heads = 4, num_kv_heads = 4;
  int key_dim = 0, value_dim = 0, head_k_dim = 0, head_v_dim = 0;
  std::string feature_map = "elementwise_product";
  bool tie_feature_map_qk = false;
  bool norm_q = false, norm_k = false;
  bool elementwise_affine = true;
};

struct RetNetConfig {
  DecoderConfig base;
  int num_heads = 8, num_kv_heads = 8;
  int key_dim = 0, value_dim = 0, head_k_dim = 0, head_v_dim = 0;
  std::string feature_map;
  // No ShortConvConfig: fla's RetNet block never hands use_short_conv to
  // MultiScaleRetention, so a retnet config's use_short_conv builds nothing.
  bool use_output_gate = true;
  bool fuse_norm = true;
  bool elementwise_affine = true;
};

struct Hgrn2Config {
  DecoderConfig base;
  int num_heads = 16;      // hidden / expand_ratio
  int expand_ratio = 128;  // head_f_dim
  int forget_dim = 0;      // num_heads · expand_ratio
  int head_i_dim = 0;      // hidden / num_heads
  ShortConvConfig conv;
  bool use_lower_bound = true;
  bool elementwise_affine = true;
};

struct Mamba2Config {
  DecoderConfig base;
  int num_heads = 64, head_dim = 64, state_size = 128, expand = 2, n_groups = 1;
  int conv_kernel = 4;
  bool use_conv_bias = true;
  bool use_bias = false;
  int intermediate_size = 0;  // expand · hidden
  int conv_dim = 0;           // intermediate + 2 · n_groups · state_size
};

struct XlstmConfig {
  DecoderConfig base;
  int num_heads = 8;
  int qk_dim = 0, v_dim = 0, qk_head_dim = 0, v_head_dim = 0;
  double gate_soft_cap = 15.0;
  double output_logit_soft_cap = 30.0;  // 0: none
  double eps = 1e-6;                    // the cell's denominator epsilon
  bool use_bias = false;
};

struct LlamaConfig {
  DecoderConfig base;
  int num_heads = 32, num_kv_heads = 32, head_dim = 128;
  double rope_theta = 10000.0;
  int max_position_embeddings = 2048;
};

using ModelConfig = std::variant<GlaConfig, GsaConfig, LinearAttnConfig, RetNetConfig, Hgrn2Config,
                                 Mamba2Config, XlstmConfig, LlamaConfig>;

// The model_type values Model::Load accepts.
inline constexpr const char* kModelTypes[] = {"gla",   "gsa",    "linear_attn", "retnet",
                                              "hgrn2", "mamba2", "xlstm",       "llama"};

// Parses any supported family, dispatching on model_type.
absl::StatusOr<ModelConfig> ParseModelConfig(const ConfigReader& reader);

// The skeleton fields of any parsed config.
const DecoderConfig& BaseConfig(const ModelConfig& config);

}  // namespace lair::models
