// How `lair` subcommands join the program: each cli/*_command.cc file
// registers itself with LAIR_REGISTER_COMMAND, so adding a command touches
// one file. main.cc parses the command line once and runs the chosen one.
#pragma once

#include <functional>

#include "CLI/CLI.hpp"

namespace lair::cli {

// Adds a subcommand (and its options) to `app`. The subcommand's callback
// sets the process exit code through SetExitCode.
using CommandRegistrar = std::function<void(CLI::App& app)>;

// Called from static initializers; returns true so it can initialize a bool.
bool RegisterCommand(const char* name, CommandRegistrar registrar);
void AddRegisteredCommands(CLI::App& app);

// The exit status the chosen subcommand wants (0 unless set).
void SetExitCode(int code);
int ExitCode();

}  // namespace lair::cli

#define LAIR_REGISTER_COMMAND(name, registrar) \
  static const bool lair_registered_##name = ::lair::cli::RegisterCommand(#name, registrar)
