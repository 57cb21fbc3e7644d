#include "cli/bench_command.h"

#include <vector>

namespace lair::cli {

CLI::App* BenchCommand(CLI::App& app) {
  const std::vector<CLI::App*> existing =
      app.get_subcommands([](CLI::App* sub) { return sub->get_name() == "bench"; });
  if (!existing.empty()) return existing.front();
  CLI::App* parent = app.add_subcommand("bench", "Measure LAIR's throughput");
  parent->require_subcommand(1);
  return parent;
}

}  // namespace lair::cli
