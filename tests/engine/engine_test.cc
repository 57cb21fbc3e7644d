// Engine tests over the fake runner: behaviour a client can see.
#include "engine/engine.h"

#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/engine/fakes.h"

namespace lair::engine {
namespace {

using testing::Collector;
using testing::Completion;
using testing::FakeRunner;
using testing::FakeTokenizer;

std::vector<int32_t> Prompt(int length, int salt) {
  std::vector<int32_t> tokens;
  tokens.reserve(length);
  for (int i = 0; i < length; ++i) tokens.push_back((i * 37 + salt * 101) % 500);
  return tokens;
}

EngineRequest Request(const std::string& id, int prompt_len, int salt, int max_tokens) {
  EngineRequest r;
  r.request_id = id;
  r.prompt_tokens = Prompt(prompt_len, salt);
  r.sampling.max_tokens = max_tokens;
  r.sampling.temperature = 0;
  r.sampling.ignore_eos = true;
  return r;
}

struct Harness {
  explicit Harness(EngineConfig config, bool with_tokenizer = false) {
    auto fake = std::make_unique<FakeRunner>();
    runner = fake.get();
    auto created = Engine::Create(std::move(fake), with_tokenizer ? &tokenizer : nullptr, config);
    EXPECT_TRUE(created.ok()) << created.status();
    engine = std::move(*created);
  }
  absl::Status Submit(EngineRequest r) {
    return engine->Submit(std::move(r), collector.Callback());
  }

