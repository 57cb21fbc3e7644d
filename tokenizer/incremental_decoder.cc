#include <string>

#include "tokenizer/tokenizer.h"

namespace lair {
namespace {

constexpr std::string_view kReplacementUtf8 = "\xEF\xBF\xBD";

bool EndsWithReplacement(const std::string& text) {
  return text.size() >= kReplacementUtf8.size() &&
         text.compare(text.size() - kReplacementUtf8.size(), kReplacementUtf8.size(),
                      kReplacementUtf8) == 0;
}

}  // namespace

IncrementalDecoder::IncrementalDecoder(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tokenizer_(tokenizer), skip_special_tokens_(skip_special_tokens) {}

std::string IncrementalDecoder::Add(int32_t token) {
  tokens_.push_back(token);
  if (tokenizer_.DependsOnNext(token)) return {};
  const std::string text = tokenizer_.Decode(tokens_, skip_special_tokens_);
  // Hold while nothing new is final: no growth, an unfinished character, or
  // (never seen with HF's decoders) a context whose text changed.
  if (text.size() <= prefix_text_.size() || EndsWithReplacement(text) ||
      text.compare(0, prefix_text_.size(), prefix_text_) != 0) {
    return {};
  }
  std::string delta = text.substr(prefix_text_.size());
  // The tokens just emitted become the context of the next window.
  tokens_.erase(tokens_.begin(), tokens_.begin() + static_cast<ptrdiff_t>(read_offset_));
  read_offset_ = tokens_.size();
  prefix_text_ = tokenizer_.Decode(tokens_, skip_special_tokens_);
  return delta;
}

std::string IncrementalDecoder::Flush() {
  const std::string text = tokenizer_.Decode(tokens_, skip_special_tokens_);
  std::string delta;
  if (text.size() > prefix_text_.size() &&
      text.compare(0, prefix_text_.size(), prefix_text_) == 0) {
    delta = text.substr(prefix_text_.size());
  }
  tokens_.clear();
  read_offset_ = 0;
  prefix_text_.clear();
  return delta;
}

}  // namespace lair
