#include "server/openai_handlers.h"

#include <iterator>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "server/api_error.h"
#include "server/openai_protocol.h"

namespace lair::server {
namespace {

using Json = nlohmann::json;

struct Item {
  int choice = 0;  // index among all of the response's choices
  engine::RequestOutput output;
};

// The engine requests behind one HTTP request (one per prompt) and the
// outputs they have streamed back that the handler has not consumed yet.
// State: running while any completion is unfinished, then finished.
// Destroying a run that is still running (client gone, a later submit
// failed) cancels its engine requests, which frees their state slots.
class GenerationRun {
 public:
  GenerationRun(EngineClient& client, const Notifier& notifier)
      : client_(client), notifier_(notifier), inbox_(std::make_shared<Inbox>()) {}
  GenerationRun(const GenerationRun&) = delete;
  GenerationRun& operator=(const GenerationRun&) = delete;
  ~GenerationRun() {
    if (Finished()) return;
    for (const std::string& id : request_ids_) client_.Cancel(id);
  }

  // Submits one prompt; its n completions become choices first_choice...
  absl::Status Submit(std::vector<int32_t> prompt, const engine::SamplingParams& sampling,
                      int first_choice) {
    {
      absl::MutexLock lock(&inbox_->mu);
      inbox_->unfinished += sampling.n;
    }
    // The callback holds only shared state, so it stays valid whatever
    // happens to this run and its connection.
    auto on_output = [inbox = inbox_, notifier = notifier_,
                      first_choice](const engine::RequestOutput& out) {
      {
        absl::MutexLock lock(&inbox->mu);
        inbox->items.push_back({first_choice + out.index, out});
        if (out.finished()) --inbox->unfinished;
      }
      notifier.Notify();
    };
    absl::StatusOr<std::string> id =
        client_.Submit(std::move(prompt), sampling, std::move(on_output));
    if (!id.ok()) {
      absl::MutexLock lock(&inbox_->mu);
      inbox_->unfinished -= sampling.n;
      return id.status();
    }
    request_ids_.push_back(*id);
    return absl::OkStatus();
  }

  // The outputs since the last call, waiting for at least one. Empty once
  // every completion has finished or the client is gone.
  asio::awaitable<std::vector<Item>> Next(const HttpExchange& exchange) {
    while (true) {
      std::vector<Item> items;
      bool finished;
      {
        absl::MutexLock lock(&inbox_->mu);
        items.swap(inbox_->items);
        finished = inbox_->unfinished == 0;
      }
      if (!items.empty()) co_return items;
      if (finished || exchange.client_gone()) co_return items;
      co_await notifier_.Wait();
    }
  }

 private:
  struct Inbox {
    absl::Mutex mu;
    std::vector<Item> items ABSL_GUARDED_BY(mu);  // not yet taken by Next
    int unfinished ABSL_GUARDED_BY(mu) = 0;       // completions without their final output
  };
  bool Finished() const {
    absl::MutexLock lock(&inbox_->mu);
    return inbox_->unfinished == 0;
  }

