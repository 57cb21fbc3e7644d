#include "tokenizer/added_vocabulary.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/unicode.h"

namespace lair::tok {
namespace {

absl::string_view AbslView(std::string_view s) { return absl::string_view(s.data(), s.size()); }

bool IsWordChar(char32_t c) { return c == '_' || IsAlphanumeric(c); }

// Start of the whitespace run that ends `s` (s.size() when there is none).
size_t TrailingSpaceStart(std::string_view s) {
  size_t end = s.size();
  while (end > 0) {
    const char32_t c = LastChar(s.substr(0, end));
    if (!IsWhiteSpace(c)) break;
    std::string utf8;
    AppendUtf8(c, &utf8);
    end -= utf8.size();
  }
  return end;
}

// Length of the whitespace run that starts `s`.
size_t LeadingSpaceLength(std::string_view s) {
  size_t pos = 0;
  while (pos < s.size()) {
    size_t next = pos;
    if (!IsWhiteSpace(NextChar(s, &next))) break;
    pos = next;
  }
  return pos;
}

}  // namespace

void AddedVocabulary::Matcher::Add(std::string_view key, size_t token_index) {
  int32_t node = 0;
  for (char ch : key) {
    const auto b = static_cast<unsigned char>(ch);
    auto& children = nodes_[node].children;
    auto it = std::find_if(children.begin(), children.end(),
                           [b](const auto& child) { return child.first == b; });
    if (it != children.end()) {
      node = it->second;
    } else {
      const auto next = static_cast<int32_t>(nodes_.size());
      children.emplace_back(b, next);
      nodes_.emplace_back();
      node = next;
    }
  }
  // The first token with a given string keeps it, as HF's map does.
  if (nodes_[node].token < 0) nodes_[node].token = static_cast<int64_t>(token_index);
  first_bytes_[static_cast<unsigned char>(key[0])] = true;
}

std::pair<size_t, size_t> AddedVocabulary::Matcher::LongestAt(std::string_view text,
                                                              size_t pos) const {
  std::pair<size_t, size_t> best{0, 0};
  int32_t node = 0;
  for (size_t i = pos; i < text.size(); ++i) {
    const auto b = static_cast<unsigned char>(text[i]);
    const auto& children = nodes_[node].children;
    auto it = std::find_if(children.begin(), children.end(),
                           [b](const auto& child) { return child.first == b; });
    if (it == children.end()) break;
    node = it->second;
    if (nodes_[node].token >= 0) best = {i + 1 - pos, static_cast<size_t>(nodes_[node].token)};
  }
  return best;
}

absl::StatusOr<std::unique_ptr<AddedVocabulary>> AddedVocabulary::FromJson(
    const Json* json, const Normalizer* normalizer, const std::string& where) {
  std::unique_ptr<AddedVocabulary> vocab(new AddedVocabulary());
  if (json == nullptr) return vocab;
  if (!json->is_array()) return absl::InvalidArgumentError(where + ": expected an array");
  for (size_t i = 0; i < json->size(); ++i) {
    const Json& entry = (*json)[i];
    const std::string entry_where = IndexPath(where, i);
    if (!entry.is_object()) {
      return absl::InvalidArgumentError(entry_where + ": expected an object");
    }
    AddedToken token;
    LAIR_ASSIGN_OR_RETURN(int64_t id, OptionalInt(entry, "id", entry_where, -1));
    if (id < 0 || id > INT32_MAX)
      return FieldError(entry_where, "id", "expected a non-negative id");
    token.id = static_cast<int32_t>(id);
    LAIR_ASSIGN_OR_RETURN(token.content, RequiredString(entry, "content", entry_where));
    if (token.content.empty()) return FieldError(entry_where, "content", "empty");
    LAIR_ASSIGN_OR_RETURN(token.special, OptionalBool(entry, "special", entry_where, false));
    // HF's default: special tokens match the raw text, others the normalized.
    LAIR_ASSIGN_OR_RETURN(token.normalized,
                          OptionalBool(entry, "normalized", entry_where, !token.special));
    LAIR_ASSIGN_OR_RETURN(token.lstrip, OptionalBool(entry, "lstrip", entry_where, false));
    LAIR_ASSIGN_OR_RETURN(token.rstrip, OptionalBool(entry, "rstrip", entry_where, false));
    LAIR_ASSIGN_OR_RETURN(token.single_word,
                          OptionalBool(entry, "single_word", entry_where, false));
    if (vocab->by_content_.contains(AbslView(token.content))) continue;
    const size_t index = vocab->tokens_.size();
    vocab->by_content_.emplace(token.content, index);
    vocab->by_id_.emplace(token.id, index);
    if (token.special) vocab->special_contents_.insert(token.content);
    if (token.normalized) {
      std::string key = token.content;
      if (normalizer != nullptr) normalizer->Normalize(&key);
      if (!key.empty()) vocab->normalized_matcher_.Add(key, index);
    } else {
      vocab->raw_matcher_.Add(token.content, index);
    }
    vocab->tokens_.push_back(std::move(token));
  }
  return vocab;
}

void AddedVocabulary::Split(std::string_view text, bool normalized,
                            std::vector<Span>* spans) const {
  spans->clear();
  const Matcher& matcher = normalized ? normalized_matcher_ : raw_matcher_;
  if (matcher.empty()) {
    if (!text.empty()) spans->push_back({0, text.size(), -1});
    return;
  }
  size_t start_offset = 0;  // end of the last kept match
  size_t pos = 0;
  while (pos < text.size()) {
    if (!matcher.MayStartWith(static_cast<unsigned char>(text[pos]))) {
      ++pos;
      continue;
    }
    const auto [length, index] = matcher.LongestAt(text, pos);
    if (length == 0) {
      ++pos;
      continue;
    }
    size_t begin = pos, end = pos + length;
    pos = end;
    const AddedToken& token = tokens_[index];
    if (token.single_word) {
      const bool word_before = begin > 0 && IsWordChar(LastChar(text.substr(0, begin)));
      size_t after = end;
      const bool word_after = end < text.size() && IsWordChar(NextChar(text, &after));
      if (word_before || word_after) continue;
    }
    if (token.lstrip) begin = std::max(TrailingSpaceStart(text.substr(0, begin)), start_offset);
    if (token.rstrip) end += LeadingSpaceLength(text.substr(end));
    if (start_offset < begin) spans->push_back({start_offset, begin, -1});
    spans->push_back({begin, end, token.id});
    start_offset = end;
  }
  if (start_offset < text.size()) spans->push_back({start_offset, text.size(), -1});
}

const AddedToken* AddedVocabulary::FindById(int32_t id) const {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &tokens_[it->second];
}

std::optional<int32_t> AddedVocabulary::FindByContent(std::string_view content) const {
  auto it = by_content_.find(AbslView(content));
  if (it == by_content_.end()) return std::nullopt;
  return tokens_[it->second].id;
}

bool AddedVocabulary::IsSpecialContent(std::string_view content) const {
  return special_contents_.contains(AbslView(content));
}

}  // namespace lair::tok
