// Decoders: turn the token strings of an id sequence back into text, as HF
// `tokenizers` does. Each decoder rewrites the list of token strings; the
// text is their concatenation. Supported `type`s: ByteLevel, Replace,
// ByteFallback, Fuse, Strip, Metaspace and Sequence.
//
// Thread safety: immutable after construction.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "tokenizer/json_fields.h"

namespace lair::tok {

class Decoder {
 public:
  // `json` is the "decoder" object of tokenizer.json; errors name `where`.
  static absl::StatusOr<std::unique_ptr<Decoder>> FromJson(const Json& json,
                                                           const std::string& where);

  virtual ~Decoder() = default;

  // Rewrites `tokens` (HF's decode_chain).
  virtual void DecodeChain(std::vector<std::string>* tokens) const = 0;

  // Whether this decoder (or a step of it) is ByteFallback, whose rendering
  // of a run of <0xAB> tokens depends on where the run ends.
  virtual bool FusesByteRuns() const { return false; }
  // Whether this decoder (or a step of it) maps byte-level characters back
  // to bytes (ByteLevel).
  virtual bool DecodesByteLevel() const { return false; }
};

// The <0xAB> form ByteFallback reads: its byte, or -1.
int ByteFallbackValue(std::string_view token);

}  // namespace lair::tok
