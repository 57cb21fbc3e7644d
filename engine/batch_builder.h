// BatchBuilder: the runner's side of ScheduleOutput (batch preparation).
//
// It mirrors the sequences the runner knows: each one's slot, position and
// tokens not yet consumed, updated from each step's changes, and packs the
// step's tokens into a models::ForwardBatch. Shared by every ModelRunner.
//
// Thread safety: thread-compatible.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "core/status.h"
#include "engine/schedule_output.h"
#include "models/model.h"

namespace lair::engine {

struct PreparedBatch {
  models::ForwardBatch forward;    // tokens, cu_seqlens, slots, start positions
  std::vector<SequenceId> ids;     // [num_seqs] sequence of each batch row
  std::vector<bool> needs_logits;  // [num_seqs] consumed every known token: sample next
  // [num_seqs] how many of its first tokens this step have their logits
  // returned to score the prompt (NewSequenceData::num_prompt_tokens_scored).
  std::vector<int> prompt_rows;
};

class BatchBuilder {
 public:
  // Drops finished and preempted sequences, records new ones and appended
  // tokens, and packs the scheduled tokens. InvalidArgument names the
  // sequence when the schedule contradicts what is known (an unknown id, or
  // more tokens than it has): a scheduler bug, reported rather than run.
  absl::StatusOr<PreparedBatch> Prepare(const ScheduleOutput& schedule);

  int num_known() const { return static_cast<int>(known_.size()); }

 private:
  struct Known {
    int slot = 0;
    int position = 0;              // tokens already in the slot
    int prompt_scored_end = 0;     // positions below this - 1 score the prompt
    std::vector<int32_t> pending;  // known tokens not yet consumed
  };
  absl::flat_hash_map<SequenceId, Known> known_;
};

}  // namespace lair::engine
