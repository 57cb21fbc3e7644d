#include "cli/command_registry.h"

#include <map>
#include <string>

namespace lair::cli {
namespace {

std::map<std::string, CommandRegistrar>& Registry() {
  static auto* registry = new std::map<std::string, CommandRegistrar>();
  return *registry;
}

int exit_code = 0;

}  // namespace

bool RegisterCommand(const char* name, CommandRegistrar registrar) {
  Registry()[name] = std::move(registrar);
  return true;
}

void AddRegisteredCommands(CLI::App& app) {
  for (auto& [name, registrar] : Registry()) registrar(app);
}

void SetExitCode(int code) { exit_code = code; }
int ExitCode() { return exit_code; }

}  // namespace lair::cli
