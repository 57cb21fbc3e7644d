// Unicode helpers for the tokenizer: UTF-8 decoding, encoding and repair,
// the character classes HF `tokenizers` takes from Rust's `char` methods,
// case mapping, and GPT-2's byte <-> printable-character table.
//
// Thread safety: every function is pure (the tables are built once, at first
// use, under the C++ static-initialization guarantee).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace lair::tok {

inline constexpr char32_t kReplacementChar = 0xFFFD;

// Bytes in the UTF-8 sequence that starts with `lead`; 1 for a byte that
// cannot start one (callers only use this on valid UTF-8).
inline size_t Utf8Length(unsigned char lead) {
  if (lead < 0x80) return 1;
  if (lead >= 0xF0) return 4;
  if (lead >= 0xE0) return 3;
  if (lead >= 0xC0) return 2;
  return 1;
}

// Decodes the character at `*pos` of valid UTF-8 and advances `*pos`.
char32_t NextChar(std::string_view s, size_t* pos);

// Decodes the last character of valid, non-empty UTF-8 `s`.
char32_t LastChar(std::string_view s);

void AppendUtf8(char32_t c, std::string* out);

bool IsValidUtf8(std::string_view s);

// Rust's String::from_utf8_lossy: valid sequences are copied and each
// maximal invalid subpart becomes one U+FFFD.
std::string Utf8Lossy(std::string_view bytes);

// Rust's char::is_whitespace (the Unicode White_Space property).
bool IsWhiteSpace(char32_t c);

// Rust's char::is_alphanumeric (Alphabetic, or a number category).
bool IsAlphanumeric(char32_t c);

// Rust's char::to_lowercase: the full mapping, one or two characters.
void AppendLowercase(char32_t c, std::string* out);

// GPT-2's reversible byte <-> character table: printable Latin-1 bytes map
// to themselves, the other 68 bytes to U+0100..U+0143.
//
// Appends the characters of `bytes` to `out`.
void ByteLevelEncode(std::string_view bytes, std::string* out);
// Appends the bytes of `token` to `out` when every character of it is in the
// table; otherwise leaves `out` unchanged and returns false.
bool ByteLevelDecode(std::string_view token, std::string* out);

}  // namespace lair::tok
