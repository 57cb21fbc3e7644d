// ChatTemplate: renders the Jinja chat templates that Hugging Face models
// ship in tokenizer_config.json ("chat_template"), without Python.
//
// Supported subset (enough for Llama-2/3, Mistral, ChatML, Zephyr, Gemma
// style templates):
//   - tags {{ expr }}, {% stmt %}, {# comment #}, with "-" whitespace control
//     and Hugging Face's trim_blocks + lstrip_blocks behaviour;
//   - statements: for (with `loop.index`, `index0`, `revindex`, `revindex0`,
//     `first`, `last`, `length`; tuple targets; an `if` filter clause),
//     if/elif/else, set (also `set ns.attr = ...` on a namespace);
//   - expressions: literals (string, int, float, true/false/none, lists,
//     dicts), names, `.attr`, `[index]`, `[start:stop]`, calls, `a if c else b`,
//     or/and/not, == != < > <= >= in / not in, + - * / // %, `~`, filters
//     (trim, length, count, upper, lower, title, capitalize, first, last,
//     join, default, string, int, float, list, reverse, replace, tojson,
//     items), tests (defined, undefined, none, string, number, integer,
//     mapping, sequence, iterable, boolean, true, false, even, odd);
//   - globals: raise_exception(msg), namespace(k=v, ...), range(...);
//   - string methods strip/lstrip/rstrip/upper/lower/title/startswith/
//     endswith/split/replace, dict methods items/keys/values/get.
// Anything else is refused by Parse (unknown tag) or Render (unknown filter,
// test or method), never silently ignored.
//
// Thread safety: immutable after Parse; Render may run on many threads.
#pragma once

#include <memory>
#include <string>

#include "core/status.h"
#include "nlohmann/json.hpp"

namespace lair::server {

class ChatTemplate {
 public:
  // The format used when a tokenizer has no chat template: BOS, then each
  // message as "<|ROLE|>\nCONTENT\n", then "<|assistant|>\n" when
  // add_generation_prompt is set.
  static const char kFallbackSource[];

  // Parses `source`. InvalidArgument names the offending tag or token.
  static absl::StatusOr<ChatTemplate> Parse(const std::string& source);

  // Renders with `variables` (a JSON object; typically messages,
  // add_generation_prompt, bos_token, eos_token). InvalidArgument on
  // raise_exception (its message) or on a type error in the template.
  absl::StatusOr<std::string> Render(const nlohmann::ordered_json& variables) const;

  struct Node;  // the parsed template; defined in chat_template.cc

 private:
  explicit ChatTemplate(std::shared_ptr<const Node> root) : root_(std::move(root)) {}
  std::shared_ptr<const Node> root_;  // a sequence node
};

}  // namespace lair::server
