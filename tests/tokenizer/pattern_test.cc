// The Oniguruma-to-PCRE2 regex translation and match iteration.
#include "tokenizer/pattern.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace lair::tok {
namespace {

std::vector<std::string> Matches(std::string_view pattern, std::string_view text) {
  auto regex = Pattern::Regex(pattern);
  EXPECT_TRUE(regex.ok()) << regex.status();
  Ranges ranges;
  (*regex)->FindAll(text, &ranges);
  std::vector<std::string> out;
  for (const auto& [begin, end] : ranges) out.emplace_back(text.substr(begin, end - begin));
  return out;
}

TEST(PatternTest, SpaceIsExactlyWhiteSpace) {
  // U+180E (Mongolian vowel separator) is not White_Space; PCRE2's own \s
  // would take it. U+3000 is.
  EXPECT_EQ(Matches("\\s+",
                    "a\xE1\xA0\x8E"
                    "b\xE3\x80\x80"
                    "c"),
            (std::vector<std::string>{"\xE3\x80\x80"}));
  EXPECT_EQ(Matches("[^\\s]+", "ab \xE1\xA0\x8E"),
            (std::vector<std::string>{"ab", "\xE1\xA0\x8E"}));
}

TEST(PatternTest, TranslatesEscapes) {
  EXPECT_EQ(TranslateOnigToPcre2("\\h"), "[0-9a-fA-F]");
  EXPECT_EQ(TranslateOnigToPcre2("\\u00e9"), "\\x{00e9}");
  EXPECT_EQ(TranslateOnigToPcre2("[^\\r\\n\\p{L}]"), "[^\\r\\n\\p{L}]");
  EXPECT_EQ(TranslateOnigToPcre2("[]\\w]"), "[]\\p{L}\\p{M}\\p{Nd}\\p{Pc}]");
  EXPECT_EQ(Matches("\\w+", "e\xCC\x81t\xC3\xA9 x_1"),
            (std::vector<std::string>{"e\xCC\x81t\xC3\xA9", "x_1"}));
}

TEST(PatternTest, LookaheadAndCaseInsensitiveGroups) {
  EXPECT_EQ(Matches("\\s+(?!\\S)|\\s+", "a   b"), (std::vector<std::string>{"  ", " "}));
  EXPECT_EQ(Matches("(?i:'s|'ll)", "IT'S WE'LL"), (std::vector<std::string>{"'S", "'LL"}));
}

TEST(PatternTest, LiteralMatchesDoNotOverlap) {
  auto literal = Pattern::Literal("aa");
  ASSERT_TRUE(literal.ok());
  Ranges ranges;
  (*literal)->FindAll("aaaaa", &ranges);
  EXPECT_EQ(ranges, (Ranges{{0, 2}, {2, 4}}));
}

}  // namespace
}  // namespace lair::tok
