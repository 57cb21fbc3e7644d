#include "models/init.h"

#include <filesystem>
#include <fstream>
#include <map>

#include "absl/strings/str_cat.h"
#include "checkpoint/config_reader.h"
#include "checkpoint/safetensors.h"
#include "models/config.h"
#include "models/decoder.h"
#include "models/params.h"

namespace lair::models {
namespace {

using nlohmann::json;

// The fixture-sized model of each family: hidden 128, 2 layers, vocab 512.
json TinyPreset(const std::string& family) {
  json c = {{"hidden_size", 128}, {"num_hidden_layers", 2}, {"vocab_size", 512}};
  if (family == "llama") {
    c.update({{"num_attention_heads", 4},
              {"num_key_value_heads", 2},
              {"head_dim", 32},
              {"intermediate_size", 352}});
  } else if (family == "mamba2") {
    c.update({{"num_heads", 8}, {"head_dim", 32}, {"state_size", 32}, {"norm_eps", 1e-5}});
  } else if (family == "xlstm") {
    c.update({{"num_heads", 2}, {"num_blocks", 2}});
  } else if (family == "hgrn2") {
    c.update({{"expand_ratio", 32}});
  } else {
    c.update({{"num_heads", 2}});
  }
  if (family == "gsa") c["num_slots"] = 16;
  return c;
}

// Named presets that fix the family: {model_type, fields}.
const std::map<std::string, json>& NamedPresets() {
  static const auto* presets = new std::map<std::string, json>{
      {"gla-340m",
       {{"model_type", "gla"},
        {"hidden_size", 1024},
        {"num_hidden_layers", 24},
        {"num_heads", 4},
        {"vocab_size", 32000},
        {"tie_word_embeddings", true}}},
      {"gla-1.3b",
       {{"model_type", "gla"},
        {"hidden_size", 2048},
        {"num_hidden_layers", 24},
        {"num_heads", 4},
        {"vocab_size", 32000}}},
      {"gsa-1.3b",
       {{"model_type", "gsa"},
        {"hidden_size", 2048},
        {"num_hidden_layers", 24},
        {"num_heads", 4},
        {"num_slots", 64},
        {"vocab_size", 32000}}},
      // transformers' xLSTMConfig defaults, which are xLSTM-7b's shape.
      {"xlstm-7b",
       {{"model_type", "xlstm"},
        {"hidden_size", 4096},
        {"num_blocks", 32},
        {"num_heads", 8},
        {"qk_dim_factor", 0.5},
        {"v_dim_factor", 1.0},
        {"vocab_size", 50304}}},
  };
  return *presets;
}

json ParseValue(const std::string& text) {
  json value = json::parse(text, nullptr, /*allow_exceptions=*/false);
  return value.is_discarded() ? json(text) : value;
}

}  // namespace

std::vector<std::string> InitPresets() {
  std::vector<std::string> names = {"tiny"};
  for (const auto& [name, fields] : NamedPresets()) names.push_back(name);
  return names;
}

absl::StatusOr<json> InitConfig(const InitOptions& options) {
  json config = json::object();
  std::string family = options.family;
  if (!options.preset.empty() && options.preset != "tiny") {
    auto it = NamedPresets().find(options.preset);
    if (it == NamedPresets().end()) {
      return absl::InvalidArgumentError(absl::StrCat("unknown preset '", options.preset, "'"));
    }
    if (!family.empty() && family != it->second["model_type"].get<std::string>()) {
      return absl::InvalidArgumentError(absl::StrCat("preset '", options.preset, "' is a ",
                                                     it->second["model_type"].get<std::string>(),
                                                     " model, not ", family));
    }
    config = it->second;
    family = config["model_type"];
  }
  if (family.empty())
    return absl::InvalidArgumentError("a family (or a preset naming one) is required");
  config["model_type"] = family;
  if (options.preset == "tiny") config.update(TinyPreset(family));
  for (const auto& [key, value] : options.overrides) {
    if (key.empty()) return absl::InvalidArgumentError("--set: empty key");
    config[key] = ParseValue(value);
  }
  LAIR_ASSIGN_OR_RETURN(ConfigReader reader, ConfigReader::FromJson(config, "config (lair init)"));
  LAIR_RETURN_IF_ERROR(ParseModelConfig(reader).status());
  return config;
}

absl::StatusOr<int64_t> InitModel(const InitOptions& options, const std::string& out_dir) {
  LAIR_ASSIGN_OR_RETURN(json config_json, InitConfig(options));
  LAIR_ASSIGN_OR_RETURN(ConfigReader reader,
                        ConfigReader::FromJson(config_json, "config (lair init)"));
  LAIR_ASSIGN_OR_RETURN(ModelConfig config, ParseModelConfig(reader));
  RandomSource source(options.seed, static_cast<float>(BaseConfig(config).initializer_range));
  Params params(&source, /*backend=*/nullptr);
  LAIR_RETURN_IF_ERROR(BuildDecoderSpec(config, params).status());
  std::error_code error;
  std::filesystem::create_directories(out_dir, error);
  if (error) return absl::InternalError(absl::StrCat(out_dir, ": ", error.message()));
  std::ofstream out(out_dir + "/config.json");
  out << config_json.dump(2) << "\n";
  if (!out) return absl::InternalError(absl::StrCat(out_dir, "/config.json: write failed"));
  if (options.matrix_dtype != DType::kF32 && options.matrix_dtype != DType::kBF16) {
    return absl::InvalidArgumentError("matrix_dtype: F32 or BF16");
  }
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (int id = 0; id < params.size(); ++id) {
    const Tensor& t = params.tensors()[id];
    if (options.matrix_dtype == DType::kBF16 && params.is_matrix(id)) {
      Tensor narrow = Tensor::Zeros(DType::kBF16, t.shape());
      for (int64_t i = 0; i < t.numel(); ++i) narrow.data<uint16_t>()[i] = FloatToBF16(t.f32()[i]);
      tensors.emplace_back(params.name(id), std::move(narrow));
    } else {
      tensors.emplace_back(params.name(id), t);
    }
  }
  LAIR_RETURN_IF_ERROR(
      WriteSafetensors(out_dir + "/model.safetensors", tensors, {{"format", "pt"}}));
  return params.NumElements();
}

}  // namespace lair::models
