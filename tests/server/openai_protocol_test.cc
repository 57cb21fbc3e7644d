#include "server/openai_protocol.h"

#include "gtest/gtest.h"
#include "server/api_error.h"

namespace lair::server {
namespace {

using Json = nlohmann::json;

// A server's limits: chat requests default to 512 tokens, none may ask for more than 4096.
const OpenAiLimits kLimits{.chat_default_max_tokens = 512, .max_tokens = 4096};

absl::Status ParseStatus(ApiKind kind, const std::string& body) {
  return ParseOpenAiRequest(kind, body, kLimits).status();
}

TEST(OpenAiProtocolTest, ParsesCompletionParameters) {
  absl::StatusOr<OpenAiRequest> r = ParseOpenAiRequest(ApiKind::kCompletion, R"({
      "model": "m", "prompt": ["a", [1, 2]], "max_tokens": 7, "min_tokens": 3,
      "skip_special_tokens": false, "allowed_token_ids": [4, 5], "temperature": 0.5, "top_p": 0.9,
      "top_k": -1, "min_p": 0.1, "n": 3, "stop": "x", "seed": 42, "logprobs": 2,
      "presence_penalty": 0.5, "frequency_penalty": -0.5, "repetition_penalty": 1.2,
      "logit_bias": {"5": -100}, "stream": true, "stream_options": {"include_usage": true},
      "user": "u", "echo": false, "unknown_field": {"ignored": true}})",
                                                       kLimits);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->model, "m");
  ASSERT_EQ(r->prompts.size(), 2u);
  EXPECT_EQ(std::get<std::string>(r->prompts[0]), "a");
  EXPECT_EQ(std::get<std::vector<int32_t>>(r->prompts[1]), (std::vector<int32_t>{1, 2}));
  const engine::SamplingParams& s = r->sampling;
  EXPECT_EQ(s.max_tokens, 7);
  EXPECT_FLOAT_EQ(s.temperature, 0.5f);
  EXPECT_FLOAT_EQ(s.top_p, 0.9f);
  EXPECT_EQ(s.top_k, 0);
  EXPECT_FLOAT_EQ(s.min_p, 0.1f);
  EXPECT_EQ(s.n, 3);
  EXPECT_EQ(s.stop, std::vector<std::string>{"x"});
  EXPECT_EQ(s.seed, 42u);
  EXPECT_EQ(s.logprobs, 2);
  EXPECT_EQ(s.min_tokens, 3);
  EXPECT_FALSE(s.skip_special_tokens);
  EXPECT_EQ(s.allowed_token_ids, (std::vector<int32_t>{4, 5}));
  EXPECT_FLOAT_EQ(s.presence_penalty, 0.5f);
  EXPECT_FLOAT_EQ(s.frequency_penalty, -0.5f);
  EXPECT_FLOAT_EQ(s.repetition_penalty, 1.2f);
  EXPECT_FLOAT_EQ(s.logit_bias.at(5), -100.0f);
  EXPECT_TRUE(r->stream);
  EXPECT_TRUE(r->include_usage);
}

TEST(OpenAiProtocolTest, ParsesChatMessagesAndLogprobs) {
  absl::StatusOr<OpenAiRequest> r = ParseOpenAiRequest(ApiKind::kChat, R"({
      "messages": [{"role": "system", "content": "s"},
                   {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
      "logprobs": true, "top_logprobs": 3, "max_completion_tokens": 9})",
                                                       kLimits);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->messages.size(), 2u);
  EXPECT_EQ(r->messages[1]["content"], "ab");
  EXPECT_EQ(r->sampling.logprobs, 3);
  EXPECT_EQ(r->sampling.max_tokens, 9);
  absl::StatusOr<OpenAiRequest> defaults =
      ParseOpenAiRequest(ApiKind::kChat, R"({"messages": [{"role": "user", "content": "x"}]})",
                         {.chat_default_max_tokens = 77});
  ASSERT_TRUE(defaults.ok());
  EXPECT_EQ(defaults->sampling.max_tokens, 77);
  EXPECT_EQ(defaults->sampling.logprobs, -1);
}

