#include "tokenizer/normalizer.h"

#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tokenizer/pattern.h"
#include "tokenizer/unicode.h"
#include "unicode/bytestream.h"
#include "unicode/normalizer2.h"
#include "unicode/uchar.h"

namespace lair::tok {
namespace {

class SequenceNormalizer : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> steps)
      : steps_(std::move(steps)) {}
  void Normalize(std::string* text) const override {
    for (const auto& step : steps_) step->Normalize(text);
  }

 private:
  const std::vector<std::unique_ptr<Normalizer>> steps_;
};

class PrependNormalizer : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  void Normalize(std::string* text) const override {
    if (!text->empty()) text->insert(0, prefix_);  // HF leaves empty text empty
  }

 private:
  const std::string prefix_;
};

class ReplaceNormalizer : public Normalizer {
 public:
  ReplaceNormalizer(std::unique_ptr<Pattern> pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void Normalize(std::string* text) const override {
    Ranges matches;
    pattern_->FindAll(*text, &matches);
    if (matches.empty()) return;
    std::string out;
    out.reserve(text->size() + matches.size() * content_.size());
    size_t last = 0;
    for (const auto& [begin, end] : matches) {
      out.append(*text, last, begin - last);
      out.append(content_);
      last = end;
    }
    out.append(*text, last, std::string::npos);
    *text = std::move(out);
  }

 private:
  const std::unique_ptr<Pattern> pattern_;
  const std::string content_;
};

class UnicodeFormNormalizer : public Normalizer {
 public:
  explicit UnicodeFormNormalizer(const icu::Normalizer2* form) : form_(form) {}
  void Normalize(std::string* text) const override {
    UErrorCode status = U_ZERO_ERROR;
    if (form_->isNormalizedUTF8(*text, status) && U_SUCCESS(status)) return;
    std::string out;
    out.reserve(text->size());
    icu::StringByteSink<std::string> sink(&out);
    status = U_ZERO_ERROR;
    form_->normalizeUTF8(0, *text, sink, nullptr, status);
    // ICU fails only on invalid UTF-8 or memory exhaustion; the text is
    // valid, so a failure is a broken invariant.
    LAIR_CHECK(U_SUCCESS(status));
    *text = std::move(out);
  }

 private:
  const icu::Normalizer2* const form_;  // owned by ICU, lives forever
};

class LowercaseNormalizer : public Normalizer {
 public:
  void Normalize(std::string* text) const override {
    std::string out;
    out.reserve(text->size());
    size_t pos = 0;
    while (pos < text->size()) AppendLowercase(NextChar(*text, &pos), &out);
    *text = std::move(out);
  }
};

class StripNormalizer : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  void Normalize(std::string* text) const override {
    size_t begin = 0, end = text->size();
    if (left_) {
      while (begin < end) {
        size_t next = begin;
        if (!IsWhiteSpace(NextChar(*text, &next))) break;
        begin = next;
      }
    }
    if (right_) {
      while (end > begin) {
        const std::string_view head(text->data() + begin, end - begin);
        const char32_t c = LastChar(head);
        if (!IsWhiteSpace(c)) break;
        std::string utf8;
        AppendUtf8(c, &utf8);
        end -= utf8.size();
      }
    }
    *text = text->substr(begin, end - begin);
  }

 private:
  const bool left_, right_;
};

class StripAccentsNormalizer : public Normalizer {
 public:
  void Normalize(std::string* text) const override {
    std::string out;
    out.reserve(text->size());
    size_t pos = 0;
    while (pos < text->size()) {
      const size_t start = pos;
      const char32_t c = NextChar(*text, &pos);
      const int8_t type = u_charType(static_cast<UChar32>(c));
      if (type == U_NON_SPACING_MARK || type == U_COMBINING_SPACING_MARK ||
          type == U_ENCLOSING_MARK) {
        continue;
      }
      out.append(*text, start, pos - start);
    }
    *text = std::move(out);
  }
};

absl::StatusOr<std::unique_ptr<Normalizer>> UnicodeForm(const std::string& type,
                                                        const std::string& where) {
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* form = nullptr;
  if (type == "NFC") form = icu::Normalizer2::getNFCInstance(status);
  if (type == "NFD") form = icu::Normalizer2::getNFDInstance(status);
  if (type == "NFKC") form = icu::Normalizer2::getNFKCInstance(status);
  if (type == "NFKD") form = icu::Normalizer2::getNFKDInstance(status);
  if (form == nullptr || U_FAILURE(status)) {
    return absl::InternalError(
        absl::StrCat(where, ": ICU has no ", type, " normalizer: ", u_errorName(status)));
  }
  return std::unique_ptr<Normalizer>(new UnicodeFormNormalizer(form));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Normalizer>> Normalizer::FromJson(const Json& json,
                                                                 const std::string& where) {
  LAIR_ASSIGN_OR_RETURN(std::string type, RequiredString(json, "type", where));
  if (type == "Sequence") {
    LAIR_ASSIGN_OR_RETURN(auto steps, SequenceSteps<Normalizer>(json, "normalizers", where));
    return std::unique_ptr<Normalizer>(new SequenceNormalizer(std::move(steps)));
  }
  if (type == "Prepend") {
    LAIR_ASSIGN_OR_RETURN(std::string prefix, RequiredString(json, "prepend", where));
    return std::unique_ptr<Normalizer>(new PrependNormalizer(std::move(prefix)));
  }
  if (type == "Replace") {
    LAIR_ASSIGN_OR_RETURN(auto pattern, Pattern::FromPatternField(json, where));
    LAIR_ASSIGN_OR_RETURN(std::string content, RequiredString(json, "content", where));
    return std::unique_ptr<Normalizer>(
        new ReplaceNormalizer(std::move(pattern), std::move(content)));
  }
  if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD") {
    return UnicodeForm(type, where);
  }
  if (type == "Lowercase") return std::unique_ptr<Normalizer>(new LowercaseNormalizer());
  if (type == "Strip") {
    LAIR_ASSIGN_OR_RETURN(bool left, OptionalBool(json, "strip_left", where, true));
    LAIR_ASSIGN_OR_RETURN(bool right, OptionalBool(json, "strip_right", where, true));
    return std::unique_ptr<Normalizer>(new StripNormalizer(left, right));
  }
  if (type == "StripAccents") return std::unique_ptr<Normalizer>(new StripAccentsNormalizer());
  return FieldError(where, "type", absl::StrCat("unsupported normalizer '", type, "'"));
}

}  // namespace lair::tok
