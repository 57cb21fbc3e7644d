#include "engine/model_runner_impl.h"

#include <algorithm>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/sampler.h"

#ifdef LAIR_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace lair::engine {

absl::StatusOr<std::unique_ptr<ModelRunnerImpl>> ModelRunnerImpl::Load(
    const std::string& dir, std::string_view device, const models::LoadOptions& options) {
  LAIR_ASSIGN_OR_RETURN(std::unique_ptr<kernels::Backend> backend, kernels::MakeBackend(device));
  LAIR_ASSIGN_OR_RETURN(std::unique_ptr<models::Model> model,
                        models::Model::Load(dir, backend.get(), options));
  const int max_context = model->family() == "llama" ? options.max_context : 0;
  return std::make_unique<ModelRunnerImpl>(std::move(backend), std::move(model), max_context);
}

ModelRunnerImpl::ModelRunnerImpl(std::unique_ptr<kernels::Backend> backend,
                                 std::unique_ptr<models::Model> model, int max_context)
    : backend_(std::move(backend)), model_(std::move(model)), max_context_(max_context) {}

models::StatePool& ModelRunnerImpl::pool() {
  LAIR_CHECK(pool_.has_value());
  return *pool_;
}

int64_t ModelRunnerImpl::DefaultStateMemoryBytes() const {
#ifdef LAIR_HAVE_CUDA
  if (backend_->device() == Device::kCuda) {
    size_t free_bytes = 0;
    size_t total_bytes = 0;
    if (cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess) {
      // Keep 10% of the device, and at least 2 GiB, for activations and logits.
      const int64_t margin =
          std::max<int64_t>(int64_t{2} << 30, static_cast<int64_t>(total_bytes / 10));
      return std::max<int64_t>(0, static_cast<int64_t>(free_bytes) - margin);
    }
    return 0;
  }
#endif
  return kCpuStateMemoryBytes;
}

absl::Status ModelRunnerImpl::CreateSlots(int num_slots) {
  if (pool_.has_value()) return absl::FailedPreconditionError("state slots already created");
  LAIR_ASSIGN_OR_RETURN(
      models::StatePool pool,
      models::StatePool::Create(backend_.get(), model_->state_layout(), num_slots));
  pool_.emplace(std::move(pool));
  return absl::OkStatus();
}

RunnerOutput ModelRunnerImpl::ExecuteDrawn(const ScheduleOutput& schedule,
                                           const PreparedBatch& batch,
                                           const models::ForwardBatch& run,
                                           const std::vector<int>& rows) {
  RunnerOutput out;
  std::vector<kernels::RowSampling> draws;  // greedy where the device does not draw
  std::vector<int32_t> host_rows;           // rows of `run` the host samples
  bool greedy = true;
  for (int r = 0; r < static_cast<int>(rows.size()); ++r) {
    const int i = rows[r];
    const auto drawn = schedule.device_sampling.find(batch.ids[i]);
    const bool here = batch.needs_logits[i] && drawn != schedule.device_sampling.end();
    draws.push_back(here ? drawn->second : kernels::RowSampling());
    greedy &= draws.back().temperature == 0 && draws.back().logprobs < 0;
    if (batch.needs_logits[i] && !here) host_rows.push_back(r);
  }
  absl::StatusOr<models::SampledStep> step;
  if (greedy && host_rows.empty()) {
    absl::StatusOr<std::vector<int32_t>> tokens = model_->ForwardGreedy(run, pool());
    if (tokens.ok()) {
      step = models::SampledStep{.tokens = std::move(*tokens), .host_logits = {}, .logprobs = {}};
    } else {
      step = tokens.status();
    }
  } else {
    step = model_->ForwardSample(run, pool(), draws, host_rows);
  }
  const int vocab = model_->vocab_size();
  if (step.ok() && step->tokens.size() != rows.size()) {
    step = absl::InternalError(absl::StrCat("the model returned ", step->tokens.size(),
                                            " tokens for ", rows.size(), " sequences"));
  }
  if (step.ok() && !host_rows.empty()) {
    if (absl::Status s = ExpectShape(step->host_logits,
                                     {static_cast<int64_t>(host_rows.size()), vocab}, "logits");
        !s.ok()) {
      step = s;
    }
  }
  const bool logprobs = std::any_of(draws.begin(), draws.end(),
                                    [](const kernels::RowSampling& d) { return d.logprobs >= 0; });
  if (step.ok() && logprobs) {
    const auto n = static_cast<int64_t>(rows.size());
    absl::Status s =
        ExpectShape(step->logprobs.values, {n, 1 + kernels::kMaxRowLogprobs}, "logprobs.values");
    if (s.ok()) {
      s = ExpectShape(step->logprobs.top_ids, {n, kernels::kMaxRowLogprobs}, "logprobs.top_ids");
    }
    if (!s.ok()) step = s;
  }
  if (!step.ok()) {
    for (int i : rows) out.failures.push_back({batch.ids[i], step.status()});
    return out;
  }
  size_t next_host = 0;
  for (int r = 0; r < static_cast<int>(rows.size()); ++r) {
    const SequenceId id = batch.ids[rows[r]];
    if (next_host < host_rows.size() && host_rows[next_host] == r) {
      const float* row = step->host_logits.f32() + static_cast<int64_t>(next_host++) * vocab;
      out.logits.push_back({id, std::vector<float>(row, row + vocab)});
    } else if (batch.needs_logits[rows[r]]) {
      std::optional<TokenLogprob> logprob;
      if (draws[r].logprobs >= 0) {
        logprob = DrawnLogprob(step->logprobs, r, step->tokens[r], draws[r].logprobs);
      }
      out.tokens.push_back({id, step->tokens[r], std::move(logprob)});
    }
  }
  return out;
}

