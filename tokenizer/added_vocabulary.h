// Added tokens (tokenizer.json's "added_tokens"): strings that are cut out
// of the text before the model sees it and become their own id.
//
// As in HF `tokenizers`, tokens with normalized=false are matched in the raw
// text first; the pieces between them are normalized, then tokens with
// normalized=true are matched (against their own normalized content). Matches
// are leftmost-longest and do not overlap. single_word keeps a match only
// between non-word characters; lstrip and rstrip make it swallow the
// whitespace before or after it.
//
// Thread safety: immutable after construction.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "core/status.h"
#include "tokenizer/json_fields.h"

namespace lair::tok {

class Normalizer;

struct AddedToken {
  int32_t id;
  std::string content;
  bool special;
  bool normalized;
  bool lstrip;
  bool rstrip;
  bool single_word;
};

class AddedVocabulary {
 public:
  // A run of the text: an added token's id, or -1 for text to tokenize.
  struct Span {
    size_t begin, end;
    int32_t id;
  };

  // `json` is the "added_tokens" array (or null); `normalizer` (may be null)
  // normalizes the content of normalized tokens. Errors name `where`.
  static absl::StatusOr<std::unique_ptr<AddedVocabulary>> FromJson(const Json* json,
                                                                   const Normalizer* normalizer,
                                                                   const std::string& where);

  AddedVocabulary(const AddedVocabulary&) = delete;
  AddedVocabulary& operator=(const AddedVocabulary&) = delete;

  // Cuts `text` (valid UTF-8) at the tokens of one kind (normalized or not)
  // into `spans`, which cover `text` in order with no empty run; an added
  // token that rstrips into the next match may make two spans overlap, as in
  // HF. Replaces the contents of `spans`.
  void Split(std::string_view text, bool normalized, std::vector<Span>* spans) const;

  const AddedToken* FindById(int32_t id) const;
  std::optional<int32_t> FindByContent(std::string_view content) const;
  // Whether `content` is the content of a special added token (HF skips
  // tokens by content when decoding with skip_special_tokens).
  bool IsSpecialContent(std::string_view content) const;
  const std::vector<AddedToken>& tokens() const { return tokens_; }

 private:
  // A byte trie over the match strings of one kind, for leftmost-longest
  // search.
  class Matcher {
   public:
    void Add(std::string_view key, size_t token_index);
    // Whether some key starts with byte `b`.
    bool MayStartWith(unsigned char b) const { return first_bytes_[b]; }
    // The longest key starting at `text[pos]`: (length, token index), or
    // length 0.
    std::pair<size_t, size_t> LongestAt(std::string_view text, size_t pos) const;
    bool empty() const { return nodes_.size() <= 1; }

   private:
    struct Node {
      std::vector<std::pair<unsigned char, int32_t>> children;
      int64_t token = -1;
    };
    std::vector<Node> nodes_{Node{}};
    bool first_bytes_[256] = {};
  };

  AddedVocabulary() = default;

  std::vector<AddedToken> tokens_;
  absl::flat_hash_map<int32_t, size_t> by_id_;
  absl::flat_hash_map<std::string, size_t> by_content_;
  absl::flat_hash_set<std::string> special_contents_;
  Matcher raw_matcher_;
  Matcher normalized_matcher_;
};

}  // namespace lair::tok