TEST(OpenAiProtocolTest, ErrorsNameTheParam) {
  struct Case {
    ApiKind kind;
    const char* body;
    const char* param;
  };
  const Case cases[] = {
      {ApiKind::kCompletion, R"({"prompt": "x", "max_tokens": "ten"})", "max_tokens"},
      {ApiKind::kCompletion, R"({"prompt": "x", "max_tokens": 0})", "max_tokens"},
      {ApiKind::kCompletion, R"({"prompt": "x", "max_tokens": 4, "min_tokens": 5})", "min_tokens"},
      {ApiKind::kCompletion, R"({"prompt": "x", "max_tokens": 4097})", "max_tokens"},
      {ApiKind::kChat, R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 4097})",
       "max_tokens"},
      {ApiKind::kChat,
       R"({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 4097})",
       "max_completion_tokens"},
      {ApiKind::kCompletion, R"({"prompt": "x", "n": 3, "best_of": 2})", "best_of"},
      {ApiKind::kCompletion, R"({"prompt": "x", "allowed_token_ids": []})", "allowed_token_ids"},
      {ApiKind::kCompletion, R"({"prompt": "x", "allowed_token_ids": [-2]})", "allowed_token_ids"},
      {ApiKind::kCompletion, R"({"prompt": "x", "temperature": "hot"})", "temperature"},
      {ApiKind::kCompletion, R"({"prompt": "x", "temperature": 3})", "temperature"},
      {ApiKind::kCompletion, R"({"prompt": "x", "top_p": 0})", "top_p"},
      {ApiKind::kCompletion, R"({"prompt": "x", "n": 0})", "n"},
      {ApiKind::kCompletion, R"({"prompt": "x", "stop": 5})", "stop"},
      {ApiKind::kCompletion, R"({"prompt": "x", "seed": 1.5})", "seed"},
      {ApiKind::kCompletion, R"({"prompt": "x", "logprobs": 50})", "logprobs"},
      {ApiKind::kCompletion, R"({"prompt": "x", "logit_bias": {"abc": 1}})", "logit_bias"},
      {ApiKind::kCompletion, R"({"prompt": "x", "stream_options": {"include_usage": true}})",
       "stream_options"},
      {ApiKind::kCompletion, R"({"prompt": 5})", "prompt"},
      {ApiKind::kCompletion, R"({"prompt": [-1]})", "prompt"},
      {ApiKind::kCompletion, R"({})", "prompt"},
      {ApiKind::kCompletion, R"({"prompt": "x", "model": 3})", "model"},
      {ApiKind::kCompletion, R"({"prompt": "x", "stream": "yes"})", "stream"},
      {ApiKind::kChat, R"({"messages": "hi"})", "messages"},
      {ApiKind::kChat, R"({"messages": [{"content": "no role"}]})", "messages"},
      {ApiKind::kChat, R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})",
       "top_logprobs"},
      {ApiKind::kChat, R"({"messages": [{"role": "user", "content": "x"}], "logprobs": 1})",
       "logprobs"},
  };
  for (const Case& c : cases) {
    absl::Status status = ParseStatus(c.kind, c.body);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.body;
    EXPECT_EQ(ErrorParam(status), c.param) << c.body << " -> " << status;
    EXPECT_EQ(HttpStatusFor(status), 400);
  }
}

TEST(OpenAiProtocolTest, MalformedAndUnsupported) {
  absl::Status malformed = ParseStatus(ApiKind::kCompletion, "{\"prompt\": ");
  EXPECT_EQ(malformed.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseStatus(ApiKind::kCompletion, "[1, 2]").code(), absl::StatusCode::kInvalidArgument);
  absl::Status suffix = ParseStatus(ApiKind::kCompletion, R"({"prompt": "x", "suffix": "y"})");
  EXPECT_EQ(HttpStatusFor(suffix), 422);
  EXPECT_EQ(ErrorParam(suffix), "suffix");
  const std::string chat = R"({"messages": [{"role": "user", "content": "x"}], )";
  absl::Status tools = ParseStatus(ApiKind::kChat, chat + R"("tools": [{"type": "function"}]})");
  EXPECT_EQ(HttpStatusFor(tools), 422);
  EXPECT_EQ(ErrorParam(tools), "tools");
  EXPECT_EQ(ErrorParam(ParseStatus(ApiKind::kChat, chat + R"("tool_choice": "auto"})")),
            "tool_choice");
  EXPECT_TRUE(ParseStatus(ApiKind::kChat, chat + R"("tools": [], "tool_choice": "none"})").ok());
  // best_of above n would drop completions: refused; equal to n it changes nothing.
  absl::Status best_of = ParseStatus(ApiKind::kCompletion, R"({"prompt": "x", "best_of": 3})");
  EXPECT_EQ(HttpStatusFor(best_of), 422);
  EXPECT_EQ(ErrorParam(best_of), "best_of");
  EXPECT_TRUE(ParseStatus(ApiKind::kCompletion, R"({"prompt": "x", "n": 2, "best_of": 2})").ok());
  // The server's cap itself is allowed.
  EXPECT_TRUE(ParseStatus(ApiKind::kCompletion, R"({"prompt": "x", "max_tokens": 4096})").ok());
}

