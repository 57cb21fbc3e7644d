// Tokenizer: Hugging Face `tokenizer.json` (BPE, byte-level or
// SentencePiece-style) with `tokenizer_config.json`, no Python at run time.
//
// Encode/Decode reproduce Hugging Face `tokenizers` exactly. Thread safety:
// immutable after Load; every const method may run on many threads at once.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace lair {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // `path` is a directory holding tokenizer.json (and optionally
  // tokenizer_config.json), or the tokenizer.json file itself. Errors name
  // the file and the field that could not be understood.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> Load(const std::string& path);

  // add_special_tokens applies the post-processor (BOS etc.), as HF does.
  virtual std::vector<int32_t> Encode(std::string_view text, bool add_special_tokens) const = 0;
  virtual std::string Decode(std::span<const int32_t> ids, bool skip_special_tokens) const = 0;

  virtual int VocabSize() const = 0;  // including added tokens
  virtual std::optional<int32_t> TokenToId(std::string_view token) const = 0;
  virtual std::string IdToToken(int32_t id) const = 0;  // empty when out of range
  virtual bool IsSpecial(int32_t id) const = 0;

  // From tokenizer_config.json (falling back to the added tokens).
  virtual std::optional<int32_t> BosId() const = 0;
  virtual std::optional<int32_t> EosId() const = 0;
  virtual std::string_view ChatTemplate() const = 0;  // empty when none
};

// Streaming detokenization: feeds tokens one at a time and returns only text
// that is final (complete UTF-8 characters whose rendering cannot change when
// later tokens arrive). Concatenating every Add() and Flush() equals
// Decode(all tokens).
class IncrementalDecoder {
 public:
  IncrementalDecoder(const Tokenizer& tokenizer, bool skip_special_tokens);
  std::string Add(int32_t token);
  // The text still held back (an incomplete character at the end).
  std::string Flush();

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_tokens_;
  std::vector<int32_t> tokens_;
  size_t prefix_offset_ = 0;  // tokens before this index are already emitted text
  size_t read_offset_ = 0;
};

}  // namespace lair
