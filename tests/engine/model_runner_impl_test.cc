// The engine over real tiny models (CPU backend): it must reproduce the
// reference greedy tokens, and batching, chunking, preemption and n > 1
// must not change any output.
#include "engine/model_runner_impl.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/safetensors.h"
#include "engine/engine.h"
#include "engine/sampler.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/sampling.h"
#include "models/model.h"
#include "models/state_pool.h"
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

// Two prompts in one step, run by fresh runners told to draw none, one or
// both on the device: the drawn ones come back as the tokens
// kernels::SampleRow draws from the logits the host would have sampled, the
// others as those logits.
TEST_P(RealModelTest, RunnerDrawsOnTheDeviceWhatTheEngineMarks) {
  LAIR_FIXTURE_OR_SKIP(dir, "models/" + GetParam());
  auto golden = SafetensorsFile::Open(dir + "/golden.safetensors");
  ASSERT_TRUE(golden.ok()) << golden.status();
  const std::vector<int32_t> prompt = Ints(*(*golden)->Get("prompt_a"));
  const std::vector<int32_t> shorter(prompt.begin(), prompt.begin() + prompt.size() / 2);
  using Draws = absl::flat_hash_map<SequenceId, kernels::RowSampling>;
  auto run = [&](Draws draws) {
    auto runner = ModelRunnerImpl::Load(dir, "cpu", models::LoadOptions());
    EXPECT_TRUE(runner.ok()) << runner.status();
    if (!runner.ok()) return RunnerOutput();
    EXPECT_TRUE((*runner)->CreateSlots(2).ok());
    ScheduleOutput step;
    for (const auto& [id, tokens] : {std::pair{0, prompt}, std::pair{1, shorter}}) {
      NewSequenceData& data = step.new_sequences.emplace_back();
      data.id = id;
      data.slot = id;
      data.token_ids = tokens;
    }
    step.num_scheduled_tokens = {{0, static_cast<int>(prompt.size())},
                                 {1, static_cast<int>(shorter.size())}};
    step.total_num_scheduled_tokens = static_cast<int>(prompt.size() + shorter.size());
    step.device_sampling = std::move(draws);
    return (*runner)->Execute(step);
  };
  const RunnerOutput host = run({});
  ASSERT_TRUE(host.failures.empty());
  ASSERT_EQ(host.logits.size(), 2u);
  EXPECT_TRUE(host.tokens.empty());
  const kernels::RowSampling greedy;
  const kernels::RowSampling drawn{
      .temperature = 0.9f, .top_k = 0, .top_p = 0.9f, .min_p = 0, .u = 0.37};
  for (const kernels::RowSampling& rule : {greedy, drawn}) {
    const RunnerOutput one = run({{1, rule}});
    ASSERT_TRUE(one.failures.empty());
    ASSERT_EQ(one.tokens.size(), 1u);
    EXPECT_EQ(one.tokens[0].id, 1);
    EXPECT_EQ(one.tokens[0].token, kernels::SampleRow(host.logits[1].logits, rule));
    ASSERT_EQ(one.logits.size(), 1u);
    EXPECT_EQ(one.logits[0].id, 0);
    EXPECT_EQ(one.logits[0].logits, host.logits[0].logits);

    const RunnerOutput both = run({{0, greedy}, {1, rule}});
    ASSERT_TRUE(both.failures.empty());
    EXPECT_TRUE(both.logits.empty());
    ASSERT_EQ(both.tokens.size(), 2u);
    for (int i = 0; i < 2; ++i) {
      EXPECT_EQ(both.tokens[i].id, host.logits[i].id);
      EXPECT_EQ(both.tokens[i].token,
                kernels::SampleRow(host.logits[i].logits, i == 0 ? greedy : rule));
    }
  }

  // A rule that asks for logprobs gets them with its token: those of the
  // distribution it drew from (the log-softmax when greedy), best first.
  kernels::RowSampling greedy_listed = greedy, drawn_listed = drawn;
  greedy_listed.logprobs = 3;
  drawn_listed.logprobs = 2;
  const RunnerOutput listed = run({{0, greedy_listed}, {1, drawn_listed}});
  ASSERT_TRUE(listed.failures.empty());
  ASSERT_EQ(listed.tokens.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    const kernels::RowSampling& rule = i == 0 ? greedy_listed : drawn_listed;
    std::vector<float> distribution(host.logits[i].logits.size());
    const int32_t token = kernels::SampleRow(host.logits[i].logits, rule, distribution);
    ASSERT_TRUE(listed.tokens[i].logprob.has_value()) << i;
    const TokenLogprob& got = *listed.tokens[i].logprob;
    EXPECT_EQ(listed.tokens[i].token, token) << i;
    EXPECT_EQ(got.token, token) << i;
    EXPECT_EQ(got.logprob, distribution[static_cast<size_t>(token)]) << i;
    EXPECT_EQ(got.top, kernels::TopLogprobs(distribution, rule.logprobs)) << i;
  }
}

