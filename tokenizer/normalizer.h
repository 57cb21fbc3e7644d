// Normalizers: the text rewrites HF `tokenizers` applies before
// pre-tokenization. Supported `type`s: Sequence, Prepend, Replace (String or
// Regex pattern), NFC, NFD, NFKC, NFKD (ICU), Lowercase, Strip, StripAccents.
// Offsets are not tracked: LAIR only needs ids.
//
// Thread safety: immutable after construction.
#pragma once

#include <memory>
#include <string>

#include "core/status.h"
#include "tokenizer/json_fields.h"

namespace lair::tok {

class Normalizer {
 public:
  // `json` is a normalizer object of tokenizer.json; errors name `where`.
  static absl::StatusOr<std::unique_ptr<Normalizer>> FromJson(const Json& json,
                                                              const std::string& where);

  virtual ~Normalizer() = default;

  // Rewrites valid UTF-8 `text` in place.
  virtual void Normalize(std::string* text) const = 0;
};

}  // namespace lair::tok
