// Fresh models: `lair init` writes config.json and model.safetensors with the
// reference tensor names for any supported family and size.
//
// The config is a preset's fields (or the family's reference defaults),
// then the --set overrides, validated by the same parser Model::Load uses,
// so a config init accepts is one Load accepts. The weights come from the
// family's own parameter declarations (models/families.h) filled by a seeded
// RandomSource: normal(0, initializer_range) matrices, unit norm weights,
// zero biases, and each family's special initializations (Mamba2 A_log and
// dt_bias, xLSTM gate biases).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "nlohmann/json.hpp"

namespace lair::models {

struct InitOptions {
  std::string family;  // a model_type; may be empty when the preset names one
  std::string preset;  // "tiny", "gla-1.3b", ... or empty (reference defaults)
  // key=value config overrides; values parse as JSON (numbers, true, null,
  // arrays), anything else is a string.
  std::vector<std::pair<std::string, std::string>> overrides;
  uint64_t seed = 0;
  // How the projection matrices are stored (kF32 or kBF16, as Hugging Face
  // checkpoints usually are); norms, biases and gate parameters stay F32.
  DType matrix_dtype = DType::kF32;
};

// The preset names InitConfig knows.
std::vector<std::string> InitPresets();

// The validated config.json for `options`.
absl::StatusOr<nlohmann::json> InitConfig(const InitOptions& options);

// Writes out_dir/config.json and out_dir/model.safetensors (matrices as
// options.matrix_dtype, the rest F32), creating out_dir. Returns the number
// of parameters.
absl::StatusOr<int64_t> InitModel(const InitOptions& options, const std::string& out_dir);

}  // namespace lair::models