  FakeTokenizer tokenizer;
  Collector collector;
  FakeRunner* runner = nullptr;  // owned by engine
  std::unique_ptr<Engine> engine;
};

// Runs each request alone in a fresh engine.
Completion Alone(EngineRequest r, bool with_tokenizer = false) {
  EngineConfig config;
  config.state_memory_bytes = 64 * 1024;
  Harness h(config, with_tokenizer);
  const std::string id = r.request_id;
  EXPECT_TRUE(h.Submit(std::move(r)).ok());
  EXPECT_TRUE(h.collector.WaitFinished(1));
  return h.collector.Get(id);
}

TEST(EngineTest, BatchInvarianceOf32ConcurrentGreedyRequests) {
  std::vector<EngineRequest> requests;
  requests.reserve(32);
  for (int i = 0; i < 32; ++i) requests.push_back(Request(absl::StrCat("r", i), 5 + i * 3, i, 12));
  EngineConfig config;
  config.max_batch_tokens = 64;  // forces chunked prefill next to decodes
  config.state_memory_bytes = 64 * 1024;
  Harness h(config);
  for (const EngineRequest& r : requests) ASSERT_TRUE(h.Submit(r).ok());
  ASSERT_TRUE(h.collector.WaitFinished(32));
  EXPECT_GT(h.engine->Stats().steps_total, 0);
  for (const EngineRequest& r : requests) {
    Completion together = h.collector.Get(r.request_id);
    Completion alone = Alone(r);
    EXPECT_EQ(together.tokens, alone.tokens) << r.request_id;
    EXPECT_EQ(together.tokens.size(), 12u);
    EXPECT_EQ(together.reason, FinishReason::kLength);
  }
}

// A request that reads nothing of its logits but its draw gets its tokens
// from the runner's draw; asking for logprobs sends its logits to the host
// sampler instead. The tokens must not depend on which one drew them, nor on
// a neighbour the host samples.
TEST(EngineTest, DeviceDrawsMatchTheHostSampler) {
  EngineConfig config;
  config.state_memory_bytes = 64 * 1024;
  std::vector<EngineRequest> variants;
  variants.push_back(Request("r", 9, 3, 16));  // greedy
  for (const auto& [top_k, top_p, min_p] :
       {std::tuple{0, 1.0f, 0.0f}, std::tuple{5, 1.0f, 0.0f}, std::tuple{0, 0.7f, 0.0f},
        std::tuple{0, 1.0f, 0.5f}, std::tuple{20, 0.9f, 0.1f}}) {
    EngineRequest r = Request("r", 9, 3, 16);
    r.sampling.temperature = 0.8f;
    r.sampling.seed = 11;
    r.sampling.top_k = top_k;
    r.sampling.top_p = top_p;
    r.sampling.min_p = min_p;
    variants.push_back(r);
  }
  EngineRequest penalized = Request("p", 7, 5, 16);
  penalized.sampling.repetition_penalty = 1.3f;
  Harness penalized_alone(config);
  ASSERT_TRUE(penalized_alone.Submit(penalized).ok());
  ASSERT_TRUE(penalized_alone.collector.WaitFinished(1));
  for (size_t v = 0; v < variants.size(); ++v) {
    Harness device(config);
    ASSERT_TRUE(device.Submit(variants[v]).ok());
    ASSERT_TRUE(device.collector.WaitFinished(1));
    EXPECT_EQ(device.runner->device_draws.load(), 16) << v;
    EXPECT_EQ(device.runner->host_draws.load(), 0) << v;

    // A logit bias of 0 changes no logit but keeps the draws on the host.
    EngineRequest biased = variants[v];
    biased.sampling.logit_bias[0] = 0.0f;
    biased.sampling.logprobs = 3;
    Harness host(config);
    ASSERT_TRUE(host.Submit(biased).ok());
    ASSERT_TRUE(host.collector.WaitFinished(1));
    EXPECT_EQ(host.runner->device_draws.load(), 0) << v;
    EXPECT_EQ(device.collector.Get("r").tokens, host.collector.Get("r").tokens) << v;
    EXPECT_EQ(device.collector.Get("r").tokens.size(), 16u) << v;

    // Logprobs are drawn on the device too, with the host sampler's values.
    EngineRequest listed = variants[v];
    listed.sampling.logprobs = 3;
    Harness with_logprobs(config);
    ASSERT_TRUE(with_logprobs.Submit(listed).ok());
    ASSERT_TRUE(with_logprobs.collector.WaitFinished(1));
    EXPECT_EQ(with_logprobs.runner->device_draws.load(), 16) << v;
    const Completion on_device = with_logprobs.collector.Get("r");
    const Completion on_host = host.collector.Get("r");
    EXPECT_EQ(on_device.tokens, on_host.tokens) << v;
    ASSERT_EQ(on_device.logprobs.size(), 16u) << v;
    ASSERT_EQ(on_host.logprobs.size(), 16u) << v;
    for (size_t t = 0; t < 16; ++t) {
      EXPECT_EQ(on_device.logprobs[t].token, on_host.logprobs[t].token) << v << " " << t;
      EXPECT_EQ(on_device.logprobs[t].logprob, on_host.logprobs[t].logprob) << v << " " << t;
      EXPECT_EQ(on_device.logprobs[t].top, on_host.logprobs[t].top) << v << " " << t;
    }

    // Beside a request the host samples, each keeps its own path and tokens.
    Harness mixed(config);
    ASSERT_TRUE(mixed.Submit(variants[v]).ok());
    ASSERT_TRUE(mixed.Submit(penalized).ok());
    ASSERT_TRUE(mixed.collector.WaitFinished(2));
    EXPECT_EQ(mixed.runner->device_draws.load(), 16) << v;
    EXPECT_EQ(mixed.runner->host_draws.load(), 16) << v;
    EXPECT_EQ(mixed.collector.Get("r").tokens, device.collector.Get("r").tokens) << v;
    EXPECT_EQ(mixed.collector.Get("p").tokens, penalized_alone.collector.Get("p").tokens) << v;
  }
}

// The host draws a step's rows in parallel (here those with a repetition
// penalty; the others draw on the device): each request's tokens and
// logprobs are those it gets alone.
TEST(EngineTest, HostDrawsOfManyRequestsMatchEachAlone) {
  const auto request = [](int i) {
    EngineRequest r = Request(absl::StrCat("h", i), 5 + i % 4, i, 12);
    r.sampling.temperature = 0.8f;
    r.sampling.top_p = 0.9f;
    r.sampling.seed = 100 + i;
    r.sampling.logprobs = 2;
    r.sampling.repetition_penalty = i % 2 == 0 ? 1.2f : 1.0f;
    return r;
  };
  EngineConfig config;
  config.state_memory_bytes = 64 * 1024;
  Harness h(config);
  constexpr int kRequests = 8;
  for (int i = 0; i < kRequests; ++i) ASSERT_TRUE(h.Submit(request(i)).ok());
  ASSERT_TRUE(h.collector.WaitFinished(kRequests));
  EXPECT_GT(h.runner->host_draws.load(), 0);
  for (int i = 0; i < kRequests; ++i) {
    const Completion alone = Alone(request(i));
    const Completion together = h.collector.Get(absl::StrCat("h", i));
    EXPECT_EQ(together.tokens, alone.tokens) << i;
    ASSERT_EQ(together.logprobs.size(), alone.logprobs.size()) << i;
    for (size_t t = 0; t < alone.logprobs.size(); ++t) {
      EXPECT_EQ(together.logprobs[t].logprob, alone.logprobs[t].logprob) << i << " " << t;
      EXPECT_EQ(together.logprobs[t].top, alone.logprobs[t].top) << i << " " << t;
    }
  }
}

TEST(EngineTest, PreemptionAndResumeGiveIdenticalOutputs) {
  EngineConfig config;
  config.state_memory_bytes = 2 * 1024;  // two slots for eight requests
  config.preempt_quantum_tokens = 3;
  config.max_batch_tokens = 16;
  Harness h(config);
  std::vector<EngineRequest> requests;
  requests.reserve(8);
  for (int i = 0; i < 8; ++i) requests.push_back(Request(absl::StrCat("p", i), 10 + i, i, 20));
  for (const EngineRequest& r : requests) ASSERT_TRUE(h.Submit(r).ok());
  ASSERT_TRUE(h.collector.WaitFinished(8));
  EXPECT_GT(h.engine->Stats().preemptions_total, 0);
  EXPECT_GT(h.runner->restores.load(), 0);
  for (const EngineRequest& r : requests) {
    EXPECT_EQ(h.collector.Get(r.request_id).tokens, Alone(r).tokens) << r.request_id;
  }
}

TEST(EngineTest, FullCacheQueuesInsteadOfFailing) {
  EngineConfig config;
  config.state_memory_bytes = 1024;  // one slot
  Harness h(config);
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(h.Submit(Request(absl::StrCat("q", i), 4, i, 3)).ok());
  ASSERT_TRUE(h.collector.WaitFinished(5));
  for (int i = 0; i < 5; ++i) {
    Completion c = h.collector.Get(absl::StrCat("q", i));
    EXPECT_EQ(c.reason, FinishReason::kLength);
    EXPECT_EQ(c.tokens.size(), 3u);
  }
  EXPECT_EQ(h.engine->Stats().slots_total, 1);
}

TEST(EngineTest, CancellationFreesTheSlot) {
  EngineConfig config;
  config.state_memory_bytes = 1024;  // one slot
  Harness h(config);
  ASSERT_TRUE(h.Submit(Request("long", 4, 1, 30000)).ok());
  ASSERT_TRUE(h.Submit(Request("next", 4, 2, 2)).ok());
  // "next" can only run once "long" gives its slot back.
  while (h.engine->Stats().generated_tokens_total < 5) absl::SleepFor(absl::Milliseconds(1));
  EXPECT_EQ(h.collector.finished(), 0);
  h.engine->Cancel("long");
  ASSERT_TRUE(h.collector.WaitFinished(2));
  EXPECT_EQ(h.collector.Get("long").reason, FinishReason::kCancelled);
  EXPECT_EQ(h.collector.Get("next").reason, FinishReason::kLength);
  h.engine->Shutdown(absl::Seconds(5));
  EXPECT_EQ(h.engine->Stats().slots_used, 0);
}

TEST(EngineTest, StopStringSplitAcrossTokens) {
  EngineRequest r = Request("s", 6, 3, 40);
  Completion free_run = Alone(r, /*with_tokenizer=*/true);
  ASSERT_GE(free_run.text.size(), 30u);
  // Three letters starting inside a token: "xy|zw" style boundaries.
  const std::string stop = free_run.text.substr(21, 3);
  const size_t first = free_run.text.find(stop);
  r.sampling.stop = {stop};
  Completion stopped = Alone(r, true);
  EXPECT_EQ(stopped.reason, FinishReason::kStop);
  EXPECT_EQ(stopped.stop_reason, stop);
  EXPECT_EQ(stopped.text, free_run.text.substr(0, first));
  // Generation stopped at the token that completed the stop string.
  ASSERT_LE(stopped.tokens.size(), free_run.tokens.size());
  const std::vector<int32_t> prefix(free_run.tokens.begin(),
                                    free_run.tokens.begin() + stopped.tokens.size());
  EXPECT_EQ(stopped.tokens, prefix);
  FakeTokenizer tokenizer;
  EXPECT_NE(tokenizer.Decode(prefix, true).find(stop), std::string::npos);
  EXPECT_EQ(tokenizer.Decode(std::span(prefix).first(prefix.size() - 1), true).find(stop),
            std::string::npos);
  r.sampling.include_stop_str_in_output = true;
  EXPECT_EQ(Alone(r, true).text, free_run.text.substr(0, first + stop.size()));
}

// min_tokens: no stop token is sampled, and no stop string matched, before
// a completion has that many tokens.
TEST(EngineTest, MinTokensHoldsStopsBack) {
  const EngineRequest r = Request("m", 6, 3, 12);
  const Completion free_run = Alone(r, /*with_tokenizer=*/true);
  ASSERT_EQ(free_run.tokens.size(), 12u);
  EngineRequest by_token = r;
  by_token.sampling.stop_token_ids = {free_run.tokens[1]};
  const Completion early = Alone(by_token, true);
  EXPECT_EQ(early.reason, FinishReason::kStop);
  EXPECT_EQ(early.tokens.size(), 2u);
  by_token.sampling.min_tokens = 6;
  const Completion held = Alone(by_token, true);
  ASSERT_GE(held.tokens.size(), 6u);
  for (int i = 0; i < 5; ++i) EXPECT_NE(held.tokens[i], free_run.tokens[1]) << "token " << i;

  EngineRequest by_string = r;
  const std::string stop = free_run.text.substr(2, 3);
  by_string.sampling.stop = {stop};
  EXPECT_EQ(Alone(by_string, true).reason, FinishReason::kStop);
  by_string.sampling.min_tokens = 12;
  const Completion full = Alone(by_string, true);
  EXPECT_EQ(full.tokens, free_run.tokens);
  EXPECT_EQ(full.text.find(stop), 2u);
}

// skip_special_tokens (the default) leaves special tokens out of the text.
TEST(EngineTest, SkipSpecialTokensChoosesWhetherTheyAreText) {
  EngineRequest r = Request("k", 4, 1, 3);  // ignore_eos: EOS does not stop it
  r.sampling.logit_bias[FakeTokenizer::kEos] = 100.0f;
  const Completion skipped = Alone(r, /*with_tokenizer=*/true);
  EXPECT_EQ(skipped.tokens, std::vector<int32_t>(3, FakeTokenizer::kEos));
  EXPECT_EQ(skipped.text, "");
  r.sampling.skip_special_tokens = false;
  EXPECT_EQ(Alone(r, true).text, "</s></s></s>");
}

// allowed_token_ids: only those are sampled, greedy or not.
TEST(EngineTest, AllowedTokenIdsAreTheOnlyChoices) {
  for (float temperature : {0.0f, 1.0f}) {
    EngineRequest r = Request("a", 5, 2, 20);
    r.sampling.temperature = temperature;
    r.sampling.seed = 7;
    r.sampling.allowed_token_ids = {3, 42, 77};
    const Completion c = Alone(r);
    ASSERT_EQ(c.tokens.size(), 20u);
    for (int32_t t : c.tokens) EXPECT_TRUE(t == 3 || t == 42 || t == 77) << t;
  }
}

TEST(EngineTest, SeedsReproduceRegardlessOfBatch) {
  auto seeded = [](const std::string& id, uint64_t seed) {
    EngineRequest r = Request(id, 7, 4, 16);
    r.sampling.temperature = 0.9f;
    r.sampling.top_p = 0.9f;
    r.sampling.seed = seed;
    return r;
  };
  EngineConfig config;
  config.state_memory_bytes = 64 * 1024;
  Harness h(config);
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(h.Submit(Request(absl::StrCat("x", i), 9, i, 16)).ok());
  ASSERT_TRUE(h.Submit(seeded("a", 42)).ok());
  ASSERT_TRUE(h.Submit(seeded("b", 43)).ok());
  ASSERT_TRUE(h.collector.WaitFinished(12));
  const Completion alone = Alone(seeded("a", 42));
  EXPECT_EQ(h.collector.Get("a").tokens, alone.tokens);
  EXPECT_NE(h.collector.Get("b").tokens, alone.tokens);
}

TEST(EngineTest, NGreaterThanOneSharesThePrefill) {
  EngineRequest r = Request("n", 50, 5, 6);
  r.sampling.n = 4;
  r.sampling.temperature = 1.0f;
  r.sampling.seed = 9;
  EngineConfig config;
  config.state_memory_bytes = 64 * 1024;
  Harness h(config);
  ASSERT_TRUE(h.Submit(r).ok());
  ASSERT_TRUE(h.collector.WaitFinished(4));
  // One prefill of 50 tokens, then 5 decode tokens per completion.
  EXPECT_EQ(h.runner->tokens_run.load(), 50 + 4 * 5);
  EXPECT_EQ(h.runner->copies.load(), 3);
  std::vector<std::vector<int32_t>> outputs;
  for (int i = 0; i < 4; ++i) {
    Completion c = h.collector.Get("n", i);
    EXPECT_EQ(c.tokens.size(), 6u);
    EXPECT_EQ(c.usage.prompt_tokens, 50);
    outputs.push_back(c.tokens);
  }
  EXPECT_NE(outputs[0], outputs[1]);  // own RNG per completion
  // Completion 0 matches the same request with n = 1.
  r.sampling.n = 1;
  EXPECT_EQ(Alone(r).tokens, outputs[0]);
}

TEST(EngineTest, RunnerFailureFinishesOnlyThatRequest) {
  EngineConfig config;
  config.state_memory_bytes = 64 * 1024;
  Harness h(config);
  h.runner->set_fail_token(499);
  EngineRequest bad = Request("bad", 4, 0, 5);
  bad.prompt_tokens[2] = 499;
  ASSERT_TRUE(h.Submit(bad).ok());
  ASSERT_TRUE(h.Submit(Request("good", 4, 1, 5)).ok());
  ASSERT_TRUE(h.collector.WaitFinished(2));
  EXPECT_EQ(h.collector.Get("bad").reason, FinishReason::kError);
  EXPECT_EQ(h.collector.Get("bad").status.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(h.collector.Get("good").reason, FinishReason::kLength);
  ASSERT_TRUE(h.Submit(Request("after", 4, 2, 2)).ok());
  ASSERT_TRUE(h.collector.WaitFinished(3));
  EXPECT_EQ(h.collector.Get("after").reason, FinishReason::kLength);
}

TEST(EngineTest, ValidationErrorsNameTheField) {
  EngineConfig config;
  config.state_memory_bytes = 64 * 1024;
  config.max_prompt_tokens = 100;
  config.max_new_tokens = 1000;
  Harness h(config);
  struct Case {
    const char* field;
    void (*mutate)(EngineRequest&);
  };
  const Case cases[] = {
      {"prompt_tokens", [](EngineRequest& r) { r.prompt_tokens.clear(); }},
      {"prompt_tokens", [](EngineRequest& r) { r.prompt_tokens.assign(101, 1); }},
      {"prompt_tokens", [](EngineRequest& r) { r.prompt_tokens[0] = 512; }},
      {"request_id", [](EngineRequest& r) { r.request_id.clear(); }},
      {"sampling.n", [](EngineRequest& r) { r.sampling.n = 0; }},
      {"sampling.max_tokens", [](EngineRequest& r) { r.sampling.max_tokens = 0; }},
      {"sampling.max_tokens", [](EngineRequest& r) { r.sampling.max_tokens = 1001; }},
      {"sampling.min_tokens", [](EngineRequest& r) { r.sampling.min_tokens = 5; }},
      {"sampling.min_tokens", [](EngineRequest& r) { r.sampling.min_tokens = -1; }},
      {"sampling.allowed_token_ids",
       [](EngineRequest& r) { r.sampling.allowed_token_ids = {512}; }},
      {"sampling.allowed_token_ids",
       [](EngineRequest& r) {
         r.sampling.stop_token_ids = {9};
         r.sampling.allowed_token_ids = {9};
         r.sampling.min_tokens = 1;
       }},
      {"sampling.temperature", [](EngineRequest& r) { r.sampling.temperature = -0.5f; }},
      {"sampling.top_p", [](EngineRequest& r) { r.sampling.top_p = 0; }},
      {"sampling.top_p", [](EngineRequest& r) { r.sampling.top_p = 1.5f; }},
      {"sampling.top_k", [](EngineRequest& r) { r.sampling.top_k = -1; }},
      {"sampling.min_p", [](EngineRequest& r) { r.sampling.min_p = 1.5f; }},
      {"sampling.repetition_penalty", [](EngineRequest& r) { r.sampling.repetition_penalty = 0; }},
      {"sampling.logprobs", [](EngineRequest& r) { r.sampling.logprobs = 21; }},
      {"sampling.logit_bias", [](EngineRequest& r) { r.sampling.logit_bias[-1] = 1; }},
      {"sampling.stop_token_ids", [](EngineRequest& r) { r.sampling.stop_token_ids = {600}; }},
      {"sampling.stop", [](EngineRequest& r) { r.sampling.stop = {"x"}; }},  // no tokenizer
  };
  for (const Case& c : cases) {
    EngineRequest r = Request("v", 4, 0, 4);
    c.mutate(r);
    absl::Status s = h.Submit(r);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_TRUE(absl::StartsWith(s.message(), c.field)) << c.field << " vs " << s.message();
  }
  ASSERT_TRUE(h.Submit(Request("dup", 4, 0, 1000)).ok());
  absl::Status dup = h.Submit(Request("dup", 4, 0, 4));
  EXPECT_EQ(dup.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StartsWith(dup.message(), "request_id"));
  h.engine->Shutdown(absl::ZeroDuration());
  EXPECT_EQ(h.Submit(Request("late", 4, 0, 4)).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(h.collector.WaitFinished(1));
  EXPECT_EQ(h.collector.Get("dup").reason, FinishReason::kCancelled);
}

TEST(EngineTest, QueueFullIsResourceExhausted) {
  EngineConfig config;
  config.state_memory_bytes = 1024;
  config.max_waiting = 2;
  Harness h(config);
  int accepted = 0;
  absl::Status last;
  for (int i = 0; i < 50 && last.ok(); ++i) {
    last = h.Submit(Request(absl::StrCat("w", i), 4, i, 30000));
    if (last.ok()) ++accepted;
  }
  EXPECT_EQ(last.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_LE(accepted, 3);  // one may already hold the slot
  h.engine->Shutdown(absl::ZeroDuration());
  EXPECT_EQ(h.collector.finished(), accepted);
}

TEST(EngineTest, ShutdownLetsRunningRequestsFinishWithinGrace) {
  EngineConfig config;
  config.state_memory_bytes = 64 * 1024;
  Harness h(config);
  ASSERT_TRUE(h.Submit(Request("short", 4, 0, 5)).ok());
  h.engine->Shutdown(absl::Seconds(10));
  EXPECT_EQ(h.collector.Get("short").reason, FinishReason::kLength);
  h.engine->Shutdown(absl::Seconds(10));  // idempotent
}

TEST(EngineTest, RandomizedLoadEndsWithEveryRequestDoneAndNoSlotLeaked) {
  EngineConfig config;
  config.state_memory_bytes = 6 * 1024;
  config.max_batch_tokens = 48;
  config.preempt_quantum_tokens = 8;
  Harness h(config, /*with_tokenizer=*/true);
  std::mt19937 rng(1234);
  int completions = 0;
  std::vector<std::string> ids;
  for (int i = 0; i < 120; ++i) {
    EngineRequest r = Request(absl::StrCat("z", i), 1 + rng() % 60, i, 1 + rng() % 25);
    r.sampling.n = 1 + rng() % 3;
    r.sampling.temperature = (rng() % 2) * 0.8f;
    r.sampling.top_k = rng() % 4 == 0 ? 5 : 0;
    r.sampling.top_p = rng() % 4 == 0 ? 0.7f : 1.0f;
    r.sampling.repetition_penalty = rng() % 5 == 0 ? 1.3f : 1.0f;
    r.sampling.logprobs = static_cast<int>(rng() % 3) - 1;
    r.sampling.ignore_eos = rng() % 2 == 0;
    if (rng() % 4 == 0) r.sampling.stop = {"ab"};
    if (rng() % 3 == 0) r.sampling.seed = rng();
    completions += r.sampling.n;
    ASSERT_TRUE(h.Submit(r).ok());
    ids.push_back(r.request_id);
    if (rng() % 5 == 0) h.engine->Cancel(ids[rng() % ids.size()]);
  }
  ASSERT_TRUE(h.collector.WaitFinished(completions, absl::Seconds(25)));
  for (int i = 0; i < 120; ++i) {
    Completion c = h.collector.Get(ids[i]);
    EXPECT_TRUE(c.reason == FinishReason::kStop || c.reason == FinishReason::kLength ||
                c.reason == FinishReason::kCancelled)
        << ids[i] << " " << FinishReasonName(c.reason);
  }
  h.engine->Shutdown(absl::Seconds(5));
  EngineStats stats = h.engine->Stats();
  EXPECT_EQ(stats.slots_used, 0);
  EXPECT_EQ(stats.running, 0);
  EXPECT_EQ(stats.waiting, 0);
}

}  // namespace
}  // namespace lair::engine
