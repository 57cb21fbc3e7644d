#include "engine/output_processor.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/engine/fakes.h"

namespace lair::engine {
namespace {

using testing::FakeTokenizer;

// Token ids spelling `text` two letters at a time (FakeTokenizer's code).
std::vector<int32_t> Spell(const std::string& text) {
  std::vector<int32_t> ids;
  for (size_t i = 0; i + 1 < text.size(); i += 2)
    ids.push_back((text[i] - 'a') + 26 * (text[i + 1] - 'a'));
  return ids;
}

struct Streamed {
  std::string text;
  std::vector<std::string> deltas;
  RequestOutput final;
  int tokens_added = 0;
};

Streamed Feed(const SamplingParams& params, const std::vector<int32_t>& tokens) {
  FakeTokenizer tokenizer;
  OutputProcessor out(&tokenizer, &params, "r", 0, 4, absl::Now());
  out.MarkScheduled(absl::Now());
  Streamed run;
  for (int32_t t : tokens) {
    ++run.tokens_added;
    const bool done = out.AddToken(t, t == FakeTokenizer::kEos, std::nullopt, absl::Now());
    EXPECT_TRUE(out.has_output());
    RequestOutput o = out.TakeOutput();
    run.text += o.text_delta;
    run.deltas.push_back(o.text_delta);
    if (done) {
      EXPECT_TRUE(o.finished());
      run.final = o;
      break;
    }
  }
  return run;
}

TEST(OutputProcessorTest, StopStringSplitAcrossTokensIsHeldBackAndCut) {
  SamplingParams p;
  p.max_tokens = 100;
  p.stop = {"cdef"};  // "ab|cd|ef|gh": the stop spans two tokens
  Streamed run = Feed(p, Spell("abcdefgh"));
  EXPECT_EQ(run.text, "ab");
  EXPECT_EQ(run.tokens_added, 3);
  EXPECT_EQ(run.final.finish_reason, FinishReason::kStop);
  EXPECT_EQ(run.final.stop_reason, "cdef");

  p.stop = {"bcde"};  // starts and ends inside tokens: "a|bc|de"
  run = Feed(p, Spell("abcdefgh"));
  EXPECT_EQ(run.text, "a");
  EXPECT_EQ(run.deltas[0], "a");  // "b" could begin the stop: held back
  EXPECT_EQ(run.final.stop_reason, "bcde");

  p.include_stop_str_in_output = true;
  run = Feed(p, Spell("abcdefgh"));
  EXPECT_EQ(run.text, "abcde");
}

TEST(OutputProcessorTest, HeldBackTextIsReleasedWhenItCannotMatch) {
  SamplingParams p;
  p.max_tokens = 4;
  p.stop = {"bx"};
  Streamed run = Feed(p, Spell("abcdabcd"));
  EXPECT_EQ(run.deltas[0], "a");  // "b" held back
  EXPECT_EQ(run.deltas[1], "bcd");
  EXPECT_EQ(run.text, "abcdabcd");
  EXPECT_EQ(run.final.finish_reason, FinishReason::kLength);
  EXPECT_EQ(run.final.usage.completion_tokens, 4);
  EXPECT_EQ(run.final.usage.prompt_tokens, 4);
}

TEST(OutputProcessorTest, EarliestStopStringWins) {
  SamplingParams p;
  p.stop = {"gh", "cd"};
  Streamed run = Feed(p, Spell("abcdefgh"));
  EXPECT_EQ(run.text, "ab");
  EXPECT_EQ(run.final.stop_reason, "cd");
}

TEST(OutputProcessorTest, StopTokenIsCountedButNotRendered) {
  SamplingParams p;
  std::vector<int32_t> tokens = Spell("abcd");
  tokens.push_back(FakeTokenizer::kEos);
  Streamed run = Feed(p, tokens);
  EXPECT_EQ(run.text, "abcd");
  EXPECT_EQ(run.final.finish_reason, FinishReason::kStop);
  EXPECT_EQ(run.final.stop_reason, "");
  EXPECT_EQ(run.final.usage.completion_tokens, 3);
  EXPECT_EQ(run.final.new_tokens.back(), FakeTokenizer::kEos);
}

TEST(OutputProcessorTest, FinishCarriesStatusAndTimings) {
  SamplingParams p;
  FakeTokenizer tokenizer;
  const absl::Time t0 = absl::Now();
  OutputProcessor out(&tokenizer, &p, "r", 2, 4, t0);
  out.MarkScheduled(t0 + absl::Milliseconds(10));
  EXPECT_FALSE(out.AddToken(1, false, std::nullopt, t0 + absl::Milliseconds(20)));
  EXPECT_FALSE(out.AddToken(2, false, std::nullopt, t0 + absl::Milliseconds(40)));
  EXPECT_FALSE(out.AddToken(3, false, std::nullopt, t0 + absl::Milliseconds(60)));
  out.Finish(FinishReason::kError, absl::InternalError("boom"), t0 + absl::Milliseconds(100));
  RequestOutput o = out.TakeOutput();
  EXPECT_EQ(o.index, 2);
  EXPECT_EQ(o.finish_reason, FinishReason::kError);
  EXPECT_EQ(o.status.code(), absl::StatusCode::kInternal);
  EXPECT_NEAR(o.timings.queue_seconds, 0.010, 1e-9);
  EXPECT_NEAR(o.timings.first_token_seconds, 0.020, 1e-9);
  EXPECT_NEAR(o.timings.mean_inter_token_seconds, 0.020, 1e-9);
  EXPECT_NEAR(o.timings.total_seconds, 0.100, 1e-9);
  EXPECT_FALSE(out.has_output());
}

}  // namespace
}  // namespace lair::engine
