// Checking a model family against its golden fixture folder
// (shared/fixtures/models/<family>-tiny, described in fixtures/README.md):
// the engine of `lair verify model`, also used by the model tests.
//
// DIR holds config.json, model.safetensors, golden.safetensors and, for all
// but xlstm, grads.safetensors. The checks, each a relative L2 error against
// a tolerance:
//   prefill logits_a / logits_b   one Forward over the prompt with all_logits
//   step logits_a / logits_b      the prompt fed one token at a time
//   greedy tokens / logits        16 greedy steps after prompt_a (tokens identical;
//                                 with bf16 weights see GreedyTokensCheck)
//   loss, grad <name>             LossAndGrad(prompt_b) against grads.safetensors
//
// Thread safety: functions keep no state; the backend is used by one thread.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "kernels/backend.h"

namespace lair::models {

struct ModelCheck {
  std::string label;  // "prefill logits_a", "grad model.norm.weight", ...
  // ‖ours − ref‖₂ / ‖ref‖₂ (greedy tokens: see GreedyTokensCheck)
  double relative_error = 0;
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

// One greedy step: the token each side picks from the logits row that
// decides it (prompt_a's last row, then the row after each golden token).
struct GreedyStep {
  int32_t ours = 0, golden = 0;
  double golden_margin = 0;  // golden top-1 logit minus its runner-up
  double logit_error = 0;    // max |ours − golden| over that row
};

// The "greedy tokens" check: its relative_error is the fraction of steps
// whose tokens differ where they may not. With fp32 weights every difference
// counts. With bf16 weights (`bf16`) a step may differ when its golden margin
// is below the logit error measured there: the rounding of the weights alone
// moves the logits by more than the gap between the top two tokens, so the
// argmax is not determined at that precision.
ModelCheck GreedyTokensCheck(std::span<const GreedyStep> steps, bool bf16);

ModelReport VerifyModel(const std::string& dir, kernels::Backend* backend,
                        const VerifyModelOptions& options = {});

}  // namespace lair::models
