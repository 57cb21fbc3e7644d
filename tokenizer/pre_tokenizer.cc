#include "tokenizer/pre_tokenizer.h"

#include <algorithm>
#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"
#include "tokenizer/pattern.h"
#include "tokenizer/unicode.h"

namespace lair::tok {
namespace {

// GPT-2's pre-tokenization regex, which ByteLevel applies when use_regex.
constexpr std::string_view kByteLevelRegex =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

// What happens to the matched parts (HF's SplitDelimiterBehavior).
enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

struct Segment {
  size_t begin, end;
  bool is_match;
};

// Cuts `piece` at `matches` as HF's NormalizedString::split does and appends
// the non-empty kept parts to `out`.
void SplitPiece(const PreToken& piece, const Ranges& matches, Behavior behavior, bool invert,
                std::vector<PreToken>* out) {
  const std::string& text = piece.text;
  std::vector<Segment> segments;
  size_t prev = 0;
  for (const auto& [begin, end] : matches) {
    if (prev != begin) segments.push_back({prev, begin, false});
    segments.push_back({begin, end, true});
    prev = end;
  }
  if (prev != text.size() || text.empty()) segments.push_back({prev, text.size(), false});
  if (invert) {
    for (Segment& s : segments) s.is_match = !s.is_match;
  }

  // Pairs of (segment, removed).
  std::vector<std::pair<Segment, bool>> parts;
  bool previous_match = false;
  switch (behavior) {
    case Behavior::kIsolated:
      for (const Segment& s : segments) parts.push_back({s, false});
      break;
    case Behavior::kRemoved:
      for (const Segment& s : segments) parts.push_back({s, s.is_match});
      break;
    case Behavior::kContiguous:
      for (const Segment& s : segments) {
        if (s.is_match == previous_match && !parts.empty()) {
          parts.back().first.end = s.end;
        } else {
          parts.push_back({s, false});
        }
        previous_match = s.is_match;
      }
      break;
    case Behavior::kMergedWithPrevious:
      for (const Segment& s : segments) {
        if (s.is_match && !previous_match && !parts.empty()) {
          parts.back().first.end = s.end;
        } else {
          parts.push_back({s, false});
        }
        previous_match = s.is_match;
      }
      break;
    case Behavior::kMergedWithNext:
      for (auto it = segments.rbegin(); it != segments.rend(); ++it) {
        if (it->is_match && !previous_match && !parts.empty()) {
          parts.back().first.begin = it->begin;
        } else {
          parts.push_back({*it, false});
        }
        previous_match = it->is_match;
      }
      std::reverse(parts.begin(), parts.end());
      break;
  }
  for (const auto& [s, removed] : parts) {
    if (removed || s.begin == s.end) continue;
    out->push_back({text.substr(s.begin, s.end - s.begin), piece.at_origin && s.begin == 0});
  }
}

class SequencePreTokenizer : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> steps)
      : steps_(std::move(steps)) {}
  void PreTokenize(std::vector<PreToken>* pieces) const override {
    for (const auto& step : steps_) step->PreTokenize(pieces);
  }

 private:
  const std::vector<std::unique_ptr<PreTokenizer>> steps_;
};

class SplitPreTokenizer : public PreTokenizer {
 public:
  SplitPreTokenizer(std::unique_ptr<Pattern> pattern, Behavior behavior, bool invert)
      : pattern_(std::move(pattern)), behavior_(behavior), invert_(invert) {}
  void PreTokenize(std::vector<PreToken>* pieces) const override {
    std::vector<PreToken> out;
    out.reserve(pieces->size() * 4);
    Ranges matches;
    for (const PreToken& piece : *pieces) {
      matches.clear();
      pattern_->FindAll(piece.text, &matches);
      SplitPiece(piece, matches, behavior_, invert_, &out);
    }
    pieces->swap(out);
  }

 private:
  const std::unique_ptr<Pattern> pattern_;
  const Behavior behavior_;
  const bool invert_;
};

