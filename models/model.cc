#include "models/model.h"

#include <algorithm>
#include <span>

#include "absl/strings/str_cat.h"
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

absl::Status CheckSampleArgs(const ForwardBatch& batch, std::span<const kernels::RowSampling> rows,
                             std::span<const int32_t> host_rows) {
  if (batch.all_logits || !batch.logit_rows.empty())
    return absl::InvalidArgumentError("ForwardSample: all_logits and logit_rows are not supported");
  if (static_cast<int>(rows.size()) != batch.num_seqs()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ForwardSample: ", rows.size(), " sampling rules for ", batch.num_seqs(), " sequences"));
  }
  for (size_t i = 0; i < host_rows.size(); ++i) {
    if (host_rows[i] < 0 || host_rows[i] >= batch.num_seqs() ||
        (i > 0 && host_rows[i] <= host_rows[i - 1])) {
      return absl::InvalidArgumentError(absl::StrCat("ForwardSample: host row ", host_rows[i],
                                                     " is out of range or out of order"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<SampledStep> Model::ForwardSample(const ForwardBatch& batch, StatePool& pool,
                                                 std::span<const kernels::RowSampling> rows,
                                                 std::span<const int32_t> host_rows) {
  LAIR_RETURN_IF_ERROR(CheckSampleArgs(batch, rows, host_rows));
  LAIR_ASSIGN_OR_RETURN(Tensor logits, Forward(batch, pool));
  const int64_t vocab = logits.dim(1);
  SampledStep out;
  for (int64_t r = 0; r < logits.dim(0); ++r) {
    out.tokens.push_back(
        kernels::SampleRow(std::span<const float>(logits.f32() + r * vocab, vocab), rows[r]));
  }
  out.host_logits = Tensor::Zeros(DType::kF32, {static_cast<int64_t>(host_rows.size()), vocab});
  for (size_t i = 0; i < host_rows.size(); ++i) {
    std::copy_n(logits.f32() + host_rows[i] * vocab, vocab, out.host_logits.f32() + i * vocab);
  }
  return out;
}

}  // namespace lair::models
