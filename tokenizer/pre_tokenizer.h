// Pre-tokenizers: cut normalized text into the pieces the model encodes one
// by one. Supported `type`s: ByteLevel (add_prefix_space, use_regex; GPT-2's
// regex; maps bytes to GPT-2's printable characters), Split (String or Regex
// pattern, every `behavior`, `invert`), Metaspace (replacement,
// prepend_scheme always/first/never or the older add_prefix_space, split),
// Digits (individual_digits) and Sequence.
//
// Thread safety: immutable after construction.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "tokenizer/json_fields.h"

namespace lair::tok {

struct PreToken {
  std::string text;
  // Whether the piece begins at offset 0 of the text given to Encode (what
  // Metaspace's prepend_scheme "first" asks).
  bool at_origin;
};

class PreTokenizer {
 public:
  // `json` is a pre_tokenizer object of tokenizer.json; errors name `where`.
  static absl::StatusOr<std::unique_ptr<PreTokenizer>> FromJson(const Json& json,
                                                                const std::string& where);

  virtual ~PreTokenizer() = default;

  // Replaces `pieces` by their sub-pieces, in order; empty pieces vanish.
  virtual void PreTokenize(std::vector<PreToken>* pieces) const = 0;
};

}  // namespace lair::tok
