// Post-processors: what Encode(..., add_special_tokens=true) adds around the
// ids of one sequence. Supported `type`s: TemplateProcessing (its "single"
// template), ByteLevel (changes offsets only, so no ids) and Sequence.
//
// Thread safety: immutable after construction.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "tokenizer/json_fields.h"

namespace lair::tok {

class PostProcessor {
 public:
  // `json` is the "post_processor" object of tokenizer.json; errors name
  // `where`.
  static absl::StatusOr<std::unique_ptr<PostProcessor>> FromJson(const Json& json,
                                                                 const std::string& where);

  virtual ~PostProcessor() = default;

  // Adds the special tokens around `ids`.
  virtual void AddSpecialTokens(std::vector<int32_t>* ids) const = 0;

  // The id the single-sequence template puts first, before the text, if any
  // (the BOS token the tokenizer adds).
  virtual std::optional<int32_t> LeadingId() const { return std::nullopt; }
};

}  // namespace lair::tok
