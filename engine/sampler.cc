#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/sampling.h"

namespace lair::engine {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// SplitMix64 finalizer: spreads (seed, index) over the whole seed space.
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

void ApplyPenalties(const SamplingParams& params, const SamplingState& state,
                    std::span<float> logits) {
  const int vocab = static_cast<int>(logits.size());
  for (const auto& [token, bias] : params.logit_bias) {
    if (token >= 0 && token < vocab) logits[token] += bias;
  }
  if (params.repetition_penalty != 1.0f) {
    auto penalize = [&](int32_t token) {
      if (token < 0 || token >= vocab) return;
      float& l = logits[token];
      l = l > 0 ? l / params.repetition_penalty : l * params.repetition_penalty;
    };
    for (int32_t token : state.prompt_tokens()) penalize(token);
    for (const auto& [token, count] : state.output_counts()) {
      if (!state.prompt_tokens().contains(token)) penalize(token);
    }
  }
  if (params.frequency_penalty != 0.0f || params.presence_penalty != 0.0f) {
    for (const auto& [token, count] : state.output_counts()) {
      if (token < 0 || token >= vocab) continue;
      logits[token] -=
          params.frequency_penalty * static_cast<float>(count) + params.presence_penalty;
    }
  }
}

TokenLogprob MakeLogprob(int n_top, std::span<const float> logprobs, int32_t token) {
  return {.token = token, .logprob = logprobs[token], .top = kernels::TopLogprobs(logprobs, n_top)};
}

}  // namespace

SamplingState::SamplingState(const SamplingParams& params, std::span<const int32_t> prompt,
                             uint64_t seed, int index)
    : rng_(Mix(Mix(seed) ^ static_cast<uint64_t>(index))) {
  if (params.repetition_penalty != 1.0f) prompt_tokens_.insert(prompt.begin(), prompt.end());
}

void SamplingState::Accept(int32_t token) { ++output_counts_[token]; }

double SamplingState::NextUniform() {
  return static_cast<double>(rng_() >> 11) * 0x1.0p-53;  // 53 random mantissa bits
}

kernels::RowSampling DrawRule(const SamplingParams& params, double u) {
  return {.temperature = params.temperature,
          .top_k = params.top_k,
          .top_p = params.top_p,
          .min_p = params.min_p,
          .u = u,
          .logprobs = params.logprobs};
}

SampleResult Sample(const SamplingParams& params, std::span<float> logits, SamplingState& state) {
  ApplyPenalties(params, state, logits);
  SampleResult result;
  // The draw is kernels/sampling.h's, the one the backends make on the
  // device (greedy: the first maximum, drawing no uniform); it leaves the
  // distribution it drew from in `logits`.
  const double u = params.temperature > 0 ? state.NextUniform() : 0.0;
  result.token = kernels::SampleRow(logits, DrawRule(params, u),
                                    params.logprobs >= 0 ? logits : std::span<float>{});
  if (params.logprobs >= 0) result.logprob = MakeLogprob(params.logprobs, logits, result.token);
  return result;
}

void KeepAllowedTokens(const SamplingParams& params, std::span<float> logits) {
  if (params.allowed_token_ids.empty()) return;
  std::vector<float> kept(params.allowed_token_ids.size());
  for (size_t i = 0; i < kept.size(); ++i) kept[i] = logits[params.allowed_token_ids[i]];
  std::fill(logits.begin(), logits.end(), kNegInf);
  for (size_t i = 0; i < kept.size(); ++i) logits[params.allowed_token_ids[i]] = kept[i];
}

void MaskStopTokens(const SamplingParams& params, std::optional<int32_t> eos,
                    std::span<float> logits) {
  const auto mask = [&](int32_t token) {
    if (token >= 0 && token < static_cast<int32_t>(logits.size())) logits[token] = kNegInf;
  };
  if (!params.ignore_eos && eos.has_value()) mask(*eos);
  for (int32_t token : params.stop_token_ids) mask(token);
}

bool IsStopToken(const SamplingParams& params, std::optional<int32_t> eos, int32_t token) {
  if (!params.ignore_eos && eos.has_value() && token == *eos) return true;
  return std::find(params.stop_token_ids.begin(), params.stop_token_ids.end(), token) !=
         params.stop_token_ids.end();
}

TokenLogprob DrawnLogprob(const kernels::DrawLogprobs& drawn, int64_t row, int32_t token,
                          int listed) {
  const float* values = drawn.values.f32() + row * (1 + kernels::kMaxRowLogprobs);
  const int32_t* ids = drawn.top_ids.data<int32_t>() + row * kernels::kMaxRowLogprobs;
  TokenLogprob out{.token = token, .logprob = values[0], .top = {}};
  for (int i = 0; i < listed && ids[i] >= 0; ++i) out.top.emplace_back(ids[i], values[1 + i]);
  return out;
}

TokenLogprob ScoreToken(std::span<float> logits, int32_t token, int top) {
  kernels::LogSoftmax(logits);
  return MakeLogprob(top, logits, token);
}

}  // namespace lair::engine