class ByteLevelPreTokenizer : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, std::unique_ptr<Pattern> regex)
      : add_prefix_space_(add_prefix_space), regex_(std::move(regex)) {}
  void PreTokenize(std::vector<PreToken>* pieces) const override {
    std::vector<PreToken> split;
    split.reserve(pieces->size() * 4);
    Ranges matches;
    for (PreToken& piece : *pieces) {
      if (add_prefix_space_ && !piece.text.empty() && piece.text[0] != ' ') {
        piece.text.insert(piece.text.begin(), ' ');
      }
      if (regex_ == nullptr) {
        if (!piece.text.empty()) split.push_back(std::move(piece));
        continue;
      }
      matches.clear();
      regex_->FindAll(piece.text, &matches);
      SplitPiece(piece, matches, Behavior::kIsolated, false, &split);
    }
    for (PreToken& piece : split) {
      std::string mapped;
      mapped.reserve(piece.text.size() + 4);
      ByteLevelEncode(piece.text, &mapped);
      piece.text = std::move(mapped);
    }
    pieces->swap(split);
  }

 private:
  const bool add_prefix_space_;
  const std::unique_ptr<Pattern> regex_;  // null when use_regex is false
};

class MetaspacePreTokenizer : public PreTokenizer {
 public:
  enum class Prepend { kAlways, kFirst, kNever };
  MetaspacePreTokenizer(std::string replacement, Prepend prepend, bool split)
      : replacement_(std::move(replacement)), prepend_(prepend), split_(split) {}
  void PreTokenize(std::vector<PreToken>* pieces) const override {
    std::vector<PreToken> out;
    out.reserve(pieces->size() * 4);
    Ranges matches;
    for (PreToken& piece : *pieces) {
      std::string text;
      text.reserve(piece.text.size() + 8);
      for (char c : piece.text) {
        if (c == ' ') {
          text.append(replacement_);
        } else {
          text.push_back(c);
        }
      }
      const bool starts_with_replacement = text.compare(0, replacement_.size(), replacement_) == 0;
      if (!text.empty() && !starts_with_replacement &&
          (prepend_ == Prepend::kAlways || (prepend_ == Prepend::kFirst && piece.at_origin))) {
        text.insert(0, replacement_);
      }
      PreToken replaced{std::move(text), piece.at_origin};
      if (!split_) {
        if (!replaced.text.empty()) out.push_back(std::move(replaced));
        continue;
      }
      matches.clear();
      size_t pos = 0;
      while ((pos = replaced.text.find(replacement_, pos)) != std::string::npos) {
        matches.emplace_back(pos, pos + replacement_.size());
        pos += replacement_.size();
      }
      SplitPiece(replaced, matches, Behavior::kMergedWithNext, false, &out);
    }
    pieces->swap(out);
  }

 private:
  const std::string replacement_;  // one character, UTF-8
  const Prepend prepend_;
  const bool split_;
};

class DigitsPreTokenizer : public PreTokenizer {
 public:
  explicit DigitsPreTokenizer(bool individual) : individual_(individual) {}
  void PreTokenize(std::vector<PreToken>* pieces) const override {
    std::vector<PreToken> out;
    Ranges matches;
    for (const PreToken& piece : *pieces) {
      matches.clear();
      for (size_t i = 0; i < piece.text.size(); ++i) {
        if (piece.text[i] >= '0' && piece.text[i] <= '9') matches.emplace_back(i, i + 1);
      }
      SplitPiece(piece, matches, individual_ ? Behavior::kIsolated : Behavior::kContiguous, false,
                 &out);
    }
    pieces->swap(out);
  }

 private:
  const bool individual_;
};

absl::StatusOr<Behavior> ParseBehavior(const std::string& name, const std::string& where) {
  if (name == "Removed") return Behavior::kRemoved;
  if (name == "Isolated") return Behavior::kIsolated;
  if (name == "MergedWithPrevious") return Behavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return Behavior::kMergedWithNext;
  if (name == "Contiguous") return Behavior::kContiguous;
  return FieldError(where, "behavior", absl::StrCat("unknown behavior '", name, "'"));
}

