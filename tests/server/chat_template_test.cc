#include "server/chat_template.h"

#include <filesystem>
#include <fstream>

#include "gtest/gtest.h"

namespace lair::server {
namespace {

using Json = nlohmann::ordered_json;

std::string RenderOrDie(const std::string& source, const Json& variables) {
  absl::StatusOr<ChatTemplate> parsed = ChatTemplate::Parse(source);
  EXPECT_TRUE(parsed.ok()) << parsed.status();
  if (!parsed.ok()) return "";
  absl::StatusOr<std::string> text = parsed->Render(variables);
  EXPECT_TRUE(text.ok()) << text.status();
  return text.ok() ? *text : "";
}

Json Messages() {
  return Json::array({{{"role", "system"}, {"content", "You are helpful."}},
                      {{"role", "user"}, {"content", "  Hi there \n"}}});
}

TEST(ChatTemplateTest, Llama3FixtureTemplate) {
  const std::filesystem::path path =
      std::filesystem::path(LAIR_DEFAULT_FIXTURES_DIR) / "tokenizers/llama3/tokenizer_config.json";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "fixture missing: " << path;
  Json config = Json::parse(std::ifstream(path));
  Json variables = {{"messages", Messages()},
                    {"bos_token", "<|begin_of_text|>"},
                    {"add_generation_prompt", true}};
  EXPECT_EQ(
      RenderOrDie(config["chat_template"].get<std::string>(), variables),
      "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are helpful.<|eot_id|>"
      "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
      "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(ChatTemplateTest, ChatMlWithWhitespaceControlAndLoopVariables) {
  const std::string source =
      "{%- for message in messages -%}\n"
      "  {{- '<|im_start|>' + message.role + '\\n' + message.content | trim + '<|im_end|>' }}\n"
      "  {%- if not loop.last %}{{ '\\n' }}{% endif -%}\n"
      "{%- endfor -%}\n"
      "{%- if add_generation_prompt %}{{ '\\n<|im_start|>assistant\\n' }}{% endif %}";
  Json variables = {{"messages", Messages()}, {"add_generation_prompt", true}};
  EXPECT_EQ(RenderOrDie(source, variables),
            "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n"
            "<|im_start|>assistant\n");
  variables["add_generation_prompt"] = false;
  EXPECT_EQ(RenderOrDie(source, variables),
            "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>");
}

TEST(ChatTemplateTest, TrimBlocksAndLstripBlocks) {
  // A block tag alone on its line leaves no blank line behind, as with
  // Hugging Face's trim_blocks and lstrip_blocks.
  const std::string source = "A\n  {% if true %}\nB\n  {% endif %}\nC";
  EXPECT_EQ(RenderOrDie(source, Json::object()), "A\nB\nC");
}

TEST(ChatTemplateTest, SetNamespaceSliceAndFilters) {
  const std::string source =
      "{% set ns = namespace(sys='') %}"
      "{% if messages[0]['role'] == 'system' %}{% set ns.sys = messages[0]['content'] %}"
      "{% set rest = messages[1:] %}{% else %}{% set rest = messages %}{% endif %}"
      "[{{ ns.sys | upper }}]"
      "{% for m in rest %}{{ loop.index0 }}:{{ m.content.strip() ~ '|' ~ (m.content | length) }}{% "
      "endfor %}"
      "{{ (messages | length) * 2 }} {{ 7 // 2 }} {{ 7 % 4 }} {{ 'x' if missing is defined else "
      "'y' }}"
      "{{ ['a', 'b'] | join('-') }}{{ missing | default('d') }}";
  EXPECT_EQ(RenderOrDie(source, {{"messages", Messages()}}),
            "[YOU ARE HELPFUL.]0:Hi there|12"
            "4 3 3 ya-bd");
}

TEST(ChatTemplateTest, RaiseExceptionBecomesInvalidArgument) {
  absl::StatusOr<ChatTemplate> parsed = ChatTemplate::Parse(
      "{% for m in messages %}{% if m.role not in ['user', 'assistant'] %}"
      "{{ raise_exception('Conversation roles must be user or assistant') }}{% endif %}{% endfor "
      "%}");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  absl::StatusOr<std::string> text = parsed->Render({{"messages", Messages()}});
  ASSERT_FALSE(text.ok());
  EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(text.status().message().find("Conversation roles must be user or assistant"),
            std::string::npos);
}

TEST(ChatTemplateTest, ParseErrorsNameTheProblem) {
  EXPECT_NE(ChatTemplate::Parse("{% for m in messages %}x").status().message().find("endfor"),
            std::string::npos);
  EXPECT_NE(ChatTemplate::Parse("{% macro f() %}{% endmacro %}").status().message().find("macro"),
            std::string::npos);
  EXPECT_FALSE(ChatTemplate::Parse("{{ 'unterminated }}").ok());
}

TEST(ChatTemplateTest, UnknownFilterIsAnError) {
  absl::StatusOr<ChatTemplate> parsed = ChatTemplate::Parse("{{ 'x' | frobnicate }}");
  ASSERT_TRUE(parsed.ok());
  EXPECT_NE(parsed->Render(Json::object()).status().message().find("frobnicate"),
            std::string::npos);
}

TEST(ChatTemplateTest, FallbackFormat) {
  Json variables = {
      {"messages", Messages()}, {"bos_token", "<s>"}, {"add_generation_prompt", true}};
  EXPECT_EQ(RenderOrDie(ChatTemplate::kFallbackSource, variables),
            "<s><|system|>\nYou are helpful.\n<|user|>\n  Hi there \n\n<|assistant|>\n");
}

}  // namespace
}  // namespace lair::server
