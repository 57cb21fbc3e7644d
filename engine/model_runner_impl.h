// ModelRunnerImpl: the ModelRunner over a loaded models::Model and its
// StatePool.
//
// Each step it turns the schedule into one packed ForwardBatch
// (BatchBuilder), runs Model::Forward (logits of each sequence's last
// token) and hands back the rows of the sequences due to sample. When some
// of those are in ScheduleOutput::device_sampling (never while a prompt is
// scored), it runs Model::ForwardGreedy or Model::ForwardSample instead and
// hands back their tokens, and the logits rows of the others. Sequences
// whose tokens would overrun max_context fail alone, before the forward; a
// Forward error fails every sequence of that step.
//
// Thread safety: used by the engine thread only.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/batch_builder.h"
#include "engine/model_runner.h"
#include "kernels/backend.h"
#include "models/model.h"
#include "models/state_pool.h"

namespace lair::engine {

class ModelRunnerImpl final : public ModelRunner {
 public:
  // The state budget used on the CPU when EngineConfig::state_memory_bytes is 0.
  static constexpr int64_t kCpuStateMemoryBytes = int64_t{1} << 30;

  // Loads the checkpoint in `dir` on `device` ("cpu", "cuda", "cuda:N"; see
  // kernels::MakeBackend). The context limit is options.max_context for
  // softmax-attention families (llama) and unbounded for recurrent ones.
  // Errors are those of MakeBackend and Model::Load.
  static absl::StatusOr<std::unique_ptr<ModelRunnerImpl>> Load(const std::string& dir,
                                                               std::string_view device,
                                                               const models::LoadOptions& options);

  // Takes ownership of `backend` and of `model` (loaded on that backend).
  // `max_context` is the model's per-sequence token limit (the KV length for
  // softmax-attention families; 0 for recurrent ones).
  ModelRunnerImpl(std::unique_ptr<kernels::Backend> backend, std::unique_ptr<models::Model> model,
                  int max_context);

  int vocab_size() const override { return model_->vocab_size(); }
  int max_context() const override { return max_context_; }
  int64_t DefaultStateMemoryBytes() const override;
  RunnerOutput Execute(const ScheduleOutput& schedule) override;

  int64_t BytesPerSlot() const override { return model_->state_layout().BytesPerSlot(); }
  absl::Status CreateSlots(int num_slots) override;
  absl::Status ZeroSlot(int slot) override { return pool().Zero(slot); }
  absl::Status CopySlot(int from, int to) override { return pool().CopySlot(from, to); }
  absl::StatusOr<std::string> SaveSlot(int slot) override { return pool().Save(slot); }
  absl::Status RestoreSlot(int slot, const std::string& bytes) override {
    return pool().Restore(slot, bytes);
  }

 private:
  // REQUIRES: CreateSlots succeeded.
  models::StatePool& pool();
  // Execute's step when the device draws: `run` is `batch` less the
  // sequences that failed alone, rows[r] the batch row of its sequence r.
  RunnerOutput ExecuteDrawn(const ScheduleOutput& schedule, const PreparedBatch& batch,
                            const models::ForwardBatch& run, const std::vector<int>& rows);

  // Declared first so it is destroyed last: model_ and pool_ hold its memory.
  std::unique_ptr<kernels::Backend> backend_;
  std::unique_ptr<models::Model> model_;
  const int max_context_;
  std::optional<models::StatePool> pool_;  // set by CreateSlots
  BatchBuilder builder_;
};

}  // namespace lair::engine
