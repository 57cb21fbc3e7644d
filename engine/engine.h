// Engine: the serving loop behind every front end.
//
// Front ends Submit() tokenized requests and receive RequestOutputs through a
// callback. One engine thread runs the step loop (schedule -> model runner ->
// sample -> outputs); Submit, Cancel and Stats are thread-safe and never
// block on a step. Callbacks run on the engine thread: they must not block
// (front ends hand the output to their own executor).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/time/time.h"
#include "core/status.h"
#include "engine/request.h"
#include "engine/request_output.h"

namespace lair {
class Tokenizer;
}

namespace lair::engine {

class ModelRunner;

struct EngineConfig {
  int max_batch_tokens = 2048;  // tokens per step: decode tokens plus prefill chunks
  int max_running = 256;        // sequences per step
  int max_waiting = 4096;       // queued requests before Submit returns ResourceExhausted
  // State-slot pool size; 0 = free device memory less a margin (1 GiB on
  // the CPU). Slots = min(max_running, this / bytes per slot), logged at start.
  int64_t state_memory_bytes = 0;
  int max_prompt_tokens = 32768;  // longer prompts are InvalidArgument
  int max_new_tokens = 32768;     // cap on SamplingParams::max_tokens
  // 0: a request that finds every state slot held waits until one frees.
  // N > 0: it may preempt a running sequence that has run N tokens since it
  // got its slot; that state is saved to host memory and restored later
  // (round-robin over more sequences than slots, no recomputation).
  int preempt_quantum_tokens = 0;
};

// A snapshot for metrics and health.
struct EngineStats {
  int running = 0;
  int waiting = 0;
  int slots_total = 0;
  int slots_used = 0;
  int64_t bytes_per_slot = 0;
  int64_t prompt_tokens_total = 0;
  int64_t generated_tokens_total = 0;
  int64_t steps_total = 0;
  int64_t preemptions_total = 0;
};

using OutputCallback = std::function<void(const RequestOutput&)>;

class Engine {
 public:
  // Starts the engine thread. `tokenizer` (may be null: outputs then carry no
  // text and stop strings are refused) must outlive the engine.
  static absl::StatusOr<std::unique_ptr<Engine>> Create(std::unique_ptr<ModelRunner> runner,
                                                        const Tokenizer* tokenizer,
                                                        EngineConfig config);
  virtual ~Engine() = default;

  // Queues a request. InvalidArgument names the bad field (empty prompt,
  // bad sampling value, prompt too long, duplicate id); ResourceExhausted
  // when the queue is full; FailedPrecondition after Shutdown began.
  // On OK, `on_output` is called one or more times, the last with
  // finished() == true, for each of the n completions.
  virtual absl::Status Submit(EngineRequest request, OutputCallback on_output) = 0;
  // Cancels a live request (no-op when unknown or finished). Its slot is
  // freed at once and its final output has FinishReason::kCancelled.
  virtual void Cancel(const std::string& request_id) = 0;
  virtual EngineStats Stats() const = 0;
  // Stops accepting, lets running requests finish for up to `grace`, cancels
  // the rest, then stops the thread. Idempotent.
  virtual void Shutdown(absl::Duration grace) = 0;
};

}  // namespace lair::engine
