// The OpenAI wire format: parsing /v1/completions and /v1/chat/completions
// bodies into an OpenAiRequest, and writing responses, stream chunks and SSE
// frames. Pure functions over JSON; no I/O and no engine access.
//
// Parsing follows OpenAI's parameters (plus vLLM's common extensions top_k,
// min_p, min_tokens, repetition_penalty, ignore_eos, skip_special_tokens,
// stop_token_ids, allowed_token_ids, include_stop_str_in_output,
// truncate_prompt_tokens, add_generation_prompt, and
// echo with max_tokens 0). A field of the wrong
// type or out of range is a ParamError naming it; a well-formed request for
// something LAIR does not do (suffix, response_format other than
// text, non-text message parts, tools) is Unimplemented naming it. Unknown fields
// are ignored, as OpenAI-compatible servers do.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "engine/request.h"
#include "engine/request_output.h"
#include "nlohmann/json.hpp"
#include "server/engine_client.h"

namespace lair::server {

enum class ApiKind { kCompletion, kChat };

struct OpenAiRequest {  // NOLINT(bugprone-exception-escape): json moves do not throw
  ApiKind kind = ApiKind::kCompletion;
  std::string model;                  // may be empty: the served model
  std::vector<PromptInput> prompts;   // completions: one engine request each
  nlohmann::ordered_json messages;    // chat: messages with string content
  bool add_generation_prompt = true;  // chat
  engine::SamplingParams sampling;    // logprobs: -1 none, else top alternatives wanted
  // Completions: each choice starts with its prompt, and with logprobs the
  // prompt's tokens are listed too (sampling.prompt_logprobs is set).
  bool echo = false;
  // echo with max_tokens 0: each choice is its prompt alone (the engine
  // generates one token, which is not sent).
  bool prompt_only = false;
  bool stream = false;
  bool include_usage = false;      // stream_options.include_usage
  int truncate_prompt_tokens = 0;  // vLLM's: > 0 keeps each prompt's last so many tokens
};

// What a server allows a request: chat_default_max_tokens applies when a
// chat request gives neither max_tokens nor max_completion_tokens
// (completions default to OpenAI's 16), and no request may ask for more than
// max_tokens (the engine's max_new_tokens).
struct OpenAiLimits {
  int chat_default_max_tokens = 1024;
  int max_tokens = INT32_MAX;
};

// Parses a request body. Malformed JSON or a body that is not an object is
// an InvalidArgument.
absl::StatusOr<OpenAiRequest> ParseOpenAiRequest(ApiKind kind, std::string_view body,
                                                 const OpenAiLimits& limits);

// vLLM's /tokenize: a text prompt, or chat messages rendered by the chat
// template (exactly one of the two).
struct TokenizeRequest {  // NOLINT(bugprone-exception-escape): json moves do not throw
  std::string model;
  std::optional<std::string> prompt;
  nlohmann::ordered_json messages;  // when no prompt
  bool add_special_tokens = true;   // the tokenizer's BOS and the like (prompts: default true)
  bool add_generation_prompt = true;
};
absl::StatusOr<TokenizeRequest> ParseTokenizeRequest(std::string_view body);

// vLLM's /detokenize.
struct DetokenizeRequest {
  std::string model;
  std::vector<int32_t> tokens;
};
absl::StatusOr<DetokenizeRequest> ParseDetokenizeRequest(std::string_view body);

// What identifies one response across its chunks.
struct ResponseHeader {
  ApiKind kind = ApiKind::kCompletion;
  std::string id;       // "cmpl-..." or "chatcmpl-..."
  int64_t created = 0;  // Unix seconds
  std::string model;
};
ResponseHeader NewResponseHeader(ApiKind kind, std::string model);

// How logprobs show a token id: its text, and (chat's "bytes") the bytes it
// contributes, raw for part of a character (Tokenizer::TokenBytes).
struct TokenRendering {
  std::function<std::string(int32_t)> text;
  std::function<std::string(int32_t)> bytes;
};

// One finished choice of a non-streaming response.
struct Choice {
  int index = 0;
  std::string text;
  std::vector<engine::TokenLogprob> logprobs;
  engine::FinishReason finish_reason = engine::FinishReason::kNone;
  // Echo: the prompt's first token, listed before `logprobs` with a null
  // logprob (nothing precedes it to score it by).
  std::optional<int32_t> unscored_first;
};

// The non-streaming response body. `with_logprobs` says whether the client
// asked for logprobs (else "logprobs": null).
nlohmann::json FullResponse(const ResponseHeader& header, const std::vector<Choice>& choices,
                            const engine::Usage& usage, bool with_logprobs,
                            const TokenRendering& tokens);

// One stream chunk for choice `index`: `text` and `logprobs` new since the
// last chunk, the finish reason once finished. `first` adds the chat role
// delta; `usage_null` adds "usage": null (stream_options.include_usage).
struct ChunkContent {
  int index = 0;
  std::string text;
  std::vector<engine::TokenLogprob> logprobs;
  engine::FinishReason finish_reason = engine::FinishReason::kNone;
  bool first = false;
  std::optional<int32_t> unscored_first;  // as in Choice
};
nlohmann::json StreamChunk(const ResponseHeader& header, const ChunkContent& content,
                           bool with_logprobs, bool usage_null, const TokenRendering& tokens);
// The last chunk when include_usage: no choices, the totals.
nlohmann::json UsageChunk(const ResponseHeader& header, const engine::Usage& usage);

// Server-sent-event framing: "data: JSON\n\n"; the stream ends with kSseDone.
std::string SseEvent(const nlohmann::json& data);
inline constexpr std::string_view kSseDone = "data: [DONE]\n\n";

}  // namespace lair::server
