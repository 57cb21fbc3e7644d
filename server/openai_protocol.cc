#include "server/openai_protocol.h"

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>

#include "server/api_error.h"

namespace lair::server {
namespace {

using Json = nlohmann::json;

constexpr int kMaxN = 128;
constexpr int kMaxLogprobs = 20;
constexpr size_t kMaxStops = 16;

// Reads optional fields of a request object. An absent or null field leaves
// the output untouched; a present one of the wrong type or range is a
// ParamError naming it.
class Fields {
 public:
  explicit Fields(const Json& object) : object_(object) {}

  const Json* Get(const char* name) const {
    auto it = object_.find(name);
    return it == object_.end() || it->is_null() ? nullptr : &*it;
  }
  absl::Status Int(const char* name, int64_t lo, int64_t hi, int64_t* out) const {
    const Json* v = Get(name);
    if (!v) return absl::OkStatus();
    if (!v->is_number_integer()) return ParamError(name, "must be an integer");
    int64_t x = v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)
                    ? INT64_MAX
                    : v->get<int64_t>();
    if (x < lo || x > hi) {
      return ParamError(name, "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                                  "], got " + std::to_string(x));
    }
    *out = x;
    return absl::OkStatus();
  }
  absl::Status Int(const char* name, int64_t lo, int64_t hi, int* out) const {
    int64_t x = *out;
    LAIR_RETURN_IF_ERROR(Int(name, lo, hi, &x));
    *out = static_cast<int>(x);
    return absl::OkStatus();
  }
  // Checks lo <= x <= hi (or lo < x when lo_open).
  absl::Status Float(const char* name, double lo, double hi, bool lo_open, float* out) const {
    const Json* v = Get(name);
    if (!v) return absl::OkStatus();
    if (!v->is_number()) return ParamError(name, "must be a number");
    double x = v->get<double>();
    if (!std::isfinite(x) || x < lo || x > hi || (lo_open && x == lo)) {
      return ParamError(name, std::string("must be in ") + (lo_open ? "(" : "[") + Num(lo) + ", " +
                                  Num(hi) + "], got " + Num(x));
    }
    *out = static_cast<float>(x);
    return absl::OkStatus();
  }
  absl::Status Bool(const char* name, bool* out) const {
    const Json* v = Get(name);
    if (!v) return absl::OkStatus();
    if (!v->is_boolean()) return ParamError(name, "must be a boolean");
    *out = v->get<bool>();
    return absl::OkStatus();
  }
  absl::Status String(const char* name, std::string* out) const {
    const Json* v = Get(name);
    if (!v) return absl::OkStatus();
    if (!v->is_string()) return ParamError(name, "must be a string");
    *out = v->get<std::string>();
    return absl::OkStatus();
  }

 private:
  static std::string Num(double x) {
    std::string s = std::to_string(x);
    s.erase(s.find_last_not_of('0') + 1);
    if (!s.empty() && s.back() == '.') s.pop_back();
    return s;
  }
  const Json& object_;
};

absl::StatusOr<std::vector<int32_t>> TokenIds(const Json& array, std::string_view param) {
  std::vector<int32_t> ids;
  for (const Json& id : array) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX) {
      return ParamError(param, "token ids must be non-negative integers");
    }
    ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
  }
  return ids;
}

// The list of token ids in field `name`, when present (and not empty when
// `non_empty`).
absl::Status OptionalTokenIds(const Fields& f, const char* name, bool non_empty,
                              std::vector<int32_t>* out) {
  const Json* ids = f.Get(name);
  if (!ids) return absl::OkStatus();
  if (!ids->is_array() || (non_empty && ids->empty())) {
    return ParamError(
        name, non_empty ? "must be a non-empty list of token ids" : "must be a list of token ids");
  }
  LAIR_ASSIGN_OR_RETURN(*out, TokenIds(*ids, name));
  return absl::OkStatus();
}