absl::StatusOr<std::unique_ptr<PreTokenizer>> Metaspace(const Json& json,
                                                        const std::string& where) {
  LAIR_ASSIGN_OR_RETURN(std::string replacement, RequiredString(json, "replacement", where));
  size_t pos = 0;
  if (replacement.empty() || (NextChar(replacement, &pos), pos != replacement.size())) {
    return FieldError(where, "replacement", "expected one character");
  }
  LAIR_ASSIGN_OR_RETURN(auto scheme, OptionalString(json, "prepend_scheme", where));
  MetaspacePreTokenizer::Prepend prepend;
  if (scheme.has_value()) {
    if (*scheme == "always") {
      prepend = MetaspacePreTokenizer::Prepend::kAlways;
    } else if (*scheme == "first") {
      prepend = MetaspacePreTokenizer::Prepend::kFirst;
    } else if (*scheme == "never") {
      prepend = MetaspacePreTokenizer::Prepend::kNever;
    } else {
      return FieldError(where, "prepend_scheme", absl::StrCat("unknown scheme '", *scheme, "'"));
    }
  } else {
    LAIR_ASSIGN_OR_RETURN(bool add_prefix_space,
                          OptionalBool(json, "add_prefix_space", where, true));
    prepend = add_prefix_space ? MetaspacePreTokenizer::Prepend::kAlways
                               : MetaspacePreTokenizer::Prepend::kNever;
  }
  LAIR_ASSIGN_OR_RETURN(bool split, OptionalBool(json, "split", where, true));
  return std::unique_ptr<PreTokenizer>(
      new MetaspacePreTokenizer(std::move(replacement), prepend, split));
}

}  // namespace

absl::StatusOr<std::unique_ptr<PreTokenizer>> PreTokenizer::FromJson(const Json& json,
                                                                     const std::string& where) {
  LAIR_ASSIGN_OR_RETURN(std::string type, RequiredString(json, "type", where));
  if (type == "Sequence") {
    LAIR_ASSIGN_OR_RETURN(auto steps, SequenceSteps<PreTokenizer>(json, "pretokenizers", where));
    return std::unique_ptr<PreTokenizer>(new SequencePreTokenizer(std::move(steps)));
  }
  if (type == "Split") {
    LAIR_ASSIGN_OR_RETURN(auto pattern, Pattern::FromPatternField(json, where));
    LAIR_ASSIGN_OR_RETURN(std::string behavior_name, RequiredString(json, "behavior", where));
    LAIR_ASSIGN_OR_RETURN(Behavior behavior, ParseBehavior(behavior_name, where));
    LAIR_ASSIGN_OR_RETURN(bool invert, OptionalBool(json, "invert", where, false));
    return std::unique_ptr<PreTokenizer>(
        new SplitPreTokenizer(std::move(pattern), behavior, invert));
  }
  if (type == "ByteLevel") {
    LAIR_ASSIGN_OR_RETURN(bool add_prefix_space,
                          OptionalBool(json, "add_prefix_space", where, true));
    LAIR_ASSIGN_OR_RETURN(bool use_regex, OptionalBool(json, "use_regex", where, true));
    std::unique_ptr<Pattern> regex;
    if (use_regex) {
      LAIR_ASSIGN_OR_RETURN(regex, Pattern::Regex(kByteLevelRegex));
    }
    return std::unique_ptr<PreTokenizer>(
        new ByteLevelPreTokenizer(add_prefix_space, std::move(regex)));
  }
  if (type == "Metaspace") return Metaspace(json, where);
  if (type == "Digits") {
    LAIR_ASSIGN_OR_RETURN(bool individual, OptionalBool(json, "individual_digits", where, false));
    return std::unique_ptr<PreTokenizer>(new DigitsPreTokenizer(individual));
  }
  return FieldError(where, "type", absl::StrCat("unsupported pre-tokenizer '", type, "'"));
}

}  // namespace lair::tok
