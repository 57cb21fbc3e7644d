#include "checkpoint/config_reader.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/fixtures.h"

namespace lair {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

ConfigReader Reader(std::string_view text) {
  auto reader = ConfigReader::FromJson(nlohmann::json::parse(text), "config.json");
  LAIR_CHECK(reader.ok());
  return *std::move(reader);
}

void ExpectError(const absl::Status& status, std::string_view message) {
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(), HasSubstr(message));
}

constexpr std::string_view kConfig = R"({
  "hidden_size": 128, "num_heads": "2", "big": 3000000000, "neg": -4, "ratio": 1.0,
  "eps": 1e-6, "whole": 4, "tie": false, "act": "swish", "kv": null,
  "dims": [1, 2, 3], "mixed": [1, "a"], "rope": {"theta": 10000, "kind": "ntk", "bad": true}
})";

TEST(ConfigReaderTest, Integers) {
  ConfigReader c = Reader(kConfig);
  EXPECT_EQ(*c.Int("hidden_size"), 128);
  EXPECT_EQ(*c.Int("neg"), -4);
  EXPECT_EQ(*c.Int("missing", 7), 7);
  EXPECT_EQ(*c.Int("kv", 3), 3) << "null takes the default";
  EXPECT_EQ(*c.OptionalInt("kv"), std::nullopt);
  EXPECT_EQ(*c.OptionalInt("hidden_size"), 128);
  ExpectError(c.Int("num_heads").status(),
              "config.json: field 'num_heads': expected an integer, got string \"2\"");
  ExpectError(c.Int("num_heads", 1).status(), "field 'num_heads': expected an integer");
  ExpectError(c.Int("ratio").status(), "field 'ratio': expected an integer, got number 1.0");
  ExpectError(c.Int("tie").status(), "field 'tie': expected an integer, got boolean false");
  ExpectError(c.Int("big").status(), "field 'big': expected an integer that fits in 32 bits");
  ExpectError(c.Int("missing").status(),
              "config.json: field 'missing': missing, expected an integer");
  ExpectError(c.Int("kv").status(), "field 'kv': missing, expected an integer");
}

TEST(ConfigReaderTest, FloatsBoolsStrings) {
  ConfigReader c = Reader(kConfig);
  EXPECT_DOUBLE_EQ(*c.Float("eps"), 1e-6);
  EXPECT_DOUBLE_EQ(*c.Float("whole"), 4.0) << "an integer is a number";
  EXPECT_DOUBLE_EQ(*c.Float("missing", 0.5), 0.5);
  EXPECT_EQ(*c.OptionalFloat("kv"), std::nullopt);
  ExpectError(c.Float("act").status(), "field 'act': expected a number, got string \"swish\"");

  EXPECT_FALSE(*c.Bool("tie"));
  EXPECT_TRUE(*c.Bool("missing", true));
  EXPECT_EQ(*c.OptionalBool("tie"), false);
  ExpectError(c.Bool("whole").status(), "field 'whole': expected a boolean, got number 4");

  EXPECT_EQ(*c.String("act"), "swish");
  EXPECT_EQ(*c.String("missing", "gelu"), "gelu");
  EXPECT_EQ(*c.OptionalString("missing"), std::nullopt);
  ExpectError(c.String("dims").status(), "field 'dims': expected a string, got array [1,2,3]");
  ExpectError(c.String("missing").status(), "field 'missing': missing, expected a string");
}

TEST(ConfigReaderTest, IntLists) {
  ConfigReader c = Reader(kConfig);
  EXPECT_THAT(*c.IntList("dims"), ElementsAre(1, 2, 3));
  EXPECT_THAT(*c.IntList("missing", {4, 5}), ElementsAre(4, 5));
  ExpectError(c.IntList("mixed").status(), "field 'mixed': expected an array of integers");
  ExpectError(c.IntList("hidden_size").status(),
              "field 'hidden_size': expected an array of integers");
  ExpectError(c.IntList("missing").status(), "field 'missing': missing");
}

