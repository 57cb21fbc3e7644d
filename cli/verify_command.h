// `lair verify`: the parent command shared by every verify subcommand
// (`lair verify ops`, `lair verify tokenizer`, ...). Each subcommand's file adds itself with
// VerifyCommand(app)->add_subcommand(...), so no file lists them all.
#pragma once

#include "CLI/CLI.hpp"

namespace lair::cli {

// The `verify` subcommand of `app`: created on the first call, returned as
// is afterwards. It requires one of its own subcommands.
CLI::App* VerifyCommand(CLI::App& app);

}  // namespace lair::cli
