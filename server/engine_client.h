// EngineClient: the one path from both front ends (HTTP and gRPC) to the
// engine. It owns what the two share: the model name check, prompt
// tokenization and chat-template rendering, prompt validation, fresh request
// ids, and the latency metrics observed on every output.
//
// Thread safety: every method may be called from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "core/status.h"
#include "engine/engine.h"
#include "nlohmann/json.hpp"
#include "server/chat_template.h"
#include "server/metrics.h"
#include "tokenizer/tokenizer.h"

namespace lair::server {

// A completion prompt as a client sends it: text, or token ids.
using PromptInput = std::variant<std::string, std::vector<int32_t>>;

class EngineClient {
 public:
  // Parses the tokenizer's chat template (or ChatTemplate::kFallbackSource
  // when it has none); InvalidArgument when it cannot be parsed. `engine`,
  // `tokenizer` and `metrics` must outlive the client.
  static absl::StatusOr<std::unique_ptr<EngineClient>> Create(engine::Engine* engine,
                                                              const Tokenizer* tokenizer,
                                                              std::string model_name,
                                                              int max_prompt_tokens,
                                                              Metrics* metrics);
  EngineClient(const EngineClient&) = delete;
  EngineClient& operator=(const EngineClient&) = delete;

  const std::string& model_name() const { return model_name_; }
  int max_prompt_tokens() const { return max_prompt_tokens_; }
  int vocab_size() const { return tokenizer_->VocabSize(); }
  Metrics& metrics() const { return *metrics_; }
  engine::EngineStats Stats() const { return engine_->Stats(); }

  // OK for the served name or an empty one; NotFound otherwise.
  absl::Status CheckModel(std::string_view requested) const;

  // A completion prompt's tokens (text gets the tokenizer's special tokens,
  // ids are taken as they are), validated by CheckPrompt. `truncate` > 0
  // keeps only the last `truncate` tokens first (vLLM's
  // truncate_prompt_tokens), as ChatPromptTokens does.
  absl::StatusOr<std::vector<int32_t>> PromptTokens(const PromptInput& prompt,
                                                    std::string_view param, int truncate = 0) const;
  // Renders `messages` (OpenAI chat messages, content already flattened to
  // strings) with the chat template and tokenizes the result without adding
  // special tokens (the template writes BOS itself).
  absl::StatusOr<std::vector<int32_t>> ChatPromptTokens(const nlohmann::ordered_json& messages,
                                                        bool add_generation_prompt,
                                                        int truncate = 0) const;
  // InvalidArgument (a ParamError on `param`) for an empty prompt, an id
  // outside the vocabulary, or more than max_prompt_tokens tokens.
  absl::Status CheckPrompt(const std::vector<int32_t>& tokens, std::string_view param) const;

  std::vector<int32_t> Tokenize(std::string_view text, bool add_special_tokens) const;
  std::string Detokenize(std::span<const int32_t> ids, bool skip_special_tokens) const;
  // One token's text, as shown in logprobs, and its bytes (Tokenizer::TokenBytes).
  std::string TokenText(int32_t id) const;
  std::string TokenBytes(int32_t id) const { return tokenizer_->TokenBytes(id); }

  // Submits under a fresh request id, which it returns. `on_output` runs on
  // the engine thread as Engine::Submit describes; the client observes
  // metrics before calling it. Errors are the engine's.
  absl::StatusOr<std::string> Submit(std::vector<int32_t> prompt_tokens,
                                     const engine::SamplingParams& sampling,
                                     engine::OutputCallback on_output);
  void Cancel(const std::string& request_id) { engine_->Cancel(request_id); }

 private:
  EngineClient(engine::Engine* engine, const Tokenizer* tokenizer, std::string model_name,
               int max_prompt_tokens, Metrics* metrics, ChatTemplate chat_template);

  engine::Engine* const engine_;
  const Tokenizer* const tokenizer_;
  const std::string model_name_;
  const int max_prompt_tokens_;
  Metrics* const metrics_;
  const ChatTemplate chat_template_;
  const std::string bos_token_;  // "" when the tokenizer has none
  const std::string eos_token_;
  std::atomic<uint64_t> next_request_ = 0;  // request ids are "lair-N"
};

}  // namespace lair::server
