// `lair`: the one program. Subcommands live in cli/*_command.cc.
#include <cstdio>

#include "CLI/CLI.hpp"
#include "cli/command_registry.h"

int main(int argc, char** argv) {
  CLI::App app{"LAIR, the Linear-Attention Inference Runtime"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "lair 0.1.0");
  lair::cli::AddRegisteredCommands(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return lair::cli::ExitCode();
}
