// `lair`: the one program. Subcommands live in cli/*_command.cc.
#include <cstdio>
#include <exception>

#include "CLI/CLI.hpp"
#include "cli/command_registry.h"

int main(int argc, char** argv) {
  try {
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
  } catch (const std::exception& e) {
    // Commands report their errors as statuses; this is for what escapes
    // a library (an allocation failure, a bug): a message, not an abort.
    std::fprintf(stderr, "lair: %s\n", e.what());
    return 1;
  }
}
