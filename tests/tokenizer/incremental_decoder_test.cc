// IncrementalDecoder against Decode: on every golden case, fed one token at a
// time, the pieces concatenate to Decode(all) and each piece is whole UTF-8.
#include <fstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/support/fixtures.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace lair {
namespace {

// Streams `ids` and returns the concatenation, failing on a piece that is
// not whole UTF-8.
std::string Stream(const Tokenizer& tokenizer, const std::vector<int32_t>& ids, bool skip,
                   const std::string& label) {
  IncrementalDecoder stream(tokenizer, skip);
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    const std::string piece = stream.Add(ids[i]);
    EXPECT_TRUE(tok::IsValidUtf8(piece)) << label << " token " << i;
    out += piece;
  }
  const std::string rest = stream.Flush();
  EXPECT_TRUE(tok::IsValidUtf8(rest)) << label << " flush";
  return out + rest;
}

class IncrementalGoldenTest : public ::testing::TestWithParam<std::string> {};

TEST_P(IncrementalGoldenTest, EqualsDecodeOnEveryCase) {
  LAIR_FIXTURE_OR_SKIP(golden_path, "tokenizers/" + GetParam() + "/golden.json");
  auto tokenizer = Tokenizer::Load(testing::FixturesDir() + "/tokenizers/" + GetParam());
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  std::ifstream in(golden_path);
  const nlohmann::json cases = nlohmann::json::parse(in).at("cases");
  for (size_t i = 0; i < cases.size(); ++i) {
    for (const char* field : {"ids", "ids_special"}) {
      const auto ids = cases[i].at(field).get<std::vector<int32_t>>();
      for (bool skip : {false, true}) {
        const std::string label = GetParam() + " case " + std::to_string(i) + " " + field +
                                  (skip ? " skipping specials" : "");
        EXPECT_EQ(Stream(**tokenizer, ids, skip, label), (*tokenizer)->Decode(ids, skip)) << label;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, IncrementalGoldenTest,
                         ::testing::Values("llama2", "llama3", "gpt2"));

TEST(IncrementalDecoderTest, HoldsAPartialCharacterUntilItCompletes) {
  LAIR_FIXTURE_OR_SKIP(path, "tokenizers/gpt2");
  auto tokenizer = Tokenizer::Load(path);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  // GPT-2 spells this emoji in several byte-level tokens.
  const std::vector<int32_t> ids = (*tokenizer)->Encode("ok 🤗", false);
  ASSERT_GT(ids.size(), 2u);
  IncrementalDecoder stream(**tokenizer, false);
  EXPECT_EQ(stream.Add(ids[0]), "ok");
  for (size_t i = 1; i + 1 < ids.size(); ++i) EXPECT_EQ(stream.Add(ids[i]), "") << i;
  EXPECT_EQ(stream.Add(ids.back()), " 🤗");
  EXPECT_EQ(stream.Flush(), "");
}

TEST(IncrementalDecoderTest, ByteFallbackRunsStayExactWhenInvalid) {
  LAIR_FIXTURE_OR_SKIP(path, "tokenizers/llama2");
  auto tokenizer = Tokenizer::Load(path);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  const auto byte = [&](const char* token) { return *(*tokenizer)->TokenToId(token); };
  const int32_t word = (*tokenizer)->Encode("hello", false).back();
  // 'a', then a stray lead byte, then a valid euro sign: HF renders an
  // invalid run as one U+FFFD per byte, so the 'a' changes with later bytes.
  const std::vector<int32_t> ids = {
      word, byte("<0x61>"), byte("<0xE2>"), byte("<0xE2>"), byte("<0x82>"), byte("<0xAC>"), word};
  EXPECT_TRUE((*tokenizer)->DependsOnNext(byte("<0x61>")));
  EXPECT_FALSE((*tokenizer)->DependsOnNext(word));
  EXPECT_EQ(Stream(**tokenizer, ids, false, "invalid run"), (*tokenizer)->Decode(ids, false));
  const std::vector<int32_t> valid = {byte("<0xE2>"), byte("<0x82>"), byte("<0xAC>")};
  EXPECT_EQ(Stream(**tokenizer, valid, false, "valid run"), "€");
}

// TokenBytes gives a partial character's raw bytes (where Decode gives
// U+FFFD), byte-level and byte-fallback alike; whole tokens their text.
TEST(TokenBytesTest, PartialCharactersKeepTheirBytes) {
  LAIR_FIXTURE_OR_SKIP(gpt2_path, "tokenizers/gpt2");
  auto gpt2 = Tokenizer::Load(gpt2_path);
  ASSERT_TRUE(gpt2.ok()) << gpt2.status();
  const std::vector<int32_t> ids = (*gpt2)->Encode("ok 🤗", false);
  std::string bytes;
  for (int32_t id : ids) bytes += (*gpt2)->TokenBytes(id);
  EXPECT_EQ(bytes, "ok 🤗");
  EXPECT_EQ((*gpt2)->TokenBytes(ids[0]),
            (*gpt2)->Decode(std::span<const int32_t>(&ids[0], 1), false));
  EXPECT_EQ((*gpt2)->Decode(std::span<const int32_t>(&ids.back(), 1), false), "\xEF\xBF\xBD");

  LAIR_FIXTURE_OR_SKIP(llama2_path, "tokenizers/llama2");
  auto llama2 = Tokenizer::Load(llama2_path);
  ASSERT_TRUE(llama2.ok()) << llama2.status();
  EXPECT_EQ((*llama2)->TokenBytes(*(*llama2)->TokenToId("<0xE2>")), "\xE2");
  const int32_t bos = *(*llama2)->BosId();
  EXPECT_EQ((*llama2)->TokenBytes(bos),
            (*llama2)->Decode(std::span<const int32_t>(&bos, 1), false));
}

}  // namespace
}  // namespace lair
