// FakeEngine: an engine::Engine for server tests, with no model. Each step
// (every `step_delay`) every running completion gets one lowercase letter or
// space chosen from its context: greedy at temperature 0, otherwise from a
// generator seeded by `seed` (and the completion index) when given. It
// honours n, max_tokens, stop strings (held back across tokens),
// stop_token_ids, logprobs and prompt logprobs (fixed fake values),
// cancellation, the waiting
// queue limit and Shutdown (every callback runs on its own thread, in
// order, as the real engine's do), and reports slots like a real engine (one slot
// per running request, max_running slots).
#pragma once

#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "engine/engine.h"
#include "tokenizer/tokenizer.h"

namespace lair::server::testing {

class FakeEngine final : public engine::Engine {
 public:
  FakeEngine(const Tokenizer* tokenizer, engine::EngineConfig config, absl::Duration step_delay);
  ~FakeEngine() override;

  absl::Status Submit(engine::EngineRequest request, engine::OutputCallback on_output) override;
  void Cancel(const std::string& request_id) override;
  engine::EngineStats Stats() const override;
  void Shutdown(absl::Duration grace) override;

 private:
  struct Completion {
    std::vector<int32_t> context;  // prompt and generated tokens
    std::string text;              // generated text
    size_t emitted = 0;            // bytes of text already sent
    int generated = 0;
    uint64_t rng = 0;
    bool done = false;
  };
  struct Live {
    engine::EngineRequest request;
    engine::OutputCallback on_output;
    std::vector<Completion> completions;
  };
  using Delivery = std::pair<engine::OutputCallback, engine::RequestOutput>;

  void Loop();
  // Admits waiting requests, advances every running one by a token.
  std::vector<Delivery> StepLocked();
  engine::RequestOutput Advance(Live& live, int index);
  void Deliver(const std::vector<Delivery>& deliveries);
  std::vector<Delivery> CancelLocked(const std::string& id);

  const Tokenizer* const tokenizer_;
  const engine::EngineConfig config_;
  const absl::Duration step_delay_;
  mutable std::mutex mu_;
  std::condition_variable wake_;
  std::map<std::string, Live> running_;  // guarded by mu_
  std::deque<std::string> waiting_;      // ids of queued_ in arrival order; guarded by mu_
  std::map<std::string, Live> queued_;   // guarded by mu_
  std::vector<std::string> cancels_;     // Cancel calls not yet applied by Loop; guarded by mu_
  bool accepting_ = true;                // guarded by mu_
  bool stop_ = false;                    // guarded by mu_
  int64_t prompt_tokens_ = 0, generated_tokens_ = 0, steps_ = 0;  // guarded by mu_
  std::thread thread_;
};

}  // namespace lair::server::testing
