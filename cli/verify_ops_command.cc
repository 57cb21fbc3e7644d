// `lair verify ops`: runs every op listed in an ops fixture folder's
// manifest.json through a backend (both forward forms and the backward) and
// compares outputs, final states and gradients with the golden values at the
// tolerances of fixtures/README.md. With bf16 activations each check is also
// run exactly (F32, on the CPU) on the same rounded inputs: where rounding
// alone uses up more than half the tolerance, the check is judged against
// that exact result (kernels/verify_ops.h, AddRoundingFloor) and says so.
// Prints one block per op and ends with "N passed, M failed"; the exit
// status is 1 when any op failed.
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "CLI/CLI.hpp"
#include "cli/command_registry.h"
#include "cli/verify_command.h"
#include "kernels/backend.h"
#include "kernels/verify_ops.h"

namespace lair::cli {
namespace {

struct VerifyOpsFlags {
  std::string dir;
  std::string device = "cpu";
  std::string dtype = "f32";
  int chunk_size = 64;
};

std::string DefaultOpsDir() {
  const char* env = std::getenv("LAIR_FIXTURES");
  return std::string(env != nullptr && *env != '\0' ? env : LAIR_DEFAULT_FIXTURES_DIR) + "/ops";
}

int RunVerifyOps(const VerifyOpsFlags& flags) {
  absl::StatusOr<std::unique_ptr<kernels::Backend>> backend = kernels::MakeBackend(flags.device);
  if (!backend.ok()) {
    std::fprintf(stderr, "lair verify ops: %s\n", backend.status().ToString().c_str());
    return 1;
  }
  absl::StatusOr<std::vector<kernels::OpSpec>> ops = kernels::ReadOpsManifest(flags.dir);
  if (!ops.ok()) {
    std::fprintf(stderr, "lair verify ops: %s\n", ops.status().ToString().c_str());
    return 1;
  }
  kernels::VerifyOpsOptions options;
  options.dtype = flags.dtype == "bf16" ? DType::kBF16 : DType::kF32;
  absl::StatusOr<std::unique_ptr<kernels::Backend>> exact = kernels::MakeBackend("cpu");
  if (!exact.ok()) {
    std::fprintf(stderr, "lair verify ops: %s\n", exact.status().ToString().c_str());
    return 1;
  }
  options.chunk_size = flags.chunk_size;
  std::printf("backend %s, activations %s, chunk size %d, fixtures %s\n",
              (*backend)->Name().c_str(), flags.dtype.c_str(), flags.chunk_size, flags.dir.c_str());

  int passed = 0, failed = 0;
  for (const kernels::OpSpec& spec : *ops) {
    kernels::OpReport report = kernels::VerifyOp(**backend, flags.dir, spec, options);
    kernels::AddRoundingFloor(**exact, flags.dir, options, report);
    std::printf("%s  %s (%s)\n", report.passed() ? "PASS" : "FAIL", spec.name.c_str(),
                spec.kind.c_str());
    for (const kernels::TensorCheck& check : report.checks) {
      std::printf("      %-20s rel. error %.2e  tolerance %.0e%s\n", check.label.c_str(),
                  check.relative_error, check.tolerance, check.passed() ? "" : "  <-- FAIL");
      if (check.relative_error > check.tolerance && check.floor >= 0) {
        std::printf(
            "      %-20s exact on the rounded inputs: rel. error %.2e; ours against "
            "it %.2e%s\n",
            "", check.floor, check.own_error,
            check.at_floor() ? "  (pass: the rounding alone takes over half the tolerance)" : "");
      }
    }
    if (!report.status.ok()) std::printf("      error: %s\n", report.status.ToString().c_str());
    ++(report.passed() ? passed : failed);
  }
  std::printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}

}  // namespace

LAIR_REGISTER_COMMAND(verify_ops, [](CLI::App& app) {
  CLI::App* ops = VerifyCommand(app)->add_subcommand(
      "ops",
      "Check the mixer kernels against the golden ops fixtures (forward, final states, gradients)");
  auto flags = std::make_shared<VerifyOpsFlags>();
  flags->dir = DefaultOpsDir();
  ops->add_option("--dir", flags->dir, "Ops fixture folder holding manifest.json")
      ->capture_default_str();
  ops->add_option("--device", flags->device, "Backend: cpu, cuda or cuda:N")->capture_default_str();
  ops->add_option("--dtype", flags->dtype, "Activation dtype (gates and states stay f32)")
      ->check(CLI::IsMember({"f32", "bf16"}))
      ->capture_default_str();
  ops->add_option("--chunk-size", flags->chunk_size, "Chunk size of the chunked form")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  ops->callback([flags] { SetExitCode(RunVerifyOps(*flags)); });
});

}  // namespace lair::cli
