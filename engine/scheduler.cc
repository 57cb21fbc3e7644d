#include "engine/scheduler.h"

#include <algorithm>

namespace lair::engine {

Scheduler::Scheduler(const SchedulerConfig& config, StateCache* cache)
    : config_(config), cache_(cache) {}

void Scheduler::AddWaiting(Sequence* seq) {
  LAIR_CHECK(seq->status == SequenceStatus::kWaiting);
  waiting_.push_back(seq);
}

absl::Status Scheduler::AddForked(Sequence* child, const Sequence& parent) {
  LAIR_CHECK(parent.status == SequenceStatus::kRunning && parent.slot.has_value());
  LAIR_CHECK(child->status == SequenceStatus::kWaiting &&
             child->num_computed_tokens == parent.num_computed_tokens);
  if (num_running() < config_.max_running) {
    absl::StatusOr<StateSlot> slot = cache_->AllocateCopy(*parent.slot);
    if (slot.ok()) {
      child->slot = *slot;
      child->status = SequenceStatus::kRunning;
      child->tokens_since_resume = 0;
      running_.push_back(child);
      return absl::OkStatus();
    }
    if (!absl::IsResourceExhausted(slot.status())) return slot.status();
  }
  LAIR_ASSIGN_OR_RETURN(child->saved_state, cache_->Save(*parent.slot));
  waiting_.push_front(child);  // its request arrived before anything queued behind it
  return absl::OkStatus();
}

ScheduleOutput Scheduler::Schedule() {
  ScheduleOutput out;
  out.finished_ids = std::move(finished_since_step_);
  finished_since_step_.clear();
  MaybePreempt(&out);
  int budget = config_.max_batch_tokens;
  for (Sequence* seq : running_) {
    if (budget == 0) break;
    const int count = std::min(seq->num_tokens() - seq->num_computed_tokens, budget);
    if (count <= 0) continue;
    Add(seq, count, &out);
    budget -= count;
  }
  while (budget > 0 && !waiting_.empty() && num_running() < config_.max_running) {
    if (!Admit()) break;
    Sequence* seq = running_.back();
    const int count = std::min(seq->num_tokens() - seq->num_computed_tokens, budget);
    Add(seq, count, &out);
    budget -= count;
  }
  return out;
}

bool Scheduler::Admit() {
  while (!waiting_.empty()) {
    Sequence* seq = waiting_.front();
    absl::StatusOr<StateSlot> slot = seq->num_computed_tokens == 0
                                         ? cache_->Allocate()
                                         : cache_->AllocateRestored(seq->saved_state);
    if (absl::IsResourceExhausted(slot.status())) return false;  // stays queued
    waiting_.pop_front();
    if (!slot.ok()) {
      failed_.emplace_back(seq, slot.status());
      continue;
    }
    seq->slot = *slot;
    seq->saved_state.clear();
    seq->status = SequenceStatus::kRunning;
    seq->tokens_since_resume = 0;
    running_.push_back(seq);
    return true;
  }
  return false;
}

void Scheduler::MaybePreempt(ScheduleOutput* out) {
  if (config_.preempt_quantum_tokens <= 0 || waiting_.empty()) return;
  if (cache_->num_free() > 0 && num_running() < config_.max_running) return;
  std::vector<Sequence*> victims;
  for (Sequence* seq : running_) {
    if (seq->tokens_since_resume >= config_.preempt_quantum_tokens) victims.push_back(seq);
  }
  std::stable_sort(victims.begin(), victims.end(), [](const Sequence* a, const Sequence* b) {
    return a->tokens_since_resume > b->tokens_since_resume;
  });
  victims.resize(std::min(victims.size(), waiting_.size()));
  for (Sequence* seq : victims) {
    running_.erase(std::find(running_.begin(), running_.end(), seq));
    absl::StatusOr<std::string> saved = cache_->Save(*seq->slot);
    if (!saved.ok()) {
      failed_.emplace_back(seq, saved.status());
      continue;
    }
    seq->saved_state = std::move(*saved);
    cache_->Free(*seq->slot);
    seq->slot.reset();
    seq->status = SequenceStatus::kWaiting;
    if (seq->num_tokens_sent.has_value()) out->preempted_ids.push_back(seq->id());
    seq->num_tokens_sent.reset();
    waiting_.push_back(seq);
    ++preemptions_total_;
  }
}

void Scheduler::Add(Sequence* seq, int count, ScheduleOutput* out) {
  if (!seq->num_tokens_sent.has_value()) {
    const int scored = seq->params().prompt_logprobs >= 0 ? seq->num_prompt_tokens() : 0;
    out->new_sequences.push_back(
        {seq->id(), seq->slot->index(), seq->tokens(), seq->num_computed_tokens, scored});
  } else {
    const auto& tokens = seq->tokens();
    out->cached_sequences.push_back(
        {seq->id(), std::vector<int32_t>(tokens.begin() + *seq->num_tokens_sent, tokens.end())});
  }
  seq->num_tokens_sent = seq->num_tokens();
  out->num_scheduled_tokens.emplace_back(seq->id(), count);
  out->total_num_scheduled_tokens += count;
  seq->num_computed_tokens += count;
  seq->tokens_since_resume += count;
}

std::vector<std::pair<Sequence*, absl::Status>> Scheduler::TakeFailed() {
  std::vector<std::pair<Sequence*, absl::Status>> failed = std::move(failed_);
  failed_.clear();
  return failed;
}

void Scheduler::Free(Sequence* seq) {
  if (seq->status == SequenceStatus::kFinished) return;
  if (auto it = std::find(running_.begin(), running_.end(), seq); it != running_.end()) {
    running_.erase(it);
  } else if (auto wit = std::find(waiting_.begin(), waiting_.end(), seq); wit != waiting_.end()) {
    waiting_.erase(wit);
  }
  if (seq->slot.has_value()) cache_->Free(*seq->slot);
  seq->slot.reset();
  seq->saved_state.clear();
  if (seq->num_tokens_sent.has_value()) finished_since_step_.push_back(seq->id());
  seq->num_tokens_sent.reset();
  seq->status = SequenceStatus::kFinished;
}

}  // namespace lair::engine
