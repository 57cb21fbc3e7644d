// `lair bench engine`: the serving engine's throughput as `lair serve` runs
// it (scheduler, state cache, model runner, sampler, output processing),
// without the network front ends; vLLM's offline throughput benchmark.
//
//   lair bench engine --model DIR [--device cpu|cuda] [--dtype f32|bf16] [--gemm fast|exact]
//                     --batch B --prompt-len P --gen-len G [--temperature T]
//                     [--top-k K] [--top-p P] [--logprobs N] [--host-requests H]
//                     [--max-batch-tokens N] [--rounds R]
//
// It loads DIR as `lair serve` does (cli/serving_model.h), makes an Engine
// of B state slots, then runs R rounds. A round submits B requests at once,
// each of P random prompt tokens and G generated tokens (ignore_eos;
// temperature T, 0 = greedy, with top_k and top_p; N logprobs a token with
// --logprobs N; seeded), and waits for all of them. The first
// round warms up (it records the decode step graphs) and is not reported.
// For each other round it reports:
//   - decode: once every request has its first token, until the last one
//     finishes, the tokens generated over that time, and the time a step
//     (that window over the steps of the request that started last);
//   - end to end: B·G tokens over the time from submission to the last finish;
//   - time to first token, mean and longest.
// The first H requests (0 unless --host-requests) carry a logit bias (of 0,
// on token 0: the same distribution), so the host samples them from their
// downloaded logits rows; the others ask for nothing the device cannot
// draw, so it draws them, logprobs included (ScheduleOutput::
// device_sampling). `lair bench decode` times the model's greedy steps
// alone, for comparison.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "cli/bench_command.h"
#include "cli/command_registry.h"
#include "cli/serving_model.h"
#include "engine/engine.h"
#include "engine/sampler.h"

namespace lair::cli {
namespace {

using Clock = std::chrono::steady_clock;

struct BenchEngineFlags {
  ServingModelFlags model;
  int batch = 1;
  int prompt_len = 0;
  int gen_len = 0;
  float temperature = 0;
  int top_k = 0;
  float top_p = 1;
  int logprobs = -1;
  int host_requests = 0;
  int max_batch_tokens = engine::EngineConfig().max_batch_tokens;
  int rounds = 3;
};

absl::Status Validate(const BenchEngineFlags& f) {
  if (f.batch < 1) return absl::InvalidArgumentError("--batch must be >= 1");
  if (f.prompt_len < 1) return absl::InvalidArgumentError("--prompt-len must be >= 1");
  if (f.gen_len < 2) return absl::InvalidArgumentError("--gen-len must be >= 2");
  if (!(f.temperature >= 0)) return absl::InvalidArgumentError("--temperature must be >= 0");
  if (f.top_k < 0) return absl::InvalidArgumentError("--top-k must be >= 0");
  if (!(f.top_p > 0 && f.top_p <= 1))
    return absl::InvalidArgumentError("--top-p must be in (0, 1]");
  if (f.logprobs < -1 || f.logprobs > engine::kMaxLogprobs) {
    return absl::InvalidArgumentError(
        absl::StrCat("--logprobs must be in [-1, ", engine::kMaxLogprobs, "]"));
  }
  if (f.host_requests < 0 || f.host_requests > f.batch) {
    return absl::InvalidArgumentError("--host-requests must be in [0, --batch]");
  }
  if (f.max_batch_tokens < 1) return absl::InvalidArgumentError("--max-batch-tokens must be >= 1");
  if (f.rounds < 2) {
    return absl::InvalidArgumentError("--rounds must be >= 2 (the first one warms up)");
  }
  return absl::OkStatus();
}

// Each request's outputs as they arrive on the engine thread.
class Recorder {
 public:
  struct Output {
    Clock::time_point at;
    int tokens = 0;
  };

  explicit Recorder(int requests) : outputs_(requests) {}

  engine::OutputCallback Callback(int request) {
    return [this, request](const engine::RequestOutput& out) {
      absl::MutexLock lock(&mu_);
      outputs_[request].push_back({Clock::now(), static_cast<int>(out.new_tokens.size())});
      if (out.finished()) {
        ++finished_;
        if (out.finish_reason != engine::FinishReason::kLength) {
          failure_ = absl::StrCat("request ", request, " ended with ",
                                  engine::FinishReasonName(out.finish_reason), ": ",
                                  out.status.ToString());
        }
      }
    };
  }

  // Waits for every request; the failure of one, if any.
  absl::Status Wait() {
    absl::MutexLock lock(&mu_);
    auto all = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return finished_ == static_cast<int>(outputs_.size());
    };
    mu_.Await(absl::Condition(&all));
    return failure_.empty() ? absl::OkStatus() : absl::InternalError(failure_);
  }