// prompt: a string, a list of strings, a list of token ids, or a list of
// lists of token ids.
absl::StatusOr<std::vector<PromptInput>> ParsePrompts(const Json* prompt) {
  constexpr std::string_view kParam = "prompt";
  if (!prompt) return ParamError(kParam, "is required");
  std::vector<PromptInput> prompts;
  if (prompt->is_string()) {
    prompts.emplace_back(std::in_place_type<std::string>, prompt->get<std::string>());
    return prompts;
  }
  if (!prompt->is_array() || prompt->empty()) {
    return ParamError(kParam,
                      "must be a string, a list of strings, or a non-empty list of token ids");
  }
  if ((*prompt)[0].is_number_integer()) {
    LAIR_ASSIGN_OR_RETURN(std::vector<int32_t> ids, TokenIds(*prompt, kParam));
    prompts.emplace_back(std::in_place_type<std::vector<int32_t>>, std::move(ids));
    return prompts;
  }
  for (const Json& item : *prompt) {
    if (item.is_string()) {
      prompts.emplace_back(std::in_place_type<std::string>, item.get<std::string>());
    } else if (item.is_array()) {
      LAIR_ASSIGN_OR_RETURN(std::vector<int32_t> ids, TokenIds(item, kParam));
      prompts.emplace_back(std::in_place_type<std::vector<int32_t>>, std::move(ids));
    } else {
      return ParamError(kParam, "list items must be strings or lists of token ids");
    }
  }
  return prompts;
}

// messages: objects with a string role and content that is a string, null,
// or a list of {"type": "text", "text": ...} parts (joined into one string).
absl::StatusOr<nlohmann::ordered_json> ParseMessages(const Json* messages) {
  constexpr std::string_view kParam = "messages";
  if (!messages) return ParamError(kParam, "is required");
  if (!messages->is_array() || messages->empty())
    return ParamError(kParam, "must be a non-empty list");
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const Json& message : *messages) {
    if (!message.is_object()) return ParamError(kParam, "each message must be an object");
    auto role = message.find("role");
    if (role == message.end() || !role->is_string())
      return ParamError(kParam, "each message needs a string role");
    nlohmann::ordered_json copy = nlohmann::ordered_json::parse(message.dump());
    auto content = message.find("content");
    std::string text;
    if (content != message.end() && content->is_array()) {
      for (const Json& part : *content) {
        if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
            !part["text"].is_string()) {
          return UnsupportedParamError(kParam, "only text content parts are supported");
        }
        text += part["text"].get<std::string>();
      }
    } else if (content != message.end() && content->is_string()) {
      text = content->get<std::string>();
    } else if (content != message.end() && !content->is_null()) {
      return ParamError(kParam, "message content must be a string or a list of text parts");
    }
    copy["content"] = text;
    out.push_back(std::move(copy));
  }
  return out;
}

