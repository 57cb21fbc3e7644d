// `lair verify tokenizer --tokenizer DIR --golden FILE`: checks every case of
// a golden file (the format of fixtures/tokenizers/*/golden.json: text, ids,
// ids_special, decoded) against LAIR's tokenizer. Prints each mismatch (case
// index, field, where the values part) and ends with "N passed, M failed".
// Exit status: 0 all passed, 1 some case failed, 2 a file could not be used.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "cli/command_registry.h"
#include "cli/verify_command.h"
#include "nlohmann/json.hpp"
#include "tokenizer/tokenizer.h"

namespace lair::cli {
namespace {

struct VerifyTokenizerFlags {
  std::string tokenizer;
  std::string golden;
};

// Ids [from, to) of `ids`, with "..." where cut.
std::string IdsExcerpt(const std::vector<int32_t>& ids, size_t from, size_t to) {
  to = std::min(to, ids.size());
  std::string out = from > 0 ? "[... " : "[";
  for (size_t i = from; i < to; ++i) {
    if (i > from) out += ", ";
    out += std::to_string(ids[i]);
  }
  out += to < ids.size() ? " ...]" : "]";
  return out;
}

std::string IdsDiff(const std::vector<int32_t>& want, const std::vector<int32_t>& got) {
  size_t at = 0;
  while (at < want.size() && at < got.size() && want[at] == got[at]) ++at;
  const size_t from = at >= 3 ? at - 3 : 0;
  return "first difference at index " + std::to_string(at) + " of " + std::to_string(want.size()) +
         " (got " + std::to_string(got.size()) + "): want " + IdsExcerpt(want, from, at + 5) +
         ", got " + IdsExcerpt(got, from, at + 5);
}

// A JSON string literal of `text` (escapes control characters).
std::string Quoted(const std::string& text) {
  return nlohmann::json(text).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string TextDiff(const std::string& want, const std::string& got) {
  size_t at = 0;
  while (at < want.size() && at < got.size() && want[at] == got[at]) ++at;
  // Back up to a character boundary so the excerpts stay readable UTF-8.
  while (at > 0 && at < want.size() && (static_cast<unsigned char>(want[at]) & 0xC0) == 0x80) --at;
  size_t from = at >= 16 ? at - 16 : 0;
  while (from > 0 && (static_cast<unsigned char>(want[from]) & 0xC0) == 0x80) --from;
  return "first difference at byte " + std::to_string(at) + ": want " +
         Quoted(want.substr(from, at - from + 24)) + ", got " +
         Quoted(got.substr(from, at - from + 24));
}

int RunVerifyTokenizer(const VerifyTokenizerFlags& flags) {
  auto tokenizer = Tokenizer::Load(flags.tokenizer);
  if (!tokenizer.ok()) {
    std::fprintf(stderr, "lair verify tokenizer: %s\n", tokenizer.status().ToString().c_str());
    return 2;
  }
  std::ifstream in(flags.golden);
  if (!in) {
    std::fprintf(stderr, "lair verify tokenizer: %s: cannot open\n", flags.golden.c_str());
    return 2;
  }
  nlohmann::json cases;
  try {
    cases = nlohmann::json::parse(in).at("cases");
    if (!cases.is_array()) throw std::runtime_error("\"cases\" is not an array");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lair verify tokenizer: %s: %s\n", flags.golden.c_str(), e.what());
    return 2;
  }

  int passed = 0, failed = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    std::string text, decoded;
    std::vector<int32_t> ids, ids_special;
    try {
      text = cases[i].at("text").get<std::string>();
      ids = cases[i].at("ids").get<std::vector<int32_t>>();
      ids_special = cases[i].at("ids_special").get<std::vector<int32_t>>();
      decoded = cases[i].at("decoded").get<std::string>();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "lair verify tokenizer: %s: cases[%zu]: %s\n", flags.golden.c_str(), i,
                   e.what());
      return 2;
    }
    std::vector<std::string> problems;
    const std::vector<int32_t> got_ids = (*tokenizer)->Encode(text, false);
    if (got_ids != ids) problems.push_back("ids: " + IdsDiff(ids, got_ids));
    const std::vector<int32_t> got_special = (*tokenizer)->Encode(text, true);
    if (got_special != ids_special) {
      problems.push_back("ids_special: " + IdsDiff(ids_special, got_special));
    }
    const std::string got_decoded = (*tokenizer)->Decode(ids, false);
    if (got_decoded != decoded) problems.push_back("decoded: " + TextDiff(decoded, got_decoded));
    if (problems.empty()) {
      ++passed;
      continue;
    }
    ++failed;
    const std::string shown = text.size() > 60 ? text.substr(0, 60) + "..." : text;
    std::printf("case %zu %s\n", i, Quoted(shown).c_str());
    for (const std::string& problem : problems) std::printf("  %s\n", problem.c_str());
  }
  std::printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}

}  // namespace

LAIR_REGISTER_COMMAND(verify_tokenizer, [](CLI::App& app) {
  CLI::App* command = VerifyCommand(app)->add_subcommand(
      "tokenizer", "Check a tokenizer against a golden file of HF `tokenizers` outputs");
  auto flags = std::make_shared<VerifyTokenizerFlags>();
  command
      ->add_option("--tokenizer", flags->tokenizer,
                   "Folder holding tokenizer.json (or the file itself)")
      ->required();
  command
      ->add_option("--golden", flags->golden,
                   "golden.json with {text, ids, ids_special, decoded} cases")
      ->required();
  command->callback([flags] { SetExitCode(RunVerifyTokenizer(*flags)); });
});

}  // namespace lair::cli
