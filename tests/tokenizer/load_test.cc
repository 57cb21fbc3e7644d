// Loading: errors name the file and field; tokenizer_config.json fields.
#include <filesystem>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/fixtures.h"
#include "tokenizer/tokenizer.h"

namespace lair {
namespace {

using ::testing::HasSubstr;

// A fresh folder under the test temp dir holding the given files.
std::string MakeFolder(const std::string& name,
                       std::initializer_list<std::pair<const char*, std::string>> files) {
  const std::filesystem::path dir = std::filesystem::path(::testing::TempDir()) / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  for (const auto& [file, contents] : files) std::ofstream(dir / file) << contents;
  return dir.string();
}

// A minimal valid tokenizer.json around `model`, with extra top-level fields.
std::string TokenizerJson(const std::string& model, const std::string& extra = "") {
  return R"({"added_tokens": [{"id": 3, "content": "<s>", "special": true}],)" + extra +
         R"("model": )" + model + "}";
}

const char kModel[] = R"({"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]})";

TEST(LoadTest, MissingFileIsNamed) {
  auto t = Tokenizer::Load("/nonexistent/lair-tokenizer");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(t.status().message()), HasSubstr("/nonexistent/lair-tokenizer"));
}

TEST(LoadTest, InvalidJsonNamesTheFile) {
  const std::string dir = MakeFolder("invalid_json", {{"tokenizer.json", "{\"model\": "}});
  auto t = Tokenizer::Load(dir);
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(std::string(t.status().message()), HasSubstr(dir + "/tokenizer.json"));
  EXPECT_THAT(std::string(t.status().message()), HasSubstr("invalid JSON"));
}

TEST(LoadTest, BadMergeNamesTheField) {
  const std::string dir = MakeFolder(
      "bad_merge", {{"tokenizer.json", TokenizerJson(R"({"type": "BPE", "vocab": {"a": 0},
                                                         "merges": ["a c"]})")}});
  auto t = Tokenizer::Load(dir);
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(std::string(t.status().message()), HasSubstr("tokenizer.json: model.merges[0]"));
  EXPECT_THAT(std::string(t.status().message()), HasSubstr("'c' is not in the vocabulary"));
}

TEST(LoadTest, UnsupportedComponentNamesTheField) {
  const std::string dir = MakeFolder(
      "bad_normalizer",
      {{"tokenizer.json", TokenizerJson(kModel, R"("normalizer": {"type": "Sequence", "normalizers":
                                   [{"type": "Lowercase"}, {"type": "Bert"}]},)")}});
  auto t = Tokenizer::Load(dir);
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(std::string(t.status().message()),
              HasSubstr("normalizer.normalizers[1].type: unsupported normalizer 'Bert'"));
}

TEST(LoadTest, BadRegexNamesTheField) {
  const std::string dir = MakeFolder(
      "bad_regex",
      {{"tokenizer.json", TokenizerJson(kModel, R"("pre_tokenizer": {"type": "Split", "pattern":
                                   {"Regex": "(unclosed"}, "behavior": "Isolated"},)")}});
  auto t = Tokenizer::Load(dir);
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(std::string(t.status().message()), HasSubstr("pre_tokenizer.pattern.Regex"));
}

TEST(LoadTest, ConfigTokenMustExist) {
  const std::string dir =
      MakeFolder("bad_config", {{"tokenizer.json", TokenizerJson(kModel)},
                                {"tokenizer_config.json", R"({"eos_token": "</s>"})"}});
  auto t = Tokenizer::Load(dir);
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(std::string(t.status().message()), HasSubstr("tokenizer_config.json: eos_token"));
}

TEST(LoadTest, MinimalTokenizerWorksFromTheFilePath) {
  const std::string dir =
      MakeFolder("minimal", {{"tokenizer.json", TokenizerJson(kModel)},
                             {"tokenizer_config.json",
                              R"({"bos_token": {"content": "<s>"}, "add_bos_token": true,
                       "chat_template": [{"name": "tool_use", "template": "T"},
                                         {"name": "default", "template": "D"}]})"}});
  auto t = Tokenizer::Load(dir + "/tokenizer.json");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->Encode("abba<s>a", true), (std::vector<int32_t>{2, 1, 0, 3, 0}));
  EXPECT_EQ((*t)->Decode(std::vector<int32_t>{2, 3, 0}, false), "ab <s> a");  // no decoder
  EXPECT_EQ((*t)->Decode(std::vector<int32_t>{2, 3, 0}, true), "ab a");
  EXPECT_EQ((*t)->VocabSize(), 4);
  EXPECT_EQ((*t)->BosId(), 3);
  EXPECT_EQ((*t)->EosId(), std::nullopt);
  EXPECT_TRUE((*t)->AddBosToken());
  EXPECT_EQ((*t)->ChatTemplate(), "D");
  EXPECT_TRUE((*t)->IsSpecial(3));
  EXPECT_FALSE((*t)->IsSpecial(2));
  EXPECT_EQ((*t)->IdToToken(2), "ab");
  EXPECT_EQ((*t)->IdToToken(99), "");
}

TEST(LoadTest, FixtureConfigs) {
  LAIR_FIXTURE_OR_SKIP(dir, "tokenizers");
  auto llama2 = Tokenizer::Load(dir + "/llama2");
  ASSERT_TRUE(llama2.ok()) << llama2.status();
  EXPECT_EQ((*llama2)->VocabSize(), 32000);
  EXPECT_EQ((*llama2)->BosId(), 1);
  EXPECT_EQ((*llama2)->EosId(), 2);
  EXPECT_TRUE((*llama2)->AddBosToken());
  EXPECT_EQ((*llama2)->ChatTemplate(), "");

  auto llama3 = Tokenizer::Load(dir + "/llama3");
  ASSERT_TRUE(llama3.ok()) << llama3.status();
  EXPECT_EQ((*llama3)->VocabSize(), 128256);
  EXPECT_EQ((*llama3)->BosId(), 128000);
  EXPECT_EQ((*llama3)->EosId(), 128001);
  EXPECT_THAT(std::string((*llama3)->ChatTemplate()), HasSubstr("<|start_header_id|>"));
  EXPECT_EQ((*llama3)->TokenToId("<|eot_id|>"), 128009);

  auto gpt2 = Tokenizer::Load(dir + "/gpt2");
  ASSERT_TRUE(gpt2.ok()) << gpt2.status();
  EXPECT_EQ((*gpt2)->VocabSize(), 50257);
  EXPECT_EQ((*gpt2)->BosId(), std::nullopt);
  EXPECT_EQ((*gpt2)->EosId(), 50256);
  EXPECT_FALSE((*gpt2)->AddBosToken());
}

}  // namespace
}  // namespace lair