absl::Status ParseSampling(ApiKind kind, const Fields& f, int max_tokens,
                           engine::SamplingParams* s) {
  // 0 only with echo (checked by the caller): the prompt alone.
  LAIR_RETURN_IF_ERROR(
      f.Int("max_tokens", kind == ApiKind::kCompletion ? 0 : 1, max_tokens, &s->max_tokens));
  if (kind == ApiKind::kChat)
    LAIR_RETURN_IF_ERROR(f.Int("max_completion_tokens", 1, max_tokens, &s->max_tokens));
  LAIR_RETURN_IF_ERROR(f.Int("min_tokens", 0, s->max_tokens, &s->min_tokens));
  LAIR_RETURN_IF_ERROR(f.Int("n", 1, kMaxN, &s->n));
  LAIR_RETURN_IF_ERROR(f.Float("temperature", 0, 2, false, &s->temperature));
  LAIR_RETURN_IF_ERROR(f.Float("top_p", 0, 1, true, &s->top_p));
  LAIR_RETURN_IF_ERROR(f.Int("top_k", -1, INT32_MAX, &s->top_k));
  if (s->top_k == -1) s->top_k = 0;  // vLLM spells "off" as -1
  LAIR_RETURN_IF_ERROR(f.Float("min_p", 0, 1, false, &s->min_p));
  LAIR_RETURN_IF_ERROR(f.Float("presence_penalty", -2, 2, false, &s->presence_penalty));
  LAIR_RETURN_IF_ERROR(f.Float("frequency_penalty", -2, 2, false, &s->frequency_penalty));
  LAIR_RETURN_IF_ERROR(f.Float("repetition_penalty", 0, 100, true, &s->repetition_penalty));
  LAIR_RETURN_IF_ERROR(f.Bool("ignore_eos", &s->ignore_eos));
  LAIR_RETURN_IF_ERROR(f.Bool("skip_special_tokens", &s->skip_special_tokens));
  LAIR_RETURN_IF_ERROR(f.Bool("include_stop_str_in_output", &s->include_stop_str_in_output));
  if (const Json* seed = f.Get("seed")) {
    if (!seed->is_number_integer()) return ParamError("seed", "must be an integer");
    s->seed = seed->is_number_unsigned() ? seed->get<uint64_t>()
                                         : static_cast<uint64_t>(seed->get<int64_t>());
  }
  if (const Json* stop = f.Get("stop")) {
    if (stop->is_string()) {
      s->stop = {stop->get<std::string>()};
    } else if (stop->is_array() && stop->size() <= kMaxStops) {
      for (const Json& item : *stop) {
        if (!item.is_string()) return ParamError("stop", "must be a string or a list of strings");
        s->stop.push_back(item.get<std::string>());
      }
    } else {
      return ParamError("stop", "must be a string or a list of at most " +
                                    std::to_string(kMaxStops) + " strings");
    }
    for (const std::string& str : s->stop) {
      if (str.empty()) return ParamError("stop", "stop strings must not be empty");
    }
  }
  LAIR_RETURN_IF_ERROR(OptionalTokenIds(f, "stop_token_ids", false, &s->stop_token_ids));
  LAIR_RETURN_IF_ERROR(OptionalTokenIds(f, "allowed_token_ids", true, &s->allowed_token_ids));
  if (const Json* bias = f.Get("logit_bias")) {
    if (!bias->is_object())
      return ParamError("logit_bias", "must be an object mapping token ids to numbers");
    for (auto it = bias->begin(); it != bias->end(); ++it) {
      int64_t id = -1;
      try {
        size_t used = 0;
        id = std::stoll(it.key(), &used);
        if (used != it.key().size()) id = -1;
      } catch (const std::exception&) {
        id = -1;
      }
      if (id < 0 || id > INT32_MAX)
        return ParamError("logit_bias", "key '" + it.key() + "' is not a token id");
      if (!it->is_number() || std::fabs(it->get<double>()) > 100) {
        return ParamError("logit_bias", "values must be numbers in [-100, 100]");
      }
      s->logit_bias[static_cast<int32_t>(id)] = it->get<float>();
    }
  }
  if (kind == ApiKind::kCompletion) {
    return f.Int("logprobs", 0, kMaxLogprobs, &s->logprobs);
  }
  bool logprobs = false;
  LAIR_RETURN_IF_ERROR(f.Bool("logprobs", &logprobs));
  int top = -1;
  LAIR_RETURN_IF_ERROR(f.Int("top_logprobs", 0, kMaxLogprobs, &top));
  if (top >= 0 && !logprobs) return ParamError("top_logprobs", "requires logprobs to be true");
  if (logprobs) s->logprobs = std::max(top, 0);
  return absl::OkStatus();
}

absl::StatusOr<Json> ParseBody(std::string_view body) {
  Json json = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) return absl::InvalidArgumentError("the request body is not valid JSON");
  if (!json.is_object())
    return absl::InvalidArgumentError("the request body must be a JSON object");
  return json;
}

}  // namespace

absl::StatusOr<TokenizeRequest> ParseTokenizeRequest(std::string_view body) {
  LAIR_ASSIGN_OR_RETURN(const Json json, ParseBody(body));
  Fields f(json);
  TokenizeRequest request;
  LAIR_RETURN_IF_ERROR(f.String("model", &request.model));
  const bool has_prompt = f.Get("prompt") != nullptr, has_messages = f.Get("messages") != nullptr;
  if (has_prompt == has_messages) return ParamError("prompt", "give either prompt or messages");
  if (has_prompt) {
    request.prompt.emplace();
    LAIR_RETURN_IF_ERROR(f.String("prompt", &*request.prompt));
  } else {
    LAIR_ASSIGN_OR_RETURN(request.messages, ParseMessages(f.Get("messages")));
    request.add_special_tokens = false;  // the template writes them (vLLM's default)
    LAIR_RETURN_IF_ERROR(f.Bool("add_generation_prompt", &request.add_generation_prompt));
  }
  LAIR_RETURN_IF_ERROR(f.Bool("add_special_tokens", &request.add_special_tokens));
  return request;
}

absl::StatusOr<DetokenizeRequest> ParseDetokenizeRequest(std::string_view body) {
  LAIR_ASSIGN_OR_RETURN(const Json json, ParseBody(body));
  Fields f(json);
  DetokenizeRequest request;
  LAIR_RETURN_IF_ERROR(f.String("model", &request.model));
  const Json* tokens = f.Get("tokens");
  if (!tokens || !tokens->is_array()) return ParamError("tokens", "must be a list of token ids");
  LAIR_ASSIGN_OR_RETURN(request.tokens, TokenIds(*tokens, "tokens"));
  return request;
}