  // REQUIRES: Wait() returned.
  std::vector<std::vector<Output>> outputs() {
    absl::MutexLock lock(&mu_);
    return outputs_;
  }

 private:
  absl::Mutex mu_;
  std::vector<std::vector<Output>> outputs_ ABSL_GUARDED_BY(mu_);
  int finished_ ABSL_GUARDED_BY(mu_) = 0;
  std::string failure_ ABSL_GUARDED_BY(mu_);
};

struct RoundFigures {
  double decode_tokens_per_second = 0;
  double step_seconds = 0;
  double end_to_end_tokens_per_second = 0;
  double mean_first_token_seconds = 0;
  double max_first_token_seconds = 0;
};

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

RoundFigures Measure(const std::vector<std::vector<Recorder::Output>>& outputs,
                     Clock::time_point submitted, int gen_len) {
  RoundFigures r;
  Clock::time_point all_started = submitted, last_finish = submitted;
  size_t last_starter = 0;
  for (size_t i = 0; i < outputs.size(); ++i) {
    const auto first = std::find_if(outputs[i].begin(), outputs[i].end(),
                                    [](const Recorder::Output& o) { return o.tokens > 0; });
    r.mean_first_token_seconds += Seconds(first->at - submitted) / outputs.size();
    if (first->at > all_started) all_started = first->at, last_starter = i;
    last_finish = std::max(last_finish, outputs[i].back().at);
  }
  int64_t window_tokens = 0;
  for (const auto& request : outputs) {
    for (const Recorder::Output& o : request) window_tokens += o.at > all_started ? o.tokens : 0;
  }
  const auto steps = std::count_if(outputs[last_starter].begin(), outputs[last_starter].end(),
                                   [&](const Recorder::Output& o) { return o.at > all_started; });
  const double window = Seconds(last_finish - all_started);
  r.decode_tokens_per_second = window > 0 ? static_cast<double>(window_tokens) / window : 0;
  r.step_seconds = steps > 0 ? window / static_cast<double>(steps) : 0;
  r.end_to_end_tokens_per_second =
      static_cast<double>(outputs.size()) * gen_len / Seconds(last_finish - submitted);
  r.max_first_token_seconds = Seconds(all_started - submitted);
  return r;
}

absl::Status RunBenchEngine(const BenchEngineFlags& f) {
  LAIR_RETURN_IF_ERROR(Validate(f));
  LAIR_ASSIGN_OR_RETURN(ServingRunner loaded, LoadServingRunner(f.model));
  const int vocab = loaded.runner->vocab_size();
  const int64_t bytes_per_slot = loaded.runner->BytesPerSlot();
  engine::EngineConfig config;
  config.max_running = f.batch;
  config.max_batch_tokens = f.max_batch_tokens;
  config.max_prompt_tokens = std::max(config.max_prompt_tokens, f.prompt_len);
  config.max_new_tokens = std::max(config.max_new_tokens, f.gen_len);
  config.state_memory_bytes = bytes_per_slot * f.batch;
  LAIR_ASSIGN_OR_RETURN(std::unique_ptr<engine::Engine> eng,
                        engine::Engine::Create(std::move(loaded.runner), nullptr, config));
  std::printf("model %s; one-sequence decode steps on %s\n", loaded.model.c_str(),
              loaded.decode_path.c_str());
  std::printf(
      "engine: %d requests at once, prompt %d, %d generated tokens each, temperature %g, "
      "top_k %d, top_p %g, logprobs %d, %d of them sampled on the host (logit bias), "
      "max_batch_tokens %d, %d state slots of %.2f MB\n",
      f.batch, f.prompt_len, f.gen_len, f.temperature, f.top_k, f.top_p, f.logprobs,
      f.host_requests, f.max_batch_tokens, f.batch, static_cast<double>(bytes_per_slot) / 1e6);

  std::mt19937 rng(20261129);
  std::uniform_int_distribution<int32_t> token(0, vocab - 1);
  std::vector<RoundFigures> rounds;
  for (int round = 0; round < f.rounds; ++round) {
    Recorder recorder(f.batch);
    const Clock::time_point submitted = Clock::now();
    for (int i = 0; i < f.batch; ++i) {
      engine::EngineRequest request;
      request.request_id = absl::StrCat("bench-", round, "-", i);
      request.prompt_tokens.resize(f.prompt_len);
      for (int32_t& t : request.prompt_tokens) t = token(rng);
      request.sampling.max_tokens = f.gen_len;
      request.sampling.temperature = f.temperature;
      request.sampling.top_k = f.top_k;
      request.sampling.top_p = f.top_p;
      request.sampling.ignore_eos = true;
      request.sampling.seed = static_cast<uint64_t>(i);
      request.sampling.logprobs = f.logprobs;
      if (i < f.host_requests) request.sampling.logit_bias[0] = 0.0f;
      LAIR_RETURN_IF_ERROR(eng->Submit(std::move(request), recorder.Callback(i)));
    }
    LAIR_RETURN_IF_ERROR(recorder.Wait());
    if (round > 0) rounds.push_back(Measure(recorder.outputs(), submitted, f.gen_len));
  }
  eng->Shutdown(absl::ZeroDuration());

  std::printf("  %-6s %-16s %-14s %-18s %-22s\n", "round", "decode tok/s", "ms a step",
              "end to end tok/s", "first token mean / max");
  for (size_t i = 0; i < rounds.size(); ++i) {
    const RoundFigures& r = rounds[i];
    std::printf("  %-6zu %-16.1f %-14.3f %-18.1f %.1f / %.1f ms\n", i + 1,
                r.decode_tokens_per_second, r.step_seconds * 1e3, r.end_to_end_tokens_per_second,
                r.mean_first_token_seconds * 1e3, r.max_first_token_seconds * 1e3);
  }
  std::vector<RoundFigures> by_rate = rounds;
  std::sort(by_rate.begin(), by_rate.end(), [](const RoundFigures& a, const RoundFigures& b) {
    return a.decode_tokens_per_second < b.decode_tokens_per_second;
  });
  const RoundFigures& median = by_rate[by_rate.size() / 2];
  std::printf(
      "lair bench engine: %s B=%d P=%d G=%d T=%g top_k=%d top_p=%g logprobs=%d host=%d: %.1f "
      "decode tokens/s, %.3f ms/step, %.1f tokens/s end to end (median of %zu rounds)\n",
      f.model.model.c_str(), f.batch, f.prompt_len, f.gen_len, f.temperature, f.top_k, f.top_p,
      f.logprobs, f.host_requests, median.decode_tokens_per_second, median.step_seconds * 1e3,
      median.end_to_end_tokens_per_second, rounds.size());
  return absl::OkStatus();
}

}  // namespace

