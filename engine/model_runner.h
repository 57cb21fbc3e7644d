// ModelRunner: runs one scheduled step on a model (scheduler -> runner ->
// engine). An interface, so the scheduler and engine tests run against a
// fake without a model or GPU (as LevelDB's Env is a seam).
//
// The runner also owns the device memory of the state slots (SlotStore):
// the StateCache decides which slot a sequence gets, the runner holds the
// bytes.
//
// Thread safety: used by the engine thread only.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "engine/request_output.h"
#include "engine/schedule_output.h"
#include "engine/state_cache.h"

namespace lair::engine {

struct SequenceLogits {
  SequenceId id = 0;
  std::vector<float> logits;  // [vocab] next-token logits, unprocessed
};

// Logits of positions first_position, first_position + 1, ... of one
// sequence's prompt (NewSequenceData::num_prompt_tokens_scored), each
// predicting the prompt token after it.
struct PromptLogits {
  SequenceId id = 0;
  int first_position = 0;
  std::vector<float> logits;  // [positions, vocab], unprocessed
};

// A sequence's next token, drawn by the runner (ScheduleOutput::device_sampling),
// with its logprobs when the rule asked for them (RowSampling::logprobs).
struct SequenceToken {
  SequenceId id = 0;
  int32_t token = 0;
  std::optional<TokenLogprob> logprob;
};

struct SequenceFailure {
  SequenceId id = 0;
  absl::Status status;  // why this sequence's step failed
};

// Runner -> engine. Every scheduled sequence appears in at most one list;
// one that consumed all its known tokens appears in exactly one.
struct RunnerOutput {
  std::vector<SequenceLogits> logits;       // sequences due to sample, batch order
  std::vector<SequenceToken> tokens;        // or their tokens (device_sampling), batch order
  std::vector<PromptLogits> prompt_logits;  // prompts being scored, batch order
  std::vector<SequenceFailure> failures;    // sequences that failed this step
};

class ModelRunner : public SlotStore {
 public:
  virtual int vocab_size() const = 0;
  // The most tokens one sequence's state can hold; 0 when unbounded (every
  // recurrent family).
  virtual int max_context() const = 0;
  // The state budget when EngineConfig::state_memory_bytes is 0: on CUDA,
  // free device memory less a margin for activations; on the CPU a fixed
  // default.
  virtual int64_t DefaultStateMemoryBytes() const = 0;

  // Applies the schedule's changes and runs its tokens. A failure that
  // concerns one sequence fails only it; one that spoils the whole batch
  // fails every scheduled sequence. Never fails the engine.
  virtual RunnerOutput Execute(const ScheduleOutput& schedule) = 0;
};

}  // namespace lair::engine
