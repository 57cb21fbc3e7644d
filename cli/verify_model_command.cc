// `lair verify model --model DIR [--device cpu]`: runs a model folder with
// golden.safetensors (and grads.safetensors when present) through
// models::VerifyModel: prefill and one-token logits, greedy tokens and
// logits, loss and every parameter gradient, each against the tolerances of
// fixtures/README.md. Prints one line per check and ends with
// "N passed, M failed"; the exit status is 1 when any check failed.
#include <cstdio>
#include <memory>
#include <string>

#include "CLI/CLI.hpp"
#include "cli/command_registry.h"
#include "cli/verify_command.h"
#include "kernels/backend.h"
#include "models/verify.h"

namespace lair::cli {
namespace {

struct VerifyModelFlags {
  std::string dir;
  std::string device = "cpu";
  std::string dtype = "f32";
  bool no_grads = false;
};

int RunVerifyModel(const VerifyModelFlags& flags) {
  absl::StatusOr<std::unique_ptr<kernels::Backend>> backend = kernels::MakeBackend(flags.device);
  if (!backend.ok()) {
    std::fprintf(stderr, "lair verify model: %s\n", backend.status().ToString().c_str());
    return 1;
  }
  models::VerifyModelOptions options;
  options.weight_dtype = flags.dtype == "bf16" ? DType::kBF16 : DType::kF32;
  options.gradients = !flags.no_grads;
  std::printf("model %s, backend %s, weights %s\n", flags.dir.c_str(), (*backend)->Name().c_str(),
              flags.dtype.c_str());
  models::ModelReport report = models::VerifyModel(flags.dir, backend->get(), options);
  int passed = 0, failed = 0;
  for (const models::ModelCheck& check : report.checks) {
    std::printf("%s  %-48s rel. error %.2e  tolerance %.1e\n", check.passed() ? "PASS" : "FAIL",
                check.label.c_str(), check.relative_error, check.tolerance);
    ++(check.passed() ? passed : failed);
  }
  if (!report.status.ok()) {
    std::printf("FAIL  %s\n", report.status.ToString().c_str());
    ++failed;
  }
  std::printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}

}  // namespace

LAIR_REGISTER_COMMAND(verify_model, [](CLI::App& app) {
  CLI::App* model = VerifyCommand(app)->add_subcommand(
      "model", "Check a model folder against its golden logits, greedy tokens and gradients");
  auto flags = std::make_shared<VerifyModelFlags>();
  model
      ->add_option("--model", flags->dir,
                   "Model folder with config.json, model.safetensors, golden.safetensors")
      ->required();
  model->add_option("--device", flags->device, "Backend: cpu, cuda or cuda:N")
      ->capture_default_str();
  model
      ->add_option("--dtype", flags->dtype,
                   "Weight dtype on the device (bf16 uses the bf16 tolerances)")
      ->check(CLI::IsMember({"f32", "bf16"}))
      ->capture_default_str();
  model->add_flag("--no-grads", flags->no_grads, "Skip the gradient checks");
  model->callback([flags] { SetExitCode(RunVerifyModel(*flags)); });
});

}  // namespace lair::cli
