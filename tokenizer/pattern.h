// What Split, Replace and the ByteLevel pre-tokenizer search for: a literal
// string or a regular expression, as `{"String": ...}` or `{"Regex": ...}`.
//
// Regexes are written in the dialect HF `tokenizers` hands to Oniguruma
// (Ruby syntax, Unicode). They run on PCRE2 (UTF, Unicode properties, JIT)
// after a translation of the escapes whose meaning differs between the two:
// \s and \S (Oniguruma: exactly the White_Space property), \w and \W,
// \h and \H (Oniguruma: hex digits), \uHHHH; ^ and $ match at line breaks as
// in Ruby. Lookahead, possessive and atomic forms and (?i:...) carry over.
//
// Thread safety: immutable after construction; FindAll may run on many
// threads at once (each call uses its own match data and a per-thread JIT
// stack).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"
#include "tokenizer/json_fields.h"

namespace lair::tok {

// Byte ranges [first, second) of `text`.
using Ranges = std::vector<std::pair<size_t, size_t>>;

class Pattern {
 public:
  static absl::StatusOr<std::unique_ptr<Pattern>> Literal(std::string literal);
  static absl::StatusOr<std::unique_ptr<Pattern>> Regex(std::string_view onig_pattern);
  // `json` is `{"String": s}` or `{"Regex": r}`; errors name `where`.
  static absl::StatusOr<std::unique_ptr<Pattern>> FromJson(const Json& json,
                                                           const std::string& where);
  // FromJson of the required member "pattern" of `obj` (Split, Replace).
  static absl::StatusOr<std::unique_ptr<Pattern>> FromPatternField(const Json& obj,
                                                                   const std::string& where);

  virtual ~Pattern() = default;

  // Appends the leftmost non-overlapping matches in `text` (valid UTF-8),
  // in order. An empty match right after the previous match is skipped, as
  // Oniguruma's match iterator does; a literal never matches empty.
  virtual void FindAll(std::string_view text, Ranges* matches) const = 0;
};

// The regex dialect translation, exposed for tests.
std::string TranslateOnigToPcre2(std::string_view onig_pattern);

}  // namespace lair::tok
