#include "models/model.h"

#include "checkpoint/config_reader.h"
#include "checkpoint/safetensors.h"
#include "models/config.h"
#include "models/decoder.h"
#include "models/params.h"

namespace lair::models {

absl::StatusOr<std::unique_ptr<Model>> Model::Load(const std::string& dir,
                                                   kernels::Backend* backend,
                                                   const LoadOptions& options) {
  LAIR_ASSIGN_OR_RETURN(ConfigReader reader, ConfigReader::FromFile(dir + "/config.json"));
  LAIR_ASSIGN_OR_RETURN(ModelConfig config, ParseModelConfig(reader));
  LAIR_ASSIGN_OR_RETURN(Checkpoint checkpoint, Checkpoint::Open(dir));
  CheckpointSource source(&checkpoint);
  auto params = std::make_unique<Params>(&source, backend, options.weight_dtype);
  LAIR_ASSIGN_OR_RETURN(DecoderSpec spec, BuildDecoderSpec(config, *params));
  std::vector<int> folded_norms;
  if (options.fold_norm_weights) {
    LAIR_ASSIGN_OR_RETURN(folded_norms, FoldNormWeights(spec, *params));
  }
  if (options.fuse_low_rank_gates) {
    LAIR_RETURN_IF_ERROR(FuseLowRankGates(spec, *params, folded_norms));
  }
  return MakeDecoder(BaseConfig(config), std::move(params), std::move(spec), backend,
                     options.max_context, options.step_graphs, std::move(folded_norms),
                     options.persistent_decode);
}

absl::StatusOr<std::vector<int32_t>> Model::ForwardGreedy(const ForwardBatch& batch,
                                                          StatePool& pool) {
  if (batch.all_logits || !batch.logit_rows.empty())
    return absl::InvalidArgumentError("ForwardGreedy: all_logits and logit_rows are not supported");
  LAIR_ASSIGN_OR_RETURN(Tensor logits, Forward(batch, pool));
  return RowArgmax(logits);
}

}  // namespace lair::models
