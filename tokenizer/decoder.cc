#include "tokenizer/decoder.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "tokenizer/pattern.h"
#include "tokenizer/unicode.h"

namespace lair::tok {
namespace {

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// One character of UTF-8 `s`, or an error naming the field.
absl::StatusOr<char32_t> SingleChar(const std::string& s, const std::string& where,
                                    std::string_view key) {
  size_t pos = 0;
  if (s.empty()) return FieldError(where, key, "expected one character");
  const char32_t c = NextChar(s, &pos);
  if (pos != s.size()) return FieldError(where, key, "expected one character");
  return c;
}

class SequenceDecoder : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> steps)
      : steps_(std::move(steps)) {}
  void DecodeChain(std::vector<std::string>* tokens) const override {
    for (const auto& step : steps_) step->DecodeChain(tokens);
  }
  bool FusesByteRuns() const override {
    for (const auto& step : steps_) {
      if (step->FusesByteRuns()) return true;
    }
    return false;
  }
  bool DecodesByteLevel() const override {
    for (const auto& step : steps_) {
      if (step->DecodesByteLevel()) return true;
    }
    return false;
  }

 private:
  const std::vector<std::unique_ptr<Decoder>> steps_;
};

class ByteLevelDecoder : public Decoder {
 public:
  void DecodeChain(std::vector<std::string>* tokens) const override {
    std::string bytes;
    for (const std::string& token : *tokens) {
      // A token with characters outside the table (an added token, say)
      // contributes its own UTF-8.
      if (!ByteLevelDecode(token, &bytes)) bytes.append(token);
    }
    tokens->assign(1, Utf8Lossy(bytes));
  }
  bool DecodesByteLevel() const override { return true; }
};

class ReplaceDecoder : public Decoder {
 public:
  ReplaceDecoder(std::unique_ptr<Pattern> pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void DecodeChain(std::vector<std::string>* tokens) const override {
    Ranges matches;
    for (std::string& token : *tokens) {
      matches.clear();
      pattern_->FindAll(token, &matches);
      if (matches.empty()) continue;
      std::string out;
      size_t last = 0;
      for (const auto& [begin, end] : matches) {
        out.append(token, last, begin - last);
        out.append(content_);
        last = end;
      }
      out.append(token, last, std::string::npos);
      token = std::move(out);
    }
  }

 private:
  const std::unique_ptr<Pattern> pattern_;
  const std::string content_;
};

class ByteFallbackDecoder : public Decoder {
 public:
  void DecodeChain(std::vector<std::string>* tokens) const override {
    std::vector<std::string> out;
    out.reserve(tokens->size());
    std::string run;  // bytes of consecutive <0xAB> tokens
    const auto flush = [&] {
      if (run.empty()) return;
      if (IsValidUtf8(run)) {
        out.push_back(run);
      } else {
        // An invalid run becomes one U+FFFD per byte, not per subpart.
        for (size_t i = 0; i < run.size(); ++i) out.emplace_back("\xEF\xBF\xBD");
      }
      run.clear();
    };
    for (std::string& token : *tokens) {
      const int byte = ByteFallbackValue(token);
      if (byte >= 0) {
        run.push_back(static_cast<char>(byte));
        continue;
      }
      flush();
      out.push_back(std::move(token));
    }
    flush();
    tokens->swap(out);
  }
  bool FusesByteRuns() const override { return true; }
};

class FuseDecoder : public Decoder {
 public:
  void DecodeChain(std::vector<std::string>* tokens) const override {
    std::string joined;
    for (const std::string& token : *tokens) joined.append(token);
    tokens->clear();
    tokens->push_back(std::move(joined));
  }
};

class StripDecoder : public Decoder {
 public:
  StripDecoder(char32_t content, size_t start, size_t stop)
      : content_(content), start_(start), stop_(stop) {}
  void DecodeChain(std::vector<std::string>* tokens) const override {
    for (std::string& token : *tokens) {
      std::vector<size_t> boundaries;  // byte offset of each character, then the size
      std::vector<char32_t> chars;
      size_t pos = 0;
      while (pos < token.size()) {
        boundaries.push_back(pos);
        chars.push_back(NextChar(token, &pos));
      }
      boundaries.push_back(token.size());
      size_t start_cut = 0;
      for (size_t i = 0; i < start_ && i < chars.size() && chars[i] == content_; ++i) {
        start_cut = i + 1;
      }
      size_t stop_cut = chars.size();
      for (size_t i = 0; i < stop_ && i < chars.size(); ++i) {
        const size_t index = chars.size() - i - 1;
        if (chars[index] != content_) break;
        stop_cut = index;
      }
      if (stop_cut < start_cut) stop_cut = start_cut;
      token = token.substr(boundaries[start_cut], boundaries[stop_cut] - boundaries[start_cut]);
    }
  }

