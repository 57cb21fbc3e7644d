// `lair init --family F --out DIR [--preset P] [--set key=value ...] [--seed S]
//  [--dtype f32|bf16] [--byte-tokenizer]`: writes a fresh model (config.json and
// model.safetensors with the reference tensor names) through
// models::InitModel. --byte-tokenizer also writes the byte-level demo
// tokenizer (tokenizer/byte_tokenizer_writer.h) into DIR and sizes the
// vocabulary to it (an explicit --set vocab_size wins), so `lair generate
// --model DIR` runs without a downloaded vocabulary.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "cli/command_registry.h"
#include "models/config.h"
#include "models/init.h"
#include "tokenizer/byte_tokenizer_writer.h"

namespace lair::cli {
namespace {

struct InitFlags {
  std::string family, preset, out;
  std::vector<std::string> sets;
  uint64_t seed = 0;
  std::string dtype = "f32";
  bool byte_tokenizer = false;
};

int RunInit(const InitFlags& flags) {
  models::InitOptions options;
  options.family = flags.family;
  options.preset = flags.preset;
  options.seed = flags.seed;
  options.matrix_dtype = flags.dtype == "bf16" ? DType::kBF16 : DType::kF32;
  // First, so that a --set vocab_size later in the list overrides it.
  if (flags.byte_tokenizer)
    options.overrides.emplace_back("vocab_size", std::to_string(kByteTokenizerVocabSize));
  for (const std::string& set : flags.sets) {
    size_t eq = set.find('=');
    if (eq == std::string::npos) {
      std::fprintf(stderr, "lair init: --set %s: expected key=value\n", set.c_str());
      return 1;
    }
    options.overrides.emplace_back(set.substr(0, eq), set.substr(eq + 1));
  }
  absl::StatusOr<int64_t> params = models::InitModel(options, flags.out);
  if (!params.ok()) {
    std::fprintf(stderr, "lair init: %s\n", params.status().ToString().c_str());
    return 1;
  }
  std::printf("wrote %s/config.json and model.safetensors (%lld parameters)\n", flags.out.c_str(),
              static_cast<long long>(*params));
  if (flags.byte_tokenizer) {
    absl::Status written = WriteByteTokenizer(flags.out);
    if (!written.ok()) {
      std::fprintf(stderr, "lair init: %s\n", written.ToString().c_str());
      return 1;
    }
    std::printf("wrote %s/tokenizer.json and tokenizer_config.json (byte-level, %d ids)\n",
                flags.out.c_str(), kByteTokenizerVocabSize);
  }
  return 0;
}

}  // namespace

LAIR_REGISTER_COMMAND(init, [](CLI::App& app) {
  CLI::App* init =
      app.add_subcommand("init", "Write a freshly initialized model of any supported family");
  auto flags = std::make_shared<InitFlags>();
  std::vector<std::string> families(std::begin(models::kModelTypes), std::end(models::kModelTypes));
  init->add_option("--family", flags->family, "Model family (config.json model_type)")
      ->check(CLI::IsMember(families));
  init->add_option("--preset", flags->preset, "Size preset")
      ->check(CLI::IsMember(models::InitPresets()));
  init->add_option("--out", flags->out, "Output folder")->required();
  init->add_option("--set", flags->sets, "Override a config field: key=value (repeatable)");
  init->add_option("--seed", flags->seed, "Random seed")->capture_default_str();
  init->add_option("--dtype", flags->dtype,
                   "Projection matrices on disk: f32 or bf16 (half the bytes)")
      ->check(CLI::IsMember({"f32", "bf16"}))
      ->capture_default_str();
  init->add_flag("--byte-tokenizer", flags->byte_tokenizer,
                 "Also write the byte-level demo tokenizer and size the vocabulary to it");
  init->callback([flags] { SetExitCode(RunInit(*flags)); });
});

}  // namespace lair::cli
