// Scheduler: decides, each step, which sequences run and how many tokens.
//
// The rule: every sequence has num_computed_tokens (folded into its state)
// and a target, num_tokens() (its prompt, then each sampled token); each
// step closes the gap of as many sequences as fit in the token budget
// (max_batch_tokens) and the slot budget (one state slot per running
// sequence), running sequences first in admission order, then waiting ones
// first-come first-served. There is no prefill or decode phase: a decode is
// a gap of 1, a prompt a larger gap cut into chunks across steps.
//
// A waiting sequence that finds no free slot stays queued (the cache answers
// ResourceExhausted; nothing fails). With preempt_quantum_tokens > 0, when
// sequences wait and every slot is held, running sequences that have
// scheduled at least that many tokens since they got their slot are
// preempted (most tokens first, one per waiting sequence): their state is
// saved to host memory, the slot freed, and they requeue at the back; on
// resumption the state is restored, so nothing is recomputed.
//
// Finished, cancelled and failed sequences free their slots at once (Free).
//
// Thread safety: thread-compatible; owned by the engine thread.
#pragma once

#include <cstdint>
#include <deque>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "engine/schedule_output.h"
#include "engine/sequence.h"
#include "engine/state_cache.h"

namespace lair::engine {

struct SchedulerConfig {
  int max_batch_tokens = 2048;     // tokens per step over all sequences
  int max_running = 256;           // sequences per step (slots in use)
  int preempt_quantum_tokens = 0;  // 0: never preempt
};

class Scheduler {
 public:
  // `cache` must outlive the scheduler. Sequences passed in are owned by the
  // caller and must stay alive until Free.
  Scheduler(const SchedulerConfig& config, StateCache* cache);

  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues a new sequence at the back. REQUIRES: seq is kWaiting.
  void AddWaiting(Sequence* seq);
  // Gives `child` the state of `parent`'s slot (n > 1 siblings): a slot copy
  // when one is free and the slot budget allows (child runs from the next
  // step), else a host copy with the child queued at the front. Errors from
  // the copy are returned and leave child unscheduled.
  // REQUIRES: parent is kRunning; child is kWaiting with
  // num_computed_tokens == parent's.
  absl::Status AddForked(Sequence* child, const Sequence& parent);

  // Plans one step and advances num_computed_tokens of every scheduled
  // sequence. Sequences whose state could not be restored are failed and
  // reported by TakeFailed.
  ScheduleOutput Schedule();
  // Sequences that failed inside Schedule since the last call (still to be
  // passed to Free by the caller).
  std::vector<std::pair<Sequence*, absl::Status>> TakeFailed();

  // Removes a sequence in any state, freeing its slot at once.
  void Free(Sequence* seq);

  int num_running() const { return static_cast<int>(running_.size()); }
  int num_waiting() const { return static_cast<int>(waiting_.size()); }
  bool has_work() const { return !running_.empty() || !waiting_.empty(); }
  int64_t preemptions_total() const { return preemptions_total_; }

 private:
  // Preempts running sequences past their quantum when others wait for a slot.
  void MaybePreempt(ScheduleOutput* out);
  // Adds `count` tokens of `seq` to `out` as new or cached data.
  void Add(Sequence* seq, int count, ScheduleOutput* out);
  // Moves the first admissible waiting sequence into a slot (failing those
  // whose state cannot be restored); false when no slot is free.
  bool Admit();

  const SchedulerConfig config_;
  StateCache* const cache_;
  std::vector<Sequence*> running_;  // admission order
  std::deque<Sequence*> waiting_;   // first come, first served
  std::vector<SequenceId> finished_since_step_;
  std::vector<std::pair<Sequence*, absl::Status>> failed_;
  int64_t preemptions_total_ = 0;
};

}  // namespace lair::engine
