// Checking a model family against its golden fixture folder
// (shared/fixtures/models/<family>-tiny, described in fixtures/README.md):
// the engine of `lair verify model`, also used by the model tests.
//
// DIR holds config.json, model.safetensors, golden.safetensors and, for all
// but xlstm, grads.safetensors. The checks, each a relative L2 error against
// a tolerance:
//   prefill logits_a / logits_b   one Forward over the prompt with all_logits
//   step logits_a / logits_b      the prompt fed one token at a time
//   greedy tokens / logits        16 greedy steps after prompt_a (tokens identical)
//   loss, grad <name>             LossAndGrad(prompt_b) against grads.safetensors
//
// Thread safety: functions keep no state; the backend is used by one thread.
#pragma once

#include <string>
#include <vector>

#include "core/tensor.h"
#include "kernels/backend.h"

namespace lair::models {

struct ModelCheck {
  std::string label;          // "prefill logits_a", "grad model.norm.weight", ...
  double relative_error = 0;  // ‖ours − ref‖₂ / ‖ref‖₂ (greedy tokens: fraction that differ)
  double tolerance = 0;
  bool passed() const { return relative_error <= tolerance; }
};

struct ModelReport {
  std::vector<ModelCheck> checks;
  // Why the checks stopped early (load error, missing golden tensor); the
  // checks made before are kept.
  absl::Status status;
  bool passed() const;
};

struct VerifyModelOptions {
  DType weight_dtype = DType::kF32;  // kBF16 loosens the tolerances to the bf16 row
  bool gradients = true;             // also check grads.safetensors when present
};

ModelReport VerifyModel(const std::string& dir, kernels::Backend* backend,
                        const VerifyModelOptions& options = {});

}  // namespace lair::models
