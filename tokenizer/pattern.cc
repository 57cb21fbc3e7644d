#include "tokenizer/pattern.h"

#include <optional>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "absl/strings/str_cat.h"
#include "tokenizer/unicode.h"

namespace lair::tok {
namespace {

// Oniguruma's \s: the White_Space property (PCRE2's also takes U+180E).
constexpr std::string_view kSpaceItems =
    "\\x{9}-\\x{d}\\x{20}\\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}"
    "\\x{202f}\\x{205f}\\x{3000}";
// Oniguruma's \w: letters, marks, decimal digits and connector punctuation.
constexpr std::string_view kWordItems = "\\p{L}\\p{M}\\p{Nd}\\p{Pc}";
// Oniguruma's \h: a hexadecimal digit.
constexpr std::string_view kHexItems = "0-9a-fA-F";

bool IsHexDigit(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

void AppendClass(std::string_view items, bool negated, bool in_class, std::string* out) {
  if (in_class) {
    out->append(items);  // only reached for the positive forms
    return;
  }
  out->append(negated ? "[^" : "[");
  out->append(items);
  out->push_back(']');
}

class LiteralPattern : public Pattern {
 public:
  explicit LiteralPattern(std::string literal) : literal_(std::move(literal)) {}

  void FindAll(std::string_view text, Ranges* matches) const override {
    if (literal_.empty()) return;
    size_t pos = 0;
    while ((pos = text.find(literal_, pos)) != std::string_view::npos) {
      matches->emplace_back(pos, pos + literal_.size());
      pos += literal_.size();
    }
  }

 private:
  const std::string literal_;
};

// One match context and JIT stack per thread: the default 32 KiB JIT stack
// is too small for lookahead over long whitespace runs.
struct ThreadMatchContext {
  ThreadMatchContext() {
    context = pcre2_match_context_create(nullptr);
    stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
    if (context != nullptr && stack != nullptr) pcre2_jit_stack_assign(context, nullptr, stack);
  }
  ~ThreadMatchContext() {
    if (stack != nullptr) pcre2_jit_stack_free(stack);
    if (context != nullptr) pcre2_match_context_free(context);
  }
  pcre2_match_context* context;
  pcre2_jit_stack* stack;
};

class RegexPattern : public Pattern {
 public:
  explicit RegexPattern(pcre2_code* code) : code_(code) {}
  ~RegexPattern() override { pcre2_code_free(code_); }
  RegexPattern(const RegexPattern&) = delete;
  RegexPattern& operator=(const RegexPattern&) = delete;

  void FindAll(std::string_view text, Ranges* matches) const override {
    thread_local ThreadMatchContext thread_context;
    pcre2_match_data* data = pcre2_match_data_create_from_pattern(code_, nullptr);
    LAIR_CHECK(data != nullptr);
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    const size_t n = text.size();
    size_t search_from = 0;
    std::optional<size_t> last_end;
    while (search_from <= n) {
      int rc = pcre2_match(code_, subject, n, search_from, PCRE2_NO_UTF_CHECK, data,
                           thread_context.context);
      if (rc < 0 && rc != PCRE2_ERROR_NOMATCH) {
        // A JIT resource limit: the interpreter keeps its frames on the heap.
        rc = pcre2_match(code_, subject, n, search_from, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, data,
                         nullptr);
      }
      // No match, or the interpreter's heap limit too: the rest is unmatched
      // text, which still tokenizes (as larger pieces).
      if (rc < 0) break;
      const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data);
      const size_t begin = ovector[0], end = ovector[1];
      if (begin == end && last_end == end) {
        search_from +=
            search_from < n ? Utf8Length(static_cast<unsigned char>(text[search_from])) : 1;
        continue;
      }
      matches->emplace_back(begin, end);
      search_from = end;
      last_end = end;
    }
    pcre2_match_data_free(data);
  }

 private:
  pcre2_code* const code_;
};

}  // namespace

std::string TranslateOnigToPcre2(std::string_view p) {
  std::string out;
  out.reserve(p.size() + 64);
  bool in_class = false;
  bool class_start = false;  // just after '[' or '[^': a ']' here is literal
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char e = p[++i];
      class_start = false;
      switch (e) {
        case 's':
          AppendClass(kSpaceItems, false, in_class, &out);
          continue;
        case 'w':
          AppendClass(kWordItems, false, in_class, &out);
          continue;
        case 'h':
          AppendClass(kHexItems, false, in_class, &out);
          continue;
        case 'S':
        case 'W':
        case 'H':
          if (!in_class) {
            AppendClass(e == 'S'   ? kSpaceItems
                        : e == 'W' ? kWordItems
                                   : kHexItems,
                        true, false, &out);
            continue;
          }
          // A negated class inside a class has no PCRE2 spelling; PCRE2's
          // own \S and \W are the nearest (\H has no near equivalent).
          if (e != 'H') {
            out.push_back('\\');
            out.push_back(e);
            continue;
          }
          break;
        case 'u':
          if (i + 4 < p.size() && IsHexDigit(p[i + 1]) && IsHexDigit(p[i + 2]) &&
              IsHexDigit(p[i + 3]) && IsHexDigit(p[i + 4])) {
            absl::StrAppend(&out, "\\x{", std::string(p.substr(i + 1, 4)), "}");
            i += 4;
            continue;
          }
          break;
        default:
          break;
      }
      out.push_back('\\');
      out.push_back(e);
      continue;
    }
    if (in_class) {
      if (c == '[' && i + 1 < p.size() && p[i + 1] == ':') {
        // A POSIX class such as [:alpha:]: copy it whole.
        const size_t close = p.find(":]", i + 2);
        if (close != std::string_view::npos) {
          out.append(p.substr(i, close + 2 - i));
          i = close + 1;
          class_start = false;
          continue;
        }
      }
      if (c == ']' && !class_start) in_class = false;
      if (c == '^' && class_start && out.back() == '[') {
        out.push_back(c);
        continue;  // still at the start of the class
      }
      class_start = false;
      out.push_back(c);
      continue;
    }
    if (c == '[') {
      in_class = true;
      class_start = true;
    }
    out.push_back(c);
  }
  return out;
}

