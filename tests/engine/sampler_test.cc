#include "engine/sampler.h"

#include <cmath>
#include <cstdint>
#include <random>
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
