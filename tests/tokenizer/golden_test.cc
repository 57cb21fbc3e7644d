// Every case of the golden files from HF `tokenizers` 0.23.2: ids without and
// with the post-processor's special tokens, and the decoded text.
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/support/fixtures.h"
#include "tokenizer/tokenizer.h"

namespace lair {
namespace {

class GoldenTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenTest, MatchesEveryCase) {
  LAIR_FIXTURE_OR_SKIP(golden_path, "tokenizers/" + GetParam() + "/golden.json");
  auto tokenizer = Tokenizer::Load(testing::FixturesDir() + "/tokenizers/" + GetParam());
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  std::ifstream in(golden_path);
  const nlohmann::json golden = nlohmann::json::parse(in);
  const auto& cases = golden.at("cases");
  ASSERT_EQ(cases.size(), 192u);
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto& c = cases[i];
    const std::string text = c.at("text").get<std::string>();
    const auto ids = c.at("ids").get<std::vector<int32_t>>();
    EXPECT_EQ((*tokenizer)->Encode(text, false), ids) << "case " << i << ": " << text;
    EXPECT_EQ((*tokenizer)->Encode(text, true), c.at("ids_special").get<std::vector<int32_t>>())
        << "case " << i << ": " << text;
    EXPECT_EQ((*tokenizer)->Decode(ids, false), c.at("decoded").get<std::string>()) << "case " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, GoldenTest, ::testing::Values("llama2", "llama3", "gpt2"));

}  // namespace
}  // namespace lair
