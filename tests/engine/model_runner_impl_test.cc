// The engine over real tiny models (CPU backend): it must reproduce the
// reference greedy tokens, and batching, chunking, preemption and n > 1
// must not change any output.
#include "engine/model_runner_impl.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/safetensors.h"
#include "engine/engine.h"
#include "gtest/gtest.h"
#include "models/model.h"
#include "tests/engine/fakes.h"
#include "tests/support/fixtures.h"

namespace lair::engine {
namespace {

using testing::Collector;

std::vector<int32_t> Ints(const Tensor& t) {
  std::vector<int32_t> out;
  for (int64_t i = 0; i < t.numel(); ++i) out.push_back(static_cast<int32_t>(t.data<int64_t>()[i]));
  return out;
}

std::unique_ptr<Engine> MakeEngine(const std::string& dir, EngineConfig config) {
  auto runner = ModelRunnerImpl::Load(dir, "cpu", models::LoadOptions());
  EXPECT_TRUE(runner.ok()) << runner.status();
  if (!runner.ok()) return nullptr;
  auto engine = Engine::Create(std::move(*runner), nullptr, config);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return engine.ok() ? std::move(*engine) : nullptr;
}

EngineRequest Greedy(const std::string& id, std::vector<int32_t> prompt, int max_tokens) {
  EngineRequest r;
  r.request_id = id;
  r.prompt_tokens = std::move(prompt);
  r.sampling.temperature = 0;
  r.sampling.max_tokens = max_tokens;
  return r;
}

// Runs `requests` together in one engine; returns each completion's tokens.
std::vector<std::vector<int32_t>> RunAll(const std::string& dir, EngineConfig config,
                                         const std::vector<EngineRequest>& requests) {
  std::unique_ptr<Engine> engine = MakeEngine(dir, config);
  if (engine == nullptr) return {};
  Collector collector;
  int completions = 0;
  for (const EngineRequest& r : requests) {
    EXPECT_TRUE(engine->Submit(r, collector.Callback()).ok());
    completions += r.sampling.n;
  }
  EXPECT_TRUE(collector.WaitFinished(completions));
  std::vector<std::vector<int32_t>> out;
  for (const EngineRequest& r : requests) {
    for (int i = 0; i < r.sampling.n; ++i) out.push_back(collector.Get(r.request_id, i).tokens);
  }
  return out;
}

class RealModelTest : public ::testing::TestWithParam<std::string> {};

TEST_P(RealModelTest, ReproducesReferenceGreedyTokensWithChunkedPrefill) {
  LAIR_FIXTURE_OR_SKIP(dir, "models/" + GetParam());
  auto golden = SafetensorsFile::Open(dir + "/golden.safetensors");
  ASSERT_TRUE(golden.ok()) << golden.status();
  const std::vector<int32_t> prompt = Ints(*(*golden)->Get("prompt_a"));
  const std::vector<int32_t> expected = Ints(*(*golden)->Get("greedy_a"));
  EngineConfig config;
  config.max_batch_tokens = 32;  // the 100-token prompt runs as 32+32+32+4
  config.state_memory_bytes = int64_t{64} << 20;
  config.max_running = 8;
  auto out = RunAll(dir, config, {Greedy("a", prompt, static_cast<int>(expected.size()))});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0], expected);
}

TEST_P(RealModelTest, BatchingPreemptionAndForkingDoNotChangeOutputs) {
  LAIR_FIXTURE_OR_SKIP(dir, "models/" + GetParam());
  auto golden = SafetensorsFile::Open(dir + "/golden.safetensors");
  ASSERT_TRUE(golden.ok()) << golden.status();
  const std::vector<int32_t> base = Ints(*(*golden)->Get("prompt_a"));
  std::vector<EngineRequest> requests;
  for (int i = 0; i < 6; ++i) {
    requests.push_back(Greedy(absl::StrCat("g", i),
                              std::vector<int32_t>(base.begin() + i * 7, base.begin() + 30 + i * 9),
                              8));
  }
  EngineRequest sampled = Greedy("s", std::vector<int32_t>(base.begin(), base.begin() + 20), 8);
  sampled.sampling.temperature = 0.8f;
  sampled.sampling.seed = 5;
  sampled.sampling.n = 3;
  requests.push_back(sampled);

  EngineConfig roomy;
  roomy.state_memory_bytes = int64_t{64} << 20;
  roomy.max_running = 16;
  const auto together = RunAll(dir, roomy, requests);
  EngineConfig tight = roomy;  // two slots, round-robin with saved states
  tight.max_running = 2;
  tight.max_batch_tokens = 24;
  tight.preempt_quantum_tokens = 5;
  const auto preempted = RunAll(dir, tight, requests);
  ASSERT_EQ(together.size(), 9u);
  EXPECT_EQ(preempted, together);
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(RunAll(dir, roomy, {requests[i]})[0], together[i]) << requests[i].request_id;
  }
  EngineRequest single = sampled;
  single.sampling.n = 1;
  EXPECT_EQ(RunAll(dir, roomy, {single})[0], together[6]);
}

TEST(RealModelContextTest, LlamaStopsAtItsContextAndRefusesLongerPrompts) {
  LAIR_FIXTURE_OR_SKIP(dir, "models/llama-tiny");
  models::LoadOptions options;
  options.max_context = 64;
  auto runner = ModelRunnerImpl::Load(dir, "cpu", options);
  ASSERT_TRUE(runner.ok()) << runner.status();
  EXPECT_EQ((*runner)->max_context(), 64);
  EngineConfig config;
  config.state_memory_bytes = int64_t{64} << 20;
  config.max_running = 4;
  auto engine = Engine::Create(std::move(*runner), nullptr, config);
  ASSERT_TRUE(engine.ok()) << engine.status();
  Collector collector;
  absl::Status too_long =
      (*engine)->Submit(Greedy("long", std::vector<int32_t>(64, 3), 4), collector.Callback());
  EXPECT_EQ(too_long.code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE((*engine)
                  ->Submit(Greedy("fits", std::vector<int32_t>(60, 3), 10), collector.Callback())
                  .ok());
  ASSERT_TRUE(collector.WaitFinished(1));
  const testing::Completion c = collector.Get("fits");
  EXPECT_EQ(c.reason, FinishReason::kLength);
  EXPECT_EQ(c.tokens.size(), 4u);  // 60 + 4 fills the 64-token context
}

INSTANTIATE_TEST_SUITE_P(Families, RealModelTest,
                         ::testing::Values("gla-tiny", "mamba2-tiny", "llama-tiny"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name = info.param;
                           for (char& c : name) c = c == '-' ? '_' : c;
                           return name;
                         });

}  // namespace
}  // namespace lair::engine