RunnerOutput ModelRunnerImpl::Execute(const ScheduleOutput& schedule) {
  RunnerOutput out;
  auto fail_all = [&](const absl::Status& status) {
    for (const auto& [id, count] : schedule.num_scheduled_tokens) {
      out.failures.push_back({id, status});
    }
    return out;
  };
  absl::StatusOr<PreparedBatch> prepared = builder_.Prepare(schedule);
  if (!prepared.ok()) return fail_all(prepared.status());
  PreparedBatch& batch = *prepared;

  // Sequences that would overrun the context fail alone; the rest run.
  models::ForwardBatch run;
  std::vector<int> rows;  // batch row of each sequence in `run`
  run.cu_seqlens.push_back(0);
  for (int i = 0; i < batch.forward.num_seqs(); ++i) {
    const int begin = batch.forward.cu_seqlens[i];
    const int end = batch.forward.cu_seqlens[i + 1];
    if (max_context_ > 0 && batch.forward.start_positions[i] + (end - begin) > max_context_) {
      out.failures.push_back({batch.ids[i], absl::OutOfRangeError(absl::StrCat(
                                                "sequence exceeds the model's context of ",
                                                max_context_, " tokens"))});
      continue;
    }
    run.tokens.insert(run.tokens.end(), batch.forward.tokens.begin() + begin,
                      batch.forward.tokens.begin() + end);
    run.cu_seqlens.push_back(static_cast<int32_t>(run.tokens.size()));
    run.slots.push_back(batch.forward.slots[i]);
    run.start_positions.push_back(batch.forward.start_positions[i]);
    rows.push_back(i);
  }
  if (rows.empty()) return out;
  // Scoring a prompt needs the logits of its rows too: then the model
  // returns exactly the rows used (each scored sequence's first prompt_rows
  // tokens, each sampling sequence's last), in batch order.
  const bool scoring =
      std::any_of(rows.begin(), rows.end(), [&](int i) { return batch.prompt_rows[i] > 0; });
  for (int r = 0; scoring && r < static_cast<int>(rows.size()); ++r) {
    for (int j = 0; j < batch.prompt_rows[rows[r]]; ++j) {
      run.logit_rows.push_back(run.cu_seqlens[r] + j);
    }
    if (batch.needs_logits[rows[r]]) run.logit_rows.push_back(run.cu_seqlens[r + 1] - 1);
  }
  // Sequences whose draw reads only their raw logits get it on the device,
  // and only the others' rows come back: a step downloads B ids and those
  // rows rather than B × vocab floats.
  if (!scoring && !schedule.device_sampling.empty())
    return ExecuteDrawn(schedule, batch, run, rows);
  absl::StatusOr<Tensor> logits = model_->Forward(run, pool());
  if (!logits.ok()) {
    for (int i : rows) out.failures.push_back({batch.ids[i], logits.status()});
    return out;
  }
  const int vocab = model_->vocab_size();
  const int64_t logit_rows = scoring ? static_cast<int64_t>(run.logit_rows.size()) : run.num_seqs();
  if (absl::Status s = ExpectShape(*logits, {logit_rows, vocab}, "logits"); !s.ok()) {
    for (int i : rows) out.failures.push_back({batch.ids[i], s});
    return out;
  }
  const Tensor host = logits->ToF32();
  int64_t next = 0;  // the next logits row
  for (int r = 0; r < static_cast<int>(rows.size()); ++r) {
    const int i = rows[r];
    if (batch.prompt_rows[i] > 0) {
      const float* begin = host.f32() + next * vocab;
      out.prompt_logits.push_back(
          {batch.ids[i], batch.forward.start_positions[i],
           std::vector<float>(begin, begin + static_cast<int64_t>(batch.prompt_rows[i]) * vocab)});
      next += batch.prompt_rows[i];
    }
    if (!batch.needs_logits[i]) {
      next += scoring ? 0 : 1;  // the last-row logits nobody samples from
      continue;
    }
    const float* row = host.f32() + next * vocab;
    out.logits.push_back({batch.ids[i], std::vector<float>(row, row + vocab)});
    ++next;
  }
  return out;
}

}  // namespace lair::engine
