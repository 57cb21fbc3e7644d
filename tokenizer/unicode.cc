#include "tokenizer/unicode.h"

#include <array>

#include "unicode/uchar.h"

namespace lair::tok {
namespace {

struct ByteLevelTables {
  // UTF-8 of the character for each byte (1 or 2 bytes long).
  std::array<std::array<char, 2>, 256> encoded;
  std::array<uint8_t, 256> encoded_length;
  // Byte for each character below 0x144, or -1.
  std::array<int16_t, 0x144> decoded;
};

const ByteLevelTables& Tables() {
  static const ByteLevelTables* tables = [] {
    auto* t = new ByteLevelTables();
    t->decoded.fill(-1);
    char32_t next_extra = 0x100;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      const char32_t c = printable ? static_cast<char32_t>(b) : next_extra++;
      std::string utf8;
      AppendUtf8(c, &utf8);
      t->encoded_length[b] = static_cast<uint8_t>(utf8.size());
      for (size_t i = 0; i < utf8.size(); ++i) t->encoded[b][i] = utf8[i];
      t->decoded[c] = static_cast<int16_t>(b);
    }
    return t;
  }();
  return *tables;
}

bool InRange(unsigned char b, unsigned char lo, unsigned char hi) { return b >= lo && b <= hi; }

// For a multi-byte lead: continuation count and the allowed range of the
// first continuation byte (the others are always 0x80..0xBF). Returns false
// for a byte that cannot lead a sequence.
bool LeadInfo(unsigned char lead, int* continuations, unsigned char* lo, unsigned char* hi) {
  *lo = 0x80;
  *hi = 0xBF;
  if (InRange(lead, 0xC2, 0xDF)) {
    *continuations = 1;
  } else if (lead == 0xE0) {
    *continuations = 2;
    *lo = 0xA0;
  } else if (lead == 0xED) {
    *continuations = 2;
    *hi = 0x9F;
  } else if (InRange(lead, 0xE1, 0xEF)) {
    *continuations = 2;
  } else if (lead == 0xF0) {
    *continuations = 3;
    *lo = 0x90;
  } else if (lead == 0xF4) {
    *continuations = 3;
    *hi = 0x8F;
  } else if (InRange(lead, 0xF1, 0xF3)) {
    *continuations = 3;
  } else {
    return false;
  }
  return true;
}

// Length of the valid sequence at `pos`, or 0 with `*subpart` set to the
// length of the maximal invalid subpart there.
size_t ValidSequenceAt(std::string_view s, size_t pos, size_t* subpart) {
  const auto lead = static_cast<unsigned char>(s[pos]);
  if (lead < 0x80) return 1;
  int continuations;
  unsigned char lo, hi;
  if (!LeadInfo(lead, &continuations, &lo, &hi)) {
    *subpart = 1;
    return 0;
  }
  size_t end = pos + 1;
  for (int k = 0; k < continuations; ++k, ++end) {
    if (end >= s.size()) {
      *subpart = end - pos;
      return 0;
    }
    const auto b = static_cast<unsigned char>(s[end]);
    if (!(k == 0 ? InRange(b, lo, hi) : InRange(b, 0x80, 0xBF))) {
      *subpart = end - pos;
      return 0;
    }
  }
  return end - pos;
}

}  // namespace

char32_t NextChar(std::string_view s, size_t* pos) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data()) + *pos;
  const size_t n = Utf8Length(p[0]);
  *pos += n;
  switch (n) {
    case 1:
      return p[0];
    case 2:
      return ((p[0] & 0x1Fu) << 6) | (p[1] & 0x3Fu);
    case 3:
      return ((p[0] & 0x0Fu) << 12) | ((p[1] & 0x3Fu) << 6) | (p[2] & 0x3Fu);
    default:
      return ((p[0] & 0x07u) << 18) | ((p[1] & 0x3Fu) << 12) | ((p[2] & 0x3Fu) << 6) |
             (p[3] & 0x3Fu);
  }
}

char32_t LastChar(std::string_view s) {
  size_t start = s.size() - 1;
  while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
  return NextChar(s, &start);
}

void AppendUtf8(char32_t c, std::string* out) {
  if (c < 0x80) {
    out->push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (c >> 6)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (c >> 12)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (c >> 18)));
    out->push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

bool IsValidUtf8(std::string_view s) {
  size_t pos = 0;
  while (pos < s.size()) {
    if (static_cast<unsigned char>(s[pos]) < 0x80) {
      ++pos;
      continue;
    }
    size_t subpart;
    const size_t n = ValidSequenceAt(s, pos, &subpart);
    if (n == 0) return false;
    pos += n;
  }
  return true;
}

std::string Utf8Lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t pos = 0;
  while (pos < bytes.size()) {
    size_t subpart = 0;
    const size_t n = ValidSequenceAt(bytes, pos, &subpart);
    if (n > 0) {
      out.append(bytes.substr(pos, n));
      pos += n;
    } else {
      AppendUtf8(kReplacementChar, &out);
      pos += subpart;
    }
  }
  return out;
}

bool IsWhiteSpace(char32_t c) {
  if (c < 0x80) return c == ' ' || (c >= 0x09 && c <= 0x0D);
  switch (c) {
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
      return true;
    default:
      return c >= 0x2000 && c <= 0x200A;
  }
}

bool IsAlphanumeric(char32_t c) {
  if (c < 0x80) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
  }
  const auto cp = static_cast<UChar32>(c);
  if (u_isUAlphabetic(cp)) return true;
  const int8_t type = u_charType(cp);
  return type == U_DECIMAL_DIGIT_NUMBER || type == U_LETTER_NUMBER || type == U_OTHER_NUMBER;
}

void AppendLowercase(char32_t c, std::string* out) {
  if (c < 0x80) {
    out->push_back(static_cast<char>(c >= 'A' && c <= 'Z' ? c + ('a' - 'A') : c));
    return;
  }
  // The one unconditional multi-character lowercase mapping (SpecialCasing).
  if (c == 0x130) {
    out->push_back('i');
    AppendUtf8(0x307, out);
    return;
  }
  AppendUtf8(static_cast<char32_t>(u_tolower(static_cast<UChar32>(c))), out);
}

void ByteLevelEncode(std::string_view bytes, std::string* out) {
  const ByteLevelTables& t = Tables();
  for (char ch : bytes) {
    const auto b = static_cast<unsigned char>(ch);
    out->append(t.encoded[b].data(), t.encoded_length[b]);
  }
}

bool ByteLevelDecode(std::string_view token, std::string* out) {
  const ByteLevelTables& t = Tables();
  const size_t mark = out->size();
  size_t pos = 0;
  while (pos < token.size()) {
    const char32_t c = NextChar(token, &pos);
    if (c >= t.decoded.size() || t.decoded[c] < 0) {
      out->resize(mark);
      return false;
    }
    out->push_back(static_cast<char>(t.decoded[c]));
  }
  return true;
}

}  // namespace lair::tok
