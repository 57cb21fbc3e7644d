// The model as `lair serve` loads it, shared by `lair serve` and
// `lair bench engine` so that the benchmark measures what is served.
#pragma once

#include <memory>
#include <string>

#include "core/status.h"
#include "engine/model_runner_impl.h"

namespace lair::cli {

struct ServingModelFlags {
  std::string model;  // folder with config.json and weights
  std::string device = "cpu";
  std::string dtype;          // empty: f32 on the CPU, bf16 on CUDA
  std::string gemm = "fast";  // kernels::GemmMode
  int max_context = 4096;     // KV length per sequence for softmax-attention families
};

struct ServingRunner {
  std::unique_ptr<engine::ModelRunnerImpl> runner;
  std::string model;        // "DIR (family), vocabulary V, on BACKEND"
  std::string decode_path;  // how one-sequence decode steps run, and why
};

// Loads flags.model for inference: the norms' weights folded into their
// products, low-rank gates fused, one-sequence decode steps on the
// persistent kernel where the model and backend have it. InvalidArgument
// names a bad --dtype or --gemm.
absl::StatusOr<ServingRunner> LoadServingRunner(const ServingModelFlags& flags);

}  // namespace lair::cli