TEST(ConfigReaderTest, OneOf) {
  ConfigReader c = Reader(kConfig);
  EXPECT_EQ(*c.OneOf("act", {"swish", "gelu"}), "swish");
  EXPECT_EQ(*c.OneOf("missing", {"swish", "gelu"}, "gelu"), "gelu");
  ExpectError(c.OneOf("act", {"relu", "gelu"}).status(),
              "field 'act': expected one of 'relu', 'gelu', got string \"swish\"");
  ExpectError(c.OneOf("act", {"relu", "gelu"}, "relu").status(), "expected one of 'relu', 'gelu'");
  ExpectError(c.OneOf("whole", {"relu"}).status(), "field 'whole': expected a string");
  ExpectError(c.OneOf("missing", {"relu"}).status(),
              "field 'missing': missing, expected one of 'relu'");
}

TEST(ConfigReaderTest, NestedObjectsNameTheirPath) {
  ConfigReader c = Reader(kConfig);
  EXPECT_TRUE(c.Has("rope"));
  EXPECT_FALSE(c.Has("kv"));
  EXPECT_FALSE(c.Has("missing"));
  auto rope = c.OptionalObject("rope");
  ASSERT_TRUE(rope.ok());
  ASSERT_TRUE(rope->has_value());
  EXPECT_DOUBLE_EQ(*(*rope)->Float("theta"), 10000);
  ExpectError((*rope)->Int("bad").status(), "config.json: field 'rope.bad': expected an integer");
  EXPECT_EQ(*c.OptionalObject("kv"), std::nullopt);
  ExpectError(c.OptionalObject("dims").status(), "field 'dims': expected an object");
  ExpectError(c.FieldError("hidden_size", "must be divisible by num_heads"),
              "config.json: field 'hidden_size': must be divisible by num_heads");
}

TEST(ConfigReaderTest, FromJsonRejectsNonObjects) {
  auto reader = ConfigReader::FromJson(nlohmann::json::array(), "x.json");
  ExpectError(reader.status(), "x.json: expected a JSON object at the top level, got array");
}

class ConfigReaderFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) / absl::StrCat("lair_config_", getpid());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string Write(std::string_view name, std::string_view text) {
    std::string path = (dir_ / name).string();
    std::ofstream(path) << text;
    return path;
  }

  fs::path dir_;
};

TEST_F(ConfigReaderFileTest, FileErrorsNameTheFile) {
  const std::string missing = (dir_ / "nope.json").string();
  auto absent = ConfigReader::FromFile(missing);
  EXPECT_EQ(absent.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(absent.status().message(), HasSubstr(missing));

  const std::string bad = Write("bad.json", "{\"a\": ");
  auto not_json = ConfigReader::FromFile(bad);
  ExpectError(not_json.status(), absl::StrCat(bad, ": not valid JSON"));

  const std::string list = Write("list.json", "[1]");
  ExpectError(ConfigReader::FromFile(list).status(),
              absl::StrCat(list, ": expected a JSON object at the top level"));

  const std::string good = Write("config.json", R"({"num_heads": "2"})");
  auto reader = ConfigReader::FromFile(good);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ(reader->origin(), good);
  ExpectError(reader->Int("num_heads").status(),
              absl::StrCat(good, ": field 'num_heads': expected an integer, got string"));
}

TEST(ConfigReaderFixtureTest, ReadsGlaTinyConfig) {
  LAIR_FIXTURE_OR_SKIP(path, "models/gla-tiny/config.json");
  auto c = ConfigReader::FromFile(path);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(*c->String("model_type"), "gla");
  EXPECT_EQ(*c->Int("hidden_size"), 128);
  EXPECT_EQ(*c->Int("num_heads"), 2);
  EXPECT_EQ(*c->OptionalInt("num_kv_heads"), std::nullopt);
  EXPECT_DOUBLE_EQ(*c->Float("expand_k"), 0.5);
  EXPECT_DOUBLE_EQ(*c->Float("norm_eps"), 1e-6);
  EXPECT_TRUE(*c->Bool("use_output_gate"));
  EXPECT_EQ(*c->OneOf("attn_mode", {"chunk", "fused_recurrent", "fused_chunk"}), "fused_recurrent");
}

}  // namespace
}  // namespace lair
