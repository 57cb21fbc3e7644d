// The whole Tiny Shakespeare corpus, as one text and line by line (each line
// with its '\n'), against HF `tokenizers` 0.23.2. The expected values are the
// id count and the 64-bit FNV-1a hash of the ids (each as 4 little-endian
// bytes), computed with the Python package on the same file.
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "gtest/gtest.h"
#include "tests/support/fixtures.h"
#include "tokenizer/tokenizer.h"

namespace lair {
namespace {

struct Digest {
  size_t count = 0;
  uint64_t hash = 0xcbf29ce484222325u;
  void Add(const std::vector<int32_t>& ids) {
    for (int32_t id : ids) {
      for (int shift = 0; shift < 32; shift += 8) {
        hash ^= (static_cast<uint32_t>(id) >> shift) & 0xFFu;
        hash *= 0x100000001b3u;
      }
    }
    count += ids.size();
  }
};

struct CorpusCase {
  const char* tokenizer;
  size_t whole_count;
  uint64_t whole_hash;
  size_t lines_count;
  uint64_t lines_hash;
};

class CorpusTest : public ::testing::TestWithParam<CorpusCase> {};

TEST_P(CorpusTest, MatchesHuggingFace) {
  const CorpusCase& c = GetParam();
  LAIR_FIXTURE_OR_SKIP(path, std::string("tokenizers/") + c.tokenizer);
  const std::string corpus_path = testing::CorpusDir() + "/tinyshakespeare.txt";
  std::ifstream in(corpus_path, std::ios::binary);
  if (!in) GTEST_SKIP() << corpus_path << " is absent (set LAIR_CORPUS)";
  std::ostringstream contents;
  contents << in.rdbuf();
  const std::string text = contents.str();
  auto tokenizer = Tokenizer::Load(path);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();

  Digest whole;
  whole.Add((*tokenizer)->Encode(text, false));
  EXPECT_EQ(whole.count, c.whole_count);
  EXPECT_EQ(whole.hash, c.whole_hash);

  Digest lines;
  for (size_t start = 0; start < text.size();) {
    const size_t newline = text.find('\n', start);
    const size_t end = newline == std::string::npos ? text.size() : newline + 1;
    lines.Add((*tokenizer)->Encode(std::string_view(text).substr(start, end - start), false));
    start = end;
  }
  EXPECT_EQ(lines.count, c.lines_count);
  EXPECT_EQ(lines.hash, c.lines_hash);
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, CorpusTest,
                         ::testing::Values(CorpusCase{"llama2", 361972, 0x1f94c76c8e29f107u, 367302,
                                                      0x470e24663e17a16fu},
                                           CorpusCase{"llama3", 301768, 0x9872323539695389u, 308986,
                                                      0x3e64e1f7bd2a6aeeu},
                                           CorpusCase{"gpt2", 338025, 0xe22fcd868ca90167u, 338027,
                                                      0x73ffe8420a2e53ebu}),
                         [](const auto& info) { return std::string(info.param.tokenizer); });

}  // namespace
}  // namespace lair
