// Sequence: one completion's state, from admission to its final output.
//
// A request with n completions is one RequestGroup and, after its shared
// prefill, n Sequences (see Engine: siblings are forked from the first
// sequence's state once the prompt is computed).
//
// State machine. Only the Scheduler moves a sequence between states:
//
//             slot allocated (zeroed, copied or restored)
//   kWaiting ----------------------------------------> kRunning
//      ^                                                  |
//      +---- preempted: state saved to host, slot freed --+
//   kWaiting or kRunning -- finished, cancelled, failed --> kFinished
//
// Invariants: a kRunning sequence holds a slot whose state is that of its
// first num_computed_tokens tokens; a kWaiting sequence holds none, and its
// state is in saved_state when num_computed_tokens > 0; a kFinished sequence
// holds nothing.
//
// Thread safety: thread-compatible; owned by the engine thread.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "engine/engine.h"
#include "engine/output_processor.h"
#include "engine/request.h"
#include "engine/sampler.h"
#include "engine/state_cache.h"

namespace lair::engine {

// Engine-wide sequence number; never reused.
using SequenceId = int64_t;

class Sequence;

// What the n completions of one request share.
struct RequestGroup {
  EngineRequest request;                 // as submitted (prompt and parameters)
  OutputCallback on_output;              // receives every output of every completion
  uint64_t seed = 0;                     // request seed, or one the engine drew
  std::vector<OutputProcessor> outputs;  // [n] one stream per completion
  bool forked = false;                   // siblings 1..n-1 exist (prompt computed)
  std::vector<Sequence*> live;           // its sequences not yet finished
  int unfinished = 0;                    // completions whose final output is not sent
  // Prompt tokens 1.. scored so far (SamplingParams::prompt_logprobs), in order.
  std::vector<TokenLogprob> prompt_logprobs;
};

enum class SequenceStatus { kWaiting, kRunning, kFinished };

class Sequence {
 public:
  // A sequence of `group` (which must outlive it) for completion `index`,
  // whose first num_computed_tokens of `tokens` are already in `saved_state`
  // (0 and empty for a fresh prompt).
  Sequence(SequenceId id, RequestGroup* group, int index, std::vector<int32_t> tokens,
           int num_computed_tokens, std::string saved_state);

  Sequence(const Sequence&) = delete;
  Sequence& operator=(const Sequence&) = delete;

  SequenceId id() const { return id_; }
  RequestGroup& group() const { return *group_; }
  int index() const { return index_; }
  OutputProcessor& output() const { return group_->outputs[index_]; }
  const SamplingParams& params() const { return group_->request.sampling; }

  // Prompt, then generated tokens.
  const std::vector<int32_t>& tokens() const { return tokens_; }
  int num_tokens() const { return static_cast<int>(tokens_.size()); }
  int num_prompt_tokens() const { return num_prompt_tokens_; }
  // Whether the prompt is computed but no token generated yet: the point
  // where n > 1 siblings fork.
  bool at_first_sample() const { return num_tokens() == num_prompt_tokens_; }
  // Appends a generated token.
  void AppendToken(int32_t token);

  SamplingState& sampling() { return sampling_; }

  // --- Scheduler-owned state (see the state machine above) --------------
  SequenceStatus status = SequenceStatus::kWaiting;
  int num_computed_tokens = 0;    // tokens folded into the state
  std::optional<StateSlot> slot;  // held iff kRunning
  std::string saved_state;        // host state while waiting with num_computed_tokens > 0
  // Tokens the runner has been told about since it last saw this sequence
  // as new; nullopt when the runner does not know the sequence (never
  // scheduled, or preempted since).
  std::optional<int> num_tokens_sent;
  int tokens_since_resume = 0;  // tokens scheduled since the slot was (re)acquired

 private:
  const SequenceId id_;
  RequestGroup* const group_;
  const int index_;
  std::vector<int32_t> tokens_;
  const int num_prompt_tokens_;
  SamplingState sampling_;
};

}  // namespace lair::engine
