// `lair bench`: the parent command shared by every bench subcommand
// (`lair bench ops`, ...). Each subcommand's file adds itself with
// BenchCommand(app)->add_subcommand(...), so no file lists them all.
#pragma once

#include "CLI/CLI.hpp"

namespace lair::cli {

// The `bench` subcommand of `app`: created on the first call, returned as
// is afterwards. It requires one of its own subcommands.
CLI::App* BenchCommand(CLI::App& app);

}  // namespace lair::cli
