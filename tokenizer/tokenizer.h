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

  // Whether the text of `id` may still change with the tokens after it: a
  // byte-fallback <0xAB> piece, since a run of them decodes as a whole.
  // IncrementalDecoder holds its text back until a later token ends the run.
  // (Not pure, so simple test tokenizers need not define it.)
  virtual bool DependsOnNext(int32_t /*id*/) const { return false; }

  // The bytes `id` contributes to decoded text before any UTF-8 repair: a
  // byte-level or <0xAB> token that holds part of a character gives its raw
  // bytes, where Decode gives U+FFFD (OpenAI's logprob "bytes"). Other
  // tokens give Decode's text. (Not pure: Decode's by default.)
  virtual std::string TokenBytes(int32_t id) const {
    return Decode(std::span<const int32_t>(&id, 1), /*skip_special_tokens=*/false);
  }

  // From tokenizer_config.json; without one (or without the field), BOS is
  // the token the post-processor puts first and EOS a special token with a
  // well-known name (</s>, <|endoftext|>, <|end_of_text|>, <eos>).
  virtual std::optional<int32_t> BosId() const = 0;
  virtual std::optional<int32_t> EosId() const = 0;
  // add_bos_token from tokenizer_config.json; absent: whether the
  // post-processor puts BosId() first. Informational: Encode follows the
  // post-processor of tokenizer.json, as HF `tokenizers` does.
  virtual bool AddBosToken() const { return false; }
  // chat_template (a string, or the entry named "default" of a list).
  virtual std::string_view ChatTemplate() const = 0;  // empty when none
};

// Streaming detokenization: feeds tokens one at a time and returns only text
// that is final (complete UTF-8 characters whose rendering cannot change when
// later tokens arrive). Concatenating every Add() and Flush() equals
// Decode(all tokens).
//
// It decodes a short window: the tokens of the previous emission (context,
// so that decoders which treat the first token specially, such as
// SentencePiece's leading-space strip, see the same start both times) plus
// the new ones, and emits what the window adds beyond the context's text.
// Text is held while it ends in U+FFFD (an unfinished character) or in a
// byte-fallback run. Each call costs O(window); `tokenizer` must outlive it.
// Thread-compatible: one stream per object.
class IncrementalDecoder {
 public:
  IncrementalDecoder(const Tokenizer& tokenizer, bool skip_special_tokens);
  std::string Add(int32_t token);
  // The text still held back (an incomplete character at the end), after
  // which the stream continues as if it had just started a new window.
  std::string Flush();

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_tokens_;
  // The window: context tokens (already emitted) then new ones. Earlier
  // tokens are final and dropped.
  std::vector<int32_t> tokens_;
  size_t read_offset_ = 0;   // tokens before this index are the context
  std::string prefix_text_;  // Decode(tokens_[0, read_offset_))
};

}  // namespace lair
