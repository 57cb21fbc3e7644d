// `lair tokenize --tokenizer DIR [--special] TEXT`: prints the ids of TEXT,
// space-separated, on one line. --special adds the post-processor's special
// tokens (BOS etc.). A tokenizer that does not load exits 2.
#include <cstdio>
#include <memory>
#include <string>

#include "CLI/CLI.hpp"
#include "cli/command_registry.h"
#include "tokenizer/tokenizer.h"

namespace lair::cli {
namespace {

struct TokenizeFlags {
  std::string tokenizer;
  bool special = false;
  std::string text;
};

int RunTokenize(const TokenizeFlags& flags) {
  auto tokenizer = Tokenizer::Load(flags.tokenizer);
  if (!tokenizer.ok()) {
    std::fprintf(stderr, "lair tokenize: %s\n", tokenizer.status().ToString().c_str());
    return 2;
  }
  const std::vector<int32_t> ids = (*tokenizer)->Encode(flags.text, flags.special);
  std::string line;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i > 0) line.push_back(' ');
    line += std::to_string(ids[i]);
  }
  std::printf("%s\n", line.c_str());
  return 0;
}

}  // namespace

LAIR_REGISTER_COMMAND(tokenize, [](CLI::App& app) {
  CLI::App* command = app.add_subcommand("tokenize", "Print the token ids of a text");
  auto flags = std::make_shared<TokenizeFlags>();
  command
      ->add_option("--tokenizer", flags->tokenizer,
                   "Folder holding tokenizer.json (or the file itself)")
      ->required();
  command->add_flag("--special", flags->special,
                    "Add the post-processor's special tokens (BOS etc.)");
  command->add_option("text", flags->text, "The text to encode")->required();
  command->callback([flags] { SetExitCode(RunTokenize(*flags)); });
});

}  // namespace lair::cli