  EngineClient& client_;
  const Notifier notifier_;
  const std::shared_ptr<Inbox> inbox_;
  std::vector<std::string> request_ids_;
};

// Echo (completions): what each prompt's choices start with.
struct EchoedPrompt {
  std::string text;     // the prompt as given, or its tokens' text
  int32_t first_token;  // listed unscored before the prompt's logprobs
};

// The start of choice `choice`'s first output under echo: its prompt's
// text and scored tokens before the output's own.
void PrependEcho(const EchoedPrompt& echo, std::string* text,
                 std::vector<engine::TokenLogprob>* logprobs,
                 std::vector<engine::TokenLogprob> prompt_logprobs,
                 std::optional<int32_t>* unscored_first) {
  *text = echo.text + *text;
  prompt_logprobs.insert(prompt_logprobs.end(), std::make_move_iterator(logprobs->begin()),
                         std::make_move_iterator(logprobs->end()));
  *logprobs = std::move(prompt_logprobs);
  *unscored_first = echo.first_token;
}

// Echo with max_tokens 0: what the engine generated is left out, and the
// completion ends for its length (0 tokens) unless it failed.
void DropGenerated(engine::RequestOutput* out) {
  out->new_tokens.clear();
  out->text_delta.clear();
  out->logprobs.clear();
  out->stop_reason.clear();
  if (out->finish_reason == engine::FinishReason::kStop) {
    out->finish_reason = engine::FinishReason::kLength;
  }
}

absl::Status OutputError(const engine::RequestOutput& out) {
  return out.status.ok() ? absl::InternalError("generation failed") : out.status;
}

// Streams every choice as SSE chunks, then the usage chunk (when asked) and [DONE].
asio::awaitable<void> StreamResponse(HttpExchange& exchange, GenerationRun& run,
                                     const OpenAiRequest& request, const ResponseHeader& header,
                                     engine::Usage usage, int num_choices,
                                     const std::vector<EchoedPrompt>& echoes,
                                     const TokenRendering& tokens) {
  if (!co_await exchange.BeginStream()) co_return;
  std::vector<bool> started(num_choices, false);
  const bool with_logprobs = request.sampling.logprobs >= 0;
  while (true) {
    std::vector<Item> items = co_await run.Next(exchange);
    if (items.empty()) break;
    std::string frames;
    for (Item& item : items) {
      engine::RequestOutput& out = item.output;
      if (request.prompt_only) DropGenerated(&out);
      usage.completion_tokens += static_cast<int>(out.new_tokens.size());
      if (out.finish_reason == engine::FinishReason::kError) {
        frames += SseEvent(OpenAiErrorBody(OutputError(out)));
        continue;
      }
      ChunkContent chunk;
      chunk.index = item.choice;
      chunk.text = std::move(out.text_delta);
      chunk.logprobs = std::move(out.logprobs);
      chunk.finish_reason = out.finish_reason;
      chunk.first = !started[item.choice];
      if (chunk.first && !echoes.empty()) {
        PrependEcho(echoes[item.choice / request.sampling.n], &chunk.text, &chunk.logprobs,
                    std::move(out.prompt_logprobs), &chunk.unscored_first);
      }
      started[item.choice] = true;
      frames += SseEvent(StreamChunk(header, chunk, with_logprobs, request.include_usage, tokens));
    }
    if (!co_await exchange.Send(std::move(frames))) co_return;
  }
  if (exchange.client_gone()) co_return;
  std::string tail;
  if (request.include_usage) tail += SseEvent(UsageChunk(header, usage));
  tail += kSseDone;
  if (co_await exchange.Send(std::move(tail))) co_await exchange.EndStream();
}

// Collects every choice, then answers with one JSON body.
asio::awaitable<void> WholeResponse(HttpExchange& exchange, GenerationRun& run,
                                    const OpenAiRequest& request, const ResponseHeader& header,
                                    engine::Usage usage, int num_choices,
                                    const std::vector<EchoedPrompt>& echoes,
                                    const TokenRendering& tokens) {
  std::vector<Choice> choices(num_choices);
  std::vector<bool> started(num_choices, false);
  for (int i = 0; i < num_choices; ++i) choices[i].index = i;
  absl::Status error;
  while (true) {
    std::vector<Item> items = co_await run.Next(exchange);
    if (items.empty()) break;
    for (Item& item : items) {
      if (request.prompt_only) DropGenerated(&item.output);
      Choice& choice = choices[item.choice];
      if (!started[item.choice] && !echoes.empty()) {
        PrependEcho(echoes[item.choice / request.sampling.n], &choice.text, &choice.logprobs,
                    std::move(item.output.prompt_logprobs), &choice.unscored_first);
      }
      started[item.choice] = true;
      choice.text += item.output.text_delta;
      for (auto& lp : item.output.logprobs) choice.logprobs.push_back(std::move(lp));
      usage.completion_tokens += static_cast<int>(item.output.new_tokens.size());
      choice.finish_reason = item.output.finish_reason;
      if (item.output.finish_reason == engine::FinishReason::kError)
        error = OutputError(item.output);
    }
  }
  if (exchange.client_gone()) co_return;
  if (!error.ok()) {
    co_await exchange.ReplyError(error);
    co_return;
  }
  Json body = FullResponse(header, choices, usage, request.sampling.logprobs >= 0, tokens);
  co_await exchange.Reply(http::status::ok, DumpJson(body), "application/json");
}

asio::awaitable<void> HandleGenerate(HttpExchange& exchange, EngineClient& client, ApiKind kind,
                                     const OpenAiLimits& limits) {
  absl::StatusOr<OpenAiRequest> parsed =
      ParseOpenAiRequest(kind, exchange.request().body(), limits);
  absl::Status status = parsed.status();
  std::vector<std::vector<int32_t>> prompts;
  if (status.ok()) status = client.CheckModel(parsed->model);
  if (status.ok() && kind == ApiKind::kChat) {
    absl::StatusOr<std::vector<int32_t>> tokens = client.ChatPromptTokens(
        parsed->messages, parsed->add_generation_prompt, parsed->truncate_prompt_tokens);
    status = tokens.status();
    if (status.ok()) prompts.push_back(std::move(*tokens));
  }
  std::vector<EchoedPrompt> echoes;
  for (size_t i = 0; status.ok() && kind == ApiKind::kCompletion && i < parsed->prompts.size();
       ++i) {
    absl::StatusOr<std::vector<int32_t>> tokens =
        client.PromptTokens(parsed->prompts[i], "prompt", parsed->truncate_prompt_tokens);
    status = tokens.status();
    if (!status.ok()) break;
    if (parsed->echo) {
      // The prompt as sent, unless it was given as ids or truncated.
      const auto* text = std::get_if<std::string>(&parsed->prompts[i]);
      const bool as_sent = text != nullptr && parsed->truncate_prompt_tokens == 0;
      echoes.push_back({as_sent ? *text : client.Detokenize(*tokens, false), tokens->front()});
    }
    prompts.push_back(std::move(*tokens));
  }
  GenerationRun run(client, exchange.notifier());
  engine::Usage usage;
  for (size_t i = 0; status.ok() && i < prompts.size(); ++i) {
    usage.prompt_tokens += static_cast<int>(prompts[i].size());
    status = run.Submit(std::move(prompts[i]), parsed->sampling,
                        static_cast<int>(i) * parsed->sampling.n);
  }
  if (!status.ok()) {
    co_await exchange.ReplyError(status);
    co_return;
  }
  exchange.WatchForDisconnect();
  const ResponseHeader header = NewResponseHeader(kind, client.model_name());
  const int num_choices = static_cast<int>(prompts.size()) * parsed->sampling.n;
  const TokenRendering tokens{[&client](int32_t id) { return client.TokenText(id); },
                              [&client](int32_t id) { return client.TokenBytes(id); }};
  if (parsed->stream) {
    co_await StreamResponse(exchange, run, *parsed, header, usage, num_choices, echoes, tokens);
  } else {
    co_await WholeResponse(exchange, run, *parsed, header, usage, num_choices, echoes, tokens);
  }
}

asio::awaitable<void> HandleModels(HttpExchange& exchange, EngineClient& client) {
  Json model = {{"id", client.model_name()},
                {"object", "model"},
                {"created", NewResponseHeader(ApiKind::kCompletion, "").created},
                {"owned_by", "lair"},
                {"max_model_len", client.max_prompt_tokens()}};
  Json body = {{"object", "list"}, {"data", Json::array({model})}};
  co_await exchange.Reply(http::status::ok, DumpJson(body), "application/json");
}

// vLLM's /tokenize: {"count", "max_model_len", "tokens"} (and each token's
// vocabulary entry in "token_strs").
asio::awaitable<void> HandleTokenize(HttpExchange& exchange, EngineClient& client) {
  absl::StatusOr<TokenizeRequest> parsed = ParseTokenizeRequest(exchange.request().body());
  absl::Status status = parsed.status();
  if (status.ok()) status = client.CheckModel(parsed->model);
  std::vector<int32_t> tokens;
  if (status.ok() && parsed->prompt.has_value()) {
    tokens = client.Tokenize(*parsed->prompt, parsed->add_special_tokens);
  } else if (status.ok()) {
    absl::StatusOr<std::vector<int32_t>> chat =
        client.ChatPromptTokens(parsed->messages, parsed->add_generation_prompt);
    status = chat.status();
    if (status.ok()) tokens = std::move(*chat);
  }
  if (!status.ok()) {
    co_await exchange.ReplyError(status);
    co_return;
  }
  Json strs = Json::array();
  for (int32_t id : tokens) strs.push_back(client.TokenText(id));
  Json body = {{"count", tokens.size()},
               {"max_model_len", client.max_prompt_tokens()},
               {"tokens", tokens},
               {"token_strs", std::move(strs)}};
  co_await exchange.Reply(http::status::ok, DumpJson(body), "application/json");
}

// vLLM's /detokenize: {"prompt": text}.
asio::awaitable<void> HandleDetokenize(HttpExchange& exchange, EngineClient& client) {
  absl::StatusOr<DetokenizeRequest> parsed = ParseDetokenizeRequest(exchange.request().body());
  absl::Status status = parsed.status();
  if (status.ok()) status = client.CheckModel(parsed->model);
  for (size_t i = 0; status.ok() && i < parsed->tokens.size(); ++i) {
    if (parsed->tokens[i] >= client.vocab_size()) {
      status = ParamError(
          "tokens", "token id " + std::to_string(parsed->tokens[i]) + " is outside the vocabulary");
    }
  }
  if (!status.ok()) {
    co_await exchange.ReplyError(status);
    co_return;
  }
  Json body = {{"prompt", client.Detokenize(parsed->tokens, /*skip_special_tokens=*/false)}};
  co_await exchange.Reply(http::status::ok, DumpJson(body), "application/json");
}

asio::awaitable<void> Route(HttpExchange& exchange, EngineClient& client,
                            const std::string& api_key, const OpenAiLimits& limits) {
  const std::string_view path = exchange.path();
  const http::verb method = exchange.request().method();
  if (path == "/health") {
    co_await exchange.Reply(http::status::ok, R"({"status":"ok"})", "application/json");
    co_return;
  }
  if (path == "/metrics") {
    co_await exchange.Reply(http::status::ok, client.metrics().Render(client.Stats()),
                            "text/plain; version=0.0.4; charset=utf-8");
    co_return;
  }
  const bool known = path == "/v1/models" || path == "/v1/completions" ||
                     path == "/v1/chat/completions" || path == "/tokenize" || path == "/detokenize";
  if (!known) {
    co_await exchange.ReplyError(absl::NotFoundError("no route for " + std::string(path)));
    co_return;
  }
  const auto authorization = exchange.request()[http::field::authorization];
  if (!BearerMatches(std::string_view(authorization.data(), authorization.size()), api_key)) {
    co_await exchange.ReplyError(absl::UnauthenticatedError("missing or invalid API key"));
    co_return;
  }
  if (path == "/v1/models" && method == http::verb::get) {
    co_await HandleModels(exchange, client);
  } else if (path == "/v1/completions" && method == http::verb::post) {
    co_await HandleGenerate(exchange, client, ApiKind::kCompletion, limits);
  } else if (path == "/v1/chat/completions" && method == http::verb::post) {
    co_await HandleGenerate(exchange, client, ApiKind::kChat, limits);
  } else if (path == "/tokenize" && method == http::verb::post) {
    co_await HandleTokenize(exchange, client);
  } else if (path == "/detokenize" && method == http::verb::post) {
    co_await HandleDetokenize(exchange, client);
  } else {
    absl::Status wrong =
        absl::InvalidArgumentError(std::string(exchange.request().method_string()) +
                                   " is not allowed on " + std::string(path));
    co_await exchange.Reply(http::status::method_not_allowed, DumpJson(OpenAiErrorBody(wrong)),
                            "application/json");
  }
}

}  // namespace

bool BearerMatches(std::string_view authorization, const std::string& api_key) {
  if (api_key.empty()) return true;
  constexpr std::string_view kPrefix = "Bearer ";
  if (authorization.substr(0, kPrefix.size()) != kPrefix) return false;
  std::string_view given = authorization.substr(kPrefix.size());
  // Constant time in the key's length, so timing does not reveal a prefix.
  unsigned diff = given.size() == api_key.size() ? 0 : 1;
  for (size_t i = 0; i < api_key.size(); ++i) {
    diff |= static_cast<unsigned char>(api_key[i]) ^
            static_cast<unsigned char>(i < given.size() ? given[i] : 0);
  }
  return diff == 0;
}

HttpServer::Handler MakeOpenAiHandler(EngineClient* client, std::string api_key,
                                      OpenAiLimits limits) {
  return [client, api_key = std::move(api_key), limits](HttpExchange& exchange) {
    return Route(exchange, *client, api_key, limits);
  };
}

}  // namespace lair::server
