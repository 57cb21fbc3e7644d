#include "cli/serving_model.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/backend.h"
#include "models/model.h"

namespace lair::cli {

absl::StatusOr<ServingRunner> LoadServingRunner(const ServingModelFlags& flags) {
  kernels::BackendOptions backend_options;
  LAIR_ASSIGN_OR_RETURN(backend_options.gemm, kernels::ParseGemmMode(flags.gemm, "--gemm"));
  LAIR_ASSIGN_OR_RETURN(std::unique_ptr<kernels::Backend> backend,
                        kernels::MakeBackend(flags.device, backend_options));
  models::LoadOptions options;
  const std::string dtype =
      flags.dtype.empty() ? (flags.device == "cpu" ? "f32" : "bf16") : flags.dtype;
  if (dtype != "f32" && dtype != "bf16")
    return absl::InvalidArgumentError("--dtype: use f32 or bf16");
  options.weight_dtype = dtype == "bf16" ? DType::kBF16 : DType::kF32;
  options.max_context = flags.max_context;
  options.fold_norm_weights = true;  // inference only
  options.fuse_low_rank_gates = true;
  options.persistent_decode = true;
  LAIR_ASSIGN_OR_RETURN(std::unique_ptr<models::Model> model,
                        models::Model::Load(flags.model, backend.get(), options));
  ServingRunner out;
  const absl::Status persistent = model->persistent_decode_status();
  out.decode_path = persistent.ok() ? "the persistent decode kernel"
                                    : absl::StrCat("the step graphs (", persistent.message(), ")");
  out.model = absl::StrCat(flags.model, " (", model->family(), "), vocabulary ",
                           model->vocab_size(), ", on ", backend->Name());
  // Only softmax attention (llama) has a per-sequence context limit; the
  // recurrent families carry a fixed-size state.
  const int max_context = model->family() == "llama" ? flags.max_context : 0;
  out.runner =
      std::make_unique<engine::ModelRunnerImpl>(std::move(backend), std::move(model), max_context);
  return out;
}

}  // namespace lair::cli