 private:
  const char32_t content_;
  const size_t start_, stop_;
};

class MetaspaceDecoder : public Decoder {
 public:
  MetaspaceDecoder(char32_t replacement, bool strip_first)
      : replacement_(replacement), strip_first_(strip_first) {}
  void DecodeChain(std::vector<std::string>* tokens) const override {
    for (size_t i = 0; i < tokens->size(); ++i) {
      std::string& token = (*tokens)[i];
      std::string out;
      out.reserve(token.size());
      size_t pos = 0;
      while (pos < token.size()) {
        const size_t start = pos;
        const char32_t c = NextChar(token, &pos);
        if (c != replacement_) {
          out.append(token, start, pos - start);
        } else if (!(i == 0 && strip_first_)) {
          out.push_back(' ');
        }
        // HF drops every replacement character of the first token.
      }
      token = std::move(out);
    }
  }

 private:
  const char32_t replacement_;
  const bool strip_first_;
};

absl::StatusOr<std::unique_ptr<Decoder>> Metaspace(const Json& json, const std::string& where) {
  LAIR_ASSIGN_OR_RETURN(std::string replacement, RequiredString(json, "replacement", where));
  LAIR_ASSIGN_OR_RETURN(char32_t c, SingleChar(replacement, where, "replacement"));
  LAIR_ASSIGN_OR_RETURN(auto scheme, OptionalString(json, "prepend_scheme", where));
  bool strip_first;
  if (scheme.has_value()) {
    if (*scheme != "always" && *scheme != "first" && *scheme != "never") {
      return FieldError(where, "prepend_scheme", absl::StrCat("unknown scheme '", *scheme, "'"));
    }
    strip_first = *scheme != "never";
  } else {
    LAIR_ASSIGN_OR_RETURN(strip_first, OptionalBool(json, "add_prefix_space", where, true));
  }
  return std::unique_ptr<Decoder>(new MetaspaceDecoder(c, strip_first));
}

}  // namespace

int ByteFallbackValue(std::string_view token) {
  if (token.size() != 6 || token.substr(0, 3) != "<0x" || token[5] != '>') return -1;
  // Rust's u8::from_str_radix, which HF uses, also takes a leading '+'.
  if (token[3] == '+') return HexValue(token[4]);
  const int high = HexValue(token[3]), low = HexValue(token[4]);
  return high < 0 || low < 0 ? -1 : high * 16 + low;
}

absl::StatusOr<std::unique_ptr<Decoder>> Decoder::FromJson(const Json& json,
                                                           const std::string& where) {
  LAIR_ASSIGN_OR_RETURN(std::string type, RequiredString(json, "type", where));
  if (type == "Sequence") {
    LAIR_ASSIGN_OR_RETURN(auto steps, SequenceSteps<Decoder>(json, "decoders", where));
    return std::unique_ptr<Decoder>(new SequenceDecoder(std::move(steps)));
  }
  if (type == "ByteLevel") return std::unique_ptr<Decoder>(new ByteLevelDecoder());
  if (type == "Replace") {
    LAIR_ASSIGN_OR_RETURN(auto pattern, Pattern::FromPatternField(json, where));
    LAIR_ASSIGN_OR_RETURN(std::string content, RequiredString(json, "content", where));
    return std::unique_ptr<Decoder>(new ReplaceDecoder(std::move(pattern), std::move(content)));
  }
  if (type == "ByteFallback") return std::unique_ptr<Decoder>(new ByteFallbackDecoder());
  if (type == "Fuse") return std::unique_ptr<Decoder>(new FuseDecoder());
  if (type == "Strip") {
    LAIR_ASSIGN_OR_RETURN(std::string content, RequiredString(json, "content", where));
    LAIR_ASSIGN_OR_RETURN(char32_t c, SingleChar(content, where, "content"));
    LAIR_ASSIGN_OR_RETURN(int64_t start, OptionalInt(json, "start", where, 0));
    LAIR_ASSIGN_OR_RETURN(int64_t stop, OptionalInt(json, "stop", where, 0));
    if (start < 0 || stop < 0) return FieldError(where, "start", "expected counts >= 0");
    return std::unique_ptr<Decoder>(
        new StripDecoder(c, static_cast<size_t>(start), static_cast<size_t>(stop)));
  }
  if (type == "Metaspace") return Metaspace(json, where);
  return FieldError(where, "type", absl::StrCat("unsupported decoder '", type, "'"));
}

}  // namespace lair::tok
