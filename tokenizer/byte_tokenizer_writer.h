// A byte-level demo tokenizer, so a fresh machine can serve a model it
// initialized itself without downloading a vocabulary.
//
// The vocabulary is the 256 bytes (ids 0-255, spelled with GPT-2's
// byte-to-character mapping, no merges, so every byte is one token) plus
// the special tokens <|bos|> (256) and <|eos|> (257): 258 ids in all. Text
// prompts get <|bos|> prepended by the post-processor. tokenizer_config.json
// names bos/eos and carries a simple chat template:
//   <|bos|><|ROLE|>\nCONTENT<|eos|>\n ... then <|assistant|>\n
#pragma once

#include <string>

#include "core/status.h"

namespace lair {

inline constexpr int kByteTokenizerVocabSize = 258;

// Writes DIR/tokenizer.json and DIR/tokenizer_config.json (creating DIR).
// InvalidArgument/Internal name the file that could not be written.
absl::Status WriteByteTokenizer(const std::string& dir);

}  // namespace lair