absl::StatusOr<std::unique_ptr<Pattern>> Pattern::Literal(std::string literal) {
  return std::unique_ptr<Pattern>(new LiteralPattern(std::move(literal)));
}

absl::StatusOr<std::unique_ptr<Pattern>> Pattern::Regex(std::string_view onig_pattern) {
  const std::string translated = TranslateOnigToPcre2(onig_pattern);
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                    PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE, &error_code, &error_offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error_code, message, sizeof(message));
    return absl::InvalidArgumentError(
        absl::StrCat("regex '", std::string(onig_pattern), "' does not compile (as '", translated,
                     "', at offset ", error_offset, "): ", reinterpret_cast<const char*>(message)));
  }
  // Without JIT support pcre2_match interprets; same results, slower.
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  return std::unique_ptr<Pattern>(new RegexPattern(code));
}

absl::StatusOr<std::unique_ptr<Pattern>> Pattern::FromPatternField(const Json& obj,
                                                                   const std::string& where) {
  const Json* json = FindField(obj, "pattern");
  if (json == nullptr) return FieldError(where, "pattern", "missing");
  return FromJson(*json, FieldPath(where, "pattern"));
}

absl::StatusOr<std::unique_ptr<Pattern>> Pattern::FromJson(const Json& json,
                                                           const std::string& where) {
  if (!json.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": expected {\"String\": ...} or {\"Regex\": ...}"));
  }
  LAIR_ASSIGN_OR_RETURN(auto literal, OptionalString(json, "String", where));
  if (literal.has_value()) return Literal(std::move(*literal));
  LAIR_ASSIGN_OR_RETURN(auto regex, OptionalString(json, "Regex", where));
  if (regex.has_value()) {
    auto pattern = Regex(*regex);
    if (!pattern.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(FieldPath(where, "Regex"), ": ", std::string(pattern.status().message())));
    }
    return pattern;
  }
  return absl::InvalidArgumentError(
      absl::StrCat(where, ": expected {\"String\": ...} or {\"Regex\": ...}"));
}

}  // namespace lair::tok
