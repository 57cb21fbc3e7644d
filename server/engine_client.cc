#include "server/engine_client.h"

#include <chrono>
#include <map>

#include "absl/synchronization/mutex.h"
#include "server/api_error.h"

namespace lair::server {
namespace {

// truncate > 0: only the last `truncate` tokens stay.
void KeepLast(int truncate, std::vector<int32_t>* tokens) {
  if (truncate > 0 && static_cast<int>(tokens->size()) > truncate) {
    tokens->erase(tokens->begin(), tokens->end() - truncate);
  }
}

std::string SpecialToken(const Tokenizer& tokenizer, std::optional<int32_t> id) {
  return id ? tokenizer.IdToToken(*id) : std::string();
}

// Per-request latency bookkeeping, shared by the engine-thread callbacks of
// the request's n completions.
class LatencyTracker {
 public:
  explicit LatencyTracker(Metrics* metrics) : metrics_(metrics), start_(Clock::now()) {}

  void Observe(const engine::RequestOutput& output) {
    const Clock::time_point now = Clock::now();
    absl::MutexLock lock(&mu_);
    if (!output.new_tokens.empty()) {
      auto it = last_token_.find(output.index);
      if (it == last_token_.end()) {
        metrics_->ObserveTimeToFirstToken(Seconds(start_, now));
      } else {
        const double gap = Seconds(it->second, now) / static_cast<double>(output.new_tokens.size());
        for (size_t i = 0; i < output.new_tokens.size(); ++i)
          metrics_->ObserveInterTokenLatency(gap);
      }
      last_token_[output.index] = now;
    }
    if (output.finished()) {
      metrics_->RecordFinish(output.finish_reason);
      metrics_->ObserveEndToEnd(Seconds(start_, now));
    }
  }

 private:
  using Clock = std::chrono::steady_clock;
  static double Seconds(Clock::time_point from, Clock::time_point to) {
    return std::chrono::duration<double>(to - from).count();
  }

  Metrics* const metrics_;
  const Clock::time_point start_;
  absl::Mutex mu_;
  // When each completion (by index) last produced a token; absent before its first.
  std::map<int, Clock::time_point> last_token_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::StatusOr<std::unique_ptr<EngineClient>> EngineClient::Create(engine::Engine* engine,
                                                                   const Tokenizer* tokenizer,
                                                                   std::string model_name,
                                                                   int max_prompt_tokens,
                                                                   Metrics* metrics) {
  std::string source(tokenizer->ChatTemplate());
  LAIR_ASSIGN_OR_RETURN(
      ChatTemplate chat_template,
      ChatTemplate::Parse(source.empty() ? ChatTemplate::kFallbackSource : source));
  return std::unique_ptr<EngineClient>(new EngineClient(engine, tokenizer, std::move(model_name),
                                                        max_prompt_tokens, metrics,
                                                        std::move(chat_template)));
}

EngineClient::EngineClient(engine::Engine* engine, const Tokenizer* tokenizer,
                           std::string model_name, int max_prompt_tokens, Metrics* metrics,
                           ChatTemplate chat_template)
    : engine_(engine),
      tokenizer_(tokenizer),
      model_name_(std::move(model_name)),
      max_prompt_tokens_(max_prompt_tokens),
      metrics_(metrics),
      chat_template_(std::move(chat_template)),
      bos_token_(SpecialToken(*tokenizer, tokenizer->BosId())),
      eos_token_(SpecialToken(*tokenizer, tokenizer->EosId())) {}

absl::Status EngineClient::CheckModel(std::string_view requested) const {
  if (requested.empty() || requested == model_name_) return absl::OkStatus();
  return absl::NotFoundError("The model `" + std::string(requested) +
                             "` does not exist; this server serves `" + model_name_ + "`.");
}

absl::StatusOr<std::vector<int32_t>> EngineClient::PromptTokens(const PromptInput& prompt,
                                                                std::string_view param,
                                                                int truncate) const {
  std::vector<int32_t> tokens =
      std::holds_alternative<std::string>(prompt)
          ? Tokenize(std::get<std::string>(prompt), /*add_special_tokens=*/true)
          : std::get<std::vector<int32_t>>(prompt);
  KeepLast(truncate, &tokens);
  LAIR_RETURN_IF_ERROR(CheckPrompt(tokens, param));
  return tokens;
}

absl::StatusOr<std::vector<int32_t>> EngineClient::ChatPromptTokens(
    const nlohmann::ordered_json& messages, bool add_generation_prompt, int truncate) const {
  nlohmann::ordered_json variables = {{"messages", messages},
                                      {"add_generation_prompt", add_generation_prompt},
                                      {"bos_token", bos_token_},
                                      {"eos_token", eos_token_}};
  absl::StatusOr<std::string> text = chat_template_.Render(variables);
  if (!text.ok()) return ParamError("messages", std::string(text.status().message()));
  std::vector<int32_t> tokens = Tokenize(*text, /*add_special_tokens=*/false);
  KeepLast(truncate, &tokens);
  LAIR_RETURN_IF_ERROR(CheckPrompt(tokens, "messages"));
  return tokens;
}

absl::Status EngineClient::CheckPrompt(const std::vector<int32_t>& tokens,
                                       std::string_view param) const {
  if (tokens.empty()) return ParamError(param, "the prompt is empty");
  const int vocab = tokenizer_->VocabSize();
  for (int32_t id : tokens) {
    if (id < 0 || id >= vocab) {
      return ParamError(param, "token id " + std::to_string(id) +
                                   " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
    }
  }
  if (static_cast<int64_t>(tokens.size()) > max_prompt_tokens_) {
    return ParamError(
        param, "this model's maximum context length is " + std::to_string(max_prompt_tokens_) +
                   " tokens, but the prompt has " + std::to_string(tokens.size()) + " tokens");
  }
  return absl::OkStatus();
}

std::vector<int32_t> EngineClient::Tokenize(std::string_view text, bool add_special_tokens) const {
  return tokenizer_->Encode(text, add_special_tokens);
}

std::string EngineClient::Detokenize(std::span<const int32_t> ids, bool skip_special_tokens) const {
  return tokenizer_->Decode(ids, skip_special_tokens);
}

std::string EngineClient::TokenText(int32_t id) const {
  return tokenizer_->Decode(std::span<const int32_t>(&id, 1), /*skip_special_tokens=*/false);
}

absl::StatusOr<std::string> EngineClient::Submit(std::vector<int32_t> prompt_tokens,
                                                 const engine::SamplingParams& sampling,
                                                 engine::OutputCallback on_output) {
  engine::EngineRequest request;
  request.request_id = "lair-" + std::to_string(next_request_.fetch_add(1));
  request.prompt_tokens = std::move(prompt_tokens);
  request.sampling = sampling;
  std::string id = request.request_id;
  auto tracker = std::make_shared<LatencyTracker>(metrics_);
  LAIR_RETURN_IF_ERROR(engine_->Submit(
      std::move(request),
      [tracker, on_output = std::move(on_output)](const engine::RequestOutput& output) {
        tracker->Observe(output);
        on_output(output);
      }));
  return id;
}

}  // namespace lair::server
