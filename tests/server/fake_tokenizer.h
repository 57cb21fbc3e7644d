// FakeByteTokenizer: a Tokenizer for server tests. Ids 0-255 are bytes,
// 256 is <|bos|> and 257 is <|eos|>; Encode with special tokens prepends BOS.
// `chat_template` is what ChatTemplate() returns.
#pragma once

#include <string>

#include "tokenizer/tokenizer.h"

namespace lair::server::testing {

class FakeByteTokenizer final : public Tokenizer {
 public:
  static constexpr int32_t kBos = 256;
  static constexpr int32_t kEos = 257;
  explicit FakeByteTokenizer(std::string chat_template = "")
      : chat_template_(std::move(chat_template)) {}

  std::vector<int32_t> Encode(std::string_view text, bool add_special_tokens) const override {
    std::vector<int32_t> ids;
    if (add_special_tokens) ids.push_back(kBos);
    for (unsigned char c : text) ids.push_back(c);
    return ids;
  }
  std::string Decode(std::span<const int32_t> ids, bool skip_special_tokens) const override {
    std::string text;
    for (int32_t id : ids) {
      if (id < 256)
        text += static_cast<char>(id);
      else if (!skip_special_tokens)
        text += IdToToken(id);
    }
    return text;
  }
  int VocabSize() const override { return 258; }
  std::optional<int32_t> TokenToId(std::string_view token) const override {
    if (token == "<|bos|>") return kBos;
    if (token == "<|eos|>") return kEos;
    if (token.size() == 1) return static_cast<unsigned char>(token[0]);
    return std::nullopt;
  }
  std::string IdToToken(int32_t id) const override {
    if (id == kBos) return "<|bos|>";
    if (id == kEos) return "<|eos|>";
    if (id >= 0 && id < 256) return std::string(1, static_cast<char>(id));
    return "";
  }
  bool IsSpecial(int32_t id) const override { return id >= 256; }
  std::optional<int32_t> BosId() const override { return kBos; }
  std::optional<int32_t> EosId() const override { return kEos; }
  std::string_view ChatTemplate() const override { return chat_template_; }

 private:
  std::string chat_template_;
};

}  // namespace lair::server::testing
