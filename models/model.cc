#include "models/model.h"

#include "checkpoint/config_reader.h"
#include "checkpoint/safetensors.h"
#include "models/config.h"
#include "models/decoder.h"
#include "models/params.h"

namespace lair::models {

absl::StatusOr<std::unique_ptr<Model>> Model::Load(const std::string& dir, kernels::Backend* backend,
                                                   const LoadOptions& options) {
  LAIR_ASSIGN_OR_RETURN(ConfigReader reader, ConfigReader::FromFile(dir + "/config.json"));
  LAIR_ASSIGN_OR_RETURN(ModelConfig config, ParseModelConfig(reader));
  LAIR_ASSIGN_OR_RETURN(Checkpoint checkpoint, Checkpoint::Open(dir));
  CheckpointSource source(&checkpoint);
  auto params = std::make_unique<Params>(&source, backend, options.weight_dtype);
  LAIR_ASSIGN_OR_RETURN(DecoderSpec spec, BuildDecoderSpec(config, *params));
  return MakeDecoder(BaseConfig(config), std::move(params), std::move(spec), backend, options.max_context);
}

}  // namespace lair::models
