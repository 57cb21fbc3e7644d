// `lair generate --model DIR [--tokenizer DIR] --prompt TEXT | --prompt-ids "1 2 3"
//  [--max-tokens N --temperature T --top-p P --top-k K --seed S] [--device cpu]`:
// prefills the prompt, then decodes one token at a time, streaming text to
// stdout (ids with --prompt-ids and no tokenizer). Sampling is deliberately
// minimal (the engine owns the full sampler): greedy at temperature 0, else
// softmax(logits / T) cut to the top k and the top-p nucleus, drawn with a
// seeded std::mt19937_64. Stops at max-tokens or the tokenizer's EOS.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "cli/command_registry.h"
#include "kernels/backend.h"
#include "models/model.h"
#include "models/state_pool.h"
#include "tokenizer/tokenizer.h"

namespace lair::cli {
namespace {

struct GenerateFlags {
  std::string model, tokenizer, prompt, prompt_ids, device = "cpu", gemm = "fast";
  int max_tokens = 64;
  float temperature = 0.0f, top_p = 1.0f;
  int top_k = 0;
  uint64_t seed = 0;
};

int32_t Sample(const float* logits, int64_t vocab, const GenerateFlags& flags,
               std::mt19937_64& rng) {
  if (flags.temperature <= 0.0f)
    return static_cast<int32_t>(std::max_element(logits, logits + vocab) - logits);
  std::vector<int32_t> order(vocab);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(),
            [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  if (flags.top_k > 0 && flags.top_k < vocab) order.resize(flags.top_k);
  std::vector<double> probs(order.size());
  double total = 0;
  for (size_t i = 0; i < order.size(); ++i) {
    probs[i] = std::exp((logits[order[i]] - logits[order[0]]) / flags.temperature);
    total += probs[i];
  }
  double kept = 0;
  size_t n = 0;
  while (n < order.size() && (n == 0 || kept < flags.top_p * total)) kept += probs[n++];
  std::uniform_real_distribution<double> uniform(0.0, kept);
  double r = uniform(rng);
  for (size_t i = 0; i < n; ++i) {
    if ((r -= probs[i]) <= 0) return order[i];
  }
  return order[n - 1];
}

int RunGenerate(const GenerateFlags& flags) {
  auto fail = [](const absl::Status& status) {
    std::fprintf(stderr, "lair generate: %s\n", status.ToString().c_str());
    return 1;
  };
  std::unique_ptr<Tokenizer> tokenizer;
  if (!flags.tokenizer.empty() || flags.prompt_ids.empty()) {
    auto loaded = Tokenizer::Load(flags.tokenizer.empty() ? flags.model : flags.tokenizer);
    if (!loaded.ok()) return fail(loaded.status());
    tokenizer = std::move(*loaded);
  }
  std::vector<int32_t> prompt;
  if (!flags.prompt_ids.empty()) {
    std::istringstream in(flags.prompt_ids);
    for (int64_t id; in >> id;) prompt.push_back(static_cast<int32_t>(id));
  } else {
    prompt = tokenizer->Encode(flags.prompt, /*add_special_tokens=*/true);
  }
  if (prompt.empty()) return fail(absl::InvalidArgumentError("the prompt has no tokens"));
  kernels::BackendOptions backend_options;
  absl::StatusOr<kernels::GemmMode> gemm = kernels::ParseGemmMode(flags.gemm, "--gemm");
  if (!gemm.ok()) return fail(gemm.status());
  backend_options.gemm = *gemm;
  auto backend = kernels::MakeBackend(flags.device, backend_options);
  if (!backend.ok()) return fail(backend.status());
  models::LoadOptions options;
  options.max_context = static_cast<int>(prompt.size()) + flags.max_tokens;
  options.fold_norm_weights = true;  // inference only
  options.fuse_low_rank_gates = true;
  options.persistent_decode = true;
  auto model = models::Model::Load(flags.model, backend->get(), options);
  if (!model.ok()) return fail(model.status());
  auto pool = models::StatePool::Create(backend->get(), (*model)->state_layout(), 1);
  if (!pool.ok()) return fail(pool.status());

  std::mt19937_64 rng(flags.seed);
  std::unique_ptr<IncrementalDecoder> decoder;
  if (tokenizer)
    decoder = std::make_unique<IncrementalDecoder>(*tokenizer, /*skip_special_tokens=*/true);
  models::ForwardBatch batch;
  batch.tokens = prompt;
  batch.cu_seqlens = {0, static_cast<int32_t>(prompt.size())};
  batch.slots = {0};
  batch.start_positions = {0};
  int position = static_cast<int>(prompt.size());
  for (int step = 0; step < flags.max_tokens; ++step) {
    int32_t next = 0;
    if (flags.temperature <= 0.0f) {  // greedy: the argmax runs where the logits are
      auto ids = (*model)->ForwardGreedy(batch, *pool);
      if (!ids.ok()) return fail(ids.status());
      next = ids->front();
    } else {
      auto logits = (*model)->Forward(batch, *pool);
      if (!logits.ok()) return fail(logits.status());
      next = Sample(logits->f32(), logits->dim(1), flags, rng);
    }
    if (tokenizer && tokenizer->EosId() == next) break;
    if (decoder) {
      std::fputs(decoder->Add(next).c_str(), stdout);
    } else {
      std::printf("%s%d", step == 0 ? "" : " ", next);
    }
    std::fflush(stdout);
    batch.tokens = {next};
    batch.cu_seqlens = {0, 1};
    batch.start_positions = {position++};
  }
  if (decoder) std::fputs(decoder->Flush().c_str(), stdout);
  std::printf("\n");
  return 0;
}

}  // namespace

LAIR_REGISTER_COMMAND(generate, [](CLI::App& app) {
  CLI::App* gen = app.add_subcommand("generate", "Generate text from a model (minimal sampling)");
  auto flags = std::make_shared<GenerateFlags>();
  gen->add_option("--model", flags->model, "Model folder")->required();
  gen->add_option("--tokenizer", flags->tokenizer,
                  "Tokenizer folder or tokenizer.json (default: the model folder)");
  auto* prompt = gen->add_option("--prompt", flags->prompt, "Prompt text");
  auto* ids =
      gen->add_option("--prompt-ids", flags->prompt_ids, "Prompt token ids, e.g. \"1 2 3\"");
  prompt->excludes(ids);
  gen->add_option("--max-tokens", flags->max_tokens, "Tokens to generate")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  gen->add_option("--temperature", flags->temperature, "0 = greedy")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  gen->add_option("--top-p", flags->top_p, "Nucleus mass")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  gen->add_option("--top-k", flags->top_k, "Keep the k most likely (0 = all)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  gen->add_option("--seed", flags->seed, "Sampling seed")->capture_default_str();
  gen->add_option("--device", flags->device, "Backend: cpu, cuda or cuda:N")->capture_default_str();
  gen->add_option("--gemm", flags->gemm,
                  "Matrix products on CUDA: fast (tensor cores) or exact (fp32)")
      ->capture_default_str();
  gen->callback([flags] {
    if (flags->prompt.empty() && flags->prompt_ids.empty()) {
      std::fprintf(stderr, "lair generate: --prompt or --prompt-ids is required\n");
      SetExitCode(2);
      return;
    }
    SetExitCode(RunGenerate(*flags));
  });
});

}  // namespace lair::cli