absl::StatusOr<OpenAiRequest> ParseOpenAiRequest(ApiKind kind, std::string_view body,
                                                 const OpenAiLimits& limits) {
  LAIR_ASSIGN_OR_RETURN(const Json json, ParseBody(body));
  Fields f(json);
  OpenAiRequest request;
  request.kind = kind;
  if (kind == ApiKind::kChat) request.sampling.max_tokens = limits.chat_default_max_tokens;
  LAIR_RETURN_IF_ERROR(f.String("model", &request.model));
  LAIR_RETURN_IF_ERROR(ParseSampling(kind, f, limits.max_tokens, &request.sampling));
  LAIR_RETURN_IF_ERROR(f.Bool("stream", &request.stream));
  if (const Json* options = f.Get("stream_options")) {
    if (!options->is_object()) return ParamError("stream_options", "must be an object");
    if (!request.stream) return ParamError("stream_options", "is only allowed when stream is true");
    LAIR_RETURN_IF_ERROR(Fields(*options).Bool("include_usage", &request.include_usage));
  }
  std::string user;
  LAIR_RETURN_IF_ERROR(f.String("user", &user));
  LAIR_RETURN_IF_ERROR(
      f.Int("truncate_prompt_tokens", 1, INT32_MAX, &request.truncate_prompt_tokens));
  if (const Json* format = f.Get("response_format")) {
    if (!format->is_object() || format->value("type", "") != "text") {
      return UnsupportedParamError("response_format", "only {\"type\": \"text\"} is supported");
    }
  }
  if (kind == ApiKind::kCompletion) {
    LAIR_RETURN_IF_ERROR(f.Bool("echo", &request.echo));
    // The prompt is listed with the logprobs asked for the output.
    if (request.echo) request.sampling.prompt_logprobs = request.sampling.logprobs;
    if (request.sampling.max_tokens == 0) {
      if (!request.echo) return ParamError("max_tokens", "must be at least 1 without echo");
      // The engine runs the prompt and one token, which the response leaves out.
      request.prompt_only = true;
      request.sampling.max_tokens = 1;
    }
    if (f.Get("suffix")) return UnsupportedParamError("suffix", "suffix is not supported");
    // best_of > n would return the n best of more completions; not done, so
    // not silently ignored.
    int best_of = request.sampling.n;
    LAIR_RETURN_IF_ERROR(f.Int("best_of", request.sampling.n, kMaxN, &best_of));
    if (best_of != request.sampling.n) {
      return UnsupportedParamError(
          "best_of", "only best_of equal to n (every completion returned) is supported");
    }
    LAIR_ASSIGN_OR_RETURN(request.prompts, ParsePrompts(f.Get("prompt")));
  } else {
    LAIR_ASSIGN_OR_RETURN(request.messages, ParseMessages(f.Get("messages")));
    LAIR_RETURN_IF_ERROR(f.Bool("add_generation_prompt", &request.add_generation_prompt));
    // Tools would be silently ignored: a client that offers them is told.
    for (const char* tools : {"tools", "functions"}) {
      const Json* offered = f.Get(tools);
      if (offered && !(offered->is_array() && offered->empty())) {
        return UnsupportedParamError(tools, "tool calling is not supported");
      }
    }
    if (const Json* choice = f.Get("tool_choice"); choice && *choice != "none") {
      return UnsupportedParamError("tool_choice", "tool calling is not supported");
    }
  }
  return request;
}

ResponseHeader NewResponseHeader(ApiKind kind, std::string model) {
  thread_local std::mt19937_64 rng(std::random_device{}());
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(rng()));
  ResponseHeader header;
  header.kind = kind;
  header.id = std::string(kind == ApiKind::kChat ? "chatcmpl-" : "cmpl-") + hex;
  header.created = std::chrono::duration_cast<std::chrono::seconds>(
                       std::chrono::system_clock::now().time_since_epoch())
                       .count();
  header.model = std::move(model);
  return header;
}

