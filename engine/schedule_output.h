// ScheduleOutput: what one engine step runs (scheduler -> model runner).
//
// Like vLLM's SchedulerOutput it carries changes, not snapshots. A sequence
// the runner does not know yet (first scheduled, or resumed after
// preemption) comes with its full data in new_sequences; a sequence it
// already knows comes in cached_sequences with only the tokens appended
// since (the tokens sampled last step). The runner keeps each known
// sequence's slot and unconsumed tokens (engine/batch_builder.h) and drops
// those listed in finished_ids and preempted_ids.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "engine/sequence.h"
#include "kernels/sampling.h"

namespace lair::engine {

struct NewSequenceData {
  SequenceId id = 0;
  int slot = 0;                    // state slot it reads and writes
  std::vector<int32_t> token_ids;  // every token known: prompt, then output so far
  int num_computed_tokens = 0;     // tokens already in the slot (> 0 when resumed or forked)
  // > 0: the runner also returns the logits of each position p <
  // num_prompt_tokens_scored - 1 it runs, which predict prompt token p + 1.
  int num_prompt_tokens_scored = 0;
};

struct CachedSequenceData {
  SequenceId id = 0;
  std::vector<int32_t> new_token_ids;  // appended since the runner last heard of it
};

struct ScheduleOutput {
  std::vector<NewSequenceData> new_sequences;
  std::vector<CachedSequenceData> cached_sequences;
  // [sequences scheduled] (id, tokens to run this step), in batch order. A
  // sequence runs the next `count` of its unconsumed tokens; when that
  // consumes all it knows, the runner returns its next-token logits.
  std::vector<std::pair<SequenceId, int>> num_scheduled_tokens;
  int total_num_scheduled_tokens = 0;
  // Sequences that left since the previous step (finished, cancelled or
  // failed): their slots are already free.
  std::vector<SequenceId> finished_ids;
  // Sequences preempted this step: state saved to host, slot free.
  std::vector<SequenceId> preempted_ids;
  // Sequences due to sample this step whose draw reads nothing but their
  // raw logits (no penalties, bias, allowed ids or stop-token masking),
  // each with its rule and draw (kernels/sampling.h; temperature 0 takes
  // the argmax; logprobs listed where it asks). Set by the engine; empty
  // when a prompt is scored.
  // The runner draws their tokens where the logits are and returns them
  // instead (RunnerOutput::tokens); the other sequences due to sample get
  // their logits rows.
  absl::flat_hash_map<SequenceId, kernels::RowSampling> device_sampling;

  bool empty() const { return num_scheduled_tokens.empty(); }
};

}  // namespace lair::engine
