// Sampler: turns one completion's next-token logits into a token.
//
// Processing order (vLLM's): logit bias; repetition penalty over prompt and
// output tokens (a positive logit is divided by it, a negative one
// multiplied); frequency and presence penalties over output tokens; then
// either greedy argmax (temperature 0; lowest id wins ties) or temperature
// scaling, min-p, top-k and top-p filtering and a draw from what is left.
//
// Logprobs are computed from the processed distribution, as vLLM v0 does:
// log-softmax of the logits after penalties, temperature and filtering
// (filtered tokens have -inf and are never listed). So the chosen token's
// logprob is the log of the probability it was actually drawn with; for
// greedy requests it is the log-softmax after penalties.
//
// Reproducibility: each completion owns a SamplingState whose RNG is
// seeded from (request seed, completion index) alone, and the draw walks
// the kept tokens in id order, so the output does not depend on the batch.
// The filters and the draw are kernels/sampling.h's, which the backends'
// SampleRows run on the device for requests that need nothing else.
//
// Thread safety: SamplingState is thread-compatible; Sample is a pure
// function of its arguments.
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "engine/request.h"
#include "engine/request_output.h"
#include "kernels/backend.h"
#include "kernels/sampling.h"

namespace lair::engine {

// The largest SamplingParams::logprobs accepted.
inline constexpr int kMaxLogprobs = kernels::kMaxRowLogprobs;

// Per-completion sampling state.
class SamplingState {
 public:
  // `prompt` feeds the repetition penalty (kept only when params use it);
  // `seed` is the request's seed (or one the engine drew for it) and
  // `index` the completion's index.
  SamplingState(const SamplingParams& params, std::span<const int32_t> prompt, uint64_t seed,
                int index);

  // Records a generated token for the penalties.
  void Accept(int32_t token);
  // A uniform double in [0, 1) from this completion's RNG.
  double NextUniform();

  // Penalties read these.
  const absl::flat_hash_set<int32_t>& prompt_tokens() const { return prompt_tokens_; }
  const absl::flat_hash_map<int32_t, int>& output_counts() const { return output_counts_; }

 private:
  std::mt19937_64 rng_;  // the standard fixes its sequence, so seeds reproduce everywhere
  absl::flat_hash_set<int32_t> prompt_tokens_;
  absl::flat_hash_map<int32_t, int> output_counts_;
};

struct SampleResult {
  int32_t token = 0;
  std::optional<TokenLogprob> logprob;  // set when params.logprobs >= 0
};

// params' filters with the draw's uniform u, as kernels::SampleRow takes
// them (the engine hands them to the device, Sample to the CPU draw).
kernels::RowSampling DrawRule(const SamplingParams& params, double u);

// Samples from `logits` ([vocab], overwritten with the processed logits).
// REQUIRES: params passed Engine::Submit's validation; logits not empty.
SampleResult Sample(const SamplingParams& params, std::span<float> logits, SamplingState& state);

// Row `row` of a device draw's logprobs (kernels::DrawLogprobs, on the
// host) for the drawn `token`, with its first `listed` likeliest tokens.
TokenLogprob DrawnLogprob(const kernels::DrawLogprobs& drawn, int64_t row, int32_t token,
                          int listed);

// `token`'s logprob under the raw distribution of `logits` ([vocab],
// overwritten with their log-softmax: no penalties, temperature or
// filtering, as vLLM scores prompt tokens), with the `top` likeliest tokens.
// REQUIRES: 0 <= token < logits.size().
TokenLogprob ScoreToken(std::span<float> logits, int32_t token, int top);

// Masks (sets to -inf) every token of `logits` but params.allowed_token_ids
// (when any are given).
void KeepAllowedTokens(const SamplingParams& params, std::span<float> logits);

// Masks (sets to -inf) in `logits` the tokens that would end a completion:
// `eos` (unless ignore_eos) and params.stop_token_ids. For min_tokens.
void MaskStopTokens(const SamplingParams& params, std::optional<int32_t> eos,
                    std::span<float> logits);

// Whether `token` ends a completion: `eos` (unless ignore_eos) or one of
// params.stop_token_ids.
bool IsStopToken(const SamplingParams& params, std::optional<int32_t> eos, int32_t token);

}  // namespace lair::engine