namespace {

Json Bytes(const std::string& s) {
  Json bytes = Json::array();
  for (unsigned char c : s) bytes.push_back(static_cast<int>(c));
  return bytes;
}

// Chat shape: {"content": [{token, logprob, bytes, top_logprobs: [...]}]};
// completions shape: {tokens, token_logprobs, top_logprobs: [{text: lp}]}.
Json LogprobsJson(ApiKind kind, const std::vector<engine::TokenLogprob>& logprobs,
                  std::optional<int32_t> unscored_first, const TokenRendering& rendering) {
  if (kind == ApiKind::kChat) {
    Json content = Json::array();
    for (const auto& lp : logprobs) {
      std::string text = rendering.text(lp.token);
      Json top = Json::array();
      for (const auto& [id, value] : lp.top) {
        top.push_back({{"token", rendering.text(id)},
                       {"logprob", value},
                       {"bytes", Bytes(rendering.bytes(id))}});
      }
      content.push_back({{"token", text},
                         {"logprob", lp.logprob},
                         {"bytes", Bytes(rendering.bytes(lp.token))},
                         {"top_logprobs", top}});
    }
    return {{"content", content}};
  }
  Json tokens = Json::array(), token_logprobs = Json::array(), top_logprobs = Json::array();
  if (unscored_first.has_value()) {
    tokens.push_back(rendering.text(*unscored_first));
    token_logprobs.push_back(nullptr);
    top_logprobs.push_back(nullptr);
  }
  for (const auto& lp : logprobs) {
    tokens.push_back(rendering.text(lp.token));
    token_logprobs.push_back(lp.logprob);
    Json top = Json::object();
    for (const auto& [id, value] : lp.top) top[rendering.text(id)] = value;
    top_logprobs.push_back(top);
  }
  return {{"tokens", tokens}, {"token_logprobs", token_logprobs}, {"top_logprobs", top_logprobs}};
}

Json FinishJson(engine::FinishReason reason) {
  return reason == engine::FinishReason::kNone ? Json(nullptr)
                                               : Json(engine::FinishReasonName(reason));
}

Json UsageJson(const engine::Usage& usage) {
  return {{"prompt_tokens", usage.prompt_tokens},
          {"completion_tokens", usage.completion_tokens},
          {"total_tokens", usage.prompt_tokens + usage.completion_tokens}};
}

Json Envelope(const ResponseHeader& header, const char* object) {
  return {
      {"id", header.id}, {"object", object}, {"created", header.created}, {"model", header.model}};
}

}  // namespace

Json FullResponse(const ResponseHeader& header, const std::vector<Choice>& choices,
                  const engine::Usage& usage, bool with_logprobs, const TokenRendering& tokens) {
  const bool chat = header.kind == ApiKind::kChat;
  Json out = Envelope(header, chat ? "chat.completion" : "text_completion");
  Json list = Json::array();
  for (const Choice& c : choices) {
    Json choice = {
        {"index", c.index},
        {"logprobs", with_logprobs ? LogprobsJson(header.kind, c.logprobs, c.unscored_first, tokens)
                                   : Json(nullptr)},
        {"finish_reason", FinishJson(c.finish_reason)}};
    if (chat) {
      choice["message"] = {{"role", "assistant"}, {"content", c.text}};
    } else {
      choice["text"] = c.text;
    }
    list.push_back(std::move(choice));
  }
  out["choices"] = std::move(list);
  out["usage"] = UsageJson(usage);
  return out;
}

Json StreamChunk(const ResponseHeader& header, const ChunkContent& content, bool with_logprobs,
                 bool usage_null, const TokenRendering& tokens) {
  const bool chat = header.kind == ApiKind::kChat;
  Json out = Envelope(header, chat ? "chat.completion.chunk" : "text_completion");
  Json choice = {{"index", content.index},
                 {"logprobs", with_logprobs ? LogprobsJson(header.kind, content.logprobs,
                                                           content.unscored_first, tokens)
                                            : Json(nullptr)},
                 {"finish_reason", FinishJson(content.finish_reason)}};
  if (chat) {
    Json delta = Json::object();
    if (content.first) delta["role"] = "assistant";
    if (content.first || !content.text.empty()) delta["content"] = content.text;
    choice["delta"] = std::move(delta);
  } else {
    choice["text"] = content.text;
  }
  out["choices"] = Json::array({std::move(choice)});
  if (usage_null) out["usage"] = nullptr;
  return out;
}

Json UsageChunk(const ResponseHeader& header, const engine::Usage& usage) {
  Json out =
      Envelope(header, header.kind == ApiKind::kChat ? "chat.completion.chunk" : "text_completion");
  out["choices"] = Json::array();
  out["usage"] = UsageJson(usage);
  return out;
}

std::string SseEvent(const nlohmann::json& data) { return "data: " + DumpJson(data) + "\n\n"; }

}  // namespace lair::server