// Echo lists the prompt with the logprobs asked for the output.
TEST(OpenAiProtocolTest, EchoScoresThePromptWithTheOutputsLogprobs) {
  absl::StatusOr<OpenAiRequest> scored = ParseOpenAiRequest(
      ApiKind::kCompletion, R"({"prompt": "x", "echo": true, "logprobs": 2})", kLimits);
  ASSERT_TRUE(scored.ok()) << scored.status();
  EXPECT_TRUE(scored->echo);
  EXPECT_EQ(scored->sampling.prompt_logprobs, 2);
  absl::StatusOr<OpenAiRequest> text_only =
      ParseOpenAiRequest(ApiKind::kCompletion, R"({"prompt": "x", "echo": true})", kLimits);
  ASSERT_TRUE(text_only.ok()) << text_only.status();
  EXPECT_EQ(text_only->sampling.prompt_logprobs, -1);
  absl::StatusOr<OpenAiRequest> plain =
      ParseOpenAiRequest(ApiKind::kCompletion, R"({"prompt": "x", "logprobs": 2})", kLimits);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->sampling.prompt_logprobs, -1);
  // max_tokens 0: the prompt alone, with echo only.
  absl::StatusOr<OpenAiRequest> alone = ParseOpenAiRequest(
      ApiKind::kCompletion, R"({"prompt": "x", "echo": true, "max_tokens": 0})", kLimits);
  ASSERT_TRUE(alone.ok()) << alone.status();
  EXPECT_TRUE(alone->prompt_only);
  EXPECT_EQ(alone->sampling.max_tokens, 1);
  absl::Status no_echo = ParseStatus(ApiKind::kCompletion, R"({"prompt": "x", "max_tokens": 0})");
  EXPECT_EQ(ErrorParam(no_echo), "max_tokens");
  EXPECT_EQ(ErrorParam(ParseStatus(ApiKind::kChat, R"({"messages": [{"role": "user",
      "content": "x"}], "max_tokens": 0})")),
            "max_tokens");
}

