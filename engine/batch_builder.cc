#include "engine/batch_builder.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace lair::engine {

absl::StatusOr<PreparedBatch> BatchBuilder::Prepare(const ScheduleOutput& schedule) {
  for (SequenceId id : schedule.finished_ids) known_.erase(id);
  for (SequenceId id : schedule.preempted_ids) known_.erase(id);
  for (const NewSequenceData& seq : schedule.new_sequences) {
    Known& k = known_[seq.id];
    k.slot = seq.slot;
    k.position = seq.num_computed_tokens;
    k.prompt_scored_end = seq.num_prompt_tokens_scored;
    k.pending.assign(seq.token_ids.begin() + seq.num_computed_tokens, seq.token_ids.end());
  }
  for (const CachedSequenceData& seq : schedule.cached_sequences) {
    auto it = known_.find(seq.id);
    if (it == known_.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("schedule: cached sequence ", seq.id, " is unknown to the runner"));
    }
    it->second.pending.insert(it->second.pending.end(), seq.new_token_ids.begin(),
                              seq.new_token_ids.end());
  }
  PreparedBatch batch;
  batch.forward.cu_seqlens.push_back(0);
  for (const auto& [id, count] : schedule.num_scheduled_tokens) {
    auto it = known_.find(id);
    if (it == known_.end() || count < 1 || count > static_cast<int>(it->second.pending.size())) {
      return absl::InvalidArgumentError(absl::StrCat("schedule: sequence ", id, " scheduled for ",
                                                     count, " tokens it does not have"));
    }
    Known& k = it->second;
    batch.forward.tokens.insert(batch.forward.tokens.end(), k.pending.begin(),
                                k.pending.begin() + count);
    batch.forward.cu_seqlens.push_back(static_cast<int32_t>(batch.forward.tokens.size()));
    batch.forward.slots.push_back(k.slot);
    batch.forward.start_positions.push_back(k.position);
    batch.prompt_rows.push_back(std::clamp(k.prompt_scored_end - 1 - k.position, 0, count));
    k.pending.erase(k.pending.begin(), k.pending.begin() + count);
    k.position += count;
    batch.ids.push_back(id);
    batch.needs_logits.push_back(k.pending.empty());
  }
  return batch;
}

}  // namespace lair::engine