TEST_P(RealModelTest, BatchingPreemptionAndForkingDoNotChangeOutputs) {
  LAIR_FIXTURE_OR_SKIP(dir, "models/" + GetParam());
  auto golden = SafetensorsFile::Open(dir + "/golden.safetensors");
  ASSERT_TRUE(golden.ok()) << golden.status();
  const std::vector<int32_t> base = Ints(*(*golden)->Get("prompt_a"));
  std::vector<EngineRequest> requests;
  requests.reserve(6);
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

// SamplingParams::prompt_logprobs scores prompt tokens 1..P-1 with the
// log-softmax of one forward's logits over the whole prompt, whatever the
// chunking and preemption, and every completion of n gets them in its first
// output.
TEST_P(RealModelTest, PromptLogprobsAreOneForwardsLogSoftmax) {
  LAIR_FIXTURE_OR_SKIP(dir, "models/" + GetParam());
  auto golden = SafetensorsFile::Open(dir + "/golden.safetensors");
  ASSERT_TRUE(golden.ok()) << golden.status();
  const std::vector<int32_t> all = Ints(*(*golden)->Get("prompt_a"));
  const std::vector<int32_t> prompt(all.begin(), all.begin() + 40);

  // The reference: the whole prompt's logits from one forward.
  std::unique_ptr<kernels::Backend> backend = kernels::MakeCpuBackend(2);
  auto model = models::Model::Load(dir, backend.get(), models::LoadOptions());
  ASSERT_TRUE(model.ok()) << model.status();
  auto pool = models::StatePool::Create(backend.get(), (*model)->state_layout(), 1);
  ASSERT_TRUE(pool.ok()) << pool.status();
  models::ForwardBatch batch;
  batch.tokens = prompt;
  batch.cu_seqlens = {0, static_cast<int32_t>(prompt.size())};
  batch.slots = {0};
  batch.start_positions = {0};
  batch.all_logits = true;
  auto logits = (*model)->Forward(batch, *pool);
  ASSERT_TRUE(logits.ok()) << logits.status();
  const Tensor host = logits->ToF32();
  const int vocab = (*model)->vocab_size();

  EngineRequest request = Greedy("p", prompt, 3);
  request.sampling.prompt_logprobs = 2;
  request.sampling.n = 2;
  request.sampling.temperature = 0.7f;
  request.sampling.seed = 3;
  EngineConfig config;  // chunks of 16 tokens, one slot: the prompt is preempted and resumed
  config.state_memory_bytes = int64_t{64} << 20;
  config.max_batch_tokens = 16;
  config.max_running = 1;
  config.preempt_quantum_tokens = 16;
  std::unique_ptr<Engine> engine = MakeEngine(dir, config);
  ASSERT_NE(engine, nullptr);
  Collector collector;
  ASSERT_TRUE(engine->Submit(request, collector.Callback()).ok());
  ASSERT_TRUE(collector.WaitFinished(2));
  for (int index = 0; index < 2; ++index) {
    const testing::Completion c = collector.Get("p", index);
    ASSERT_EQ(c.prompt_logprobs.size(), prompt.size() - 1) << "completion " << index;
    for (size_t p = 0; p + 1 < prompt.size(); ++p) {
      std::vector<float> row(host.f32() + p * vocab, host.f32() + (p + 1) * vocab);
      const TokenLogprob want = ScoreToken(row, prompt[p + 1], 2);
      const TokenLogprob& got = c.prompt_logprobs[p];
      EXPECT_EQ(got.token, prompt[p + 1]);
      EXPECT_NEAR(got.logprob, want.logprob, 1e-4) << "position " << p;
      ASSERT_EQ(got.top.size(), 2u);
      EXPECT_EQ(got.top[0].first, want.top[0].first) << "position " << p;
      EXPECT_NEAR(got.top[0].second, want.top[0].second, 1e-4) << "position " << p;
    }
  }
  EngineRequest unscored = request;
  unscored.request_id = "u";
  unscored.sampling.prompt_logprobs = -1;
  ASSERT_TRUE(engine->Submit(unscored, collector.Callback()).ok());
  ASSERT_TRUE(collector.WaitFinished(4));
  EXPECT_TRUE(collector.Get("u").prompt_logprobs.empty());
  EXPECT_EQ(collector.Get("u").tokens, collector.Get("p").tokens);
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
