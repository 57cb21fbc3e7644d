#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <span>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/sampling.h"

namespace lair::engine {
namespace {

std::vector<float> Logits() { return {1.0f, 3.0f, 2.0f, 3.0f, -1.0f, 0.5f}; }

SamplingParams Greedy() {
  SamplingParams p;
  p.temperature = 0;
  return p;
}

TEST(SamplerTest, GreedyTakesTheFirstMaximum) {
  SamplingState state(SamplingParams(), {}, 1, 0);
  auto logits = Logits();
  EXPECT_EQ(Sample(Greedy(), logits, state).token, 1);
}

TEST(SamplerTest, LogitBiasAndPenaltiesMoveTheArgmax) {
  SamplingParams p = Greedy();
  p.logit_bias[5] = 10;
  SamplingState state(SamplingParams(), {}, 1, 0);
  auto logits = Logits();
  EXPECT_EQ(Sample(p, logits, state).token, 5);

  // Token 1 in the prompt: repetition penalty 2 halves its logit (3 -> 1.5).
  SamplingParams rep = Greedy();
  rep.repetition_penalty = 2;
  std::vector<int32_t> prompt = {1};
  SamplingState with_prompt(rep, prompt, 1, 0);
  logits = Logits();
  EXPECT_EQ(Sample(rep, logits, with_prompt).token, 3);
  EXPECT_FLOAT_EQ(logits[1], 1.5f);

  // Generated tokens 1 and 3: frequency and presence penalties lower both.
  SamplingParams freq = Greedy();
  freq.frequency_penalty = 1;
  freq.presence_penalty = 0.25f;
  SamplingState generated(freq, {}, 1, 0);
  generated.Accept(1);
  generated.Accept(3);
  generated.Accept(3);
  logits = Logits();
  EXPECT_EQ(Sample(freq, logits, generated).token, 2);
  EXPECT_FLOAT_EQ(logits[1], 1.75f);
  EXPECT_FLOAT_EQ(logits[3], 0.75f);
}

TEST(SamplerTest, SeedAndIndexFixTheDraw) {
  SamplingParams p;
  p.temperature = 1.5f;
  auto draw = [&](uint64_t seed, int index) {
    SamplingState state(p, {}, seed, index);
    std::vector<int32_t> tokens;
    for (int i = 0; i < 32; ++i) {
      auto logits = Logits();
      tokens.push_back(Sample(p, logits, state).token);
    }
    return tokens;
  };
  EXPECT_EQ(draw(7, 0), draw(7, 0));
  EXPECT_NE(draw(7, 0), draw(7, 1));
  EXPECT_NE(draw(7, 0), draw(8, 0));
}

TEST(SamplerTest, FiltersLeaveOnlyTheBestTokens) {
  // No ties here: tokens by logit are 1, 3, 2, 0, 5, 4.
  auto untied_logits = [] { return std::vector<float>{1.0f, 3.0f, 2.0f, 2.5f, -1.0f, 0.5f}; };
  for (int variant = 0; variant < 3; ++variant) {
    SamplingParams p;
    if (variant == 0) p.top_k = 1;
    if (variant == 1) p.top_p = 0.01f;
    if (variant == 2) p.min_p = 1.0f;
    SamplingState state(SamplingParams(), {}, 3, 0);
    for (int i = 0; i < 20; ++i) {
      auto logits = untied_logits();
      EXPECT_EQ(Sample(p, logits, state).token, 1) << "variant " << variant;
    }
  }
  // top_k = 3 keeps tokens 1, 3 and 2 only.
  SamplingParams p;
  p.top_k = 3;
  SamplingState state(SamplingParams(), {}, 3, 0);
  for (int i = 0; i < 200; ++i) {
    auto logits = untied_logits();
    const int32_t token = Sample(p, logits, state).token;
    EXPECT_TRUE(token == 1 || token == 2 || token == 3) << token;
  }
}

TEST(SamplerTest, LogprobsComeFromTheProcessedDistribution) {
  SamplingParams p;
  p.top_k = 2;
  p.logprobs = 3;
  SamplingState state(SamplingParams(), {}, 5, 0);
  auto logits = Logits();
  SampleResult r = Sample(p, logits, state);
  ASSERT_TRUE(r.logprob.has_value());
  // Two survivors of equal logit: each has probability 1/2; the rest are gone.
  EXPECT_NEAR(r.logprob->logprob, std::log(0.5), 1e-5);
  ASSERT_EQ(r.logprob->top.size(), 2u);
  EXPECT_EQ(r.logprob->top[0].first, 1);
  EXPECT_EQ(r.logprob->top[1].first, 3);

  SamplingParams g = Greedy();
  g.logprobs = 0;
  auto raw = Logits();
  double z = 0;
  for (float l : raw) z += std::exp(l);
  SampleResult gr = Sample(g, raw, state);
  ASSERT_TRUE(gr.logprob.has_value());
  EXPECT_NEAR(gr.logprob->logprob, 3.0 - std::log(z), 1e-5);
  EXPECT_TRUE(gr.logprob->top.empty());
}

// The host sampler and the backends' SampleRow draw the same token from the
// same logits and uniform, under every filter.
TEST(SamplerTest, HostDrawsWhatSampleRowDraws) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> logits(300);
  for (float& l : logits) l = normal(rng);
  logits[17] = logits[40];  // a tie
  for (float temperature : {0.0f, 0.5f, 1.0f, 2.0f}) {
    for (const auto& [top_k, top_p, min_p] :
         {std::tuple{0, 1.0f, 0.0f}, std::tuple{3, 1.0f, 0.0f}, std::tuple{0, 0.6f, 0.0f},
          std::tuple{0, 1.0f, 0.3f}, std::tuple{30, 0.8f, 0.01f}}) {
      SamplingParams p;
      p.temperature = temperature;
      p.top_k = top_k;
      p.top_p = top_p;
      p.min_p = min_p;
      for (uint64_t seed = 0; seed < 20; ++seed) {
        SamplingState state(p, {}, seed, 0);
        SamplingState twin(p, {}, seed, 0);
        const kernels::RowSampling rule{.temperature = temperature,
                                        .top_k = top_k,
                                        .top_p = top_p,
                                        .min_p = min_p,
                                        .u = temperature > 0 ? twin.NextUniform() : 0.0};
        std::vector<float> copy = logits;
        EXPECT_EQ(Sample(p, copy, state).token, kernels::SampleRow(logits, rule))
            << "T " << temperature << " k " << top_k << " p " << top_p << " min_p " << min_p
            << " seed " << seed;
      }
    }
  }
}

// sampling.h's rules with the whole vocabulary ranked, as they are written:
// SampleRow ranks only the prefix it keeps, and must keep the same tokens
// and write the same logprobs.
std::vector<float> KeptByAFullRanking(std::span<const float> logits,
                                      const kernels::RowSampling& r) {
  const auto vocab = static_cast<int32_t>(logits.size());
  std::vector<float> s(logits.size());
  for (size_t i = 0; i < s.size(); ++i) s[i] = logits[i] / r.temperature;
  const float max_s = *std::max_element(s.begin(), s.end());
  std::vector<double> p(s.size());
  double total = 0;
  for (size_t i = 0; i < s.size(); ++i) total += p[i] = std::exp(s[i] - max_s);
  std::vector<int32_t> ranked(logits.size());
  std::iota(ranked.begin(), ranked.end(), 0);
  std::sort(ranked.begin(), ranked.end(),
            [&](int32_t a, int32_t b) { return s[a] != s[b] ? s[a] > s[b] : a < b; });
  int32_t keep = vocab;
  if (r.min_p > 0) {
    while (keep > 1 && p[ranked[keep - 1]] < static_cast<double>(r.min_p)) --keep;
  }
  if (r.top_k > 0) keep = std::min(keep, r.top_k);
  if (r.top_p < 1) {
    double mass = 0;
    int32_t n = 0;
    while (n < keep) {
      mass += p[ranked[n++]] / total;
      if (mass >= r.top_p) break;
    }
    keep = n;
  }
  for (int32_t i = keep; i < vocab; ++i) p[ranked[i]] = -1;
  double kept = 0;
  for (double q : p) kept += q > 0 ? q : 0;
  std::vector<float> logprobs(logits.size());
  for (size_t i = 0; i < p.size(); ++i) {
    logprobs[i] = p[i] > 0 ? static_cast<float>(static_cast<double>(s[i] - max_s) - std::log(kept))
                           : -std::numeric_limits<float>::infinity();
  }
  return logprobs;
}

TEST(SamplerTest, SampleRowKeepsWhatAFullRankingKeeps) {
  {  // -0 and +0 tie: the lower id ranks first
    const std::vector<float> tied = {1.0f, -0.0f, 0.0f, -1.0f};
    const kernels::RowSampling top2{.temperature = 1.0f, .top_k = 2, .u = 0.5};
    std::vector<float> logprobs(tied.size());
    kernels::SampleRow(tied, top2, logprobs);
    EXPECT_EQ(logprobs, KeptByAFullRanking(tied, top2));
    EXPECT_GT(logprobs[1], -std::numeric_limits<float>::infinity());
  }
  std::mt19937 rng(11);
  // Peaked and nearly flat rows of 5,000 tokens (a flat row's top_p 0.9
  // keeps thousands: several of SampleRow's growing prefixes), with ties.
  for (float spread : {4.0f, 0.05f}) {
    std::normal_distribution<float> normal(0.0f, spread);
    std::vector<float> logits(5000);
    for (float& l : logits) l = normal(rng);
    for (int i = 0; i < 50; ++i) logits[i * 97 % 5000] = logits[i];
    logits[3000] = -0.0f;  // ties +0 (RankKey)
    logits[20] = 0.0f;
    for (const auto& [top_k, top_p, min_p] :
         {std::tuple{0, 0.0f, 0.0f}, std::tuple{0, 0.3f, 0.0f}, std::tuple{0, 0.9f, 0.0f},
          std::tuple{0, 0.999f, 0.0f}, std::tuple{1, 1.0f, 0.0f}, std::tuple{700, 1.0f, 0.0f},
          std::tuple{0, 1.0f, 0.2f}, std::tuple{0, 1.0f, 0.97f}, std::tuple{400, 0.95f, 0.5f},
          std::tuple{5000, 0.9f, 0.0f}}) {
      const kernels::RowSampling rule{
          .temperature = 0.8f, .top_k = top_k, .top_p = top_p, .min_p = min_p, .u = 0.5};
      std::vector<float> logprobs(logits.size());
      kernels::SampleRow(logits, rule, logprobs);
      EXPECT_EQ(logprobs, KeptByAFullRanking(logits, rule))
          << "spread " << spread << " k " << top_k << " p " << top_p << " min_p " << min_p;
    }
  }
}

TEST(SamplerTest, StopTokens) {
  SamplingParams p;
  p.stop_token_ids = {7};
  EXPECT_TRUE(IsStopToken(p, 2, 2));
  EXPECT_TRUE(IsStopToken(p, 2, 7));
  EXPECT_FALSE(IsStopToken(p, 2, 3));
  EXPECT_FALSE(IsStopToken(p, std::nullopt, 2));
  p.ignore_eos = true;
  EXPECT_FALSE(IsStopToken(p, 2, 2));
  EXPECT_TRUE(IsStopToken(p, 2, 7));
}

}  // namespace
}  // namespace lair::engine