LAIR_REGISTER_COMMAND(bench_engine, [](CLI::App& app) {
  auto flags = std::make_shared<BenchEngineFlags>();
  CLI::App* cmd = BenchCommand(app)->add_subcommand(
      "engine", "Throughput of the serving engine (no network front ends) on concurrent requests");
  cmd->add_option("--model", flags->model.model, "Model folder (config.json and weights)")
      ->required();
  cmd->add_option("--device", flags->model.device, "Backend: cpu, cuda or cuda:N")
      ->capture_default_str();
  cmd->add_option("--dtype", flags->model.dtype,
                  "Weight matrices: f32 or bf16 (default f32 on cpu, bf16 on cuda)");
  cmd->add_option("--gemm", flags->model.gemm,
                  "Matrix products: fast (tensor cores) or exact (fp32)")
      ->capture_default_str();
  cmd->add_option("--batch", flags->batch, "Requests submitted at once B")->capture_default_str();
  cmd->add_option("--prompt-len", flags->prompt_len, "Prompt tokens P per request")->required();
  cmd->add_option("--gen-len", flags->gen_len, "Generated tokens G per request")->required();
  cmd->add_option("--temperature", flags->temperature, "0 = greedy")->capture_default_str();
  cmd->add_option("--top-k", flags->top_k, "0 = off")->capture_default_str();
  cmd->add_option("--top-p", flags->top_p, "1 = off")->capture_default_str();
  cmd->add_option("--logprobs", flags->logprobs,
                  "Logprobs a token every request asks for (-1 = none; up to 20)")
      ->capture_default_str();
  cmd->add_option("--host-requests", flags->host_requests,
                  "Requests (of B) with a logit bias (of 0), so the host samples them")
      ->capture_default_str();
  cmd->add_option("--max-batch-tokens", flags->max_batch_tokens, "Tokens per engine step")
      ->capture_default_str();
  cmd->add_option("--rounds", flags->rounds, "Rounds of B requests, the first untimed")
      ->capture_default_str();
  cmd->callback([flags] {
    const absl::Status status = RunBenchEngine(*flags);
    if (!status.ok()) {
      std::fprintf(stderr, "lair bench engine: %s\n", std::string(status.message()).c_str());
      SetExitCode(1);
    }
  });
});

}  // namespace lair::cli
