#include "cli/verify_command.h"

#include <vector>

namespace lair::cli {

CLI::App* VerifyCommand(CLI::App& app) {
  const std::vector<CLI::App*> existing =
      app.get_subcommands([](CLI::App* sub) { return sub->get_name() == "verify"; });
  if (!existing.empty()) return existing.front();
  CLI::App* parent = app.add_subcommand("verify", "Check LAIR against golden data");
  parent->require_subcommand(1);
  return parent;
}

}  // namespace lair::cli