TEST(OpenAiProtocolTest, TokenizeAndDetokenizeRequests) {
  absl::StatusOr<TokenizeRequest> text = ParseTokenizeRequest(R"({"prompt": "a b"})");
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(text->prompt, "a b");
  EXPECT_TRUE(text->add_special_tokens);
  absl::StatusOr<TokenizeRequest> chat = ParseTokenizeRequest(
      R"({"messages": [{"role": "user", "content": "x"}], "add_generation_prompt": false})");
  ASSERT_TRUE(chat.ok()) << chat.status();
  EXPECT_FALSE(chat->prompt.has_value());
  EXPECT_FALSE(chat->add_special_tokens);
  EXPECT_FALSE(chat->add_generation_prompt);
  EXPECT_EQ(ErrorParam(ParseTokenizeRequest("{}").status()), "prompt");
  EXPECT_EQ(ErrorParam(ParseTokenizeRequest(R"({"prompt": 3})").status()), "prompt");
  absl::StatusOr<DetokenizeRequest> ids = ParseDetokenizeRequest(R"({"tokens": [1, 2]})");
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(ids->tokens, (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(ErrorParam(ParseDetokenizeRequest(R"({"tokens": [-1]})").status()), "tokens");
  EXPECT_EQ(ParseDetokenizeRequest("[1]").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(OpenAiProtocolTest, ErrorBodyHasOpenAiShape) {
  Json body = OpenAiErrorBody(ParamError("max_tokens", "must be an integer"));
  EXPECT_EQ(body["error"]["message"], "max_tokens: must be an integer");
  EXPECT_EQ(body["error"]["type"], "invalid_request_error");
  EXPECT_EQ(body["error"]["param"], "max_tokens");
  EXPECT_EQ(body["error"]["code"], "invalid_argument");
  Json not_found = OpenAiErrorBody(absl::NotFoundError("no model"));
  EXPECT_TRUE(not_found["error"]["param"].is_null());
  EXPECT_EQ(HttpStatusFor(absl::NotFoundError("")), 404);
  EXPECT_EQ(HttpStatusFor(absl::UnauthenticatedError("")), 401);
  EXPECT_EQ(HttpStatusFor(absl::ResourceExhaustedError("")), 429);
  EXPECT_EQ(HttpStatusFor(absl::FailedPreconditionError("")), 503);
  EXPECT_EQ(HttpStatusFor(absl::InternalError("")), 500);
}

std::string TokenText(int32_t id) { return std::string(1, static_cast<char>(id)); }
// Bytes differ from text, as a partial character's do.
std::string TokenBytes(int32_t id) { return std::string(2, static_cast<char>(id)); }
const TokenRendering kTokens{TokenText, TokenBytes};

TEST(OpenAiProtocolTest, SseFramingOfChunks) {
  ResponseHeader header{ApiKind::kChat, "chatcmpl-1", 100, "m"};
  ChunkContent first{0, "Hi", {}, engine::FinishReason::kNone, true, std::nullopt};
  std::string frame = SseEvent(StreamChunk(header, first, false, true, kTokens));
  ASSERT_EQ(frame.rfind("data: ", 0), 0u);
  ASSERT_EQ(frame.substr(frame.size() - 2), "\n\n");
  EXPECT_EQ(frame.find('\n'), frame.size() - 2) << "one line per event";
  Json chunk = Json::parse(frame.substr(6));
  EXPECT_EQ(chunk["object"], "chat.completion.chunk");
  EXPECT_EQ(chunk["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(chunk["choices"][0]["delta"]["content"], "Hi");
  EXPECT_TRUE(chunk["choices"][0]["finish_reason"].is_null());
  EXPECT_TRUE(chunk.contains("usage") && chunk["usage"].is_null());

  ChunkContent last{0, "", {}, engine::FinishReason::kLength, false, std::nullopt};
  Json end = StreamChunk(header, last, false, false, kTokens);
  EXPECT_EQ(end["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(end["choices"][0]["delta"].empty());
  EXPECT_FALSE(end.contains("usage"));

  Json usage = UsageChunk(header, engine::Usage{3, 4});
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["total_tokens"], 7);
  EXPECT_EQ(std::string(kSseDone), "data: [DONE]\n\n");
}

TEST(OpenAiProtocolTest, LogprobShapes) {
  std::vector<engine::TokenLogprob> logprobs = {{'a', -0.5f, {{'a', -0.5f}, {'b', -1.5f}}}};
  ResponseHeader completion{ApiKind::kCompletion, "cmpl-1", 1, "m"};
  Json c = FullResponse(completion, {{0, "a", logprobs, engine::FinishReason::kStop, std::nullopt}},
                        {1, 1}, true, kTokens);
  EXPECT_EQ(c["object"], "text_completion");
  EXPECT_EQ(c["choices"][0]["text"], "a");
  EXPECT_EQ(c["choices"][0]["logprobs"]["tokens"][0], "a");
  EXPECT_FLOAT_EQ(c["choices"][0]["logprobs"]["token_logprobs"][0].get<float>(), -0.5f);
  EXPECT_FLOAT_EQ(c["choices"][0]["logprobs"]["top_logprobs"][0]["b"].get<float>(), -1.5f);
  ResponseHeader chat{ApiKind::kChat, "chatcmpl-1", 1, "m"};
  Json h = FullResponse(chat, {{0, "a", logprobs, engine::FinishReason::kStop, std::nullopt}},
                        {1, 1}, true, kTokens);
  EXPECT_EQ(h["choices"][0]["message"]["content"], "a");
  const Json& entry = h["choices"][0]["logprobs"]["content"][0];
  EXPECT_EQ(entry["token"], "a");
  EXPECT_EQ(entry["bytes"], Json::array({97, 97}));
  EXPECT_EQ(entry["top_logprobs"][1]["token"], "b");
  EXPECT_EQ(h["usage"]["total_tokens"], 2);

  // Echo: the prompt's first token leads, unscored.
  Json e = FullResponse(completion, {{0, "pa", logprobs, engine::FinishReason::kStop, 'p'}}, {1, 1},
                        true, kTokens);
  const Json& echoed = e["choices"][0]["logprobs"];
  EXPECT_EQ(echoed["tokens"], Json::array({"p", "a"}));
  EXPECT_TRUE(echoed["token_logprobs"][0].is_null());
  EXPECT_TRUE(echoed["top_logprobs"][0].is_null());
  EXPECT_FLOAT_EQ(echoed["token_logprobs"][1].get<float>(), -0.5f);
}

}  // namespace
}  // namespace lair::server
